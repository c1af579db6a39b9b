#include "worker/tensor/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain {

const char* ComputeTypeName(ComputeType type) {
  switch (type) {
    case ComputeType::kFloat32:
      return "float32";
    case ComputeType::kBfloat16:
      return "bfloat16";
    case ComputeType::kFloat16:
      return "float16";
  }
  return "unknown";
}
namespace {

// Allocation, release and copies of CUDA storage; without a CUDA build no
// kCuda tensor can exist, so reaching these is a bug in a caller that
// skipped validation (docs/architecture.md §6a).
[[noreturn]] [[maybe_unused]] void NoCudaBuild(const char* what) {
  DISTRAIN_CHECK(false) << what
                        << ": a CUDA tensor in a CPU-only build of distrain (DISTRAIN_CUDA=OFF or "
                           "no toolkit at build time)";
  __builtin_unreachable();
}

}  // namespace

int VisibleGpus() {
#ifdef DISTRAIN_HAVE_CUDA
  return cuda::VisibleDeviceCount();
#else
  return 0;
#endif
}

std::string DeviceId::ToString() const {
  return kind == Device::kCpu ? std::string("CPU") : absl::StrCat("GPU:", ordinal);
}

int64_t Tensor::NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DISTRAIN_CHECK_GE(d, 0) << "negative dimension in shape";
    n *= d;
  }
  return n;
}

Tensor::Tensor(std::vector<int64_t> shape, float fill)
    : shape_(std::move(shape)), size_(NumElements(shape_)), host_(size_, fill) {}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> values)
    : shape_(std::move(shape)), size_(NumElements(shape_)), host_(std::move(values)) {
  DISTRAIN_CHECK_EQ(static_cast<int64_t>(host_.size()), size_)
      << "value count does not match shape " << ShapeString();
}

Tensor::Tensor(std::vector<int64_t> shape, DeviceId device) {
  Resize(std::move(shape), device);
  Fill(0.0f);
}

Tensor::~Tensor() { ReleaseDevice(); }

Tensor::Tensor(const Tensor& other) { CopyFrom(other); }

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) CopyFrom(other);
  return *this;
}

Tensor Tensor::Alias(const Tensor& base, std::vector<int64_t> shape) {
  Tensor alias;
  alias.size_ = NumElements(shape);
  DISTRAIN_CHECK_EQ(alias.size_, base.size())
      << "alias of " << base.ShapeString() << " as " << Tensor(shape).ShapeString();
  alias.shape_ = std::move(shape);
  alias.device_ = base.device_;
  alias.alias_ = const_cast<float*>(base.data());
  return alias;
}

Tensor::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, DeviceId::Cpu())),
      host_(std::move(other.host_)),
      alias_(std::exchange(other.alias_, nullptr)),
      device_data_(std::exchange(other.device_data_, nullptr)),
      device_capacity_(std::exchange(other.device_capacity_, 0)) {
  other.shape_.clear();
  other.host_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  ReleaseDevice();
  shape_ = std::move(other.shape_);
  size_ = std::exchange(other.size_, 0);
  device_ = std::exchange(other.device_, DeviceId::Cpu());
  host_ = std::move(other.host_);
  alias_ = std::exchange(other.alias_, nullptr);
  device_data_ = std::exchange(other.device_data_, nullptr);
  device_capacity_ = std::exchange(other.device_capacity_, 0);
  other.shape_.clear();
  other.host_.clear();
  return *this;
}

void Tensor::ReleaseDevice() {
  if (device_data_ == nullptr) return;
#ifdef DISTRAIN_HAVE_CUDA
  cuda::FreeFloats(device_.ordinal, device_data_, device_capacity_);
#endif
  device_data_ = nullptr;
  device_capacity_ = 0;
}

void Tensor::CopyFrom(const Tensor& other) {
  Resize(other.shape_, other.device_);  // an alias becomes an owning tensor here
  if (size_ == 0) return;
  if (on_host()) {
    std::copy(other.data(), other.data() + other.size_, host_.begin());
    return;
  }
#ifdef DISTRAIN_HAVE_CUDA
  cuda::CopyDeviceToDevice(other.device_.ordinal, other.data(), device_.ordinal, device_data_,
                           size_);
#else
  NoCudaBuild("Tensor copy");
#endif
}

void Tensor::Resize(std::vector<int64_t> shape) { Resize(std::move(shape), device_); }

void Tensor::Resize(std::vector<int64_t> shape, DeviceId device) {
  const int64_t n = NumElements(shape);
  // Storage of its own from now on: the aliased tensor is never written
  // through a resized alias (the class comment).
  alias_ = nullptr;
  if (device.kind == Device::kCpu) {
    ReleaseDevice();
    host_.resize(n);
  } else {
    host_.clear();
    host_.shrink_to_fit();
    if (!(device == device_) || n > device_capacity_) {
      ReleaseDevice();
#ifdef DISTRAIN_HAVE_CUDA
      if (n > 0) {
        device_data_ = cuda::AllocateFloats(device.ordinal, n);
        device_capacity_ = n;
      }
#else
      NoCudaBuild("Tensor on a GPU");
#endif
    }
  }
  device_ = device;
  shape_ = std::move(shape);
  size_ = n;
}

void Tensor::Fill(float value) {
  if (on_host()) {
    std::fill(data(), data() + size_, value);
    return;
  }
#ifdef DISTRAIN_HAVE_CUDA
  if (size_ > 0) cuda::FillFloats(device_.ordinal, data(), size_, value);
#else
  NoCudaBuild("Tensor::Fill");
#endif
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]");
}

}  // namespace distrain

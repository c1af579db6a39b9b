#ifndef DISTRAIN_WORKER_TENSOR_TENSOR_H_
#define DISTRAIN_WORKER_TENSOR_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace distrain {

// Where a tensor's storage lives (docs/architecture.md §6a). kCuda storage
// exists only in a CUDA build (DISTRAIN_HAVE_CUDA); asking for it elsewhere
// is a CHECK failure, since every path that could reach it validates first.
enum class Device { kCpu, kCuda };

// A device of the process: the host, or the CUDA device of that ordinal
// (an index into what CUDA_VISIBLE_DEVICES leaves visible).
struct DeviceId {
  Device kind = Device::kCpu;
  int ordinal = 0;
  static DeviceId Cpu() { return {}; }
  static DeviceId Cuda(int ordinal) { return {Device::kCuda, ordinal}; }
  bool operator==(const DeviceId&) const = default;
  std::string ToString() const;  // "CPU", "GPU:1"
};

// The values a float32 tensor of a mixed-precision model holds, and what a
// matrix product or convolution may compute in (ops::MatMul, ops::Conv2D*):
// kFloat32, or every value exactly a bfloat16 / float16 (ops::RoundTo) —
// storage stays float32 either way. Under a 16-bit type a GPU backend runs
// its products on tensor cores, whose conversion of such inputs is exact;
// every backend accumulates in float32. docs/architecture.md §6a.
enum class ComputeType { kFloat32, kBfloat16, kFloat16 };
const char* ComputeTypeName(ComputeType type);  // "bfloat16"

// The CUDA devices this process sees (cuda::VisibleDeviceCount, which honours
// CUDA_VISIBLE_DEVICES as the device plugin sets it); 0 in a CPU-only build
// or without a driver. What the strategies place replicas on and the GPU
// tests run on.
int VisibleGpus();

// A dense, row-major float32 tensor on the host or on one CUDA device.
//
// Ownership: a Tensor owns its storage (value semantics: copy = deep copy on
// the same device, move = cheap). CUDA storage comes from the device's
// caching allocator (worker/tensor/cuda/device_memory.h) and is returned to
// it on destruction; every op on it is queued on the device's compute stream,
// so freeing is safe while kernels that read it are still queued (the next
// user of the block is ordered behind them on the same stream).
//
// Host accessors (span, operator[], at) are for host tensors only; on a CUDA
// tensor span() is empty, and data() is the device pointer the backend
// passes to kernels. Thread-safety: none; distinct tensors may be used from
// distinct threads, a single tensor needs external synchronisation.
//
// An alias (Tensor::Alias) is the exception to ownership: the same elements
// as another tensor under another shape, owning nothing — how Flatten and
// Reshape pass their input on without copying it. It is valid while the
// tensor it aliases keeps its storage (is neither resized nor destroyed);
// copying an alias, assigning to one or resizing one gives an owning tensor,
// so writing through it never reaches the aliased one by accident.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape, float fill = 0.0f);
  Tensor(std::vector<int64_t> shape, std::vector<float> values);  // CHECKs size
  // A zero-filled tensor on `device`.
  Tensor(std::vector<int64_t> shape, DeviceId device);
  ~Tensor();
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  static Tensor Zeros(std::vector<int64_t> shape) { return Tensor(std::move(shape)); }
  // `base`'s elements as `shape` (the same element count), without a copy;
  // see the class comment for how long it is valid.
  static Tensor Alias(const Tensor& base, std::vector<int64_t> shape);
  bool is_alias() const { return alias_ != nullptr; }

  Device device() const { return device_.kind; }
  DeviceId device_id() const { return device_; }
  bool on_host() const { return device_.kind == Device::kCpu; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size() * static_cast<int64_t>(sizeof(float)); }
  bool empty() const { return size_ == 0; }

  // The first element's address in the tensor's own memory space.
  float* data() { return alias_ != nullptr ? alias_ : on_host() ? host_.data() : device_data_; }
  const float* data() const {
    return alias_ != nullptr ? alias_ : on_host() ? host_.data() : device_data_;
  }
  absl::Span<float> span() {
    return on_host() ? absl::MakeSpan(data(), size_) : absl::Span<float>();
  }
  absl::Span<const float> span() const {
    return on_host() ? absl::MakeConstSpan(data(), size_) : absl::Span<const float>();
  }
  float& operator[](int64_t i) { return data()[i]; }
  float operator[](int64_t i) const { return data()[i]; }
  // Row-major 2-D access; CHECK-free for speed, callers own the bounds.
  float& at(int64_t r, int64_t c) { return data()[r * shape_[1] + c]; }
  float at(int64_t r, int64_t c) const { return data()[r * shape_[1] + c]; }

  // Resizes to `shape` on the tensor's device, reusing capacity; contents are
  // unspecified afterwards unless `fill` semantics are needed (use Fill).
  void Resize(std::vector<int64_t> shape);
  // The same on `device`: an op sizes its output on its inputs' device, so
  // a default-constructed output follows them there.
  void Resize(std::vector<int64_t> shape, DeviceId device);
  void Fill(float value);
  bool SameShape(const Tensor& other) const { return shape_ == other.shape_; }
  std::string ShapeString() const;  // "[256, 784]"

  static int64_t NumElements(const std::vector<int64_t>& shape);

 private:
  void ReleaseDevice();
  void CopyFrom(const Tensor& other);

  std::vector<int64_t> shape_;
  int64_t size_ = 0;
  DeviceId device_;
  std::vector<float> host_;          // kCpu storage
  float* alias_ = nullptr;           // an alias's elements (on device_), owned elsewhere
  float* device_data_ = nullptr;     // kCuda storage, device_capacity_ elements
  int64_t device_capacity_ = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_TENSOR_TENSOR_H_

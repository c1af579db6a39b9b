#ifndef DISTRAIN_WORKER_TENSOR_TENSOR_H_
#define DISTRAIN_WORKER_TENSOR_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace distrain {

// Where a tensor's storage lives. Only kCpu is backed by this class today; CUDA
// tensors live in worker/tensor/cuda (a later issue) and are copied through host
// Tensors at strategy boundaries.
enum class Device { kCpu, kCuda };

// A dense, row-major float32 tensor on the host.
//
// Ownership: a Tensor owns its storage (value semantics: copy = deep copy,
// move = cheap). Thread-safety: none; distinct tensors may be used from
// distinct threads, a single tensor needs external synchronisation.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape, float fill = 0.0f);
  Tensor(std::vector<int64_t> shape, std::vector<float> values);  // CHECKs size

  static Tensor Zeros(std::vector<int64_t> shape) { return Tensor(std::move(shape)); }

  // Host storage only, until the CUDA backend (worker/tensor/cuda/) gives
  // Tensor device storage; ops dispatch on this.
  Device device() const { return Device::kCpu; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }
  int64_t bytes() const { return size() * static_cast<int64_t>(sizeof(float)); }
  bool empty() const { return data_.empty(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  absl::Span<float> span() { return absl::MakeSpan(data_); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data_); }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  // Row-major 2-D access; CHECK-free for speed, callers own the bounds.
  float& at(int64_t r, int64_t c) { return data_[r * shape_[1] + c]; }
  float at(int64_t r, int64_t c) const { return data_[r * shape_[1] + c]; }

  // Resizes to `shape`, reusing capacity; contents are unspecified afterwards
  // unless `fill` semantics are needed (use Fill).
  void Resize(std::vector<int64_t> shape);
  void Fill(float value);
  bool SameShape(const Tensor& other) const { return shape_ == other.shape_; }
  std::string ShapeString() const;  // "[256, 784]"

  static int64_t NumElements(const std::vector<int64_t>& shape);

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_TENSOR_TENSOR_H_

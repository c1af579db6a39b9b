#ifndef DISTRAIN_WORKER_MODEL_OPTIMIZER_H_
#define DISTRAIN_WORKER_MODEL_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_config.h"
#include "worker/model/layer.h"

namespace distrain {

// Keras update rules:
//   SGD:       w -= lr * g
//   Momentum:  v = m*v - lr*g;  w += v            (nesterov: w += m*v - lr*g)
//   Adam:      m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//              lr_t = lr * sqrt(1-b2^t) / (1-b1^t);  w -= lr_t * m / (sqrt(v) + eps)
// Slot variables are keyed by the parameter name, so the same optimizer
// serves a local model (Apply) and a parameter-server shard (ApplyDense).
// Thread-safety: none; callers serialise (a ps locks per variable shard).
class Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);
  virtual ~Optimizer() = default;

  // One step over all params (their grad fields), each on its own device;
  // iterations() += 1.
  void Apply(absl::Span<Parameter* const> params);
  // Update one variable with the given 1-based iteration (Adam's t). Slots
  // are created zero-filled on first use, sized like `value`.
  void ApplyDense(const std::string& name, absl::Span<float> value, absl::Span<const float> grad,
                  int64_t iteration) {
    ApplyDenseRange(name, static_cast<int64_t>(value.size()), 0, value, grad, iteration);
  }
  // The same for elements [offset, offset + value.size()) of a variable of
  // `size` elements (slots sized `size`): the rules are element-wise, so
  // updating a variable range by range equals one ApplyDense, bit for bit.
  // Lets a caller form a gradient block by block and apply each block while
  // it is still in cache.
  virtual void ApplyDenseRange(const std::string& name, int64_t size, int64_t offset,
                               absl::Span<float> value, absl::Span<const float> grad,
                               int64_t iteration) = 0;

  // The same rule for a whole variable on a GPU: slots live on the
  // variable's device, the update is queued on its compute stream.
  virtual void ApplyOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                             int64_t iteration) = 0;

  int64_t iterations() const { return iterations_; }
  // Slot tensors for checkpoints, named "<param>/<slot>" (e.g.
  // "dense_0/kernel/m"); restoring them makes the next step bit-identical to
  // an uninterrupted run.
  virtual std::map<std::string, Tensor> SlotState() const = 0;
  virtual absl::Status RestoreState(const std::map<std::string, Tensor>& slots, int64_t iterations) = 0;

 protected:
  int64_t iterations_ = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_OPTIMIZER_H_

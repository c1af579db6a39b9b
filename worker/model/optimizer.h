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
#include "worker/model/loss_scale.h"

namespace distrain {

// Keras update rules:
//   SGD:       w -= lr * g
//   Momentum:  v = m*v - lr*g;  w += v            (nesterov: w += m*v - lr*g)
//   Adam:      m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//              lr_t = lr * sqrt(1-b2^t) / (1-b1^t);  w -= lr_t * m / (sqrt(v) + eps)
//   AdamW:     Adam, with weight decay 0.004 unless configured
//   RMSprop:   v = rho*v + (1-rho)*g^2;  w -= lr * g / sqrt(v + eps)
//              (centered: a = rho*a + (1-rho)*g;  w -= lr * g / sqrt(v - a^2 + eps))
// and, for every rule with a weight decay wd (Keras' weight_decay), first
// w -= w * wd * lr, as Keras' optimizer applies it before the update. lr is
// the schedule's rate for the step (OptimizerConfig::LearningRate): step t
// (1-based) uses the rate at t - 1, as Keras does.
// Slot variables are keyed by the parameter name, so the same optimizer
// serves a local model (Apply) and a parameter-server shard (ApplyDense).
// Thread-safety: none; callers serialise (a ps locks per variable shard).
class Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);
  // The optimizer of a model trained under `precision`: with dynamic loss
  // scaling for mixed_float16, as Keras' compile() wraps it.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config,
                                                           Precision precision);
  virtual ~Optimizer() = default;

  // One step over all params (their grad fields), each on its own device;
  // iterations() += 1. With dynamic loss scaling the grads are the scaled
  // ones: Apply unscales them first, or skips the step (no variable, slot or
  // iterations() changes) when they overflowed — see loss_scale.h. Returns
  // whether the step was applied.
  bool Apply(absl::Span<Parameter* const> params);

  // Turns on Keras' LossScaleOptimizer around this optimizer (mixed_float16).
  void EnableDynamicLossScale(int64_t growth_steps = DynamicLossScale::kGrowthSteps);
  // The factor the model multiplies the loss gradient by: the dynamic scale,
  // or 1 without loss scaling.
  float loss_scale() const { return loss_scale_ ? loss_scale_->scale() : 1.0f; }
  const DynamicLossScale* dynamic_loss_scale() const { return loss_scale_.get(); }
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
  void ApplyDenseRange(const std::string& name, int64_t size, int64_t offset,
                       absl::Span<float> value, absl::Span<const float> grad, int64_t iteration);

  // The same rule for a whole variable on a GPU: slots live on the
  // variable's device, the update is queued on its compute stream.
  void ApplyOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                     int64_t iteration);

  int64_t iterations() const { return iterations_; }
  // Slot tensors for checkpoints, named "<param>/<slot>" (e.g.
  // "dense_0/kernel/m"), and the loss scale's state when there is one;
  // restoring them makes the next step bit-identical to an uninterrupted
  // run. A loss scale's keys in a checkpoint are ignored by an optimizer
  // without one (the job's precision changed), and a loss scale missing
  // from one starts afresh.
  std::map<std::string, Tensor> SlotState() const;
  absl::Status RestoreState(const std::map<std::string, Tensor>& slots, int64_t iterations);

 protected:
  explicit Optimizer(const OptimizerConfig& config)
      : config_(config), weight_decay_(config.EffectiveWeightDecay()) {}

  // The update rule itself with the step's learning rate `lr`, after the
  // weight decay (ApplyDenseRange, ApplyOnDevice).
  virtual void UpdateRange(const std::string& name, int64_t size, int64_t offset,
                           absl::Span<float> value, absl::Span<const float> grad,
                           int64_t iteration, float lr) = 0;
  virtual void UpdateOnDevice(const std::string& name, const Tensor& grad, Tensor* value,
                              int64_t iteration, float lr) = 0;
  // The update rule's own slots (SlotState without the loss scale).
  virtual std::map<std::string, Tensor> RuleSlotState() const = 0;
  virtual absl::Status RestoreRuleState(const std::map<std::string, Tensor>& slots,
                                        int64_t iterations) = 0;

  int64_t iterations_ = 0;

 private:
  // The rate of 1-based `iteration`.
  float RateOf(int64_t iteration) const {
    return config_.LearningRate(iteration > 0 ? iteration - 1 : 0);
  }

  OptimizerConfig config_;
  float weight_decay_;  // 0: none
  std::unique_ptr<DynamicLossScale> loss_scale_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_OPTIMIZER_H_

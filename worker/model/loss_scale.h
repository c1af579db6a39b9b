#ifndef DISTRAIN_WORKER_MODEL_LOSS_SCALE_H_
#define DISTRAIN_WORKER_MODEL_LOSS_SCALE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/model/layer.h"

namespace distrain {

// Dynamic loss scaling for spec.training.precision: mixed_float16, as Keras'
// LossScaleOptimizer does it (docs/architecture.md §6a). float16 holds
// nothing below 2^-24, where small gradients would vanish, so the model
// multiplies the loss gradient by `scale()` before backward (Model::
// set_loss_scale) and the optimizer asks Update before it applies:
//   1. If any gradient is NaN or infinite (float16 overflowed at this
//      scale), the step is skipped: no variable or slot changes, the scale
//      halves and the run of good steps restarts.
//   2. Otherwise every gradient is divided by the scale (a power of two:
//      exact), the step is applied, and after `growth_steps` finite steps in
//      a row the scale doubles.
// Synchronous strategies call it on the all-reduced gradients, where one
// replica's overflow reaches every replica, so all replicas skip the same
// steps and keep equal scales. Keras' defaults: initial scale 2^15, growth
// every 2000 steps. The state is checkpointed with the optimizer's slots
// under Keras' variable names.
//
// Owned by its Optimizer; not thread-safe (the optimizer's callers serialise).
class DynamicLossScale {
 public:
  static constexpr float kInitialScale = 32768.0f;
  static constexpr int64_t kGrowthSteps = 2000;
  // Checkpoint keys (1-element tensors), Keras' LossScaleOptimizer variables.
  static constexpr char kScaleKey[] = "loss_scale_optimizer/dynamic_scale";
  static constexpr char kCounterKey[] = "loss_scale_optimizer/step_counter";

  explicit DynamicLossScale(int64_t growth_steps = kGrowthSteps);

  float scale() const { return scale_; }
  // Finite steps since the last change of the scale.
  int64_t step_counter() const { return step_counter_; }
  // Steps skipped since the process started (a log and metric figure).
  int64_t skipped_steps() const { return skipped_steps_; }

  // Steps 1 and 2 above on the params' grads; returns whether to apply them.
  bool Update(absl::Span<Parameter* const> params);

  // Adds the state to a slot map / takes it from one (absent keys, as in a
  // checkpoint written without loss scaling: the initial state).
  void AddState(std::map<std::string, Tensor>* slots) const;
  absl::Status RestoreState(const std::map<std::string, Tensor>& slots);
  // Whether `name` is one of the keys above.
  static bool IsStateKey(const std::string& name);

 private:
  int64_t growth_steps_;
  float scale_ = kInitialScale;
  int64_t step_counter_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_LOSS_SCALE_H_

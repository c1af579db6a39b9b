#ifndef DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_
#define DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

// Conversion between a model + optimizer and a CheckpointState, shared by the
// strategies that keep variables in the worker process. Tensor names:
//   "variables/<param name>"   model parameters
//   "optimizer/<slot name>"    optimizer slots ("optimizer/dense_0/kernel/m")
// and metadata "optimizer_iterations". A checkpoint of one strategy restores
// into another as long as the model is the same.

#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace distrain {

CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step);

// Copies the checkpoint's variables into `model` and slots into `optimizer`.
// Missing or mis-shaped variables are an error naming the variable (the job's
// model changed since the checkpoint was written).
absl::Status RestoreVariableState(const CheckpointState& state, Model& model, Optimizer& optimizer);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

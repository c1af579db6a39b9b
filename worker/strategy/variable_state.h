#ifndef DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_
#define DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

// Conversion between a model + optimizer and a CheckpointState, shared by the
// strategies that keep variables in the worker process. Tensor names:
//   "variables/<name>"         model variables: parameters and the
//                              non-trainable state (BN moving statistics)
//   "optimizer/<slot name>"    optimizer slots ("optimizer/dense_0/kernel/m")
// and metadata "optimizer_iterations". A checkpoint of one strategy restores
// into another as long as the model is the same.

#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace distrain {

// Every variable of the model: parameters() then state_variables().
std::vector<Parameter*> AllVariables(Model& model);

// Averages the models' non-trainable state element-wise in a fixed replica
// order into `into` (which may be one of `models`), so a strategy that keeps
// one copy per replica leaves every copy with the replicas' mean.
void AverageStateVariables(const std::vector<Model*>& models, Model& into);

// The model's non-trainable state flattened, and back (for collectives).
int64_t StateVariableSize(Model& model);
void PackStateVariables(Model& model, float* out);
void UnpackStateVariables(const float* in, Model& model);

CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step);

// Copies the checkpoint's variables into `model` and slots into `optimizer`.
// Missing or mis-shaped variables are an error naming the variable (the job's
// model changed since the checkpoint was written).
absl::Status RestoreVariableState(const CheckpointState& state, Model& model, Optimizer& optimizer);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

#ifndef DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_
#define DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

// Conversion between a model + optimizer and a CheckpointState, shared by the
// strategies that keep variables in the worker process. Tensor names:
//   "variables/<name>"         model variables: parameters and the
//                              non-trainable state (BN moving statistics)
//   "optimizer/<slot name>"    optimizer slots ("optimizer/dense_0/kernel/m")
// and metadata "optimizer_iterations". A checkpoint of one strategy restores
// into another as long as the model is the same, and on any device: a
// CheckpointState always holds host tensors; the model's variables may live
// on a GPU (Model::MoveTo), and every function here copies across.

#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace distrain {

// Every variable of the model: parameters() then state_variables().
std::vector<Parameter*> AllVariables(Model& model);

// Averages the models' non-trainable state element-wise in a fixed replica
// order into `into` (which may be one of `models`), so a strategy that keeps
// one copy per replica leaves every copy with the replicas' mean. The sum is
// formed on the host whatever device each model is on.
void AverageStateVariables(const std::vector<Model*>& models, Model& into);

// The model's non-trainable state flattened, and back (for collectives).
// `buffer_device` is where `out` / `in` points: the host, or a GPU (device to
// device copies, e.g. a GPU replica packing into its own device buffer).
int64_t StateVariableSize(Model& model);
void PackStateVariables(Model& model, float* out, DeviceId buffer_device = DeviceId::Cpu());
void UnpackStateVariables(const float* in, Model& model,
                          DeviceId buffer_device = DeviceId::Cpu());

// `n` floats from `src` on `from` to `dst` on `to`, the raw-pointer form of
// ops::Copy (host to host: memcpy; with a GPU on either side the CUDA
// backend's copies, which have finished when this returns to the host side).
void CopyFloats(DeviceId from, const float* src, DeviceId to, float* dst, int64_t n);

// The model's variables (copied to the host) and the optimizer's slots.
CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step);

// Copies the checkpoint's variables into `model` and slots into `optimizer`.
// Missing or mis-shaped variables are an error naming the variable (the job's
// model changed since the checkpoint was written).
absl::Status RestoreVariableState(const CheckpointState& state, Model& model, Optimizer& optimizer);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_VARIABLE_STATE_H_

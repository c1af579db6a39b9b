#include "worker/strategy/variable_state.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/tensor/ops.h"
#include "worker/tensor/ops_dispatch.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain {
namespace {
constexpr char kVariablePrefix[] = "variables/";
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kIterationsKey[] = "optimizer_iterations";

// `t` itself when it is on the host, else a host copy in `scratch`.
const Tensor& OnHost(const Tensor& t, Tensor* scratch) {
  if (t.on_host()) return t;
  ops::Copy(t, scratch);  // scratch is a host tensor
  return *scratch;
}
}  // namespace

void CopyFloats(DeviceId from, const float* src, DeviceId to, float* dst, int64_t n) {
  if (n == 0) return;
  if (!ops::OnGpu(from) && !ops::OnGpu(to)) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  DISTRAIN_CUDA_ONLY({
    if (!ops::OnGpu(from)) {
      cuda::CopyHostToDevice(to.ordinal, src, dst, n);
    } else if (!ops::OnGpu(to)) {
      cuda::CopyDeviceToHost(from.ordinal, src, dst, n);
    } else {
      cuda::CopyDeviceToDevice(from.ordinal, src, to.ordinal, dst, n);
    }
  });
}

std::vector<Parameter*> AllVariables(Model& model) {
  std::vector<Parameter*> out = model.parameters();
  for (Parameter* p : model.state_variables()) out.push_back(p);
  return out;
}

void AverageStateVariables(const std::vector<Model*>& models, Model& into) {
  if (models.empty()) return;
  std::vector<std::vector<Parameter*>> states;
  for (Model* m : models) states.push_back(m->state_variables());
  std::vector<Parameter*> out = into.state_variables();
  const float inv_n = 1.0f / static_cast<float>(models.size());
  Tensor scratch;  // a host copy of a GPU replica's variable
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t n = out[i]->value.size();
    // Sum into a scratch first: `into` may be one of `models`.
    const Tensor& first = OnHost(states[0][i]->value, &scratch);
    std::vector<float> sum(first.data(), first.data() + n);
    for (size_t r = 1; r < states.size(); ++r) {
      const float* v = OnHost(states[r][i]->value, &scratch).data();
      for (int64_t j = 0; j < n; ++j) sum[j] += v[j];
    }
    for (int64_t j = 0; j < n; ++j) sum[j] *= inv_n;
    CopyFloats(DeviceId::Cpu(), sum.data(), out[i]->value.device_id(), out[i]->value.data(), n);
  }
}

int64_t StateVariableSize(Model& model) {
  int64_t n = 0;
  for (Parameter* p : model.state_variables()) n += p->value.size();
  return n;
}

void PackStateVariables(Model& model, float* out, DeviceId buffer_device) {
  for (Parameter* p : model.state_variables()) {
    CopyFloats(p->value.device_id(), p->value.data(), buffer_device, out, p->value.size());
    out += p->value.size();
  }
}

void UnpackStateVariables(const float* in, Model& model, DeviceId buffer_device) {
  for (Parameter* p : model.state_variables()) {
    CopyFloats(buffer_device, in, p->value.device_id(), p->value.data(), p->value.size());
    in += p->value.size();
  }
}

CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step) {
  CheckpointState state;
  state.step = step;
  for (Parameter* p : AllVariables(model)) {
    Tensor host;  // checkpoints are host tensors, whatever device the model is on
    ops::Copy(p->value, &host);
    state.tensors.emplace(absl::StrCat(kVariablePrefix, p->name), std::move(host));
  }
  for (auto& [name, slot] : optimizer.SlotState()) {
    state.tensors.emplace(absl::StrCat(kOptimizerPrefix, name), slot);
  }
  state.metadata[kIterationsKey] = absl::StrCat(optimizer.iterations());
  state.metadata["model"] = model.Summary();
  return state;
}

absl::Status RestoreVariableState(const CheckpointState& state, Model& model, Optimizer& optimizer) {
  for (Parameter* p : AllVariables(model)) {
    auto it = state.tensors.find(absl::StrCat(kVariablePrefix, p->name));
    if (it == state.tensors.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", state.step, " has no variable '", p->name,
          "': it was written for a different model; use a new checkpoint directory"));
    }
    if (!it->second.SameShape(p->value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", state.step, ": variable '", p->name, "' has shape ",
          it->second.ShapeString(), " but the model needs ", p->value.ShapeString(),
          "; the model changed since the checkpoint was written — use a new checkpoint directory"));
    }
    ops::Copy(it->second, &p->value);  // to the variable's own device
  }
  std::map<std::string, Tensor> slots;
  for (const auto& [name, tensor] : state.tensors) {
    if (absl::StartsWith(name, kOptimizerPrefix)) {
      slots.emplace(name.substr(std::strlen(kOptimizerPrefix)), tensor);
    }
  }
  int64_t iterations = 0;
  if (auto it = state.metadata.find(kIterationsKey); it != state.metadata.end()) {
    if (!absl::SimpleAtoi(it->second, &iterations) || iterations < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint at step ", state.step,
                                              ": bad optimizer_iterations '", it->second, "'"));
    }
  }
  return optimizer.RestoreState(slots, iterations);
}

}  // namespace distrain

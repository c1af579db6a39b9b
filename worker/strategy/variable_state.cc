#include "worker/strategy/variable_state.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace distrain {
namespace {
constexpr char kVariablePrefix[] = "variables/";
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kIterationsKey[] = "optimizer_iterations";
}  // namespace

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
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t n = out[i]->value.size();
    // Sum into a scratch first: `into` may be one of `models`.
    std::vector<float> sum(states[0][i]->value.data(), states[0][i]->value.data() + n);
    for (size_t r = 1; r < states.size(); ++r) {
      const float* v = states[r][i]->value.data();
      for (int64_t j = 0; j < n; ++j) sum[j] += v[j];
    }
    for (int64_t j = 0; j < n; ++j) out[i]->value[j] = sum[j] * inv_n;
  }
}

int64_t StateVariableSize(Model& model) {
  int64_t n = 0;
  for (Parameter* p : model.state_variables()) n += p->value.size();
  return n;
}

void PackStateVariables(Model& model, float* out) {
  for (Parameter* p : model.state_variables()) {
    std::memcpy(out, p->value.data(), p->value.bytes());
    out += p->value.size();
  }
}

void UnpackStateVariables(const float* in, Model& model) {
  for (Parameter* p : model.state_variables()) {
    std::memcpy(p->value.data(), in, p->value.bytes());
    in += p->value.size();
  }
}

CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step) {
  CheckpointState state;
  state.step = step;
  for (Parameter* p : AllVariables(model)) {
    state.tensors.emplace(absl::StrCat(kVariablePrefix, p->name), p->value);
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
    std::memcpy(p->value.data(), it->second.data(), p->value.bytes());
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

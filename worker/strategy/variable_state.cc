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

CheckpointState CaptureVariableState(Model& model, const Optimizer& optimizer, int64_t step) {
  CheckpointState state;
  state.step = step;
  for (Parameter* p : model.parameters()) {
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
  for (Parameter* p : model.parameters()) {
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

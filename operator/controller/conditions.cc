#include "operator/controller/conditions.h"

namespace distrain::controller {

bool SetCondition(api::JobStatus* status, const std::string& type, bool value,
                  const std::string& reason, const std::string& message, int64_t generation,
                  absl::Time now, bool record_false) {
  const std::string want = value ? "True" : "False";
  for (api::Condition& c : status->conditions) {
    if (c.type != type) continue;
    const bool transition = c.status != want;
    if (transition) {
      c.status = want;
      c.last_transition_time = now;
    }
    c.reason = reason;
    c.message = message;
    c.observed_generation = generation;
    return transition;
  }
  if (!value && !record_false) return false;
  status->conditions.push_back(api::Condition{type, want, reason, message, generation, now});
  return true;
}

std::string StateOf(const api::JobStatus& status) {
  for (const char* type : {api::kConditionFailed, api::kConditionSucceeded,
                           api::kConditionSuspended, api::kConditionRestarting,
                           api::kConditionQueued, api::kConditionRunning,
                           api::kConditionCreated}) {
    if (status.IsTrue(type)) return type;
  }
  return "";
}

}  // namespace distrain::controller

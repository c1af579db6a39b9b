#include "operator/controller/cleanup.h"

namespace distrain::controller {

std::vector<const ObservedPod*> PodsToCleanUp(CleanPodPolicy policy, bool stop_active,
                                              const std::vector<ObservedPod>& pods) {
  std::vector<const ObservedPod*> out;
  for (const ObservedPod& p : pods) {
    if (p.terminating) continue;
    const bool remove = policy == CleanPodPolicy::kAll ||
                        ((policy == CleanPodPolicy::kRunning || stop_active) && p.active());
    if (remove) out.push_back(&p);
  }
  return out;
}

TtlDecision DecideTtl(const RunPolicy& policy, std::optional<absl::Time> completion_time,
                      absl::Time now) {
  TtlDecision d;
  if (!policy.ttl_seconds_after_finished || !completion_time) return d;
  const absl::Time expiry = *completion_time + absl::Seconds(*policy.ttl_seconds_after_finished);
  if (now >= expiry) {
    d.delete_now = true;
  } else {
    d.requeue_after = expiry - now;
  }
  return d;
}

}  // namespace distrain::controller

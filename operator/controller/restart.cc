#include "operator/controller/restart.h"

#include <algorithm>

#include "common/exit_codes.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

bool RestartsAfterFailure(RestartPolicy policy, const ObservedPod& pod) {
  // No exit code: the pod ended without its container exiting (evicted, node
  // lost), which says nothing about the job: retry (ExitCode included). A
  // Failed pod whose main container exited 0 failed for another container's
  // sake; the same holds.
  if (!pod.exit_code || *pod.exit_code == 0) return policy != RestartPolicy::kNever;
  return ShouldRestart(policy, *pod.exit_code);
}

bool RestartsAfterSuccess(RestartPolicy policy, ReplicaType type) {
  return policy == RestartPolicy::kAlways &&
         (type == ReplicaType::kPS || type == ReplicaType::kEvaluator);
}

std::vector<ReplicaType> RestartGroup(const JobConfig& config, const ObservedPod& pod) {
  const ReplicaType type = pod.id.type;
  if (type == ReplicaType::kEvaluator) return {};
  if (config.strategy == StrategyKind::kParameterServer) {
    if (type == ReplicaType::kWorker) return {};
    return {ReplicaType::kChief, ReplicaType::kWorker, ReplicaType::kPS};
  }
  if (config.strategy == StrategyKind::kMultiWorkerMirrored &&
      config.run_policy.recovery_policy == RecoveryPolicy::kInPlace &&
      type == ReplicaType::kWorker && !IsMaster(config, pod.id) &&
      (pod.exit_code != kExitTerminated || config.elastic_policy.has_value())) {
    // Its survivors wait for it and take it back in place. (Elastic: a
    // stopped worker departed alone and the others trained on without it.)
    return {};
  }
  // Synchronous strategies (Auto is resolved before it gets here). A PS pod
  // cannot exist outside ParameterServer (the spec is validated); were it to,
  // it would restart with the rest.
  return {ReplicaType::kChief, ReplicaType::kWorker, ReplicaType::kPS};
}

RestartDecision DecideRestarts(const JobConfig& config, const std::vector<ObservedPod>& pods) {
  RestartDecision d;
  std::vector<const ObservedPod*> restartable;
  for (const ObservedPod& pod : pods) {
    if (pod.terminating || pod.id.index >= config.replicas_of(pod.id.type)) continue;
    const RestartPolicy policy = config.replicas.at(pod.id.type).restart_policy;
    if (pod.failed()) {
      if (RestartsAfterFailure(policy, pod)) {
        restartable.push_back(&pod);
      } else if (pod.id.type == ReplicaType::kEvaluator) {
        d.evaluator_lost.push_back(&pod);
      } else {
        d.fatal.push_back(&pod);
      }
    } else if (pod.succeeded() && RestartsAfterSuccess(policy, pod.id.type)) {
      restartable.push_back(&pod);
    }
  }
  for (const ObservedPod* pod : restartable) {
    // A pod that exited 0 under Always restarts alone; it broke nothing.
    const std::vector<ReplicaType> group =
        pod->failed() ? RestartGroup(config, *pod) : std::vector<ReplicaType>{};
    if (group.empty()) continue;
    d.group_causes.push_back(pod);
    for (ReplicaType t : group) {
      if (std::find(d.group_types.begin(), d.group_types.end(), t) == d.group_types.end()) {
        d.group_types.push_back(t);
      }
    }
  }
  for (const ObservedPod* pod : restartable) {
    const bool in_group = std::find(d.group_types.begin(), d.group_types.end(), pod->id.type) !=
                          d.group_types.end();
    if (!in_group) d.individual.push_back(pod);
  }
  std::sort(d.group_types.begin(), d.group_types.end());
  return d;
}

}  // namespace distrain::controller

#include "operator/controller/elastic.h"

namespace distrain::controller {

bool ResizesInPlace(const JobConfig& config, const std::vector<ObservedPod>& pods) {
  if (config.strategy != StrategyKind::kMultiWorkerMirrored || !config.elastic_policy ||
      config.run_policy.recovery_policy != RecoveryPolicy::kInPlace) {
    return false;
  }
  for (const ObservedPod& p : pods) {
    const bool training = p.id.type == ReplicaType::kChief || p.id.type == ReplicaType::kWorker;
    if (training && !p.terminating && !p.reports_progress) return false;
  }
  return true;
}

ScaleDecision DecideScale(const Topology& topology, const std::vector<ObservedPod>& pods) {
  ScaleDecision d;
  bool stale = false;
  for (const ObservedPod& p : pods) {
    if (p.terminating) continue;
    if (p.id.index >= topology.config.replicas_of(p.id.type)) {
      d.excess.push_back(&p);
      continue;
    }
    const bool training = p.id.type == ReplicaType::kChief || p.id.type == ReplicaType::kWorker;
    // Pods made before the hash existed carry none: they are trusted.
    if (training && !p.cluster_hash.empty() && p.cluster_hash != topology.cluster_hash) {
      stale = true;
    }
  }
  if (stale && topology.config.strategy != StrategyKind::kParameterServer &&
      !ResizesInPlace(topology.config, pods)) {
    for (const ObservedPod& p : pods) {
      const bool training = p.id.type == ReplicaType::kChief || p.id.type == ReplicaType::kWorker;
      if (!p.terminating && training && p.id.index < topology.config.replicas_of(p.id.type)) {
        d.regenerate.push_back(&p);
      }
    }
  }
  return d;
}

}  // namespace distrain::controller

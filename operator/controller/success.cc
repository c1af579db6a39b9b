#include "operator/controller/success.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace distrain::controller {

std::optional<std::string> SucceededBecause(const JobConfig& config,
                                            const std::vector<ObservedPod>& pods) {
  const int workers = config.replicas_of(ReplicaType::kWorker);
  if (config.success_policy == SuccessPolicy::kAllWorkers) {
    std::set<int> done;
    for (const ObservedPod& p : pods) {
      if (p.id.type == ReplicaType::kWorker && p.id.index < workers && p.succeeded()) {
        done.insert(p.id.index);
      }
    }
    if (workers > 0 && static_cast<int>(done.size()) == workers) {
      return absl::StrCat("all ", workers, workers == 1 ? " Worker" : " Workers",
                          " succeeded (successPolicy AllWorkers)");
    }
    return std::nullopt;
  }
  const ReplicaId decider = config.replicas_of(ReplicaType::kChief) > 0
                                ? ReplicaId{ReplicaType::kChief, 0}
                                : ReplicaId{ReplicaType::kWorker, 0};
  for (const ObservedPod& p : pods) {
    if (p.id == decider && p.succeeded()) return absl::StrCat("pod ", p.name, " succeeded");
  }
  return std::nullopt;
}

}  // namespace distrain::controller

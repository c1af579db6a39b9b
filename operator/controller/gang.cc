#include "operator/controller/gang.h"

namespace distrain::controller {

int GangSize(const JobConfig& config) {
  if (config.run_policy.scheduling.min_available) return *config.run_policy.scheduling.min_available;
  return static_cast<int>(DesiredReplicas(config).size());
}

nlohmann::json BuildPodGroup(const api::DistributedTrainingJob& job, const Topology& topology) {
  return {{"apiVersion", kPodGroupApiVersion},
          {"kind", "PodGroup"},
          {"metadata",
           {{"name", job.metadata.name},
            {"namespace", job.metadata.namespace_},
            {"labels", {{api::kLabelJobName, job.metadata.name},
                        {api::kLabelManagedBy, api::kManagedBy}}},
            {"ownerReferences", nlohmann::json::array({ControllerReference(job)})}}},
          {"spec", {{"minMember", GangSize(topology.config)}}}};
}

}  // namespace distrain::controller

#include "common/auto_strategy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace distrain {

StrategyChoice ChooseAutoStrategy(const JobConfig& config, const DeviceFacts& facts) {
  const int ps = config.replicas_of(ReplicaType::kPS);
  const int training = config.replicas_of(ReplicaType::kChief) + config.replicas_of(ReplicaType::kWorker);
  // 1.
  if (ps > 0) {
    return {StrategyKind::kParameterServer,
            absl::StrCat("the job has ", ps, " PS replica", ps == 1 ? "" : "s",
                         ": variables sharded on them, workers asynchronous")};
  }
  // 2.
  if (training > 1) {
    return {StrategyKind::kMultiWorkerMirrored,
            absl::StrCat(training, " training tasks (Chief + Workers), one per machine: "
                                   "synchronous all-reduce across them")};
  }
  // 3, 4.
  if (facts.gpus > 1 && facts.host_device_gbps && facts.device_device_gbps) {
    const double cpu_gpu = *facts.host_device_gbps, gpu_gpu = *facts.device_device_gbps;
    if (cpu_gpu > gpu_gpu) {
      return {StrategyKind::kCentralStorage,
              absl::StrFormat("%d GPUs; CPU<->GPU %.1f GB/s is faster than GPU<->GPU %.1f GB/s: "
                              "variables on the CPU",
                              facts.gpus, cpu_gpu, gpu_gpu)};
    }
    return {StrategyKind::kMirrored,
            absl::StrFormat("%d GPUs; GPU<->GPU %.1f GB/s is at least CPU<->GPU %.1f GB/s: a "
                            "replica per GPU",
                            facts.gpus, gpu_gpu, cpu_gpu)};
  }
  if (facts.gpus > 0) {
    return {StrategyKind::kMirrored,
            absl::StrCat(facts.gpus, " GPU", facts.gpus == 1 ? "" : "s",
                         facts.gpus > 1 ? " (bandwidths not measured)" : "",
                         ": a replica per GPU")};
  }
  // 5, 6.
  if (config.training.local_replicas > 1) {
    return {StrategyKind::kMirrored,
            absl::StrCat("one training task and no GPU: ", config.training.local_replicas,
                         " replicas on CPU threads (spec.training.localReplicas)")};
  }
  return {StrategyKind::kOneDevice, "one training task, one replica and no GPU"};
}

absl::StatusOr<std::pair<JobConfig, std::string>> ResolveAutoStrategy(const JobConfig& config,
                                                                     const DeviceFacts& facts) {
  if (config.strategy != StrategyKind::kAuto) return std::make_pair(config, std::string());
  const StrategyChoice choice = ChooseAutoStrategy(config, facts);
  JobConfig resolved = config;
  resolved.strategy = choice.strategy;
  if (absl::Status valid = ValidateJobConfig(resolved); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.strategy: Auto chose ", StrategyName(choice.strategy), " (",
                     choice.reason, "), and the spec breaks its rules: ", valid.message()));
  }
  return std::make_pair(std::move(resolved),
                        absl::StrCat("spec.strategy Auto chose ", StrategyName(choice.strategy),
                                     ": ", choice.reason));
}

}  // namespace distrain

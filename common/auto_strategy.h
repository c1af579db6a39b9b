#ifndef DISTRAIN_COMMON_AUTO_STRATEGY_H_
#define DISTRAIN_COMMON_AUTO_STRATEGY_H_

// spec.strategy: Auto — which tf.distribute strategy a job runs, from what it
// asks for (its replicas) and what the process finds on its host (devices and,
// where measured, bandwidths). One rule table, used by the operator (to plan
// pods), `distrain run` (to plan processes) and distrain-worker (to train), so
// all three always agree on the same facts. The rows, first match wins:
//   1. PS replicas                      -> ParameterServer
//   2. more than one Chief + Worker     -> MultiWorkerMirrored (one per machine)
//   3. several GPUs, both bandwidths measured:
//        CPU<->GPU faster than GPU<->GPU -> CentralStorage (variables on the CPU)
//        else                            -> Mirrored (NCCL between the GPUs)
//   4. GPUs, bandwidth not measured     -> Mirrored
//   5. no GPU, localReplicas > 1        -> Mirrored over CPU threads
//   6. otherwise                        -> OneDevice
// The choice comes with its reason in words, for the log and the job's status.
// Pure functions; thread-safe.

#include <optional>
#include <string>

#include "common/job_config.h"

namespace distrain {

// What the deciding process knows about the host. Only GPUs it can train on
// count (a build without a GPU backend sees none).
struct DeviceFacts {
  int gpus = 0;
  std::optional<double> host_device_gbps;    // pinned host <-> device copies
  std::optional<double> device_device_gbps;  // device <-> device (peer, or staged)
};

struct StrategyChoice {
  StrategyKind strategy = StrategyKind::kOneDevice;
  std::string reason;  // "one training task and no GPU: OneDevice"
};

StrategyChoice ChooseAutoStrategy(const JobConfig& config, const DeviceFacts& facts);

// `config` with Auto replaced by its choice (logged by the caller); any other
// strategy is returned as it is, with an empty reason. INVALID_ARGUMENT when
// the chosen strategy's rules reject the spec, naming what Auto chose.
absl::StatusOr<std::pair<JobConfig, std::string>> ResolveAutoStrategy(const JobConfig& config,
                                                                     const DeviceFacts& facts);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_AUTO_STRATEGY_H_

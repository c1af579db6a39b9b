#ifndef DISTRAIN_COMMON_DEVICE_USE_H_
#define DISTRAIN_COMMON_DEVICE_USE_H_

// Whether a process may start training with the devices it has: never on CPU
// threads while it holds GPUs, never with GPUs it holds left idle, and never
// with a GPU-only choice where there is no GPU (docs/architecture.md §6a,
// "Devices"). One rule for distrain-worker (in a pod, from what the operator
// says the pod holds) and `distrain run` (on the local host, before any
// process starts), so the two refuse the same jobs with the same words. Pure
// functions; thread-safe.

#include "absl/status/status.h"
#include "common/job_config.h"

namespace distrain {

// Set by the operator in every pod's main container: the nvidia.com/gpu the
// container holds (its resources, after the operator's NCCL default).
inline constexpr char kPodGpusEnv[] = "DISTRAIN_POD_GPUS";

struct DeviceUseFacts {
  bool cuda_build = false;  // this binary has the CUDA backend
  int visible_gpus = 0;     // GPUs the process can open (0 in a CPU-only build)
  int held_gpus = 0;        // GPUs the pod reserved (DISTRAIN_POD_GPUS; 0 outside a pod)
  // Whether this build's single-process strategies (StrategyTrainsOnGpus)
  // place their replicas on the visible GPUs. Only a CUDA build sets it.
  bool gpu_strategies = false;
};

// The strategies that place replicas on GPUs when the process sees some (and
// the build has gpu_strategies): OneDevice (GPU 0), Mirrored (one replica per
// GPU, NCCL between them), CentralStorage (one replica per GPU, variables on
// the host) and MultiWorkerMirrored (one replica per GPU of each worker; NCCL
// across workers with implementation: NCCL, else the TCP ring through host
// memory). ParameterServer trains on CPU threads.
bool StrategyTrainsOnGpus(StrategyKind strategy);

// OK, or UNIMPLEMENTED / FAILED_PRECONDITION naming the field to change:
//   * communication.implementation: NCCL without a CUDA build, without a
//     visible GPU, or with a strategy that does not train on GPUs;
//   * a pod that holds GPUs the job's strategy would not use: a strategy
//     that trains on CPU threads, a process that sees none of them, or fewer
//     replicas than GPUs (OneDevice with several; an explicit
//     spec.training.localReplicas below the count).
// Both exit with kExitUnsupported (common/exit_codes.h): permanent, so the
// operator fails the job instead of restarting a pod that would hold the
// GPUs again. (More replicas than visible GPUs is the strategy's own error:
// worker/strategy/local_replicas.h, ResolveLocalReplicas.)
absl::Status CheckDeviceUse(const JobConfig& config, const DeviceUseFacts& facts);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_DEVICE_USE_H_

#include "common/device_use.h"

#include "absl/strings/str_cat.h"

namespace distrain {

absl::Status CheckDeviceUse(const JobConfig& config, const DeviceUseFacts& facts) {
  if (config.training.communication.implementation == CollectiveImplementation::kNccl) {
    if (!facts.cuda_build) {
      return absl::UnimplementedError(
          "spec.training.communication.implementation: NCCL needs GPUs and a CUDA build of "
          "distrain, but this is a CPU-only build; use implementation: Ring (or Auto) to train "
          "on CPUs, or run an image built with DISTRAIN_CUDA=ON on GPU nodes");
    }
    if (facts.visible_gpus == 0) {
      return absl::FailedPreconditionError(
          "spec.training.communication.implementation: NCCL needs GPUs, and this process sees "
          "none (no driver, or CUDA_VISIBLE_DEVICES hides them); use implementation: Ring (or "
          "Auto) to train on CPUs, or request nvidia.com/gpu in the Worker template");
    }
    if (!facts.gpu_strategies) {
      return absl::UnimplementedError(absl::StrCat(
          "spec.training.communication.implementation: NCCL: this build of distrain trains ",
          StrategyName(config.strategy),
          " on CPU threads only (its GPU strategies are not built yet), so NCCL has no GPU "
          "replicas to connect; use implementation: Ring (or Auto)"));
    }
  }
  if (facts.held_gpus > 0 && !facts.gpu_strategies) {
    return absl::UnimplementedError(absl::StrCat(
        "spec.replicaSpecs: this pod holds ", facts.held_gpus,
        " GPU(s) (nvidia.com/gpu in its template's resources), but this build of distrain "
        "trains ", StrategyName(config.strategy),
        " on CPU threads only and would keep them idle; remove the nvidia.com/gpu request (and "
        "communication.implementation: NCCL, which asks for GPUs) to train on CPUs"));
  }
  return absl::OkStatus();
}

}  // namespace distrain

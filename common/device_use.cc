#include "common/device_use.h"

#include "absl/strings/str_cat.h"

namespace distrain {

bool StrategyTrainsOnGpus(StrategyKind strategy) {
  return strategy == StrategyKind::kOneDevice || strategy == StrategyKind::kMirrored ||
         strategy == StrategyKind::kCentralStorage ||
         strategy == StrategyKind::kMultiWorkerMirrored;
}

absl::Status CheckDeviceUse(const JobConfig& config, const DeviceUseFacts& facts) {
  // gpu_strategies means nothing without the backend that runs them.
  const bool gpu_build = facts.cuda_build && facts.gpu_strategies;
  const bool on_gpus = gpu_build && StrategyTrainsOnGpus(config.strategy);
  const std::string strategy = StrategyName(config.strategy);
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
    if (!gpu_build) {
      return absl::UnimplementedError(absl::StrCat(
          "spec.training.communication.implementation: NCCL: this build of distrain trains ",
          strategy,
          " on CPU threads only (its GPU strategies are not built yet), so NCCL has no GPU "
          "replicas to connect; use implementation: Ring (or Auto)"));
    }
    if (!on_gpus) {
      return absl::UnimplementedError(absl::StrCat(
          "spec.training.communication.implementation: NCCL: distrain trains ", strategy,
          " on CPU threads only (ParameterServer is not on GPUs yet; OneDevice, Mirrored, "
          "CentralStorage and MultiWorkerMirrored are), so NCCL has no GPU replicas to connect; "
          "use implementation: Ring (or Auto), or strategy: Mirrored for the GPUs of one "
          "machine"));
    }
  }
  if (facts.held_gpus == 0) return absl::OkStatus();
  const std::string holds =
      absl::StrCat("spec.replicaSpecs: this pod holds ", facts.held_gpus,
                   " GPU(s) (nvidia.com/gpu in its template's resources), but ");
  if (!gpu_build) {
    return absl::UnimplementedError(absl::StrCat(
        holds, "this build of distrain trains ", strategy,
        " on CPU threads only and would keep them idle; remove the nvidia.com/gpu request (and "
        "communication.implementation: NCCL, which asks for GPUs) to train on CPUs"));
  }
  if (!on_gpus) {
    return absl::UnimplementedError(absl::StrCat(
        holds, "distrain trains ", strategy,
        " on CPU threads only (ParameterServer is not on GPUs yet; OneDevice, Mirrored, "
        "CentralStorage and MultiWorkerMirrored are) and would keep them idle; remove the "
        "nvidia.com/gpu request (and communication.implementation: NCCL, which asks for GPUs) "
        "to train on CPUs, or use strategy: Mirrored for the GPUs of one machine"));
  }
  if (facts.visible_gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        holds, "this process sees none of them (no driver in the image, or "
        "CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES hides them) and would train ", strategy,
        " on CPU threads; run an image with the NVIDIA container runtime's driver libraries, or "
        "remove the nvidia.com/gpu request to train on CPUs"));
  }
  if (config.strategy == StrategyKind::kOneDevice && facts.held_gpus > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        holds, "OneDevice trains on one GPU and would keep ", facts.held_gpus - 1,
        " idle; request nvidia.com/gpu: 1, or use strategy: Mirrored (one replica per GPU)"));
  }
  const int replicas = config.training.local_replicas;
  if (config.strategy != StrategyKind::kOneDevice && replicas > 0 &&
      replicas < facts.held_gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.training.localReplicas: ", replicas, " replica(s), but this pod holds ",
        facts.held_gpus, " GPU(s) (nvidia.com/gpu in its template's resources) and ", strategy,
        " puts one replica on each GPU, so ", facts.held_gpus - replicas,
        " would stay idle; set localReplicas: 0 (one per GPU) or request nvidia.com/gpu: ",
        replicas));
  }
  return absl::OkStatus();
}

}  // namespace distrain

// CreateStrategy / CheckStrategySupported (declared in strategy.h): the one
// place that maps spec.strategy to an implementation.
#include "absl/strings/str_cat.h"
#include "common/device_use.h"
#include "worker/strategy/central_storage.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/multi_worker_mirrored.h"
#include "worker/strategy/one_device.h"
#include "worker/strategy/parameter_server.h"
#include "worker/strategy/strategy.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_probe.h"
#endif

namespace distrain {

DeviceUseFacts ThisProcessDeviceFacts() {
  DeviceUseFacts facts;
#ifdef DISTRAIN_HAVE_CUDA
  facts.cuda_build = true;
  facts.visible_gpus = cuda::Probe().device_count;
  facts.gpu_strategies = true;  // OneDevice, Mirrored, CentralStorage (device_use.h)
#endif
  return facts;
}

absl::Status CheckStrategySupported(const JobConfig& config) {
  // NCCL and GPUs, for every strategy (held GPUs are the worker's to add).
  if (config.strategy != StrategyKind::kTPU && config.strategy != StrategyKind::kAuto) {
    if (absl::Status s = CheckDeviceUse(config, ThisProcessDeviceFacts()); !s.ok()) return s;
  }
  switch (config.strategy) {
    case StrategyKind::kOneDevice:
    case StrategyKind::kMirrored:
    case StrategyKind::kCentralStorage:
    case StrategyKind::kMultiWorkerMirrored:
      return absl::OkStatus();
    case StrategyKind::kParameterServer:
      return absl::OkStatus();
    case StrategyKind::kTPU:
      return absl::FailedPreconditionError(
          "spec.strategy: TPU jobs run your own TensorFlow image (set "
          "spec.replicaSpecs.Worker.template with a TPU-enabled image); the distrain worker "
          "implements CPU/GPU strategies only");
    case StrategyKind::kAuto:
      // distrain-worker and `distrain run` resolve it first (common/auto_strategy.h).
      return absl::InvalidArgumentError(
          "spec.strategy: Auto must be resolved before a strategy is created "
          "(ResolveAutoStrategy); choose a strategy explicitly");
    default:
      return absl::UnimplementedError(absl::StrCat(
          "spec.strategy: ", StrategyName(config.strategy),
          " is not available in this build of distrain yet; OneDevice, Mirrored and "
          "MultiWorkerMirrored are. Use Mirrored for several replicas in one process, or "
          "MultiWorkerMirrored for synchronous training across processes"));
  }
}

absl::StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const JobConfig& config) {
  if (absl::Status s = CheckStrategySupported(config); !s.ok()) return s;
  switch (config.strategy) {
    case StrategyKind::kMirrored:
      return std::make_unique<MirroredStrategy>();
    case StrategyKind::kMultiWorkerMirrored:
      return std::make_unique<MultiWorkerMirroredStrategy>();
    case StrategyKind::kParameterServer:
      return std::make_unique<ParameterServerStrategy>();
    case StrategyKind::kCentralStorage:
      return std::make_unique<CentralStorageStrategy>();
    default:
      return std::make_unique<OneDeviceStrategy>();
  }
}

}  // namespace distrain

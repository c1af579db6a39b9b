// CreateStrategy / CheckStrategySupported (declared in strategy.h): the one
// place that maps spec.strategy to an implementation.
#include "absl/strings/str_cat.h"
#include "worker/strategy/one_device.h"
#include "worker/strategy/strategy.h"

namespace distrain {

absl::Status CheckStrategySupported(const JobConfig& config) {
  switch (config.strategy) {
    case StrategyKind::kOneDevice:
      return absl::OkStatus();
    case StrategyKind::kTPU:
      return absl::FailedPreconditionError(
          "spec.strategy: TPU jobs run your own TensorFlow image (set "
          "spec.replicaSpecs.Worker.template with a TPU-enabled image); the distrain worker "
          "implements CPU/GPU strategies only");
    case StrategyKind::kAuto:
      return absl::UnimplementedError(
          "spec.strategy: Auto selection is not available in this build of distrain yet; "
          "choose OneDevice");
    default:
      return absl::UnimplementedError(absl::StrCat(
          "spec.strategy: ", StrategyName(config.strategy),
          " is not available in this build of distrain yet; OneDevice is. "
          "Use strategy: OneDevice with one Worker to train in one process"));
  }
}

absl::StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const JobConfig& config) {
  if (absl::Status s = CheckStrategySupported(config); !s.ok()) return s;
  return std::make_unique<OneDeviceStrategy>();
}

}  // namespace distrain

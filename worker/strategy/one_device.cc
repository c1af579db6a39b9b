#include "worker/strategy/one_device.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "worker/strategy/variable_state.h"

namespace distrain {

absl::Status OneDeviceStrategy::Init(const ClusterSpec& cluster, const JobConfig& config) {
  if (cluster.num_training_tasks() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OneDevice trains in a single process but TF_CONFIG lists ", cluster.num_training_tasks(),
        " chief/worker tasks; use MultiWorkerMirrored for several workers"));
  }
  if (gpus_ > 0) spdlog::info("OneDevice: the model on {}", device().ToString());
  return absl::OkStatus();
}

absl::Status OneDeviceStrategy::CreateVariables(const ModelFactory& factory,
                                                const OptimizerConfig& optimizer) {
  auto model = factory();
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  model_->MoveTo(device());  // the optimizer's slots follow on first use
  auto opt = Optimizer::Create(optimizer, model_->precision());
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> OneDeviceStrategy::Run(const StepFn& step_fn, int64_t examples) {
  ReplicaContext ctx;
  ctx.model = model_.get();
  model_->set_loss_scale(optimizer_->loss_scale());
  LossResult result = step_fn(ctx);
  optimizer_->Apply(model_->parameters());
  return StepOutput{result.loss, result.correct, examples, /*job_accuracy=*/std::nullopt,
                    /*stop_requested=*/false};
}

absl::StatusOr<CheckpointState> OneDeviceStrategy::SaveState(int64_t step) {
  return CaptureVariableState(*model_, *optimizer_, step);
}

absl::Status OneDeviceStrategy::RestoreState(const CheckpointState& state) {
  return RestoreVariableState(state, *model_, *optimizer_);
}

}  // namespace distrain

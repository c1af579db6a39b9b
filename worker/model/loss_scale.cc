#include "worker/model/loss_scale.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "spdlog/spdlog.h"
#include "worker/tensor/ops.h"

namespace distrain {

DynamicLossScale::DynamicLossScale(int64_t growth_steps) : growth_steps_(growth_steps) {
  DISTRAIN_CHECK(growth_steps >= 1) << "growth_steps " << growth_steps;
}

bool DynamicLossScale::Update(absl::Span<Parameter* const> params) {
  std::vector<const Tensor*> grads;
  grads.reserve(params.size());
  for (const Parameter* p : params) grads.push_back(&p->grad);
  // 1. An overflow anywhere skips the step.
  if (!ops::AllFinite(grads)) {
    step_counter_ = 0;
    scale_ /= 2.0f;
    ++skipped_steps_;
    spdlog::debug("mixed_float16: non-finite gradients at loss scale {}; step skipped, loss "
                 "scale now {}",
                 scale_ * 2.0f, scale_);
    return false;
  }
  // 2. Unscale (exact: the scale is a power of two) and maybe grow.
  const float inverse = 1.0f / scale_;
  for (Parameter* p : params) ops::Scale(inverse, &p->grad);
  if (step_counter_ == growth_steps_ - 1) {
    step_counter_ = 0;
    // Past float32's range every gradient would overflow; Keras grows
    // without bound, but a scale of inf would only skip every later step.
    if (std::isfinite(scale_ * 2.0f)) scale_ *= 2.0f;
  } else {
    ++step_counter_;
  }
  return true;
}

void DynamicLossScale::AddState(std::map<std::string, Tensor>* slots) const {
  (*slots)[kScaleKey] = Tensor({1}, std::vector<float>{scale_});
  // A float holds every counter value below 2^24; the counter stays below
  // growth_steps.
  (*slots)[kCounterKey] = Tensor({1}, std::vector<float>{static_cast<float>(step_counter_)});
}

absl::Status DynamicLossScale::RestoreState(const std::map<std::string, Tensor>& slots) {
  const auto scale = slots.find(kScaleKey);
  const auto counter = slots.find(kCounterKey);
  if (scale == slots.end() && counter == slots.end()) {
    scale_ = kInitialScale;
    step_counter_ = 0;
    return absl::OkStatus();
  }
  if (scale == slots.end() || counter == slots.end() || scale->second.size() != 1 ||
      counter->second.size() != 1 || !scale->second.on_host() || !counter->second.on_host()) {
    return absl::DataLossError(absl::StrCat("optimizer state: the loss scale needs both ",
                                            kScaleKey, " and ", kCounterKey,
                                            " as one value each; the checkpoint is damaged"));
  }
  const float s = scale->second[0];
  const float c = counter->second[0];
  if (!(s > 0.0f) || !std::isfinite(s) || !(c >= 0.0f) || c != std::floor(c) ||
      c >= static_cast<float>(growth_steps_)) {
    return absl::DataLossError(absl::StrCat("optimizer state: loss scale ", s, " and step counter ",
                                            c, " are not a valid state; the checkpoint is damaged"));
  }
  scale_ = s;
  step_counter_ = static_cast<int64_t>(c);
  return absl::OkStatus();
}

bool DynamicLossScale::IsStateKey(const std::string& name) {
  return name == kScaleKey || name == kCounterKey;
}

}  // namespace distrain

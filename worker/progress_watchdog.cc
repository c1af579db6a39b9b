#include "worker/progress_watchdog.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/progress_deadline.h"

namespace distrain {

ProgressWatchdog::ProgressWatchdog(std::optional<int64_t> explicit_deadline_seconds,
                                   std::function<absl::Time()> now)
    : explicit_seconds_(explicit_deadline_seconds), now_(std::move(now)) {
  since_ = now_();
}

void ProgressWatchdog::StepCompleted(int64_t step, double seconds) {
  absl::MutexLock lock(&mu_);
  since_ = now_();
  last_step_end_ = since_;
  last_step_ = step;
  long_step_.clear();
  // The first step of the process carries the warm-up (rule step 2).
  if (steps_seen_++ > 0 && seconds >= 0) {
    if (window_.size() < kWindow) {
      window_.push_back(seconds);
    } else {
      window_[next_] = seconds;
      next_ = (next_ + 1) % kWindow;
    }
    std::vector<double> sorted = window_;
    auto mid = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
    std::nth_element(sorted.begin(), mid, sorted.end());
    median_ = *mid;
  }
  started_ = true;
  UpdateGaugeLocked();
}

void ProgressWatchdog::BeginLongPhase(const std::string& what) {
  absl::MutexLock lock(&mu_);
  long_phase_ = what;
  since_ = now_();
  UpdateGaugeLocked();
}

void ProgressWatchdog::EndLongPhase() {
  absl::MutexLock lock(&mu_);
  long_phase_.clear();
  since_ = now_();
  UpdateGaugeLocked();
}

void ProgressWatchdog::ExpectLongStep(const std::string& why) {
  absl::MutexLock lock(&mu_);
  long_step_ = why;
  since_ = now_();
  UpdateGaugeLocked();
}

void ProgressWatchdog::Done() {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

absl::Duration ProgressWatchdog::deadline() const {
  absl::MutexLock lock(&mu_);
  return DeadlineLocked();
}

absl::Duration ProgressWatchdog::AllowanceFromLastStep() const {
  absl::MutexLock lock(&mu_);
  return AllowanceLocked();
}

absl::Duration ProgressWatchdog::AllowanceLocked() const {
  const absl::Duration d = DeadlineLocked();
  if (!started_) return LongPhaseAllowance(d);  // from start-up's beginning
  // since_ is the step's end, or the start of what followed it: a long phase
  // (or expected long step) in progress, or the end of one.
  const bool long_allowance = !long_phase_.empty() || !long_step_.empty();
  return (since_ - last_step_end_) + (long_allowance ? LongPhaseAllowance(d) : d);
}

void ProgressWatchdog::AttachGauge(prometheus::Gauge* gauge) {
  absl::MutexLock lock(&mu_);
  gauge_ = gauge;
  UpdateGaugeLocked();
}

void ProgressWatchdog::UpdateGaugeLocked() {
  if (gauge_ != nullptr) gauge_->Set(std::ceil(absl::ToDoubleSeconds(AllowanceLocked())));
}

absl::Duration ProgressWatchdog::DeadlineLocked() const {
  return ProgressDeadline(explicit_seconds_, median_);
}

std::string ProgressWatchdog::DeadlineSourceLocked() const {
  if (explicit_seconds_) return "spec.runPolicy.progressDeadlineSeconds";
  if (!median_) {
    return "the default before any step is timed (spec.runPolicy.progressDeadlineSeconds is unset)";
  }
  return absl::StrFormat("max(60 s, %d x the median step time %.3g s), as "
                         "spec.runPolicy.progressDeadlineSeconds is unset",
                         kProgressDeadlineStepMultiple, *median_);
}

absl::Status ProgressWatchdog::Check() const {
  absl::MutexLock lock(&mu_);
  if (done_) return absl::OkStatus();
  const absl::Duration d = DeadlineLocked();
  const absl::Duration elapsed = now_() - since_;
  // Rule steps 1-3: which allowance applies, and what has not happened.
  const bool long_allowance = !started_ || !long_phase_.empty() || !long_step_.empty();
  const absl::Duration allowance = long_allowance ? LongPhaseAllowance(d) : d;
  if (elapsed < allowance) return absl::OkStatus();
  std::string what;
  if (!started_) {
    what = absl::StrCat("start-up has lasted ", FormatDeadlineSeconds(elapsed), " without a completed step");
  } else if (!long_phase_.empty()) {
    what = absl::StrCat(long_phase_, " after step ", last_step_, " has lasted ", FormatDeadlineSeconds(elapsed));
  } else {
    what = absl::StrCat("no step completed for ", FormatDeadlineSeconds(elapsed), " since step ", last_step_,
                        long_step_.empty() ? "" : absl::StrCat(" (", long_step_, ")"));
  }
  return absl::UnavailableError(absl::StrCat(
      "stalled: ", what, ", past ",
      long_allowance ? absl::StrCat("its allowance of ", FormatDeadlineSeconds(allowance),
                                    " (max(progress deadline ", FormatDeadlineSeconds(d), ", 10 min))")
                     : absl::StrCat("the progress deadline of ", FormatDeadlineSeconds(d)),
      "; the deadline is ", DeadlineSourceLocked()));
}

}  // namespace distrain

#include "common/progress_deadline.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace distrain {

absl::Duration ProgressDeadline(std::optional<int64_t> explicit_seconds,
                                std::optional<double> median_step_seconds) {
  if (explicit_seconds) return absl::Seconds(*explicit_seconds);
  if (!median_step_seconds || !std::isfinite(*median_step_seconds) || *median_step_seconds <= 0) {
    return kMinDefaultProgressDeadline;
  }
  // Whole seconds: the deadline is reported (a metric, the job's status) and
  // should not change with every step's noise.
  const double scaled = std::ceil(*median_step_seconds * kProgressDeadlineStepMultiple);
  return std::max(kMinDefaultProgressDeadline, absl::Seconds(std::min(scaled, 1e9)));
}

absl::Duration LongPhaseAllowance(absl::Duration deadline) {
  return std::max(deadline, kLongPhaseAllowance);
}

std::string FormatDeadlineSeconds(absl::Duration d) {
  return absl::StrFormat("%.0f s", absl::ToDoubleSeconds(d));
}

}  // namespace distrain

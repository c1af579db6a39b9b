#include "operator/controller/stall.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/progress_deadline.h"
#include "operator/controller/pods.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

std::optional<absl::Time> LastStepTime(const Json& progress) {
  if (!progress.is_object()) return std::nullopt;
  const Json& v = progress.value(kProgressLastStepTime, Json());
  if (!v.is_string()) return std::nullopt;
  absl::StatusOr<absl::Time> t = api::ParseKubeTime(v.get<std::string>(), kProgressLastStepTime);
  return t.ok() ? std::optional<absl::Time>(*t) : std::nullopt;
}

std::optional<int64_t> ReportedDeadline(const Json& progress) {
  if (!progress.is_object()) return std::nullopt;
  const Json& v = progress.value(kProgressDeadlineSeconds, Json());
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) return std::nullopt;
  return v.get<int64_t>();
}


}  // namespace

StallDecision DecideStall(const JobConfig& config, const api::JobStatus& status,
                          const std::vector<ObservedPod>& pods, absl::Time now,
                          absl::Time watch_start) {
  StallDecision d;
  const std::optional<absl::Time> last_step = LastStepTime(status.progress);
  // Step 5.
  if (const api::Condition* c = status.FindCondition(api::kConditionStalled);
      c != nullptr && c->is_true() && last_step && *last_step > c->last_transition_time) {
    d.resumed = true;
  }
  // Step 1.
  const ObservedPod* master = nullptr;
  for (const ObservedPod& p : pods) {
    if (IsMaster(config, p.id) && p.running() && p.started) master = &p;
  }
  if (master == nullptr) return d;
  const bool moved_since_start = last_step && *last_step > *master->started;
  if (!master->reports_progress && !moved_since_start) return d;
  // Steps 2-3.
  const std::optional<int64_t>& spec_seconds = config.run_policy.progress_deadline_seconds;
  const absl::Time seen = moved_since_start ? *last_step : *master->started;
  const absl::Time since = std::max(seen, watch_start);
  absl::Duration allowance;
  std::string source;
  if (moved_since_start) {
    if (std::optional<int64_t> reported = ReportedDeadline(status.progress)) {
      allowance = absl::Seconds(*reported);
      source = "the deadline the pod reports as distrain_progress_deadline_seconds";
    } else {
      allowance = ProgressDeadline(spec_seconds, std::nullopt);
      source = spec_seconds ? "spec.runPolicy.progressDeadlineSeconds" : "the default deadline";
    }
  } else {
    allowance = LongPhaseAllowance(ProgressDeadline(spec_seconds, std::nullopt));
    source = "the start-up allowance, max(progress deadline, 10 min)";
  }
  const absl::Duration slack = moved_since_start ? kScrapeSlack : absl::ZeroDuration();
  const absl::Time expiry = since + allowance + slack;
  if (now < expiry) {
    d.check_at = expiry;
    return d;
  }
  // Step 4.
  d.stalled = master;
  d.message = absl::StrCat(
      "pod ", master->name, " (", ReplicaTypeName(master->id.type), " ", master->id.index,
      ", whose step counter is the job's) ",
      since > seen
          ? absl::StrCat("completed no step in the ", FormatDeadlineSeconds(now - since),
                         " since this operator began watching at ", api::FormatKubeTime(since))
      : moved_since_start
          ? absl::StrCat("completed no step for ", FormatDeadlineSeconds(now - since), " since step ",
                         status.progress.value("step", Json(0)).dump(), " at ",
                         api::FormatKubeTime(since))
          : absl::StrCat("completed no step in the ", FormatDeadlineSeconds(now - since), " since it started at ",
                         api::FormatKubeTime(since)),
      ", past ", FormatDeadlineSeconds(allowance), " (", source, ")",
      moved_since_start ? " and the 10 s by which the scrapes may lag" : "");
  return d;
}

}  // namespace distrain::controller

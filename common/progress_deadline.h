#ifndef DISTRAIN_COMMON_PROGRESS_DEADLINE_H_
#define DISTRAIN_COMMON_PROGRESS_DEADLINE_H_

// The progress deadline: how long a training process may go without
// completing a step before it counts as stalled (docs/architecture.md §6b,
// "Stalls"). One rule, read by the worker's /healthz
// (worker/progress_watchdog.h) and by the operator's Stalled condition
// (operator/controller/stall.h), so the two never disagree about a job.
//
// The rule:
//   1. The deadline D is spec.runPolicy.progressDeadlineSeconds when set;
//      otherwise max(60 s, 20 x the median step time observed so far), and
//      60 s before any step was timed. The median rather than the mean: the
//      first step (oneDNN primitive creation, the first all-reduce's
//      connections) and the steps that carry a checkpoint or an evaluation
//      are outliers it ignores. 20 x keeps a job whose steps slow down a few
//      times over (a noisy neighbour, a larger batch of files) healthy; 60 s
//      keeps a job of millisecond steps from being called stalled by a
//      garbage-collection pause of the machine or a slow DNS answer.
//   2. A step must complete within D of the end of the previous one.
//   3. Phases that are not steps get max(D, 10 min): start-up (up to the
//      first completed step: TF_CONFIG, rendezvous with peers that may still
//      be scheduled, loading the data set into memory, restoring a
//      checkpoint), checkpoint writes and evaluations. They are bounded too,
//      so a process that hangs in them (a dead NFS mount, a data read that
//      never returns) is still found, only later.
//
// Pure functions and constants; thread-safe.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace distrain {

inline constexpr absl::Duration kMinDefaultProgressDeadline = absl::Seconds(60);
inline constexpr int kProgressDeadlineStepMultiple = 20;
inline constexpr absl::Duration kLongPhaseAllowance = absl::Minutes(10);

// Rule step 1. `explicit_seconds`: spec.runPolicy.progressDeadlineSeconds;
// `median_step_seconds`: the median step time so far (nullopt: none timed).
absl::Duration ProgressDeadline(std::optional<int64_t> explicit_seconds,
                                std::optional<double> median_step_seconds);

// Rule step 3: the allowance of start-up, checkpoint writes and evaluations.
absl::Duration LongPhaseAllowance(absl::Duration deadline);

// "31 s": how stall messages (worker /healthz, the operator's Stalled
// condition) write a duration, whole seconds.
std::string FormatDeadlineSeconds(absl::Duration d);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_PROGRESS_DEADLINE_H_

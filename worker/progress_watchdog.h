#ifndef DISTRAIN_WORKER_PROGRESS_WATCHDOG_H_
#define DISTRAIN_WORKER_PROGRESS_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/gauge.h"

namespace distrain {

// Whether this training process is making progress: what the worker's
// /healthz answers (worker/main.cc), and so what the kubelet's liveness and
// readiness probes see (operator/controller/pods.h, "Probes").
//
// It applies common/progress_deadline.h's rule to what the Trainer tells it:
//   1. From construction the process is starting up; the first completed step
//      ends start-up, which may take LongPhaseAllowance(D).
//   2. After that each step must complete within D of the previous one's
//      end (or of the end of the last long phase). D is the explicit
//      deadline, else derived from the median of the last kWindow step times
//      (the first step, which carries the warm-up, is left out).
//   3. BeginLongPhase/EndLongPhase bracket a checkpoint write or an
//      evaluation: inside, the allowance is LongPhaseAllowance(D) from its
//      start. ExpectLongStep gives the next step that allowance: a process
//      of a synchronous job whose chief writes a checkpoint or evaluates
//      after this step waits for it inside its next all-reduce.
//   4. Done (training finished or stopping): always healthy; the process is
//      about to exit and its exit code says how it went.
// Check is OK, or UNAVAILABLE with one line saying what has not happened
// for how long, against which deadline and where that deadline came from.
//
// Evaluator and ParameterServer ps/worker tasks have none: they take no
// steps of their own (an evaluator waits for checkpoints, which come as
// rarely as the job asks; a ps or ps worker serves the chief's requests), so
// their /healthz stays OK while the process serves. A stall of such a job
// shows in the chief's step counter, which the chief's own watchdog and the
// operator watch.
//
// Owns its state. Thread-safe: the Trainer's thread reports, the metrics
// server's threads Check.
class ProgressWatchdog {
 public:
  // Step times the derived deadline's median is taken over.
  static constexpr int kWindow = 101;

  // `explicit_deadline_seconds`: spec.runPolicy.progressDeadlineSeconds.
  explicit ProgressWatchdog(std::optional<int64_t> explicit_deadline_seconds,
                            std::function<absl::Time()> now = [] { return absl::Now(); });

  // Step `step` completed; it took `seconds`.
  void StepCompleted(int64_t step, double seconds);
  // Rule step 3; `what` is for the message ("writing a checkpoint").
  void BeginLongPhase(const std::string& what);
  void EndLongPhase();
  void ExpectLongStep(const std::string& why);
  // Rule step 4.
  void Done();

  absl::Status Check() const;
  // D as it stands now (rule step 2).
  absl::Duration deadline() const;
  // How long after the last completed step the next must complete: D, or
  // more while a long phase or an expected long step lasts (the time from
  // the step to the phase's start, plus its allowance). What the operator
  // judges the master's stall by (operator/controller/stall.h), since it
  // sees only the step counter and this.
  absl::Duration AllowanceFromLastStep() const;
  // Keeps `gauge` (distrain_progress_deadline_seconds) at
  // AllowanceFromLastStep from now on; not owned, must outlive this.
  void AttachGauge(prometheus::Gauge* gauge);

 private:
  absl::Duration DeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration AllowanceLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DeadlineSourceLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::optional<int64_t> explicit_seconds_;
  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // a step has completed
  absl::Time since_ ABSL_GUARDED_BY(mu_);      // what the current allowance counts from
  std::string long_phase_ ABSL_GUARDED_BY(mu_);  // "" unless inside one
  std::string long_step_ ABSL_GUARDED_BY(mu_);   // why the next step may be long; ""
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time last_step_end_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* gauge_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t steps_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> window_ ABSL_GUARDED_BY(mu_);  // ring buffer of step times
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> median_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_PROGRESS_WATCHDOG_H_

#ifndef DISTRAIN_OPERATOR_CONTROLLER_STALL_H_
#define DISTRAIN_OPERATOR_CONTROLLER_STALL_H_

// Stall detection from training metrics: the Stalled condition, and which
// pod is restarted for it (docs/architecture.md §6b, "Stalls").
//
// What it reads. The progress reporter (operator/progress_reporter.h) scrapes
// the master's /metrics every few seconds; whenever the step counter it sees
// differs from status.progress.step it writes status.progress.lastStepTime =
// now, and with every patch status.progress.progressDeadlineSeconds = the
// master's distrain_progress_deadline_seconds: the seconds after its last step
// by which the next must complete, under common/progress_deadline.h's rule
// (longer while it starts up, writes a checkpoint or evaluates). A process
// that hangs, or is stopped, answers no scrape, so lastStepTime stays.
//
// The decision, a pure function of the job, its pods and the time:
//   1. Only a master pod (the chief, or Worker 0) that is Running, not being
//      deleted, and whose start is known is judged: a pod still starting, or
//      being replaced, is not stalled, and a restart clears nothing by itself.
//      Nor is one that reports no progress: only a pod annotated
//      kReportsProgressAnnotation (it runs distrain-worker, pods.h) is judged
//      before the step has moved since it started. A user's own image (a
//      TensorFlow chief) exports no step counter, and would otherwise be
//      restarted as stalled 10 minutes into every run.
//   2. The clock starts at since = max(lastStepTime, the pod's start, the
//      time this operator began watching progress): time nobody watched is
//      not held against the pod (a lastStepTime left from before an operator
//      restart, or a pod start recorded by a node whose clock is behind).
//   3. When the step moved after the pod started (lastStepTime later than
//      its start; both are whole seconds, and the same second counts as not
//      yet: it may be the previous pod's step, and the longer allowance is
//      the one that cannot call a healthy pod stalled), the allowance is the
//      master's reported deadline (else spec.runPolicy.progressDeadlineSeconds,
//      else 60 s); before that, the pod is starting up and the allowance is
//      LongPhaseAllowance of the spec's deadline (else 60 s): at least 10 min.
//      While the step has moved, kScrapeSlack is added: the reporter sees the
//      master only every 5 s, so lastStepTime is up to one interval late and
//      a long phase that starts right after a step reaches the reported
//      figure up to one interval after it began.
//   4. now >= since + allowance: stalled. The reconcile sets Stalled True
//      (reason ProgressDeadlineExceeded), emits a Warning event naming the
//      pod, and restarts it as its replica's restartPolicy says for a pod
//      that failed without an exit code (restart.h: every policy but Never
//      restarts; Never fails the job), counted against backoffLimit and with
//      its restart group. Otherwise it looks again at since + allowance.
//   5. Stalled True clears (False, ProgressResumed) once lastStepTime is
//      later than the condition's lastTransitionTime: the step moved again,
//      in the restarted pods or because the old ones recovered.
// Why a restart and not only a condition: a process stuck outside a
// collective (a data read, a OneDevice step) never exits on its own, so
// nothing else would end the stall. Why judged on the master only: its step
// counter is the job's (a hung MultiWorkerMirrored peer stops the master's
// all-reduce too, and the group restart replaces every replica); the
// kubelet's liveness probe on every pod's /healthz (pods.h, "Probes") is
// what finds a hung ps-worker or non-master replica by itself.
//
// Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/job_config.h"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/observed.h"

namespace distrain::controller {

// status.progress fields the reporter writes and this reads.
inline constexpr char kProgressLastStepTime[] = "lastStepTime";
inline constexpr char kProgressDeadlineSeconds[] = "progressDeadlineSeconds";
inline constexpr char kReasonStalled[] = "ProgressDeadlineExceeded";
inline constexpr char kReasonResumed[] = "ProgressResumed";
// Step 3: two of the progress reporter's 5 s intervals.
inline constexpr absl::Duration kScrapeSlack = absl::Seconds(10);

struct StallDecision {
  // The master pod judged stalled (step 4); null when none is.
  const ObservedPod* stalled = nullptr;
  std::string message;  // why, naming the pod, for the condition and the event
  // Step 5: Stalled is True and the step has moved since.
  bool resumed = false;
  // When to look again (step 4), if a master is being watched.
  std::optional<absl::Time> check_at;
};

StallDecision DecideStall(const JobConfig& config, const api::JobStatus& status,
                          const std::vector<ObservedPod>& pods, absl::Time now,
                          absl::Time watch_start = absl::InfinitePast());

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_STALL_H_

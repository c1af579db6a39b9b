#ifndef DISTRAIN_OPERATOR_CONTROLLER_CLEANUP_H_
#define DISTRAIN_OPERATOR_CONTROLLER_CLEANUP_H_

// What happens to a finished job (Succeeded or Failed) and its pods.
//
// runPolicy.cleanPodPolicy, applied on every reconcile once the job has
// finished (idempotent: a deleted pod is terminating and is not deleted again):
//   None     every pod is kept (logs stay readable);
//   Running  (the default, as TFJob's) pods still pending or running are
//            deleted (PS servers, which never exit on their own, the
//            evaluator, which evaluates the final checkpoint on SIGTERM,
//            workers that outlived the chief), so a finished job holds no
//            resources;
//   All      every pod is deleted.
// The Service of a deleted pod is deleted with it. A job that failed because
// it ran out of time (activeDeadlineSeconds) or restarts (backoffLimit) is
// stopped like a batch/v1 Job: its active pods are deleted whatever the
// policy says, which then only decides about finished pods.
//
// runPolicy.ttlSecondsAfterFinished: the job is deleted that long after
// status.completionTime (its children follow by garbage collection); until
// then the reconcile asks to be requeued when the TTL expires.
//
// Pure functions; thread-safe.

#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "common/job_config.h"
#include "operator/controller/observed.h"

namespace distrain::controller {

// The pods to delete under `policy`; `stop_active` adds every active pod.
std::vector<const ObservedPod*> PodsToCleanUp(CleanPodPolicy policy, bool stop_active,
                                              const std::vector<ObservedPod>& pods);

struct TtlDecision {
  bool delete_now = false;
  std::optional<absl::Duration> requeue_after;
};
TtlDecision DecideTtl(const RunPolicy& policy, std::optional<absl::Time> completion_time,
                      absl::Time now);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_CLEANUP_H_

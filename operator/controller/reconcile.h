#ifndef DISTRAIN_OPERATOR_CONTROLLER_RECONCILE_H_
#define DISTRAIN_OPERATOR_CONTROLLER_RECONCILE_H_

// One reconcile of a DistributedTrainingJob, as a pure function of the job,
// its observed children, the facts and the options (plan.h). The policies
// live one per file: pods.h (desired pods and Services, TF_CONFIG), restart.h, stall.h,
// success.h, cleanup.h (cleanPodPolicy, TTL), elastic.h, gang.h, kueue.h,
// conditions.h; this file orders them:
//
//   1. A job being deleted: nothing (garbage collection removes the children).
//   2. A spec the operator cannot run (InvalidSpec: e.g. a name too long for
//      its pods' host names, or Auto choosing a strategy whose rules the spec
//      breaks): Failed, nothing created.
//   3. A finished job (Succeeded or Failed True): cleanPodPolicy and TTL only.
//   4. runPolicy.suspend: every pod deleted, Suspended True, startTime
//      cleared (like batch/v1, the activeDeadlineSeconds clock restarts on
//      resume). Resume: Suspended False, pods created again.
//   5. activeDeadlineSeconds past startTime: Failed (DeadlineExceeded).
//   6. Success policy: Succeeded.
//   7. Failures (restart.h): a permanent one fails the job; restarts past
//      backoffLimit fail it (BackoffLimitExceeded); otherwise the pods to
//      restart are deleted, Restarting True, restartCount counted.
//      A running master whose step has not moved within the progress
//      deadline (stall.h) counts as a pod that failed without exiting: Stalled
//      True, a Warning event naming it, then the same rules; Stalled clears
//      once the step moves again.
//   8. Membership changes (elastic.h).
//   9. Gang scheduling (gang.h): the PodGroup, or Created False when its CRD
//      is missing.
//  10. Missing pods and Services are created: never one whose name is
//      observed (present, or still terminating), and in synchronous
//      strategies no training pod while an old-generation one is still
//      terminating, so a generation starts whole. The caller's expectations
//      (operator/kube) keep Reconcile from running on a cache that has not yet
//      seen this plan's creations and deletions; with them, no pod is ever
//      created twice.
//  11. Status: Created / Running / Restarting, replicaStatuses, startTime,
//      observedGeneration, selector, state; an event for every condition
//      transition. Plan.status_changed says whether to write it.
//
// Pure functions; thread-safe.

#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/plan.h"

namespace distrain::controller {

Plan Reconcile(const api::DistributedTrainingJob& job, const Observed& observed,
               const Facts& facts, const ControllerOptions& options);

// The same from the object as the API returns it. A spec that does not parse
// (possible only when the CRD's validation was bypassed, e.g. an older CRD)
// fails the job with reason InvalidSpec and the parser's message; a status
// that does not parse is replaced (and a Warning event says so).
Plan ReconcileObject(const nlohmann::json& object, const Observed& observed, const Facts& facts,
                     const ControllerOptions& options);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_RECONCILE_H_

#ifndef DISTRAIN_OPERATOR_CONTROLLER_KUEUE_H_
#define DISTRAIN_OPERATOR_CONTROLLER_KUEUE_H_

// Kueue (kueue.sigs.k8s.io): a job that names a queue is admitted whole or not
// at all, through Kueue's pod integration ("plain pods", pod groups). Kueue has
// no integration for DistributedTrainingJob, so the operator makes the job's
// pods one Kueue pod group:
//
//   label      kueue.x-k8s.io/queue-name            the LocalQueue: spec.runPolicy.
//                                                   scheduling.queue, else the job's
//                                                   own kueue.x-k8s.io/queue-name label
//                                                   (where Kueue users put it on a Job)
//   label      kueue.x-k8s.io/pod-group-name        <job>-<first 8 hex digits of its uid>:
//                                                   the name of the Workload Kueue makes;
//                                                   the same for every pod the job ever
//                                                   has, replacements included, and new
//                                                   for a job re-created under the same name
//   annotation kueue.x-k8s.io/pod-group-total-count every replica the spec asks for (Chief,
//                                                   Workers, PS, Evaluator): Kueue creates
//                                                   the Workload once that many pods exist
//                                                   and reserves quota for all of them
//   annotation kueue.x-k8s.io/role-hash             the replica type (chief, worker, ps,
//                                                   evaluator): the Workload's pod sets,
//                                                   one per type, instead of Kueue's hash
//                                                   of each pod's spec (pods of one type
//                                                   may differ in affinity, which would
//                                                   split them into many pod sets)
//
// Kueue's webhook then adds the scheduling gate kueue.x-k8s.io/admission and its
// finalizer to each pod; once the Workload is admitted Kueue removes the gate from
// all of them together. Until then the job's condition Queued is True (reason
// WaitingForKueueAdmission, the message naming the pod group and the queue), so
// `kubectl get dtj` shows State Queued; it turns False (KueueAdmitted) once no
// pod is gated. status.startTime (the activeDeadlineSeconds clock) starts only
// when the pods are admitted, as batch/v1's does for a suspended Job.
//
// Restarts keep the group: the operator's replacement pods join it (Kueue's
// group is "retriable" by default) and Kueue ungates them at once, the quota
// staying reserved. When the job finishes (Succeeded or Failed), every pod of
// it gets kueue.x-k8s.io/retriable-in-group=false: Kueue then finishes the
// Workload, releasing the quota, once no pod runs. Without that, a group whose
// PS pods were deleted by cleanPodPolicy (or whose workers were stopped after
// the chief succeeded) never counts as finished for Kueue, and would hold its
// quota for ever.
//
// Not handled: a resize (elastic policy, kubectl scale) of a queued job changes
// the total count; Kueue re-queues a group that grows as a new Workload.
// runPolicy.suspend deletes the pods but Kueue keeps the quota reserved until
// they are back (Kueue's own suspension is the way to free it).
//
// Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/plan.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

inline constexpr char kKueuePodGroupNameLabel[] = "kueue.x-k8s.io/pod-group-name";
inline constexpr char kKueuePodGroupTotalCountAnnotation[] = "kueue.x-k8s.io/pod-group-total-count";
inline constexpr char kKueueRoleHashAnnotation[] = "kueue.x-k8s.io/role-hash";
inline constexpr char kKueueRetriableInGroupAnnotation[] = "kueue.x-k8s.io/retriable-in-group";
// The scheduling gate Kueue's webhook puts on every pod it queues.
inline constexpr char kKueueAdmissionGate[] = "kueue.x-k8s.io/admission";
inline constexpr char kReasonKueueWaiting[] = "WaitingForKueueAdmission";
inline constexpr char kReasonKueueAdmitted[] = "KueueAdmitted";

// The job's LocalQueue: spec.runPolicy.scheduling.queue, else the job's label
// kueue.x-k8s.io/queue-name; "" when it names none (no Kueue metadata at all).
std::string KueueQueueName(const api::DistributedTrainingJob& job, const JobConfig& config);

// The queue must be able to name a LocalQueue (a DNS-1123 subdomain of at
// most 63 characters, so that it is also a label value): else the pods could
// not be created (an invalid label) or Kueue would never find the queue.
// InvalidArgument names the field (or the job's label) and the fix.
absl::Status ValidateKueueQueue(const api::DistributedTrainingJob& job, const JobConfig& config);

// "<job>-<first 8 hex digits of the uid without dashes>", the job's name cut so
// the whole is at most 63 characters (a label value). Just the name when the
// uid is empty (a job not yet stored).
std::string KueuePodGroupName(const api::DistributedTrainingJob& job);

// Adds the pod-group labels and annotations (file comment) to a pod's
// metadata when the job names a queue; leaves it alone otherwise.
void AddKueuePodGroup(const api::DistributedTrainingJob& job, const JobConfig& config, ReplicaId id,
                      nlohmann::json* metadata);

// Whether the pod still carries Kueue's admission scheduling gate.
bool GatedByKueue(const nlohmann::json& pod);

// What the Queued condition should say: nullopt when the job names no queue
// or nothing is to be said (no pods yet). queued: some pod of the job (owned
// by its uid, not being deleted) is gated; else false, which is recorded only
// when Queued was True before (conditions.h).
struct QueuedDecision {
  bool queued = false;
  std::string reason;
  std::string message;
};
std::optional<QueuedDecision> DecideQueued(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const std::vector<ObjectRef>& pods);

// For a finished job: a patch setting kueue.x-k8s.io/retriable-in-group=false
// on each pod of the job that is in its Kueue pod group and lacks it (file
// comment). Empty when the job names no queue.
std::vector<PodPatch> KueueFinishedPatches(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const std::vector<ObjectRef>& pods);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_KUEUE_H_

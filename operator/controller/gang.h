#ifndef DISTRAIN_OPERATOR_CONTROLLER_GANG_H_
#define DISTRAIN_OPERATOR_CONTROLLER_GANG_H_

// Gang scheduling (runPolicy.scheduling.gang): all of the job's pods are
// scheduled together or not at all, so a partial job never holds GPUs while
// waiting for the rest. Implemented with scheduler-plugins' coscheduling: a
// PodGroup (scheduling.x-k8s.io/v1alpha1) named after the job, with
// minMember = runPolicy.scheduling.minAvailable or every replica; each pod
// carries the label scheduling.x-k8s.io/pod-group=<job> and the gang
// scheduler's schedulerName (pods.h). runPolicy.scheduling.queue becomes the
// pods' kueue.x-k8s.io/queue-name label and priorityClass their
// priorityClassName: scheduler-plugins' PodGroup has neither field.
//
// When the PodGroup CRD is not installed the job's pods are not created (a
// gang that is not one would hold resources piecemeal, the very thing the
// user asked to avoid): condition Created is False with reason
// PodGroupCRDMissing and a message saying what to install, and the job is
// retried every kGangRetry until the CRD appears.
//
// Pure functions; thread-safe.

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

inline constexpr char kPodGroupApiVersion[] = "scheduling.x-k8s.io/v1alpha1";
inline constexpr char kPodGroupResource[] = "podgroups.scheduling.x-k8s.io";
inline constexpr absl::Duration kGangRetry = absl::Seconds(30);

// minMember: minAvailable, or every replica of the job.
int GangSize(const JobConfig& config);

nlohmann::json BuildPodGroup(const api::DistributedTrainingJob& job, const Topology& topology);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_GANG_H_

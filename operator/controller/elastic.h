#ifndef DISTRAIN_OPERATOR_CONTROLLER_ELASTIC_H_
#define DISTRAIN_OPERATOR_CONTROLLER_ELASTIC_H_

// Membership changes: spec.replicaSpecs.<type>.replicas changed while the job
// runs (kubectl scale / an HPA through the scale subresource, within
// spec.elasticPolicy's bounds, which the CRD enforces; or an edit).
//
//   * Pods whose index is past the new count are deleted (ScaledDown).
//   * Synchronous strategies (everything but ParameterServer): every replica's
//     TF_CONFIG lists the whole training cluster and the collective ring is
//     formed from it, so a new count means a new cluster. Each pod carries the
//     hash of the training cluster it was made for (pods.h,
//     kClusterHashAnnotation); when a Chief or Worker pod's hash is not the
//     current one, every Chief and Worker pod is deleted and the set is
//     created again, as one new generation with the new TF_CONFIG, once the
//     old pods are gone (reconcile.h). This is a resize, not a failure: it is
//     not counted against backoffLimit.
//     Except in place (ResizesInPlace): MultiWorkerMirrored with
//     spec.elasticPolicy and recoveryPolicy InPlace whose training pods run
//     distrain-worker. Its group admits new workers and drops departed ones
//     while it trains (worker/strategy/multi_worker_mirrored.h, E1-E4), so
//     only the excess pods are deleted (they depart on SIGTERM) and the new
//     indices created, with the new TF_CONFIG; the survivors keep theirs.
//     A user's TensorFlow image cannot do that: it is regenerated.
//   * ParameterServer: workers are independent, so workers are only added
//     (with the new TF_CONFIG) or removed; the running pods stay.
// The Evaluator is not in the training cluster (its count is not hashed).
//
// Pure functions; thread-safe.

#include <vector>

#include "operator/controller/observed.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

struct ScaleDecision {
  std::vector<const ObservedPod*> excess;  // index >= replicas of its type
  // Non-empty: a new generation; these are every live Chief and Worker pod.
  std::vector<const ObservedPod*> regenerate;
};

ScaleDecision DecideScale(const Topology& topology, const std::vector<ObservedPod>& pods);

// Whether a resize of this job happens in place (see above).
bool ResizesInPlace(const JobConfig& config, const std::vector<ObservedPod>& pods);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_ELASTIC_H_

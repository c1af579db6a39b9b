#ifndef DISTRAIN_OPERATOR_CONTROLLER_NETWORK_POLICY_H_
#define DISTRAIN_OPERATOR_CONTROLLER_NETWORK_POLICY_H_

// The job's NetworkPolicy (networking.k8s.io/v1): who may open a connection
// to the job's pods (docs/architecture.md §10).
//
// A job's servers (coordination service, ring, parameter servers, ps-worker
// service) serve on the TF_CONFIG port and accept whoever connects; the
// metrics endpoint serves on the metrics port. The policy, "<job>-network",
// selects the job's pods (label distrain.io/job-name=<job>) and admits
// ingress only:
//   1. from the job's own pods (same label, same namespace) on the job's
//      TF_CONFIG ports (one per replica type; usually all 2222);
//   2. from ControllerOptions::network_policy.metrics_peers (the operator's
//      pods for the progress scrape, Prometheus) on the metrics ports.
// Everything else that reaches the pods is dropped by a CNI that enforces
// NetworkPolicy; without one (kindnet, flannel alone) the object is inert.
// Only Ingress is restricted: a job reads data, writes checkpoints and
// resolves names wherever its template says, which the operator cannot know.
// Policies are additive: a user who needs more (a TensorBoard sidecar, an
// own port) adds a policy of their own selecting the same pods; an admin
// who manages policies themselves turns this one off
// (distrain-operator --network-policy=false). The kubelet's probes come from
// the node, which the common CNIs admit regardless of policy.
// Owned by the job (ownerReferences), so the garbage collector removes it
// with the job; annotated with its spec's hash; labelled like the job's children so the operator's informer
// (label selector distrain.io/job-name) sees it.
//
// Pure functions; thread-safe.

#include <string>

#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/plan.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

inline constexpr char kNetworkPolicySuffix[] = "-network";
// Hash of the spec the operator wrote. The reconcile rewrites the policy when
// the desired spec's hash differs (a new operator version or new metrics
// peers), not when the stored spec differs: the API server may normalise what
// it stores (an empty selector's matchLabels), and comparing specs would then
// rewrite the object on every reconcile, each write triggering the next.
inline constexpr char kNetworkPolicyHashAnnotation[] = "distrain.io/network-policy-hash";

// "<job>-network".
std::string NetworkPolicyName(const std::string& job_name);

// The complete NetworkPolicy object for the job (see the file comment).
nlohmann::json BuildNetworkPolicy(const api::DistributedTrainingJob& job, const Topology& topology,
                                  const ControllerOptions& options);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_NETWORK_POLICY_H_

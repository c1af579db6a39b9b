#ifndef DISTRAIN_OPERATOR_SELF_CHECK_H_
#define DISTRAIN_OPERATOR_SELF_CHECK_H_

// `distrain-operator check`: proves an installed operator works, from outside
// it. The Helm chart's test hook (charts/distrain/templates/tests/) runs it in
// a pod against the operator's Service; it fails when the operator is down.
//
// Checks, in order, each retried until `wait` has passed:
//   1. GET readyz_url answers 200: the serving replica's informers synced,
//      which needs the DistributedTrainingJob CRD served;
//   2. GET metrics_url answers 200 with a leader_election_master_status sample
//      equal to 1: the replica behind the Service leads (a standby would
//      report 0, and without --leader-elect the metric is absent: then the
//      check passes on readiness alone unless require_leader);
//   3. with `crd` set, the API server's discovery document for the CRD's
//      group/version lists its plural (served), read with the pod's own
//      credentials (in-cluster ServiceAccount, or a kubeconfig).
//
// Pure parts (CheckLeaderMetrics, CheckCrdServed) are exposed for tests.
// Thread-safety: stateless functions.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace distrain {

struct SelfCheckOptions {
  std::string readyz_url;   // e.g. http://dt-distrain-operator-metrics.ns.svc:8081/readyz; "" skips
  std::string metrics_url;  // e.g. http://...:8080/metrics; "" skips
  bool require_leader = true;  // metrics must carry leader_election_master_status 1
  std::string crd;             // "distributedtrainingjobs.distrain.io/v1alpha1"; "" skips
  std::string kubeconfig;      // for the CRD check; "" = $KUBECONFIG / in-cluster
  absl::Duration wait = absl::Seconds(30);
  absl::Duration request_timeout = absl::Seconds(3);
};

// OK when `exposition` (Prometheus text format) has a
// leader_election_master_status sample of 1. kNotFound when the metric is
// absent, kFailedPrecondition when every sample is 0 (a standby).
absl::Status CheckLeaderMetrics(const std::string& exposition);

// OK when `resource_list` (an APIResourceList from /apis/<group>/<version>)
// lists `plural`.
absl::Status CheckCrdServed(const nlohmann::json& resource_list, const std::string& plural);

// Runs the checks; `say` gets one line per passed check. The error names the
// URL or resource and what was wrong.
absl::Status RunSelfCheck(const SelfCheckOptions& options, const std::function<void(const std::string&)>& say);

}  // namespace distrain

#endif  // DISTRAIN_OPERATOR_SELF_CHECK_H_

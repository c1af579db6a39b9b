#ifndef DISTRAIN_OPERATOR_MANAGER_H_
#define DISTRAIN_OPERATOR_MANAGER_H_

// Manager: the running operator — what distrain-operator's main() builds from
// its flags. It wires the pieces of operator/kube and operator/controller into
// controller-runtime's shape:
//
//   1. Connect: kubeconfig (or in-cluster) → RestClient with QPS/burst.
//      Probes (/healthz, /readyz) and metrics (/metrics) start listening.
//   2. Elect (--leader-elect): a LeaderElector on the Lease; standby replicas
//      stay live but do nothing else. Losing the lease ends Run with an error
//      (the process exits and its Deployment restarts it: client-go's advice,
//      since a deposed leader's caches and expectations are suspect).
//   3. Lead: informers for DistributedTrainingJobs, their pods, Services,
//      cluster-spec ConfigMaps, NetworkPolicies and checkpoint
//      PersistentVolumeClaims (label distrain.io/job-name), one set per
//      watched namespace (or one cluster-wide). Job events enqueue the job's key; child events enqueue
//      the owning job's key and settle expectations. /readyz turns 200 once
//      every informer has synced.
//   4. Reconcile: --concurrent-reconciles workers take keys from the
//      rate-limited WorkQueue. A key whose expectations are unsatisfied is
//      skipped (the awaited watch event re-queues it). Otherwise
//      controller::JobReconciler (controller/reconciler.h) computes the Plan
//      from the caches and applies it. Errors re-queue with per-key backoff;
//      a Plan's requeue_after re-queues after it. Job transitions seen on the
//      job informer (a condition turning True, restartCount rising) feed the
//      distrain_jobs_* counters.
//   4b. Progress: a ProgressReporter (progress_reporter.h) copies the chief's
//      step, loss and examples/s from its /metrics into status.progress.
//   5. Stop (SIGTERM): workers drain, informers stop, the lease is released,
//      queued events are flushed (bounded).
//
// Metrics (controller-runtime's names, so existing dashboards work):
//   controller_runtime_reconcile_total{controller,result}   result: success|error|requeue|requeue_after
//   controller_runtime_reconcile_errors_total{controller}
//   controller_runtime_reconcile_time_seconds{controller}
//   controller_runtime_max_concurrent_reconciles{controller}
//   controller_runtime_active_workers{controller}
//   workqueue_* (kube/workqueue.h), rest_client_* (kube/rest_client.h),
//   leader_election_master_status (kube/leader_election.h), and
//   distrain_jobs_{created,succeeded,failed,restarted}_total{namespace,strategy}.
//
// Ownership: owns everything it builds. Thread-safety: Create and Run are
// called from one thread; Healthy/Ready from any (the probe server's).

#include <cstddef>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace distrain {

struct ManagerOptions {
  std::string kubeconfig;  // "" = $KUBECONFIG / ~/.kube/config / in-cluster
  std::string context;
  std::vector<std::string> namespaces;  // empty = all
  int concurrent_reconciles = 4;
  double qps = 50;
  int burst = 100;
  bool leader_elect = false;
  std::string leader_election_namespace;  // "" = $POD_NAMESPACE, else the kubeconfig's
  std::string leader_election_id = "distrain-operator";
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
  std::string metrics_host = "0.0.0.0";
  int metrics_port = 8080;  // 0 = off
  std::string health_host = "0.0.0.0";
  int health_port = 8081;  // 0 = off
  // Pod defaults (controller::ControllerOptions); empty keeps its default.
  std::string default_worker_image;
  std::string default_worker_cuda_image;  // for replicas that request nvidia.com/gpu
  std::string cluster_domain;
  // The PersistentVolumeClaim provisioned per job for its checkpoints
  // (controller/checkpoint_volume.h); off: none, and no informer on
  // persistentvolumeclaims (so no RBAC for them is needed).
  bool checkpoint_volumes = true;
  std::string checkpoint_storage_class;  // "": the cluster's default class
  std::string checkpoint_storage_size = "1Gi";
  std::string checkpoint_access_mode = "ReadWriteOnce";
  // The progress reporter's scrapes of the chiefs' /metrics
  // (progress_reporter.h): per-pod deadline, byte limit, connections at once.
  absl::Duration progress_scrape_timeout = absl::Seconds(2);
  size_t progress_scrape_max_bytes = 256 * 1024;
  int progress_scrape_concurrency = 32;
  // A NetworkPolicy per job (controller/network_policy.h); off: none, and no
  // informer on networkpolicies (so no RBAC for them is needed).
  bool network_policy = true;
  // NetworkPolicyPeer objects, as JSON, admitted to the jobs' metrics ports
  // (the operator's own pods, Prometheus). Empty: the operator's namespace
  // ($POD_NAMESPACE) when it runs in a cluster, else none.
  std::vector<std::string> network_policy_metrics_peers;
};

class Manager {
 public:
  // Loads the kubeconfig and builds the client; kInvalidArgument names the
  // kubeconfig problem. Does not contact the API server.
  static absl::StatusOr<std::unique_ptr<Manager>> Create(const ManagerOptions& options);
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Steps 1-5 until `stop`; OK after a requested stop, an error when the
  // lease was lost or the servers could not start.
  absl::Status Run(std::stop_token stop);

  bool Healthy() const;
  bool Ready() const;

  struct Impl;

 private:
  explicit Manager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace distrain

#endif  // DISTRAIN_OPERATOR_MANAGER_H_

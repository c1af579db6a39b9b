#ifndef DISTRAIN_OPERATOR_CONTROLLER_RECONCILER_H_
#define DISTRAIN_OPERATOR_CONTROLLER_RECONCILER_H_

// JobReconciler: the imperative half of a reconcile. For one job key it reads
// the job and its children from the informers' caches (injected), asks the
// pure Reconcile (reconcile.h) for a Plan, and carries the Plan out through
// kube::Client:
//
//   1. No job in the cache: forget its expectations; done.
//   2. Expectations not satisfied (creations or deletions of an earlier
//      reconcile not yet seen by the informer): do nothing; the informer's
//      event for them requeues the job. This is what makes a pod never be
//      created twice, also across an operator restart mid-creation (the new
//      process's informer LISTs the pods that were created before any
//      reconcile runs).
//   3. delete_job (TTL): DELETE the job, preconditioned on its uid,
//      propagationPolicy Background (the garbage collector removes the
//      children through their owner references).
//   4. The PodGroup, then the cluster-spec ConfigMap (POST, or PUT with the
//      cached resourceVersion), then the job's NetworkPolicy (POST, 409 meaning
//      it is there; or PUT), then its checkpoint PersistentVolumeClaim (POST,
//      409 meaning it is there), then, when pods are to be created, the job's
//      identity Secret holds a certificate for each of them
//      (job_identity_secret.h: GET, then POST or PUT), then Services and pods
//      are POSTed. No pod is POSTed while the NetworkPolicy, the claim or the
//      Secret could not be written: no pod runs unprotected (a failed update
//      leaves the old policy in force), none waits unschedulable for a
//      missing claim or in ContainerCreating for a missing certificate. The
//      ConfigMap has its own expectation (ConfigMapExpectationsKey): set
//      before the write, lowered by the ConfigMap informer's add/update (or
//      here when the write fails), so a reconcile on a cache that has not
//      seen the write neither writes it again from a stale version nor, for
//      that matter, touches the pods. No pod is POSTed when the ConfigMap
//      write failed: the pods would wait for it in the kubelet.
//      Services and pods go out as one stream (each pod right after its
//      Service) through a slow-start window: 1 request in flight, one more
//      for every success (doubling per round trip, like TCP and the
//      Kubernetes job controller's batches) up to kMaxBatch; the first
//      failure stops new requests, so a quota or admission error is not
//      repeated for every child. ExpectCreations(pods) is set before the
//      first POST; every pod create that fails (409 included), and every pod
//      never sent, lowers it again, since no informer event will come for it.
//   5. When pods are to be deleted, the status is written first (step 6)
//      and the deletions only once it is: a deletion is what a restart
//      counts, and a pod once gone cannot be counted again, so a restart
//      whose status write failed would be lost (and backoffLimit never
//      reached). A failed write skips the pod deletions; the retry decides
//      them again from the fresh job.
//      Pods and Services to delete: DELETE with a uid precondition (a pod
//      recreated under the same name is never deleted by mistake) and
//      propagationPolicy Background; ExpectDeletions(uids) first; 404 and a
//      failed precondition count as observed.
//   6. The status, once: PUT .../status of the cached object with the new
//      status and the cached resourceVersion, so a concurrent writer makes it
//      fail with 409 (retried through the queue) instead of being overwritten.
//   7. The Plan's events, only once the status that explains them is written
//      (a failed write recomputes the same transitions next time).
// Any failure is returned (after the other steps ran) so the work queue
// retries the key with backoff; Reconcile's requeue_after is returned on
// success.
//
// Ownership: borrows the client and the expectations (they must outlive it).
// Thread-safety: Reconcile may run concurrently for different keys (the work
// queue never hands the same key to two workers at once); the hooks must be
// thread-safe.

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/controller/plan.h"
#include "operator/kube/client.h"
#include "operator/kube/clock.h"
#include "operator/kube/expectations.h"
#include "operator/kube/paths.h"

namespace distrain::controller {

struct ReconcilerHooks {
  // The job object of "namespace/name" from the job informer's cache.
  std::function<std::optional<nlohmann::json>(const std::string& key)> get_job;
  // Its children from the pod / service / PodGroup informers' caches.
  std::function<Observed(const nlohmann::json& job)> observe;
  // Whether podgroups.scheduling.x-k8s.io is served (discovery).
  std::function<bool()> pod_group_crd_installed = [] { return false; };
  // Since when progress has been scraped (Facts::progress_watch_start); the
  // manager: when it became leader. Unset: when the reconciler was made.
  std::function<absl::Time()> progress_watch_start;
  // Records an events.k8s.io/v1 event about the job (kube::EventRecorder).
  std::function<void(const nlohmann::json& job, const Event& event)> record_event =
      [](const nlohmann::json&, const Event&) {};
};

// The Expectations key of a job's cluster-spec ConfigMap writes ("ns/name"
// -> "ns/name#cluster-spec"; not a valid object key, so never a job's).
std::string ConfigMapExpectationsKey(const std::string& job_key);

class JobReconciler {
 public:
  static constexpr int kMaxBatch = 64;

  JobReconciler(kube::Client* client, kube::Expectations* expectations, ReconcilerHooks hooks,
                ControllerOptions options = {}, const kube::Clock* clock = kube::Clock::Real());

  // Reconciles the job `key` ("namespace/name"). OK: the requeue delay the
  // Plan asked for (nullopt: none). An error: retry with backoff.
  absl::StatusOr<std::optional<absl::Duration>> Reconcile(const std::string& key);

 private:
  // POSTs the Services and pods, each pod after its Service, in a
  // slow-start window (step 4).
  absl::Status CreateAll(const std::string& key, const std::vector<nlohmann::json>& services,
                         const std::vector<nlohmann::json>& pods);
  // Writes the Plan's ConfigMap, if any (step 4).
  absl::Status ApplyConfigMap(const std::string& key, const std::string& ns, const Plan& plan);
  absl::Status DeleteObject(const std::string& path, const Deletion& deletion,
                            bool* gone_or_stale);

  kube::Client* const client_;
  kube::Expectations* const expectations_;
  ReconcilerHooks hooks_;  // set once, in the constructor
  const ControllerOptions options_;
  const kube::Clock* const clock_;
};

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_RECONCILER_H_

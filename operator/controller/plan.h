#ifndef DISTRAIN_OPERATOR_CONTROLLER_PLAN_H_
#define DISTRAIN_OPERATOR_CONTROLLER_PLAN_H_

// The inputs and the output of one reconcile of a DistributedTrainingJob.
//
// Reconcile (reconcile.h) is a pure function:
//   (job, Observed children, Facts, ControllerOptions) -> Plan
// and the reconciler (reconciler.h) applies the Plan through the API. Keeping
// the decision pure is what lets tests/unit/operator/controller check every
// transition table-style without an API server.
//
// Value types; thread-compatible.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"

namespace distrain::controller {

// Knobs of the operator that shape the pods (flags of distrain-operator).
struct ControllerOptions {
  // The image of a replica whose template names none (or has no containers).
  std::string default_image = "localhost/distrain/worker:latest";
  // The image instead of default_image when that replica's main container
  // requests nvidia.com/gpu: the worker's CUDA variant, which carries the
  // cuBLAS, cuDNN and NCCL the CPU image leaves out (worker/Containerfile.cuda).
  std::string default_gpu_image = "localhost/distrain/worker-cuda:latest";
  // The command of a container the operator adds itself (no template
  // containers); a template's own container keeps its command.
  std::vector<std::string> default_command = {"distrain-worker"};
  // DISTRAIN_METRICS_PORT when the main container declares no port named "metrics".
  int default_metrics_port = 9090;
  // Appended to the replicas' host names in TF_CONFIG when set
  // ("cluster.local" gives <pod>.<ns>.svc.cluster.local). Empty: the
  // <pod>.<ns>.svc form, which every pod resolves through its DNS search path.
  std::string cluster_domain;
  // The PersistentVolumeClaim provisioned for a job's checkpoints when the
  // job names no storage of its own (checkpoint_volume.h); the fields of
  // spec.training.checkpoint.storage override these per job.
  struct CheckpointStorageOptions {
    bool provision = true;      // off: no claim; jobs keep only the storage they name
    std::string storage_class;  // "": the cluster's default StorageClass
    std::string size = "1Gi";
    std::string access_mode = "ReadWriteOnce";  // or ReadWriteMany
  };
  CheckpointStorageOptions checkpoint_storage;
  // The scheduler of gang-scheduled pods when runPolicy.scheduling.schedulerName
  // is empty: the scheduler-plugins second scheduler's usual name.
  std::string gang_scheduler_name = "scheduler-plugins-scheduler";
  // The job's NetworkPolicy (network_policy.h).
  struct NetworkPolicyOptions {
    // Off: no policy is created (the cluster's own policies decide), and the
    // operator needs no RBAC on networkpolicies.
    bool enabled = true;
    // NetworkPolicyPeer objects admitted to the pods' metrics port besides
    // the job's own pods: the operator (its progress scrape) and Prometheus.
    std::vector<nlohmann::json> metrics_peers;
  };
  NetworkPolicyOptions network_policy;
};

// A child as the informer caches it: shared, never modified.
using ObjectRef = std::shared_ptr<const nlohmann::json>;

// What the informers show of the job's children, as the API returns them.
struct Observed {
  std::vector<ObjectRef> pods;      // pods labelled distrain.io/job-name=<job>
  std::vector<ObjectRef> services;  // services labelled distrain.io/job-name=<job>
  std::optional<nlohmann::json> pod_group;  // the PodGroup named after the job, if any
  // The job's cluster-spec ConfigMap (pods.h ClusterConfigMapName), if any.
  std::optional<nlohmann::json> cluster_config_map;
  // The job's NetworkPolicy (network_policy.h NetworkPolicyName), if any.
  std::optional<nlohmann::json> network_policy;
  // The job's provisioned checkpoint claim (checkpoint_volume.h), if any.
  std::optional<nlohmann::json> checkpoint_claim;
};

// Facts about the world that are not children of the job.
struct Facts {
  absl::Time now;
  // Whether podgroups.scheduling.x-k8s.io is served (scheduler-plugins installed).
  bool pod_group_crd_installed = false;
  // Since when this operator has been scraping progress (it became leader):
  // no stall is judged over time nobody watched (stall.h step 2), e.g. a
  // lastStepTime left from before an operator restart or failover.
  absl::Time progress_watch_start = absl::InfinitePast();
};

// A child to delete: name, and uid as a delete precondition so that a pod
// recreated under the same name in the meantime is never deleted by mistake.
struct Deletion {
  std::string name;
  std::string uid;
  std::string reason;  // CamelCase, also used in logs ("Restart", "Suspended", ...)
  // The pod has finished (phase Failed or Succeeded: every container has
  // terminated, and restartPolicy Never means none starts again), so nothing
  // of it runs and it is deleted at once (gracePeriodSeconds 0). Its name is
  // then free for the replacement without waiting for the kubelet to confirm
  // the deletion, which is most of a second of an in-place recovery.
  bool finished = false;
  bool operator==(const Deletion&) const = default;
};

// A JSON merge patch of one of the job's pods (its metadata: Kueue's
// retriable-in-group annotation, kueue.h). The patch carries metadata.uid, so
// it fails (409) on a pod recreated under the same name meanwhile.
struct PodPatch {
  std::string name;
  std::string uid;
  nlohmann::json patch;
  bool operator==(const PodPatch&) const = default;
};

// An events.k8s.io/v1 event about the job; `related` names a pod when the
// event is about one.
struct Event {
  std::string type;  // "Normal" or "Warning"
  std::string reason;
  std::string note;
  std::string related;
  bool operator==(const Event&) const = default;
};

struct Plan {
  // The job's cluster-spec ConfigMap, to POST (absent) or PUT (the observed
  // object with new data; its resourceVersion makes a concurrent change fail).
  // Applied before any pod is created: pods read it when they start.
  std::optional<nlohmann::json> config_map_to_create;
  std::optional<nlohmann::json> config_map_to_update;
  // The job's NetworkPolicy, to POST (absent) or PUT (the observed object
  // with the desired spec; its resourceVersion guards the write). Applied
  // before any pod is created: no pod runs unprotected.
  std::optional<nlohmann::json> network_policy_to_create;
  std::optional<nlohmann::json> network_policy_to_update;
  // The job's checkpoint PersistentVolumeClaim, to POST (409: there).
  // Applied before any pod is created: the pods mount it.
  std::optional<nlohmann::json> checkpoint_claim_to_create;
  // Complete objects, ready to POST.
  std::vector<nlohmann::json> pods_to_create;
  std::vector<nlohmann::json> services_to_create;
  std::optional<nlohmann::json> pod_group_to_create;
  // The observed PodGroup with spec.minMember set to the job's gang size
  // again, to PUT after a scale (its resourceVersion guards the write).
  std::optional<nlohmann::json> pod_group_to_update;
  std::vector<Deletion> pods_to_delete;
  std::vector<Deletion> services_to_delete;
  // Applied before pods_to_delete (a pod Kueue holds by its finalizer stays
  // patchable while it terminates); a 404 is no error.
  std::vector<PodPatch> pods_to_patch;
  // The status to write (once, through /status) when status_changed.
  api::JobStatus status;
  bool status_changed = false;
  std::vector<Event> events;
  // Reconcile again after this long even if nothing changes (a deadline, a TTL).
  std::optional<absl::Duration> requeue_after;
  // ttlSecondsAfterFinished has passed: delete the job (its children follow
  // through their owner references).
  bool delete_job = false;

  bool DeletesPod(const std::string& name) const;
  void RequeueAfter(absl::Duration d);  // keeps the earliest
};

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_PLAN_H_

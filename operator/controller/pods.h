#ifndef DISTRAIN_OPERATOR_CONTROLLER_PODS_H_
#define DISTRAIN_OPERATOR_CONTROLLER_PODS_H_

// The desired children of a job: one pod and one headless Service per
// replica, carrying the operator -> worker contract of docs/architecture.md §5.
//
// Naming and DNS. Replica <type> <index> of job J in namespace N is the pod
// and the Service "J-<type>-<index>" (type lower-case: chief, worker, ps,
// evaluator). The Service is headless (clusterIP None), selects exactly that
// pod by its job-name/replica-type/replica-index labels and publishes it
// before it is ready (replicas rendezvous before any readiness), so the name
// "J-<type>-<index>.N.svc" resolves to the pod's IP through every pod's DNS
// search path; that is the host in TF_CONFIG (ControllerOptions::cluster_domain
// appends the cluster domain when a TF image needs a fully qualified name).
// The pod's hostname and subdomain are set to the same name, so its own
// `hostname -f` resolves too.
//
// The main container (named "distrain", else the first) gets:
//   DISTRAIN_TF_CLUSTER     from the job's ConfigMap "J-cluster-spec", key
//                           "cluster": TF_CONFIG's "cluster" object (evaluator
//                           included), hosts on port 2222 or the template's
//                           port named "distrain" or "tfjob-port";
//   TF_CONFIG               {"cluster":$(DISTRAIN_TF_CLUSTER),"task":{...},
//                           "environment":"cloud"}: the kubelet expands the
//                           reference, so the container sees exactly
//                           common/cluster_spec's ToJson, TensorFlow's shape;
//   DISTRAIN_JOB_CONFIG     common/job_config's JobConfigToJson of the spec
//                           (Auto resolved to the strategy chosen here);
//   DISTRAIN_METRICS_PORT   the port named "metrics", else the default;
//   DISTRAIN_CHECKPOINT_DIR when spec.training.checkpoint.dir or the
//                           operator's checkpoint root is set;
//   POD_NAME, POD_NAMESPACE, POD_IP from the downward API;
//   TPU_WORKER_ID, TPU_WORKER_HOSTNAMES on TPU workers (see BuildPod);
// and container ports named "distrain" and "metrics". These override entries
// of the same name in the template: the contract is the operator's.
// It also gets startup, liveness and readiness probes on /healthz at the
// metrics port when it runs distrain-worker (probes.h: timings, and why a
// template's own probes win).
// Why a ConfigMap: every pod lists every host, so inlining the cluster made a
// job's pod specs O(N^2) bytes (25 KB per pod at 500 workers), which the
// operator, the API server and etcd all serialise, store and watch. The
// ConfigMap holds it once; pods stay O(1). The pod only starts once the
// kubelet can read the ConfigMap, which the reconciler creates before any pod.
// The pod's restartPolicy is always Never: restarts are the operator's
// (restart.h), so they are counted, bounded by backoffLimit, and can restart
// several pods together, none of which a kubelet restart can do.
//
// Devices. A job asks for GPUs or TPUs in the main container's resources
// (nvidia.com/gpu, google.com/tpu; a request alone is copied to the limit and
// the other way round, as extended resources need both equal). The operator
// never adds a device request: a job that chooses NCCL
// (spec.training.communication.implementation) without asking for GPUs in
// its Chief and Worker templates is an invalid spec (BuildTopology). Every pod's main
// container gets DISTRAIN_POD_GPUS (the GPUs it holds; the worker refuses to
// hold GPUs it would not use), and one that holds none gets
// NVIDIA_VISIBLE_DEVICES=void unless its template sets it, so a CPU pod does
// not see the node's GPUs through an image that exposes them all.
//
// Pod security. Every pod is made to pass the "restricted" Pod Security
// Standard unless its template says otherwise, field by field: what the
// template sets is kept, what it leaves unset gets the restricted value.
//   spec.automountServiceAccountToken  false (the worker never calls the API;
//                                      a TF image that does sets it true)
//   spec.securityContext.runAsNonRoot  true, unless the template sets it or
//                                      sets runAsUser 0 on the pod or on any
//                                      container (it asked for root). No
//                                      runAsUser is chosen: the kubelet then
//                                      refuses an image whose USER is root
//                                      (CreateContainerConfigError "container
//                                      has runAsNonRoot and image will run as
//                                      root"), and the fix is the template's
//                                      runAsNonRoot false or runAsUser 0. The
//                                      distrain images run as 65532.
//   spec.securityContext.seccompProfile RuntimeDefault
//   every container and initContainer:
//     securityContext.allowPrivilegeEscalation false, unless the container is
//                                      privileged or adds CAP_SYS_ADMIN (the
//                                      API refuses that combination)
//     securityContext.capabilities.drop ["ALL"] (capabilities.add is kept)
// Container-level values override pod-level ones, so a template can opt one
// container out. Pods with spec.os.name windows get only the token setting.
//
// Pure functions; thread-safe.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auto_strategy.h"
#include "common/job_config.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/plan.h"

namespace distrain::controller {

inline constexpr int kDefaultPort = 2222;
inline constexpr char kPortName[] = "distrain";
inline constexpr char kLegacyPortName[] = "tfjob-port";  // Kubeflow TFJob's name
inline constexpr char kMetricsPortName[] = "metrics";
inline constexpr char kMainContainerName[] = "distrain";
inline constexpr char kGpuResource[] = "nvidia.com/gpu";
inline constexpr char kTpuResource[] = "google.com/tpu";
// Hash of the TF_CONFIG cluster a pod was created with: a pod whose hash is
// not the current one belongs to an older membership (elastic.h).
inline constexpr char kClusterHashAnnotation[] = "distrain.io/cluster-spec-hash";
// "true" on a pod whose main container runs distrain-worker (probes.h's
// RunsDistrainWorker): it exports the step counter the operator watches, so
// it can be judged stalled before its first step (stall.h). A user's own
// image (TensorFlow) reports no step and is never judged.
inline constexpr char kReportsProgressAnnotation[] = "distrain.io/reports-progress";
// The job's cluster-spec ConfigMap ("<job>-cluster-spec") and its one key.
inline constexpr char kClusterConfigMapSuffix[] = "-cluster-spec";
inline constexpr char kClusterConfigMapKey[] = "cluster";
// The env var the kubelet fills from that key; TF_CONFIG refers to it.
inline constexpr char kClusterEnv[] = "DISTRAIN_TF_CLUSTER";
// Label scheduler-plugins' coscheduling reads to find a pod's PodGroup.
inline constexpr char kPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";
// Label Kueue reads for the queue of a pod (runPolicy.scheduling.queue, else
// the job's own label of that name; kueue.h adds the pod-group metadata).
inline constexpr char kQueueLabel[] = "kueue.x-k8s.io/queue-name";

// Replica types in TF_CONFIG order.
inline constexpr ReplicaType kAllReplicaTypes[] = {ReplicaType::kChief, ReplicaType::kWorker,
                                                   ReplicaType::kPS, ReplicaType::kEvaluator};

struct ReplicaId {
  ReplicaType type = ReplicaType::kWorker;
  int index = 0;
  bool operator==(const ReplicaId&) const = default;
  auto operator<=>(const ReplicaId&) const = default;
};

// "mnist-worker-0".
std::string ReplicaName(const std::string& job_name, ReplicaType type, int index);

// The replica types' lower-case spelling in labels and names ("worker"), and back.
std::optional<ReplicaType> ReplicaTypeFromTaskType(const std::string& task_type);

// Every replica the spec asks for, Chief first, then Worker, PS, Evaluator.
std::vector<ReplicaId> DesiredReplicas(const JobConfig& config);

// Whether the replica coordinates (the chief, or worker 0 without one): it
// gets distrain.io/job-role=master.
bool IsMaster(const JobConfig& config, ReplicaId id);

// The main container of a pod spec: the one named "distrain", else the first;
// nullptr when there are none.
const nlohmann::json* MainContainer(const nlohmann::json& pod_spec);

// The GPUs (nvidia.com/gpu) the template's main container asks for; 0 if none.
int TemplateGpus(const nlohmann::json& pod_template);

// Everything about the job that is the same for all its pods.
struct Topology {
  JobConfig config;  // the spec, with Auto resolved (see ResolveStrategy)
  std::map<std::string, std::vector<std::string>> cluster;  // TF_CONFIG "cluster"
  std::map<ReplicaType, int> ports;          // TF_CONFIG port per type
  std::map<ReplicaType, int> metrics_ports;  // DISTRAIN_METRICS_PORT per type
  std::string cluster_hash;                  // of `cluster` without the evaluator
  std::string cluster_json;                  // `cluster` in TF_CONFIG's order (the ConfigMap's value)
  std::string job_config_json;               // DISTRAIN_JOB_CONFIG
  std::string auto_reason;  // spec.strategy Auto: why config.strategy (status.strategy)
};

// Resolves spec.strategy Auto from what the job asks for (examples/auto.yaml)
// by the rule table every part shares (common/auto_strategy.h), with the
// GPUs the Worker template requests and no measurement.
// Any other strategy is returned unchanged, with an empty reason.
StrategyChoice ResolveStrategy(const api::DistributedTrainingJob& job);

// Builds the topology; an error (reported as the job's InvalidSpec failure)
// when a derived name is not a valid host name, or when Auto resolves to a
// strategy whose rules the spec breaks. Errors name the field.
absl::StatusOr<Topology> BuildTopology(const api::DistributedTrainingJob& job,
                                       const ControllerOptions& options);

// The complete Pod object for one replica (see the file comment).
nlohmann::json BuildPod(const api::DistributedTrainingJob& job, const Topology& topology,
                        ReplicaId id, const ControllerOptions& options);

// "<job>-cluster-spec".
std::string ClusterConfigMapName(const std::string& job_name);

// The job's ConfigMap holding TF_CONFIG's "cluster" (key "cluster"), labelled
// like the job's children (job name, managed-by), annotated with the cluster
// hash, owned by the job.
nlohmann::json BuildClusterConfigMap(const api::DistributedTrainingJob& job,
                                     const Topology& topology);

// The headless Service of one replica.
nlohmann::json BuildService(const api::DistributedTrainingJob& job, const Topology& topology,
                            ReplicaId id);

// The labels every child of the replica carries (pods and services).
std::map<std::string, std::string> ReplicaLabels(const api::DistributedTrainingJob& job,
                                                 const JobConfig& config, ReplicaId id);

// The ownerReferences entry that makes the job the controller of a child.
nlohmann::json ControllerReference(const api::DistributedTrainingJob& job);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_PODS_H_

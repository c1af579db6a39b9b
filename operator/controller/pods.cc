#include "operator/controller/pods.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auto_strategy.h"
#include "common/check.h"
#include "common/cluster_spec.h"
#include "common/device_use.h"
#include "operator/controller/checkpoint_volume.h"
#include "operator/controller/final_progress.h"
#include "operator/controller/job_identity_secret.h"
#include "operator/controller/kueue.h"
#include "operator/controller/probes.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

// Host names must be DNS-1123 labels and Service names DNS-1035 labels.
constexpr size_t kMaxLabel = 63;

bool PlanHasDeletion(const std::vector<Deletion>& deletions, const std::string& name) {
  for (const Deletion& d : deletions) {
    if (d.name == name) return true;
  }
  return false;
}

// containers[i].ports entry named `name` -> containerPort.
std::optional<int> NamedPort(const Json* container, const std::string& name) {
  if (container == nullptr || !container->contains("ports") || !(*container)["ports"].is_array()) {
    return std::nullopt;
  }
  for (const Json& port : (*container)["ports"]) {
    if (port.is_object() && port.value("name", "") == name && port.contains("containerPort") &&
        port["containerPort"].is_number_integer()) {
      return port["containerPort"].get<int>();
    }
  }
  return std::nullopt;
}

const Json* TemplateMainContainer(const Json& pod_template) {
  if (!pod_template.is_object() || !pod_template.contains("spec")) return nullptr;
  return MainContainer(pod_template["spec"]);
}

int ResourceCount(const Json* container, const char* resource) {
  if (container == nullptr || !container->contains("resources")) return 0;
  const Json& resources = (*container)["resources"];
  for (const char* kind : {"limits", "requests"}) {
    if (!resources.is_object() || !resources.contains(kind) || !resources[kind].is_object()) continue;
    auto it = resources[kind].find(resource);
    if (it == resources[kind].end()) continue;
    if (it->is_number_integer()) return it->get<int>();
    if (it->is_string()) {  // quantities of whole devices, e.g. "4"
      try {
        return std::stoi(it->get<std::string>());
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

// FNV-1a, 64 bit: stable across processes and versions (std::hash is not).
std::string Fnv1aHex(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// Sets name=value in a container's env list, replacing any entry of that name.
void SetEnv(Json* env, const std::string& name, Json entry) {
  for (auto it = env->begin(); it != env->end();) {
    if (it->is_object() && it->value("name", "") == name) {
      it = env->erase(it);
    } else {
      ++it;
    }
  }
  entry["name"] = name;
  env->push_back(std::move(entry));
}

bool HasEnv(const Json& env, const std::string& name) {
  for (const Json& e : env) {
    if (e.is_object() && e.value("name", "") == name) return true;
  }
  return false;
}

// Ensures a container port `name` = `port` (an existing port of that name keeps its number).
void EnsurePort(Json* container, const std::string& name, int port) {
  Json& ports = (*container)["ports"];
  if (!ports.is_array()) ports = Json::array();
  for (Json& p : ports) {
    if (p.is_object() && p.value("name", "") == name) return;
    if (p.is_object() && p.value("containerPort", -1) == port) {
      // Same number under another name (e.g. "tfjob-port"): leave it, ports
      // must be unique per container.
      return;
    }
  }
  ports.push_back({{"name", name}, {"containerPort", port}, {"protocol", "TCP"}});
}

// Extended resources need limits, and requests equal to them when given.
void NormalizeDevice(Json* container, const char* resource, int wanted_if_absent) {
  Json& resources = (*container)["resources"];
  if (!resources.is_object()) resources = Json::object();
  Json& limits = resources["limits"];
  Json& requests = resources["requests"];
  if (!limits.is_object()) limits = Json::object();
  if (!requests.is_object()) requests = Json::object();
  if (!limits.contains(resource) && !requests.contains(resource)) {
    if (wanted_if_absent <= 0) {
      if (limits.empty()) resources.erase("limits");
      if (requests.empty()) resources.erase("requests");
      if (resources.empty()) container->erase("resources");
      return;
    }
    limits[resource] = wanted_if_absent;
  }
  if (!limits.contains(resource)) limits[resource] = requests[resource];
  if (!requests.contains(resource)) requests[resource] = limits[resource];
}

// What the container sees of the node's GPUs. With GPUs requested, the
// device plugin decides which (the runtime sets NVIDIA_VISIBLE_DEVICES to
// them), and the worker learns how many it holds from kPodGpusEnv, so it can
// refuse to train on CPU while holding them (worker/device_use.h). Without,
// NVIDIA_VISIBLE_DEVICES=void keeps the NVIDIA runtime from mounting every
// GPU of the node into a CPU pod — CUDA base images set it to "all" — unless
// the template chose a value itself.
void ExposeGpus(Json* main, int gpus) {
  Json& env = (*main)["env"];
  if (!env.is_array()) env = Json::array();
  SetEnv(&env, kPodGpusEnv, {{"value", std::to_string(gpus)}});
  if (gpus == 0 && !HasEnv(env, "NVIDIA_VISIBLE_DEVICES")) {
    SetEnv(&env, "NVIDIA_VISIBLE_DEVICES", {{"value", "void"}});
  }
}

// A securityContext object of `holder`, made an object if it is not one.
Json& SecurityContext(Json* holder) {
  Json& sc = (*holder)["securityContext"];
  if (!sc.is_object()) sc = Json::object();
  return sc;
}

bool SetsRootUser(const Json& holder) {
  if (!holder.is_object() || !holder.contains("securityContext") ||
      !holder["securityContext"].is_object()) {
    return false;
  }
  const Json& sc = holder["securityContext"];
  return sc.contains("runAsUser") && sc["runAsUser"].is_number_integer() &&
         sc["runAsUser"].get<int64_t>() == 0;
}

bool AddsSysAdmin(const Json& sc) {
  if (!sc.contains("capabilities") || !sc["capabilities"].is_object()) return false;
  const Json& add = sc["capabilities"].value("add", Json::array());
  if (!add.is_array()) return false;
  for (const Json& cap : add) {
    if (cap == "SYS_ADMIN" || cap == "CAP_SYS_ADMIN") return true;
  }
  return false;
}

// The restricted Pod Security Standard's settings, each only where the
// template leaves it unset (pods.h "Pod security").
void ApplySecurityDefaults(Json* spec) {
  if (!spec->contains("automountServiceAccountToken")) {
    (*spec)["automountServiceAccountToken"] = false;
  }
  // Windows pods may not carry the Linux-only fields below (API validation).
  if (spec->contains("os") && (*spec)["os"].is_object() &&
      (*spec)["os"].value("name", "") == "windows") {
    return;
  }
  bool root_asked = SetsRootUser(*spec);
  for (const char* list : {"initContainers", "containers"}) {
    if (!spec->contains(list) || !(*spec)[list].is_array()) continue;
    for (Json& c : (*spec)[list]) {
      if (!c.is_object()) continue;
      root_asked = root_asked || SetsRootUser(c);
      Json& sc = SecurityContext(&c);
      // The API refuses allowPrivilegeEscalation false together with
      // privileged or CAP_SYS_ADMIN: a template asking for those asked for
      // escalation.
      if (!sc.contains("allowPrivilegeEscalation") && !sc.value("privileged", false) &&
          !AddsSysAdmin(sc)) {
        sc["allowPrivilegeEscalation"] = false;
      }
      Json& caps = sc["capabilities"];
      if (!caps.is_object()) caps = Json::object();
      if (!caps.contains("drop")) caps["drop"] = Json::array({"ALL"});
    }
  }
  Json& pod_sc = SecurityContext(spec);
  if (!pod_sc.contains("runAsNonRoot") && !root_asked) pod_sc["runAsNonRoot"] = true;
  if (!pod_sc.contains("seccompProfile")) pod_sc["seccompProfile"] = {{"type", "RuntimeDefault"}};
}

}  // namespace

bool Plan::DeletesPod(const std::string& name) const {
  return PlanHasDeletion(pods_to_delete, name);
}

void Plan::RequeueAfter(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  if (!requeue_after || d < *requeue_after) requeue_after = d;
}

std::string ReplicaName(const std::string& job_name, ReplicaType type, int index) {
  return absl::StrCat(job_name, "-", ReplicaTaskType(type), "-", index);
}

std::optional<ReplicaType> ReplicaTypeFromTaskType(const std::string& task_type) {
  for (ReplicaType t : kAllReplicaTypes) {
    if (task_type == ReplicaTaskType(t)) return t;
  }
  return std::nullopt;
}

std::vector<ReplicaId> DesiredReplicas(const JobConfig& config) {
  std::vector<ReplicaId> out;
  for (ReplicaType t : kAllReplicaTypes) {
    for (int i = 0; i < config.replicas_of(t); ++i) out.push_back({t, i});
  }
  return out;
}

bool IsMaster(const JobConfig& config, ReplicaId id) {
  if (config.replicas_of(ReplicaType::kChief) > 0) return id.type == ReplicaType::kChief;
  return id.type == ReplicaType::kWorker && id.index == 0;
}

const nlohmann::json* MainContainer(const nlohmann::json& pod_spec) {
  if (!pod_spec.is_object() || !pod_spec.contains("containers") ||
      !pod_spec["containers"].is_array() || pod_spec["containers"].empty()) {
    return nullptr;
  }
  for (const Json& c : pod_spec["containers"]) {
    if (c.is_object() && c.value("name", "") == kMainContainerName) return &c;
  }
  return &pod_spec["containers"][0];
}

int TemplateGpus(const nlohmann::json& pod_template) {
  return ResourceCount(TemplateMainContainer(pod_template), kGpuResource);
}

StrategyChoice ResolveStrategy(const api::DistributedTrainingJob& job) {
  const JobConfig& c = job.spec;
  if (c.strategy != StrategyKind::kAuto) return {c.strategy, ""};
  // The GPUs the Worker template asks for stand for the ones the pod will see;
  // nothing is measured here.
  DeviceFacts facts;
  facts.gpus = TemplateGpus(job.Template(ReplicaType::kWorker));
  return ChooseAutoStrategy(c, facts);
}

absl::StatusOr<Topology> BuildTopology(const api::DistributedTrainingJob& job,
                                       const ControllerOptions& options) {
  Topology t;
  t.config = job.spec;
  t.config.name = job.metadata.name;
  t.config.namespace_ = job.metadata.namespace_;
  const std::string& name = job.metadata.name;
  if (name.empty() || !(name[0] >= 'a' && name[0] <= 'z')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata.name: \"", name,
        "\" must start with a lowercase letter: it names the job's Services, which are "
        "DNS-1035 labels; rename the job"));
  }
  for (ReplicaId id : DesiredReplicas(t.config)) {
    const std::string replica = ReplicaName(name, id.type, id.index);
    if (replica.size() > kMaxLabel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata.name: the job's pod and Service \"", replica, "\" would have ",
          replica.size(), " characters, more than the ", kMaxLabel,
          " a host name allows; shorten the job name to at most ",
          name.size() - (replica.size() - kMaxLabel), " characters"));
    }
  }
  if (absl::Status queue = ValidateKueueQueue(job, t.config); !queue.ok()) return queue;
  // NCCL runs on GPUs the template asks for; the operator never adds a GPU
  // request of its own, so a job that asks for NCCL without GPUs fails here,
  // before any pod exists (and so before any pod holds a GPU).
  if (t.config.training.communication.implementation == CollectiveImplementation::kNccl &&
      t.config.strategy != StrategyKind::kTPU) {
    for (ReplicaType type : {ReplicaType::kChief, ReplicaType::kWorker}) {
      if (t.config.replicas_of(type) == 0 || TemplateGpus(job.Template(type)) > 0) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.training.communication.implementation: NCCL all-reduces between GPUs, but "
          "spec.replicaSpecs.", ReplicaTypeName(type),
          ".template requests no nvidia.com/gpu; request one GPU per local replica in its "
          "main container's resources.limits, or use implementation: Ring to train on CPUs"));
    }
  }
  if (t.config.strategy == StrategyKind::kAuto) {
    const StrategyChoice choice = ResolveStrategy(job);
    t.config.strategy = choice.strategy;
    t.auto_reason = choice.reason;
    if (absl::Status valid = ValidateJobConfig(t.config); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.strategy: Auto chose ", StrategyName(t.config.strategy),
                       " for these replicas, and the spec breaks its rules: ", valid.message()));
    }
  }

  const std::string suffix = absl::StrCat(".", job.metadata.namespace_, ".svc",
                                          options.cluster_domain.empty() ? "" : ".",
                                          options.cluster_domain);
  for (ReplicaType type : kAllReplicaTypes) {
    const int n = t.config.replicas_of(type);
    if (n == 0) continue;
    const Json* main = TemplateMainContainer(job.Template(type));
    const int port =
        NamedPort(main, kPortName).value_or(NamedPort(main, kLegacyPortName).value_or(kDefaultPort));
    t.ports[type] = port;
    t.metrics_ports[type] = NamedPort(main, kMetricsPortName).value_or(options.default_metrics_port);
    std::vector<std::string>& hosts = t.cluster[ReplicaTaskType(type)];
    for (int i = 0; i < n; ++i) {
      hosts.push_back(absl::StrCat(ReplicaName(name, type, i), suffix, ":", port));
    }
  }
  // Validates the cluster the way the worker will (TensorFlow's rules).
  absl::StatusOr<ClusterSpec> check = ClusterSpec::Create(t.cluster, TaskId{"worker", 0});
  if (!check.ok()) return check.status();
  // The training cluster only: the evaluator coming or going changes no ring.
  Json training_cluster(check->TrainingCluster().jobs());
  t.cluster_hash = Fnv1aHex(training_cluster.dump());
  // ClusterSpec::ToJson's "cluster", so the kubelet's expansion of TF_CONFIG
  // gives ToJson's bytes exactly.
  t.cluster_json = nlohmann::ordered_json::parse(check->ToJson())["cluster"].dump();
  // spec.strategy Auto reaches the worker as Auto: it decides again with the
  // same table on what it finds — the GPUs it sees and the bandwidths it
  // measures, which the operator cannot know. The rows that shape the pods
  // depend on the replicas only, so its choice always fits the pods planned
  // here; it reports the choice, which becomes status.strategy.
  JobConfig passed = t.config;
  if (job.spec.strategy == StrategyKind::kAuto) passed.strategy = StrategyKind::kAuto;
  t.job_config_json = JobConfigToJson(passed);
  return t;
}

nlohmann::json ControllerReference(const api::DistributedTrainingJob& job) {
  return {{"apiVersion", api::kApiVersion},
          {"kind", api::kKind},
          {"name", job.metadata.name},
          {"uid", job.metadata.uid},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::map<std::string, std::string> ReplicaLabels(const api::DistributedTrainingJob& job,
                                                 const JobConfig& config, ReplicaId id) {
  std::map<std::string, std::string> labels = {
      {api::kLabelJobName, job.metadata.name},
      {api::kLabelReplicaType, ReplicaTaskType(id.type)},
      {api::kLabelReplicaIndex, std::to_string(id.index)},
      {api::kLabelManagedBy, api::kManagedBy},
  };
  if (IsMaster(config, id)) labels[api::kLabelJobRole] = "master";
  return labels;
}

nlohmann::json BuildPod(const api::DistributedTrainingJob& job, const Topology& topology,
                        ReplicaId id, const ControllerOptions& options) {
  const JobConfig& config = topology.config;
  const std::string name = ReplicaName(job.metadata.name, id.type, id.index);
  const Json& tmpl = job.Template(id.type);
  Json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}};

  // metadata: the template's labels and annotations, then ours.
  Json metadata = Json::object();
  if (tmpl.is_object() && tmpl.contains("metadata") && tmpl["metadata"].is_object()) {
    for (const char* key : {"labels", "annotations"}) {
      if (tmpl["metadata"].contains(key) && tmpl["metadata"][key].is_object()) {
        metadata[key] = tmpl["metadata"][key];
      }
    }
  }
  metadata["name"] = name;
  metadata["namespace"] = job.metadata.namespace_;
  for (const auto& [k, v] : ReplicaLabels(job, config, id)) metadata["labels"][k] = v;
  const SchedulingPolicy& scheduling = config.run_policy.scheduling;
  if (scheduling.gang) metadata["labels"][kPodGroupLabel] = job.metadata.name;
  AddKueuePodGroup(job, config, id, &metadata);  // a Kueue pod group when it names a queue
  metadata["annotations"][kClusterHashAnnotation] = topology.cluster_hash;
  metadata["ownerReferences"] = Json::array({ControllerReference(job)});
  pod["metadata"] = std::move(metadata);

  // spec: the template's, with what the contract needs.
  Json spec = tmpl.is_object() && tmpl.contains("spec") && tmpl["spec"].is_object()
                  ? tmpl["spec"]
                  : Json::object();
  spec["restartPolicy"] = "Never";  // restarts are the operator's (file comment)
  spec["hostname"] = name;
  spec["subdomain"] = name;
  if (scheduling.gang) {
    spec["schedulerName"] =
        scheduling.scheduler_name.empty() ? options.gang_scheduler_name : scheduling.scheduler_name;
  } else if (!scheduling.scheduler_name.empty()) {
    spec["schedulerName"] = scheduling.scheduler_name;
  }
  if (!scheduling.priority_class.empty()) spec["priorityClassName"] = scheduling.priority_class;

  if (!spec.contains("containers") || !spec["containers"].is_array() ||
      spec["containers"].empty()) {
    spec["containers"] = Json::array(
        {{{"name", kMainContainerName}, {"image", options.default_image},
          {"command", options.default_command}}});
  }
  Json* main = nullptr;
  for (Json& c : spec["containers"]) {
    if (c.is_object() && c.value("name", "") == kMainContainerName) main = &c;
  }
  if (main == nullptr) main = &spec["containers"][0];
  if (!main->is_object()) *main = Json::object();
  if (!main->contains("name")) (*main)["name"] = kMainContainerName;
  if (!main->contains("image") || (*main)["image"] == "") {
    (*main)["image"] = ResourceCount(main, kGpuResource) > 0 ? options.default_gpu_image
                                                             : options.default_image;
  }

  // Environment.
  Json env = main->contains("env") && (*main)["env"].is_array() ? (*main)["env"] : Json::array();
  // TF_CONFIG refers to DISTRAIN_TF_CLUSTER, so it must come after it (the
  // kubelet expands $(VAR) only from variables defined earlier in the list).
  SetEnv(&env, kClusterEnv,
         {{"valueFrom",
           {{"configMapKeyRef",
             {{"name", ClusterConfigMapName(job.metadata.name)},
              {"key", kClusterConfigMapKey}}}}}});
  // BuildTopology validated the cluster and DesiredReplicas the index; the
  // task's spelling is ClusterSpec::ToJson's.
  nlohmann::ordered_json task = {{"type", ReplicaTaskType(id.type)}, {"index", id.index}};
  SetEnv(&env, "TF_CONFIG",
         {{"value", absl::StrCat("{\"cluster\":$(", kClusterEnv, "),\"task\":", task.dump(),
                                 ",\"environment\":\"cloud\"}")}});
  SetEnv(&env, "DISTRAIN_JOB_CONFIG", {{"value", topology.job_config_json}});
  const int metrics_port = topology.metrics_ports.at(id.type);
  SetEnv(&env, "DISTRAIN_METRICS_PORT", {{"value", std::to_string(metrics_port)}});
  // The checkpoint volume and where it is mounted (checkpoint_volume.h).
  const std::string checkpoint_dir = MountCheckpointStorage(
      ResolveCheckpointStorage(job, config, options.checkpoint_storage), config, id,
      &pod["metadata"], &spec, main);
  if (!checkpoint_dir.empty()) SetEnv(&env, "DISTRAIN_CHECKPOINT_DIR", {{"value", checkpoint_dir}});
  // This task's credentials of the job (job_identity_secret.h).
  MountJobIdentity(job, config, id, &spec, main, &env);
  // Where the chief leaves its final figures for the kubelet (final_progress.h).
  SetEnv(&env, kTerminationMessageEnv, {{"value", TerminationMessagePath(*main)}});
  SetEnv(&env, "POD_NAME",
         {{"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "metadata.name"}}}}}});
  SetEnv(&env, "POD_NAMESPACE",
         {{"valueFrom",
           {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "metadata.namespace"}}}}}});
  // The worker binds its servers to the pod IP (common/net.h ListenHost).
  SetEnv(&env, "POD_IP",
         {{"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "status.podIP"}}}}}});
  if (config.strategy == StrategyKind::kTPU && id.type == ReplicaType::kWorker) {
    // What libtpu (and so TensorFlow's TPUClusterResolver(tpu="local") on a
    // TPU VM) reads to form a multi-host slice. GKE injects these only into
    // Indexed Jobs (https://cloud.google.com/kubernetes-engine/docs/how-to/tpus,
    // "TPU_WORKER_ID: a unique integer for each Pod ... TPU_WORKER_HOSTNAMES:
    // a comma-separated list of TPU VM hostnames ... ordered and zero indexed
    // by the TPU_WORKER_ID"); the operator makes bare pods, so it sets them
    // from the Worker replicas' stable names. A template's own values win.
    std::vector<std::string> hosts;
    for (int i = 0; i < config.replicas_of(ReplicaType::kWorker); ++i) {
      hosts.push_back(absl::StrCat(ReplicaName(job.metadata.name, ReplicaType::kWorker, i), ".",
                                   job.metadata.namespace_, ".svc",
                                   options.cluster_domain.empty() ? "" : ".",
                                   options.cluster_domain));
    }
    if (!HasEnv(env, "TPU_WORKER_ID")) {
      SetEnv(&env, "TPU_WORKER_ID", {{"value", std::to_string(id.index)}});
    }
    if (!HasEnv(env, "TPU_WORKER_HOSTNAMES")) {
      SetEnv(&env, "TPU_WORKER_HOSTNAMES", {{"value", absl::StrJoin(hosts, ",")}});
    }
  }
  (*main)["env"] = std::move(env);

  // Ports.
  if (!NamedPort(main, kLegacyPortName)) EnsurePort(main, kPortName, topology.ports.at(id.type));
  EnsurePort(main, kMetricsPortName, metrics_port);
  // Startup, liveness and readiness on /healthz (probes.h).
  AddHealthProbes(main, metrics_port, options);
  if (RunsDistrainWorker(*main, options)) {
    pod["metadata"]["annotations"][kReportsProgressAnnotation] = "true";
  }

  // Devices: as the template asks, never more.
  NormalizeDevice(main, kGpuResource, 0);
  NormalizeDevice(main, kTpuResource, 0);
  ExposeGpus(main, ResourceCount(main, kGpuResource));

  ApplySecurityDefaults(&spec);
  pod["spec"] = std::move(spec);
  return pod;
}

std::string ClusterConfigMapName(const std::string& job_name) {
  return absl::StrCat(job_name, kClusterConfigMapSuffix);
}

nlohmann::json BuildClusterConfigMap(const api::DistributedTrainingJob& job,
                                     const Topology& topology) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", ClusterConfigMapName(job.metadata.name)},
            {"namespace", job.metadata.namespace_},
            {"labels",
             {{api::kLabelJobName, job.metadata.name}, {api::kLabelManagedBy, api::kManagedBy}}},
            {"annotations", {{kClusterHashAnnotation, topology.cluster_hash}}},
            {"ownerReferences", Json::array({ControllerReference(job)})}}},
          {"data", {{kClusterConfigMapKey, topology.cluster_json}}}};
}

nlohmann::json BuildService(const api::DistributedTrainingJob& job, const Topology& topology,
                            ReplicaId id) {
  const std::string name = ReplicaName(job.metadata.name, id.type, id.index);
  Json labels(ReplicaLabels(job, topology.config, id));
  Json selector = {{api::kLabelJobName, job.metadata.name},
                   {api::kLabelReplicaType, ReplicaTaskType(id.type)},
                   {api::kLabelReplicaIndex, std::to_string(id.index)}};
  const int port = topology.ports.at(id.type);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", name},
            {"namespace", job.metadata.namespace_},
            {"labels", std::move(labels)},
            {"ownerReferences", Json::array({ControllerReference(job)})}}},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},
            {"selector", std::move(selector)},
            {"ports", Json::array({{{"name", kPortName},
                                    {"port", port},
                                    {"targetPort", port},
                                    {"protocol", "TCP"}}})}}}};
}

}  // namespace distrain::controller

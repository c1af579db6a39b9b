#include "operator/controller/pods.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "common/device_use.h"
#include "common/auto_strategy.h"
#include "common/job_config.h"
#include "operator/controller/checkpoint_volume.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using testing::Json;
using testing::MakeJob;
using testing::Names;
using testing::World;

// The env entry `name` of the pod's main container, or null.
Json Env(const Json& pod, const std::string& name) {
  const Json* main = MainContainer(pod["spec"]);
  for (const Json& e : (*main)["env"]) {
    if (e["name"] == name) return e;
  }
  return Json();
}

std::string EnvValue(const Json& pod, const std::string& name) {
  Json e = Env(pod, name);
  return e.is_null() ? "<unset>" : e["value"].get<std::string>();
}

// TF_CONFIG as the container sees it: the pod's env expanded the way the
// kubelet does, with the World's ConfigMap.
std::string TfConfig(const Json& pod, const World& w) {
  std::map<std::string, std::string> env = testing::KubeletEnv(pod, testing::ConfigMaps(w.config_map));
  auto it = env.find("TF_CONFIG");
  return it == env.end() ? "<unset>" : it->second;
}

std::optional<int> PortNamed(const Json& pod, const std::string& name) {
  for (const Json& p : (*MainContainer(pod["spec"]))["ports"]) {
    if (p.value("name", "") == name) return p["containerPort"].get<int>();
  }
  return std::nullopt;
}

struct TopologyCase {
  std::string name;
  std::string spec;
  std::vector<std::string> pods;  // in TF_CONFIG order
  std::map<std::string, std::vector<std::string>> cluster;
  std::string strategy_in_job_config;
};

std::string Host(const std::string& replica, int port = 2222) {
  return absl::StrCat(replica, ".team-a.svc:", port);
}

std::vector<TopologyCase> TopologyCases() {
  return {
      {"OneDevice", "  strategy: OneDevice\n  replicaSpecs:\n    Worker: {replicas: 1}\n",
       {"mnist-worker-0"},
       {{"worker", {Host("mnist-worker-0")}}},
       "OneDevice"},
      {"Mirrored",
       "  strategy: Mirrored\n  replicaSpecs:\n    Worker: {replicas: 1}\n"
       "  training: {localReplicas: 4, globalBatchSize: 64}\n",
       {"mnist-worker-0"},
       {{"worker", {Host("mnist-worker-0")}}},
       "Mirrored"},
      {"CentralStorage",
       "  strategy: CentralStorage\n  replicaSpecs:\n    Worker: {replicas: 1}\n",
       {"mnist-worker-0"},
       {{"worker", {Host("mnist-worker-0")}}},
       "CentralStorage"},
      {"MultiWorkerMirroredWithChief",
       "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
       "    Worker: {replicas: 3}\n  training: {globalBatchSize: 128}\n",
       {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"},
       {{"chief", {Host("mnist-chief-0")}},
        {"worker", {Host("mnist-worker-0"), Host("mnist-worker-1"), Host("mnist-worker-2")}}},
       "MultiWorkerMirrored"},
      {"MultiWorkerMirroredWorkersAndEvaluator",
       "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 2}\n"
       "    Evaluator: {replicas: 1}\n  training: {globalBatchSize: 128}\n",
       {"mnist-worker-0", "mnist-worker-1", "mnist-evaluator-0"},
       {{"worker", {Host("mnist-worker-0"), Host("mnist-worker-1")}},
        {"evaluator", {Host("mnist-evaluator-0")}}},
       "MultiWorkerMirrored"},
      {"ParameterServer",
       "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
       "    Worker: {replicas: 2}\n    PS: {replicas: 2}\n    Evaluator: {replicas: 1}\n",
       {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-ps-0", "mnist-ps-1",
        "mnist-evaluator-0"},
       {{"chief", {Host("mnist-chief-0")}},
        {"worker", {Host("mnist-worker-0"), Host("mnist-worker-1")}},
        {"ps", {Host("mnist-ps-0"), Host("mnist-ps-1")}},
        {"evaluator", {Host("mnist-evaluator-0")}}},
       "ParameterServer"},
      {"TPU", "  strategy: TPU\n  replicaSpecs:\n    Worker: {replicas: 2}\n",
       {"mnist-worker-0", "mnist-worker-1"},
       {{"worker", {Host("mnist-worker-0"), Host("mnist-worker-1")}}},
       "TPU"},
      {"AutoSeveralPodsIsMultiWorkerMirrored",
       "  strategy: Auto\n  replicaSpecs:\n    Worker: {replicas: 2}\n"
       "  training: {globalBatchSize: 64}\n",
       {"mnist-worker-0", "mnist-worker-1"},
       {{"worker", {Host("mnist-worker-0"), Host("mnist-worker-1")}}},
       "MultiWorkerMirrored"},
      {"AutoOnePodWithGpusIsMirrored",
       "  strategy: Auto\n  replicaSpecs:\n    Worker:\n      replicas: 1\n      template:\n"
       "        spec:\n          containers:\n          - name: distrain\n"
       "            resources: {limits: {nvidia.com/gpu: 2}}\n",
       {"mnist-worker-0"},
       {{"worker", {Host("mnist-worker-0")}}},
       "Mirrored"},
      {"AutoOnePodOnCpuIsOneDevice", "  strategy: Auto\n  replicaSpecs:\n    Worker: {replicas: 1}\n",
       {"mnist-worker-0"},
       {{"worker", {Host("mnist-worker-0")}}},
       "OneDevice"},
      {"AutoWithPsIsParameterServer",
       "  strategy: Auto\n  replicaSpecs:\n    Chief: {replicas: 1}\n    Worker: {replicas: 1}\n"
       "    PS: {replicas: 1}\n",
       {"mnist-chief-0", "mnist-worker-0", "mnist-ps-0"},
       {{"chief", {Host("mnist-chief-0")}},
        {"worker", {Host("mnist-worker-0")}},
        {"ps", {Host("mnist-ps-0")}}},
       "ParameterServer"},
  };
}

class TopologyTest : public ::testing::TestWithParam<TopologyCase> {};

TEST_P(TopologyTest, DesiredPodsServicesAndTfConfig) {
  const TopologyCase& c = GetParam();
  World w{MakeJob(c.spec)};
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_create), ElementsAreArray(c.pods));
  EXPECT_THAT(Names(plan.services_to_create), ElementsAreArray(c.pods));
  for (const Json& pod : plan.pods_to_create) {
    const std::string name = pod["metadata"]["name"];
    SCOPED_TRACE(name);
    // TF_CONFIG parses with the worker's parser, names this pod's task, and
    // lists exactly the expected cluster.
    const std::string tf_config = TfConfig(pod, w);
    absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(tf_config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->jobs(), c.cluster);
    // Byte for byte what the operator put in the pod before the cluster moved
    // to the ConfigMap: common/cluster_spec's TF_CONFIG for this task.
    absl::StatusOr<ClusterSpec> direct = ClusterSpec::Create(c.cluster, spec->task());
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(tf_config, direct->ToJson());
    EXPECT_EQ(spec->environment(), "cloud");
    EXPECT_EQ(spec->task().type, pod["metadata"]["labels"][api::kLabelReplicaType]);
    EXPECT_EQ(std::to_string(spec->task().index),
              pod["metadata"]["labels"][api::kLabelReplicaIndex]);
    EXPECT_EQ(name, ReplicaName("mnist", *ReplicaTypeFromTaskType(spec->task().type),
                                spec->task().index));
    // Exactly TensorFlow's top-level keys.
    Json tf = Json::parse(tf_config);
    std::set<std::string> keys;
    for (const auto& [k, v] : tf.items()) keys.insert(k);
    EXPECT_EQ(keys, (std::set<std::string>{"cluster", "task", "environment"}));
    // DISTRAIN_JOB_CONFIG is what the worker parses. Auto stays Auto there,
    // and the worker, seeing the GPUs its pod holds, resolves it to what the
    // pods were planned for.
    absl::StatusOr<JobConfig> config = ParseJobConfigJson(EnvValue(pod, "DISTRAIN_JOB_CONFIG"));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->strategy, w.job.spec.strategy);
    JobConfig seen = *config;
    if (seen.strategy == StrategyKind::kAuto) {
      DeviceFacts facts;
      facts.gpus = std::stoi(EnvValue(pod, kPodGpusEnv));
      auto resolved = ResolveAutoStrategy(seen, facts);
      ASSERT_TRUE(resolved.ok()) << resolved.status();
      seen = resolved->first;
    }
    EXPECT_EQ(StrategyName(seen.strategy), c.strategy_in_job_config);
    EXPECT_TRUE(ValidateJobConfig(*config).ok());
    EXPECT_EQ(config->name, "mnist");
    EXPECT_EQ(config->namespace_, "team-a");
    EXPECT_EQ(config->training, w.job.spec.training);
    EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
    EXPECT_EQ(pod["spec"]["hostname"], name);
    EXPECT_EQ(pod["spec"]["subdomain"], name);
  }
  // Each Service selects exactly its pod.
  for (size_t i = 0; i < plan.services_to_create.size(); ++i) {
    const Json& svc = plan.services_to_create[i];
    const Json& pod = plan.pods_to_create[i];
    EXPECT_EQ(svc["spec"]["clusterIP"], "None");
    EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
    int matching = 0;
    for (const Json& other : plan.pods_to_create) {
      bool all = true;
      for (const auto& [k, v] : svc["spec"]["selector"].items()) {
        all = all && other["metadata"]["labels"].value(k, "") == v;
      }
      matching += all;
    }
    EXPECT_EQ(matching, 1) << svc["metadata"]["name"];
    for (const auto& [k, v] : svc["spec"]["selector"].items()) {
      EXPECT_EQ(pod["metadata"]["labels"][k], v);
    }
    EXPECT_EQ(svc["spec"]["ports"][0]["port"], 2222);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, TopologyTest, ::testing::ValuesIn(TopologyCases()),
                         [](const auto& info) { return info.param.name; });

TEST(TopologyTest, EveryExampleGetsPodsTheWorkerAccepts) {
  int examples = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DISTRAIN_SOURCE_DIR) + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<api::DistributedTrainingJob> job = api::ParseJobYamlText(text.str());
    ASSERT_TRUE(job.ok()) << job.status();
    job->metadata.uid = "u";
    World w(*job);
    Plan plan = w.Step();
    EXPECT_TRUE(w.job.status.IsTrue(api::kConditionCreated));
    ASSERT_EQ(plan.pods_to_create.size(), DesiredReplicas(job->spec).size());
    for (const Json& pod : plan.pods_to_create) {
      absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(TfConfig(pod, w));
      ASSERT_TRUE(spec.ok()) << spec.status();
      absl::StatusOr<JobConfig> config = ParseJobConfigJson(EnvValue(pod, "DISTRAIN_JOB_CONFIG"));
      ASSERT_TRUE(config.ok()) << config.status();
      EXPECT_TRUE(ValidateJobConfig(*config).ok());
      // Auto reaches the worker as Auto (it decides on its own devices), and
      // then chooses what the operator planned the pods for.
      EXPECT_EQ(config->strategy, job->spec.strategy);
      if (config->strategy == StrategyKind::kAuto) {
        auto resolved = ResolveAutoStrategy(*config, DeviceFacts{});
        ASSERT_TRUE(resolved.ok()) << resolved.status();
        absl::StatusOr<Topology> planned = BuildTopology(*job, ControllerOptions{});
        ASSERT_TRUE(planned.ok()) << planned.status();
        EXPECT_EQ(resolved->first.strategy, planned->config.strategy);
      }
    }
  }
  EXPECT_GE(examples, 7);
}

const char kMwms[] =
    "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
    "    Worker: {replicas: 2}\n  training: {globalBatchSize: 60}\n";

TEST(BuildPodTest, LabelsOwnerAndRole) {
  World w{MakeJob(kMwms)};
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 3u);
  for (const Json& pod : plan.pods_to_create) {
    const Json& labels = pod["metadata"]["labels"];
    EXPECT_EQ(labels[api::kLabelJobName], "mnist");
    EXPECT_EQ(labels[api::kLabelManagedBy], "distrain-operator");
    EXPECT_EQ(labels.contains(api::kLabelJobRole), pod["metadata"]["name"] == "mnist-chief-0");
    ASSERT_EQ(pod["metadata"]["ownerReferences"].size(), 1u);
    const Json& owner = pod["metadata"]["ownerReferences"][0];
    EXPECT_EQ(owner["apiVersion"], "distrain.io/v1alpha1");
    EXPECT_EQ(owner["kind"], "DistributedTrainingJob");
    EXPECT_EQ(owner["name"], "mnist");
    EXPECT_EQ(owner["uid"], "uid-mnist");
    EXPECT_EQ(owner["controller"], true);
    EXPECT_EQ(owner["blockOwnerDeletion"], true);
    EXPECT_EQ(pod["metadata"]["namespace"], "team-a");
  }
  EXPECT_EQ(plan.services_to_create[0]["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  // Without a chief, worker 0 is the master.
  World no_chief{MakeJob(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 2}\n")};
  Plan p2 = no_chief.Step();
  EXPECT_EQ(p2.pods_to_create[0]["metadata"]["labels"][api::kLabelJobRole], "master");
  EXPECT_FALSE(p2.pods_to_create[1]["metadata"]["labels"].contains(api::kLabelJobRole));
}

TEST(BuildPodTest, ContractEnvPortsAndDefaultContainer) {
  World w{MakeJob(kMwms)};
  Plan plan = w.Step();
  const Json& pod = plan.pods_to_create[1];
  const Json* main = MainContainer(pod["spec"]);
  ASSERT_NE(main, nullptr);
  EXPECT_EQ((*main)["name"], "distrain");
  EXPECT_EQ((*main)["image"], w.options.default_image);
  EXPECT_EQ((*main)["command"], Json::array({"distrain-worker"}));
  EXPECT_EQ(EnvValue(pod, "DISTRAIN_METRICS_PORT"), "9090");
  EXPECT_EQ(Env(pod, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
  EXPECT_EQ(Env(pod, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace");
  EXPECT_EQ(Env(pod, "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  EXPECT_EQ(EnvValue(pod, "DISTRAIN_CHECKPOINT_DIR"), "<unset>");
  EXPECT_EQ(PortNamed(pod, "distrain"), 2222);
  EXPECT_EQ(PortNamed(pod, "metrics"), 9090);
  EXPECT_TRUE(Env(pod, "TPU_WORKER_ID").is_null());
  EXPECT_FALSE(main->contains("resources"));  // no devices asked for
}

TEST(BuildPodTest, TemplateIsKeptAndTheContractOverridesIt) {
  World w{MakeJob(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker:
      replicas: 2
      template:
        metadata:
          labels: {team: vision}
          annotations: {owner: me}
        spec:
          nodeSelector: {pool: cpu}
          restartPolicy: OnFailure
          containers:
          - name: sidecar
            image: busybox
          - name: distrain
            image: my/tf:1
            env:
            - {name: TF_CONFIG, value: "{}"}
            - {name: KEEP, value: "yes"}
            ports:
            - {name: tfjob-port, containerPort: 3333}
            - {name: metrics, containerPort: 9400}
  training: {globalBatchSize: 64}
)")};
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 2u);
  const Json& pod = plan.pods_to_create[0];
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "vision");
  EXPECT_EQ(pod["metadata"]["annotations"]["owner"], "me");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "cpu");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["containers"][0]["name"], "sidecar");
  EXPECT_FALSE(pod["spec"]["containers"][0].contains("env"));
  EXPECT_EQ(pod["spec"]["containers"][1]["image"], "my/tf:1");
  EXPECT_EQ(EnvValue(pod, "KEEP"), "yes");
  int tf_configs = 0;
  for (const Json& e : (*MainContainer(pod["spec"]))["env"]) tf_configs += e["name"] == "TF_CONFIG";
  EXPECT_EQ(tf_configs, 1);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(TfConfig(pod, w));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->addresses("worker"),
            (std::vector<std::string>{Host("mnist-worker-0", 3333), Host("mnist-worker-1", 3333)}));
  EXPECT_FALSE(PortNamed(pod, "distrain").has_value());  // tfjob-port serves
  EXPECT_EQ(EnvValue(pod, "DISTRAIN_METRICS_PORT"), "9400");
  EXPECT_EQ(plan.services_to_create[0]["spec"]["ports"][0]["port"], 3333);
}

// A job of `strategy` with one Worker whose main container lists
// `resources` (e.g. "{limits: {nvidia.com/gpu: 2}}") and `extra` lines.
api::DistributedTrainingJob GpuWorkerJob(const std::string& strategy, const std::string& resources,
                                         const std::string& extra = "") {
  return MakeJob("  strategy: " + strategy + R"(
  replicaSpecs:
    Worker:
      template:
        spec:
          containers:
          - name: distrain
)" + extra + "            resources: " + resources + "\n");
}

TEST(BuildPodTest, GpuRequestsAreNormalised) {
  World mirrored{GpuWorkerJob("Mirrored", "{limits: {nvidia.com/gpu: 4, cpu: \"8\"}}")};
  Json pod = mirrored.Step().pods_to_create.at(0);
  const Json& res = (*MainContainer(pod["spec"]))["resources"];
  EXPECT_EQ(res["limits"][kGpuResource], 4);
  EXPECT_EQ(res["requests"][kGpuResource], 4);
  EXPECT_EQ(res["limits"]["cpu"], "8");
  EXPECT_FALSE(res["requests"].contains("cpu"));
}

// NCCL runs on the GPUs the templates ask for: the operator adds no device
// request, and a job asking for NCCL without GPUs in a training template is
// refused before any pod exists, naming the field and the template.
TEST(BuildPodTest, NcclWithoutGpusInATrainingTemplateIsAnInvalidSpec) {
  const std::string without = R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Chief: {replicas: 1}
    Worker: {replicas: 1}
    Evaluator: {replicas: 1}
  training:
    localReplicas: 2
    globalBatchSize: 64
    communication: {implementation: NCCL}
)";
  absl::StatusOr<Topology> refused = BuildTopology(MakeJob(without), ControllerOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::StartsWith("spec.training.communication.implementation: NCCL"));
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("spec.replicaSpecs.Chief.template requests no nvidia.com/gpu"));

  World nccl{MakeJob(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Chief:
      template:
        spec:
          containers: [{name: distrain, resources: {limits: {nvidia.com/gpu: 2}}}]
    Worker:
      template:
        spec:
          containers: [{name: distrain, resources: {limits: {nvidia.com/gpu: 2}}}]
    Evaluator: {replicas: 1}
  training:
    localReplicas: 2
    globalBatchSize: 64
    communication: {implementation: NCCL}
)")};
  Plan plan = nccl.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 3u);
  for (int i : {0, 1}) {
    const Json& r = (*MainContainer(plan.pods_to_create[i]["spec"]))["resources"];
    EXPECT_EQ(r["limits"][kGpuResource], 2);
    EXPECT_EQ(r["requests"][kGpuResource], 2);
  }
  EXPECT_FALSE((*MainContainer(plan.pods_to_create[2]["spec"])).contains("resources"))
      << "the evaluator asked for nothing and gets nothing";
}

// The CPU worker image has no cuBLAS, cuDNN or NCCL: a replica that requests
// GPUs and names no image gets the CUDA variant, with the same probes; an
// image the template names is kept.
TEST(BuildPodTest, GpuReplicasWithoutAnImageGetTheWorkersCudaImage) {
  World w{GpuWorkerJob("Mirrored", "{limits: {nvidia.com/gpu: 2}}")};
  const Json pod = w.Step().pods_to_create.at(0);
  const Json* main = MainContainer(pod["spec"]);
  ASSERT_NE(main, nullptr);
  EXPECT_EQ((*main)["image"], w.options.default_gpu_image);
  EXPECT_NE(w.options.default_gpu_image, w.options.default_image);
  EXPECT_TRUE(main->contains("readinessProbe")) << "the CUDA image runs distrain-worker too";
  EXPECT_EQ(pod["metadata"]["annotations"].value(kReportsProgressAnnotation, ""), "true");

  World own{GpuWorkerJob("Mirrored", "{limits: {nvidia.com/gpu: 1}}",
                         "            image: registry.example/team/trainer:7\n")};
  EXPECT_EQ((*MainContainer(own.Step().pods_to_create.at(0)["spec"]))["image"],
            "registry.example/team/trainer:7");

  World cpu{MakeJob(kMwms)};
  for (const Json& p : cpu.Step().pods_to_create) {
    EXPECT_EQ((*MainContainer(p["spec"]))["image"], cpu.options.default_image);
  }
}

TEST(BuildPodTest, PodsSayWhatGpusTheyHoldAndCpuPodsSeeNone) {
  World gpus{GpuWorkerJob("Mirrored", "{requests: {nvidia.com/gpu: 2}}")};
  const Json gpu_pod = gpus.Step().pods_to_create.at(0);
  EXPECT_EQ(EnvValue(gpu_pod, kPodGpusEnv), "2");
  EXPECT_EQ(EnvValue(gpu_pod, "NVIDIA_VISIBLE_DEVICES"), "<unset>")
      << "the device plugin chooses which GPUs a requesting pod sees";

  World cpu{MakeJob(kMwms)};
  for (const Json& pod : cpu.Step().pods_to_create) {
    EXPECT_EQ(EnvValue(pod, kPodGpusEnv), "0");
    EXPECT_EQ(EnvValue(pod, "NVIDIA_VISIBLE_DEVICES"), "void");
  }

  World chose{MakeJob(R"(  strategy: OneDevice
  replicaSpecs:
    Worker:
      template:
        spec:
          containers:
          - name: distrain
            env: [{name: NVIDIA_VISIBLE_DEVICES, value: "all"}]
)")};
  EXPECT_EQ(EnvValue(chose.Step().pods_to_create.at(0), "NVIDIA_VISIBLE_DEVICES"), "all");
}

TEST(BuildPodTest, TpuWorkersGetTheTpuEnvironment) {
  World w{MakeJob(R"(  strategy: TPU
  replicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: distrain
            image: tensorflow/tensorflow:2.21.0
            resources: {requests: {google.com/tpu: 4}}
)")};
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 2u);
  for (int i : {0, 1}) {
    const Json& pod = plan.pods_to_create[i];
    EXPECT_EQ(EnvValue(pod, "TPU_WORKER_ID"), std::to_string(i));
    EXPECT_EQ(EnvValue(pod, "TPU_WORKER_HOSTNAMES"),
              "mnist-worker-0.team-a.svc,mnist-worker-1.team-a.svc");
    const Json& res = (*MainContainer(pod["spec"]))["resources"];
    EXPECT_EQ(res["limits"][kTpuResource], 4);
    EXPECT_EQ(res["requests"][kTpuResource], 4);
    EXPECT_EQ((*MainContainer(pod["spec"]))["image"], "tensorflow/tensorflow:2.21.0");
  }
}

TEST(BuildPodTest, OptionsShapeHostsAndCheckpointDir) {
  World w{MakeJob(kMwms)};
  w.options.cluster_domain = "cluster.local";
  Json pod = w.Step().pods_to_create.at(0);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(TfConfig(pod, w));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->addresses("chief")[0], "mnist-chief-0.team-a.svc.cluster.local:2222");
  // Checkpoints on the provisioned claim by default (checkpoint_volume_test.cc).
  EXPECT_EQ(EnvValue(pod, "DISTRAIN_CHECKPOINT_DIR"), kDefaultCheckpointDir);

  World own{MakeJob(kMwms)};
  own.job.spec.training.checkpoint.dir = "/data/ckpt";
  EXPECT_EQ(EnvValue(own.Step().pods_to_create.at(0), "DISTRAIN_CHECKPOINT_DIR"), "/data/ckpt");
}

TEST(BuildTopologyTest, RejectsNamesThatMakeInvalidHostNames) {
  // The names are set after parsing: the parser may reject them itself, and
  // BuildTopology must also hold for a job whose CRD validation was bypassed.
  api::DistributedTrainingJob job = MakeJob(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 1}\n"
      "    Evaluator: {replicas: 1}\n");
  job.metadata.name = std::string(52, 'a');  // + "-evaluator-0" = 64 characters
  absl::StatusOr<Topology> t = BuildTopology(job, ControllerOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("metadata.name:"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("at most 51 characters"));

  job = MakeJob("  replicaSpecs:\n    Worker: {replicas: 1}\n");
  job.metadata.name = "9lives";
  t = BuildTopology(job, ControllerOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("must start with a lowercase letter"));
}

TEST(BuildTopologyTest, AutoThatBreaksTheChosenStrategysRulesIsRejected) {
  // 3 workers: Auto picks MultiWorkerMirrored, and 64 is not divisible by 3.
  api::DistributedTrainingJob job = MakeJob(
      "  strategy: Auto\n  replicaSpecs:\n    Worker: {replicas: 3}\n"
      "  training: {globalBatchSize: 64}\n");
  absl::StatusOr<Topology> t = BuildTopology(job, ControllerOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("spec.strategy: Auto chose MultiWorkerMirrored"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("spec.training.globalBatchSize"));
}

// Auto on a pod with GPUs: the operator can count them but not measure their
// links, so status.strategy is its plan until the master reports the choice
// it made on measured bandwidths; from then on the reconcile keeps the
// master's (decidedBy: worker) instead of writing its own back.
TEST(AutoStatusTest, TheMastersMeasuredChoiceReplacesTheOperatorsAndStays) {
  World w{GpuWorkerJob("Auto", "{limits: {nvidia.com/gpu: 4}}")};
  Plan first = w.Step();
  EXPECT_EQ(first.status.strategy, "Mirrored");
  EXPECT_EQ(first.status.strategy_decided_by, api::kDecidedByOperator);
  EXPECT_THAT(first.status.strategy_reason, HasSubstr("4 GPUs"));

  // The progress reporter's patch (progress_reporter.h MergeStrategy).
  w.job.status.strategy = "CentralStorage";
  w.job.status.strategy_reason = "4 GPUs; CPU<->GPU 51.2 GB/s is faster than GPU<->GPU 24.0 GB/s";
  w.job.status.strategy_decided_by = api::kDecidedByWorker;
  Plan later = w.Step();
  EXPECT_EQ(later.status.strategy, "CentralStorage");
  EXPECT_EQ(later.status.strategy_decided_by, api::kDecidedByWorker);
  EXPECT_THAT(later.status.strategy_reason, HasSubstr("51.2 GB/s"));

  // It survives the status's round trip through the API (and the CRD keeps the field).
  const nlohmann::json object = api::ToJson(w.job);
  EXPECT_EQ(object["status"]["strategy"]["decidedBy"], "worker");
  absl::StatusOr<api::DistributedTrainingJob> parsed = api::ParseJob(object);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->status.strategy_decided_by, api::kDecidedByWorker);
}

TEST(BuildTopologyTest, ClusterHashIgnoresTheEvaluatorButNotWorkers) {
  auto hash = [](const std::string& spec) {
    absl::StatusOr<Topology> t = BuildTopology(MakeJob(spec), ControllerOptions{});
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->cluster_hash : "";
  };
  const std::string two = "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 2}\n";
  const std::string three = "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 4}\n";
  EXPECT_EQ(hash(two), hash(two + "    Evaluator: {replicas: 1}\n"));
  EXPECT_NE(hash(two), hash(three));
  EXPECT_EQ(hash(two).size(), 16u);
}

}  // namespace
}  // namespace distrain::controller

namespace distrain::controller {
namespace {

TEST(ClusterConfigMapTest, HoldsTheClusterOnceOwnedAndLabelledLikeTheChildren) {
  World w{MakeJob(kMwms)};
  Plan plan = w.Step();
  ASSERT_TRUE(plan.config_map_to_create.has_value());
  const Json& cm = *plan.config_map_to_create;
  EXPECT_EQ(cm["kind"], "ConfigMap");
  EXPECT_EQ(cm["metadata"]["name"], "mnist-cluster-spec");
  EXPECT_EQ(cm["metadata"]["namespace"], "team-a");
  EXPECT_EQ(cm["metadata"]["labels"][api::kLabelJobName], "mnist");
  EXPECT_EQ(cm["metadata"]["labels"][api::kLabelManagedBy], "distrain-operator");
  ASSERT_EQ(cm["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(cm["metadata"]["annotations"][kClusterHashAnnotation],
            plan.pods_to_create[0]["metadata"]["annotations"][kClusterHashAnnotation]);
  ASSERT_EQ(cm["data"].size(), 1u);
  EXPECT_EQ(Json::parse(cm["data"]["cluster"].get<std::string>()),
            Json({{"chief", {"mnist-chief-0.team-a.svc:2222"}},
                  {"worker", {"mnist-worker-0.team-a.svc:2222", "mnist-worker-1.team-a.svc:2222"}}}));
  // Present and current: not written again.
  Plan again = w.Step();
  EXPECT_FALSE(again.config_map_to_create.has_value());
  EXPECT_FALSE(again.config_map_to_update.has_value());
}

TEST(ClusterConfigMapTest, PodsReferToItAndStayTheSameSizeWhateverTheClusterSize) {
  auto pod_of = [](int workers) {
    World w{MakeJob(absl::StrCat("  strategy: MultiWorkerMirrored\n  replicaSpecs:\n"
                                 "    Worker: {replicas: ", workers, "}\n"
                                 "  training: {globalBatchSize: 1000}\n"))};
    return w.Step().pods_to_create.at(1);  // mnist-worker-1
  };
  const Json pod = pod_of(2);
  const Json& env = (*MainContainer(pod["spec"]))["env"];
  int cluster_at = -1, tf_config_at = -1;
  for (int i = 0; i < static_cast<int>(env.size()); ++i) {
    if (env[i]["name"] == kClusterEnv) cluster_at = i;
    if (env[i]["name"] == "TF_CONFIG") tf_config_at = i;
  }
  ASSERT_GE(cluster_at, 0);
  // The kubelet expands $(VAR) only from variables defined earlier.
  EXPECT_LT(cluster_at, tf_config_at);
  EXPECT_EQ(env[cluster_at]["valueFrom"]["configMapKeyRef"],
            Json({{"name", "mnist-cluster-spec"}, {"key", "cluster"}}));
  EXPECT_EQ(env[tf_config_at]["value"],
            "{\"cluster\":$(DISTRAIN_TF_CLUSTER),\"task\":{\"type\":\"worker\",\"index\":1},"
            "\"environment\":\"cloud\"}");
  // No host in the pod: its size does not grow with the cluster (only the
  // job config's batch size and the cluster hash differ).
  const size_t small = pod.dump().size(), large = pod_of(500).dump().size();
  EXPECT_LE(large, small + 8) << small << " vs " << large;
}

TEST(ClusterConfigMapTest, FollowsAScaleForEveryStrategyThatScales) {
  for (const char* strategy : {"MultiWorkerMirrored", "ParameterServer"}) {
    SCOPED_TRACE(strategy);
    const bool ps = std::string(strategy) == "ParameterServer";
    World w{MakeJob(absl::StrCat("  strategy: ", strategy,
                                 "\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
                                 "    Worker: {replicas: 2}\n",
                                 ps ? "    PS: {replicas: 1}\n" : "",
                                 "  training: {globalBatchSize: 48}\n"))};
    w.Step();
    w.SetAll("Running");
    w.Step();
    w.job.spec.replicas[ReplicaType::kWorker].replicas = 3;
    Plan plan = w.Step();
    ASSERT_TRUE(plan.config_map_to_update.has_value());
    EXPECT_FALSE(plan.config_map_to_create.has_value());
    w.Collect();
    w.Step();
    // Every pod the new membership starts with sees three workers.
    const std::string pod = "mnist-worker-2";
    ASSERT_TRUE(w.pods.count(pod));
    absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(TfConfig(w.Pod(pod), w));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->num_tasks("worker"), 3);
    EXPECT_EQ(spec->task(), (TaskId{"worker", 2}));
  }
}

TEST(ClusterConfigMapTest, AnEarlierJobsConfigMapHoldsThePodsBack) {
  World w{MakeJob(kMwms)};
  w.Step();
  // The job was deleted and created again under the same name; the old
  // ConfigMap (owned by the old uid) is not yet garbage-collected.
  w.pods.clear();
  w.job.metadata.uid = "uid-mnist-2";
  w.job.status = {};
  Plan plan = w.Step();
  EXPECT_TRUE(plan.pods_to_create.empty());
  EXPECT_FALSE(plan.config_map_to_create.has_value());
  EXPECT_FALSE(plan.config_map_to_update.has_value());
  EXPECT_TRUE(plan.requeue_after.has_value());
  // Collected (with the old job's checkpoint claim): created afresh, then the pods.
  w.config_map.reset();
  w.checkpoint_claim.reset();
  plan = w.Step();
  ASSERT_TRUE(plan.config_map_to_create.has_value());
  EXPECT_EQ((*plan.config_map_to_create)["metadata"]["ownerReferences"][0]["uid"], "uid-mnist-2");
  EXPECT_EQ(plan.pods_to_create.size(), 3u);
}

}  // namespace
}  // namespace distrain::controller

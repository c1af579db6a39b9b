// The checkpoint storage of a job on Kubernetes (controller/checkpoint_volume.h):
// the claim the operator provisions, which pods mount what where, and the
// spec fields that choose it.
#include "operator/controller/checkpoint_volume.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using ::testing::HasSubstr;
using testing::Json;
using testing::MakeJob;
using testing::World;

const char kPs[] =
    "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
    "    Worker: {replicas: 2}\n    PS: {replicas: 2}\n    Evaluator: {replicas: 1}\n";

std::map<std::string, Json> PodsByName(const Plan& plan) {
  std::map<std::string, Json> out;
  for (const Json& pod : plan.pods_to_create) out[pod["metadata"]["name"]] = pod;
  return out;
}

std::string Env(const Json& pod, const std::string& name) {
  for (const Json& e : pod["spec"]["containers"][0].value("env", Json::array())) {
    if (e.value("name", "") == name) return e.value("value", "<valueFrom>");
  }
  return "<unset>";
}

// The pod's volume kCheckpointVolumeName, or null.
Json CheckpointVolume(const Json& pod) {
  for (const Json& v : pod["spec"].value("volumes", Json::array())) {
    if (v.value("name", "") == kCheckpointVolumeName) return v;
  }
  return nullptr;
}

// The main container's mount path of kCheckpointVolumeName, or "".
std::string CheckpointMountPath(const Json& pod) {
  for (const Json& m : pod["spec"]["containers"][0].value("volumeMounts", Json::array())) {
    if (m.value("name", "") == kCheckpointVolumeName) return m["mountPath"];
  }
  return "";
}

TEST(CheckpointVolumeTest, ByDefaultAnOwnedReadWriteOnceClaimIsMountedWhereCheckpointsAreRead) {
  World w{MakeJob(kPs)};
  Plan plan = w.Step();
  ASSERT_TRUE(plan.checkpoint_claim_to_create.has_value());
  const Json& claim = *plan.checkpoint_claim_to_create;
  EXPECT_EQ(claim["kind"], "PersistentVolumeClaim");
  EXPECT_EQ(claim["metadata"]["name"], "mnist-checkpoints");
  EXPECT_EQ(claim["metadata"]["namespace"], "team-a");
  EXPECT_EQ(claim["metadata"]["labels"][api::kLabelJobName], "mnist");
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(claim["spec"]["accessModes"], Json::array({"ReadWriteOnce"}));
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
  // No class named: the cluster's default StorageClass provisions it.
  EXPECT_FALSE(claim["spec"].contains("storageClassName"));

  std::map<std::string, Json> pods = PodsByName(plan);
  ASSERT_EQ(pods.size(), 6u);
  // The chief saves, each PS saves its shards, the Evaluator reads.
  for (const char* name : {"mnist-chief-0", "mnist-ps-0", "mnist-ps-1", "mnist-evaluator-0"}) {
    SCOPED_TRACE(name);
    const Json& pod = pods[name];
    EXPECT_EQ(CheckpointVolume(pod)["persistentVolumeClaim"]["claimName"], "mnist-checkpoints");
    EXPECT_EQ(CheckpointMountPath(pod), kDefaultCheckpointDir);
    EXPECT_EQ(Env(pod, "DISTRAIN_CHECKPOINT_DIR"), kDefaultCheckpointDir);
    // ReadWriteOnce: kept on the node of the others that mount it.
    EXPECT_EQ(pod["metadata"]["labels"][kCheckpointVolumeLabel], "mnist-checkpoints");
    const Json& term =
        pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    EXPECT_EQ(term["topologyKey"], "kubernetes.io/hostname");
    EXPECT_EQ(term["labelSelector"]["matchLabels"][kCheckpointVolumeLabel], "mnist-checkpoints");
  }
  // Workers never read or write checkpoints: they neither mount a
  // single-node claim nor are tied to its node.
  for (const char* name : {"mnist-worker-0", "mnist-worker-1"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(CheckpointVolume(pods[name]).is_null());
    EXPECT_EQ(Env(pods[name], "DISTRAIN_CHECKPOINT_DIR"), "<unset>");
    EXPECT_FALSE(pods[name]["spec"].contains("affinity"));
    EXPECT_FALSE(pods[name]["metadata"]["labels"].contains(kCheckpointVolumeLabel));
  }
  // Created once; the next reconcile sees it and leaves it.
  w.SetAll("Running");
  EXPECT_FALSE(w.Step().checkpoint_claim_to_create.has_value());
}

TEST(CheckpointVolumeTest, WorkerZeroIsTheMasterWithoutAChief) {
  World w{MakeJob("  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 3}\n"
                  "  training: {globalBatchSize: 60}\n")};
  std::map<std::string, Json> pods = PodsByName(w.Step());
  EXPECT_EQ(CheckpointMountPath(pods["mnist-worker-0"]), kDefaultCheckpointDir);
  EXPECT_EQ(CheckpointMountPath(pods["mnist-worker-1"]), "");
  EXPECT_EQ(CheckpointMountPath(pods["mnist-worker-2"]), "");
}

TEST(CheckpointVolumeTest, TheSpecsStorageOverridesTheOperatorsDefaults) {
  World w{MakeJob(std::string(kPs) +
                  "  training:\n    checkpoint:\n      dir: /ckpt/run-1\n      storage:\n"
                  "        storageClassName: fast\n        size: 20Gi\n"
                  "        accessMode: ReadWriteMany\n")};
  w.options.checkpoint_storage.storage_class = "standard";
  w.options.checkpoint_storage.size = "5Gi";
  Plan plan = w.Step();
  ASSERT_TRUE(plan.checkpoint_claim_to_create.has_value());
  const Json& spec = (*plan.checkpoint_claim_to_create)["spec"];
  EXPECT_EQ(spec["storageClassName"], "fast");
  EXPECT_EQ(spec["resources"]["requests"]["storage"], "20Gi");
  EXPECT_EQ(spec["accessModes"], Json::array({"ReadWriteMany"}));
  // ReadWriteMany: every pod mounts it, at spec's dir, and none is tied to a node.
  for (const auto& [name, pod] : PodsByName(plan)) {
    SCOPED_TRACE(name);
    EXPECT_EQ(CheckpointMountPath(pod), "/ckpt/run-1");
    EXPECT_EQ(Env(pod, "DISTRAIN_CHECKPOINT_DIR"), "/ckpt/run-1");
    EXPECT_FALSE(pod["spec"].contains("affinity"));
  }
}

TEST(CheckpointVolumeTest, TheOperatorsDefaultsApplyWhenTheSpecSaysNothing) {
  World w{MakeJob(kPs)};
  w.options.checkpoint_storage.storage_class = "standard";
  w.options.checkpoint_storage.size = "5Gi";
  w.options.checkpoint_storage.access_mode = "ReadWriteMany";
  Plan plan = w.Step();
  const Json& spec = (*plan.checkpoint_claim_to_create)["spec"];
  EXPECT_EQ(spec["storageClassName"], "standard");
  EXPECT_EQ(spec["resources"]["requests"]["storage"], "5Gi");
  EXPECT_EQ(CheckpointMountPath(PodsByName(plan)["mnist-worker-1"]), kDefaultCheckpointDir);
}

TEST(CheckpointVolumeTest, AVolumeOfTheJobsOwnIsMountedAndNothingIsProvisioned) {
  World w{MakeJob(std::string(kPs) +
                  "  training:\n    checkpoint:\n"
                  "      volume: {persistentVolumeClaim: {claimName: team-checkpoints}}\n")};
  Plan plan = w.Step();
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  std::map<std::string, Json> pods = PodsByName(plan);
  const Json& chief = pods["mnist-chief-0"];
  EXPECT_EQ(CheckpointVolume(chief),
            Json({{"name", kCheckpointVolumeName},
                  {"persistentVolumeClaim", {{"claimName", "team-checkpoints"}}}}));
  EXPECT_EQ(CheckpointMountPath(chief), kDefaultCheckpointDir);
  EXPECT_EQ(CheckpointMountPath(pods["mnist-evaluator-0"]), kDefaultCheckpointDir);
  // Its access mode is unknown: only the pods that need it mount it, and
  // nothing is pinned to a node.
  EXPECT_EQ(CheckpointMountPath(pods["mnist-worker-0"]), "");
  EXPECT_FALSE(chief["spec"].contains("affinity"));

  // emptyDir: the user's way to opt out of durable storage.
  World scratch{MakeJob(std::string(kPs) +
                        "  training:\n    checkpoint:\n      dir: /tmp/ckpt\n"
                        "      volume: {emptyDir: {}}\n")};
  plan = scratch.Step();
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  EXPECT_TRUE(CheckpointVolume(PodsByName(plan)["mnist-chief-0"]).contains("emptyDir"));
}

TEST(CheckpointVolumeTest, ATemplateThatMountsTheDirectoryKeepsItsOwnStorage) {
  World w{MakeJob(R"(  strategy: OneDevice
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: distrain
            volumeMounts: [{name: data, mountPath: /data/}]
          volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
  training:
    checkpoint: {dir: /data/ckpt}
)")};
  Plan plan = w.Step();
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  const Json& pod = plan.pods_to_create.at(0);
  EXPECT_TRUE(CheckpointVolume(pod).is_null());
  bool kept = false;
  for (const Json& v : pod["spec"]["volumes"]) kept = kept || v.value("name", "") == "data";
  EXPECT_TRUE(kept);
  EXPECT_EQ(Env(pod, "DISTRAIN_CHECKPOINT_DIR"), "/data/ckpt");

  // A mount beside the directory (a prefix of its name, not of its path) does not count.
  World beside{MakeJob(R"(  strategy: OneDevice
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: distrain
            volumeMounts: [{name: data, mountPath: /dat}]
          volumes: [{name: data, emptyDir: {}}]
  training:
    checkpoint: {dir: /data/ckpt}
)")};
  EXPECT_TRUE(beside.Step().checkpoint_claim_to_create.has_value());
}

TEST(CheckpointVolumeTest, ProvisioningOffLeavesOnlyTheSpecsDirectory) {
  World w{MakeJob(kPs)};
  w.options.checkpoint_storage.provision = false;
  Plan plan = w.Step();
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  for (const auto& [name, pod] : PodsByName(plan)) {
    EXPECT_TRUE(CheckpointVolume(pod).is_null()) << name;
    EXPECT_EQ(Env(pod, "DISTRAIN_CHECKPOINT_DIR"), "<unset>") << name;
  }
  World dir{MakeJob(std::string(kPs) + "  training:\n    checkpoint: {dir: /shared/ckpt}\n")};
  dir.options.checkpoint_storage.provision = false;
  for (const auto& [name, pod] : PodsByName(dir.Step())) {
    EXPECT_EQ(Env(pod, "DISTRAIN_CHECKPOINT_DIR"), "/shared/ckpt") << name;
  }
}

TEST(CheckpointVolumeTest, AClaimThatIsNotTheJobsHoldsThePodsBack) {
  World w{MakeJob(kPs)};
  w.checkpoint_claim = Json{{"metadata",
                             {{"name", "mnist-checkpoints"},
                              {"namespace", "team-a"},
                              {"uid", "someone-elses"}}}};
  Plan plan = w.Step();
  EXPECT_TRUE(plan.pods_to_create.empty());
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  EXPECT_TRUE(plan.requeue_after.has_value());
  const api::Condition* created = w.job.status.FindCondition(api::kConditionCreated);
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->status, "False");
  EXPECT_EQ(created->reason, "CheckpointClaimConflict");
  EXPECT_THAT(created->message, HasSubstr("team-a/mnist-checkpoints"));
  EXPECT_THAT(created->message, HasSubstr("spec.training.checkpoint.volume"));

  // Gone (an earlier job's, collected): provisioned afresh, then the pods.
  w.checkpoint_claim.reset();
  plan = w.Step();
  EXPECT_TRUE(plan.checkpoint_claim_to_create.has_value());
  EXPECT_EQ(plan.pods_to_create.size(), 6u);
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionCreated));
}

TEST(CheckpointVolumeTest, TheClaimOutlivesTheFinishedJobsPods) {
  World w{MakeJob(kPs + std::string("  runPolicy: {cleanPodPolicy: All}\n"))};
  w.Step();
  ASSERT_TRUE(w.checkpoint_claim.has_value());
  w.SetAll("Running");
  w.Step();
  testing::SetPhase(&w.Pod("mnist-chief-0"), "Succeeded", 0);
  Plan plan = w.Step();
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionSucceeded));
  EXPECT_EQ(plan.pods_to_delete.size(), 6u);  // cleanPodPolicy All
  // The claim is not among the children to delete (there is no way for the
  // plan to delete one): `distrain export` can still read it.
  EXPECT_FALSE(plan.checkpoint_claim_to_create.has_value());
  EXPECT_TRUE(w.checkpoint_claim.has_value());
}

// The spec fields, through the parser the operator, the worker and `distrain
// run` share: bad input is refused naming the field.
absl::Status ParseCheckpoint(const std::string& checkpoint_yaml) {
  return api::ParseJobYamlText(
             "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: j}\n"
             "spec:\n  replicaSpecs: {Worker: {replicas: 1}}\n  training:\n    checkpoint:\n" +
             checkpoint_yaml)
      .status();
}

TEST(CheckpointSpecTest, BadStorageFieldsAreRefusedNamingTheField) {
  EXPECT_TRUE(ParseCheckpoint("      volume: {nfs: {server: nas, path: /ckpt}}\n").ok());
  EXPECT_TRUE(ParseCheckpoint("      storage: {size: 1.5Gi, accessMode: ReadWriteMany}\n").ok());
  struct Case {
    std::string yaml, field, words;
  };
  const Case cases[] = {
      {"      volume: {}\n", "spec.training.checkpoint.volume:", "exactly one source"},
      {"      volume: {emptyDir: {}, nfs: {server: a, path: /b}}\n",
       "spec.training.checkpoint.volume:", "exactly one source"},
      {"      volume: claim-1\n", "spec.training.checkpoint.volume:", "exactly one source"},
      {"      volume: {configMap: {name: c}}\n", "spec.training.checkpoint.volume.configMap:",
       "read-only"},
      {"      volume: {persistentVolumeClaims: {claimName: c}}\n",
       "spec.training.checkpoint.volume.persistentVolumeClaims:",
       "did you mean \"persistentVolumeClaim\""},
      {"      volume: {persistentVolumeClaim: {}}\n",
       "spec.training.checkpoint.volume.persistentVolumeClaim.claimName:", "existing"},
      {"      volume: {nfs: server}\n", "spec.training.checkpoint.volume.nfs:", "mapping"},
      {"      storage: {size: ten}\n", "spec.training.checkpoint.storage.size:", "quantity"},
      {"      storage: {accessMode: ReadOnlyMany}\n", "spec.training.checkpoint.storage.accessMode:",
       "ReadWriteOnce"},
      {"      storage: {sise: 1Gi}\n", "spec.training.checkpoint.storage.sise:", "size"},
      {"      volume: {emptyDir: {}}\n      storage: {size: 1Gi}\n",
       "spec.training.checkpoint.storage:", "remove one"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    absl::Status s = ParseCheckpoint(c.yaml);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.words));
  }
}

TEST(CheckpointSpecTest, TheVolumeAndStorageTravelInTheJobConfigJson) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: j}\n"
      "spec:\n  replicaSpecs: {Worker: {replicas: 1}}\n  training:\n    checkpoint:\n"
      "      volume: {csi: {driver: x.io, volumeAttributes: {a: b}}}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<JobConfig> back = ParseJobConfigJson(JobConfigToJson(*config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *config);
  EXPECT_EQ(back->training.checkpoint.volume["csi"]["volumeAttributes"]["a"], "b");
  // Unset storage fields are left out, not written as "" (the CRD's enum has no "").
  EXPECT_EQ(JobConfigToJson(*config).find("accessMode"), std::string::npos);
}

}  // namespace
}  // namespace distrain::controller

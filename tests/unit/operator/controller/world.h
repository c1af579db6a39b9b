#ifndef DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_WORLD_H_
#define DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_WORLD_H_

// Test support for the pure reconcile: a job, the children the API server
// would hold, and Apply() to carry a Plan out on them the way the apply layer
// and the kubelet would (created pods start Pending; deleted pods linger as
// terminating until Collect()). No API server is faked: this is the pure
// function's input and output, nothing more.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/reconcile.h"
#include "tests/unit/operator/controller/kubelet_env.h"

namespace distrain::controller::testing {

using Json = nlohmann::json;

inline absl::Time T0() { return absl::FromUnixSeconds(1'800'000'000); }

// A job from the YAML of its spec (indented by 2 under "spec:").
inline api::DistributedTrainingJob MakeJob(const std::string& spec_yaml,
                                           const std::string& name = "mnist") {
  const std::string yaml = absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata:\n  name: ", name,
      "\n  namespace: team-a\nspec:\n", spec_yaml);
  absl::StatusOr<api::DistributedTrainingJob> job = api::ParseJobYamlText(yaml);
  EXPECT_TRUE(job.ok()) << job.status() << "\n" << yaml;
  if (!job.ok()) return {};
  job->metadata.uid = "uid-" + name;
  job->metadata.generation = 1;
  return *job;
}

// Sets a pod's phase; exit_code, when given, is the main container's.
inline void SetPhase(Json* pod, const std::string& phase, std::optional<int> exit_code = {},
                     const std::string& reason = "") {
  (*pod)["status"] = {{"phase", phase}};
  if (!reason.empty()) (*pod)["status"]["reason"] = reason;
  const std::string main = (*pod)["spec"]["containers"][0]["name"];
  if (exit_code) {
    (*pod)["status"]["containerStatuses"] = Json::array(
        {{{"name", main}, {"state", {{"terminated", {{"exitCode", *exit_code}}}}}}});
  } else if (phase == "Running") {
    (*pod)["status"]["containerStatuses"] =
        Json::array({{{"name", main}, {"state", {{"running", Json::object()}}}}});
  }
}

struct World {
  explicit World(api::DistributedTrainingJob j) : job(std::move(j)) {}

  api::DistributedTrainingJob job;
  std::map<std::string, Json> pods;
  std::map<std::string, Json> services;
  std::optional<Json> pod_group;
  std::optional<Json> config_map;  // the job's cluster-spec ConfigMap
  std::optional<Json> network_policy;  // the job's NetworkPolicy
  std::optional<Json> checkpoint_claim;  // the job's provisioned checkpoint PVC
  Facts facts{T0(), true};
  ControllerOptions options;
  int next_uid = 0;

  Observed Observe() const {
    Observed o;
    for (const auto& [name, pod] : pods) o.pods.push_back(std::make_shared<const Json>(pod));
    for (const auto& [name, svc] : services) o.services.push_back(std::make_shared<const Json>(svc));
    o.pod_group = pod_group;
    o.cluster_config_map = config_map;
    o.network_policy = network_policy;
    o.checkpoint_claim = checkpoint_claim;
    return o;
  }

  // One reconcile, carried out. Returns the plan.
  Plan Step() {
    Plan plan = Reconcile(job, Observe(), facts, options);
    Apply(plan);
    return plan;
  }

  void Apply(const Plan& plan) {
    if (plan.config_map_to_create) {
      EXPECT_FALSE(config_map.has_value()) << "ConfigMap created twice";
      config_map = *plan.config_map_to_create;
      (*config_map)["metadata"]["uid"] = absl::StrCat("cm-uid-", next_uid++);
      (*config_map)["metadata"]["resourceVersion"] = "1";
    }
    if (plan.config_map_to_update) {
      EXPECT_TRUE(config_map.has_value()) << "updating a ConfigMap that is not there";
      EXPECT_EQ((*plan.config_map_to_update)["metadata"]["resourceVersion"],
                (*config_map)["metadata"]["resourceVersion"]);
      config_map = *plan.config_map_to_update;
      (*config_map)["metadata"]["resourceVersion"] = std::to_string(
          std::stoi((*config_map)["metadata"]["resourceVersion"].get<std::string>()) + 1);
    }
    if (plan.network_policy_to_create) {
      EXPECT_FALSE(network_policy.has_value()) << "NetworkPolicy created twice";
      network_policy = *plan.network_policy_to_create;
      (*network_policy)["metadata"]["uid"] = absl::StrCat("np-uid-", next_uid++);
    }
    if (plan.network_policy_to_update) network_policy = *plan.network_policy_to_update;
    if (plan.checkpoint_claim_to_create) {
      EXPECT_FALSE(checkpoint_claim.has_value()) << "checkpoint claim created twice";
      checkpoint_claim = *plan.checkpoint_claim_to_create;
      (*checkpoint_claim)["metadata"]["uid"] = absl::StrCat("pvc-uid-", next_uid++);
    }
    for (const Json& pod : plan.pods_to_create) {
      for (const Json& v : pod["spec"].value("volumes", Json::array())) {
        if (v.contains("persistentVolumeClaim") && v.value("name", "") == "distrain-checkpoints" &&
            options.checkpoint_storage.provision && job.spec.training.checkpoint.volume.is_null()) {
          EXPECT_TRUE(checkpoint_claim.has_value()) << "pods created before their checkpoint claim";
        }
      }
    }
    if (!plan.pods_to_create.empty()) {
      EXPECT_TRUE(config_map.has_value()) << "pods created before their ConfigMap";
      if (options.network_policy.enabled) {
        EXPECT_TRUE(network_policy.has_value()) << "pods created before their NetworkPolicy";
      }
    }
    for (const Json& pod : plan.pods_to_create) {
      const std::string name = pod["metadata"]["name"];
      EXPECT_FALSE(pods.count(name)) << "created twice: " << name;
      Json p = pod;
      p["metadata"]["uid"] = absl::StrCat("pod-uid-", next_uid++);
      p["status"] = {{"phase", "Pending"}};
      pods[name] = p;
    }
    for (const Json& svc : plan.services_to_create) {
      const std::string name = svc["metadata"]["name"];
      EXPECT_FALSE(services.count(name)) << "service created twice: " << name;
      Json s = svc;
      s["metadata"]["uid"] = absl::StrCat("svc-uid-", next_uid++);
      services[name] = s;
    }
    for (const Deletion& d : plan.pods_to_delete) {
      ASSERT_TRUE(pods.count(d.name)) << "deleting a pod that is not there: " << d.name;
      EXPECT_EQ(pods[d.name]["metadata"]["uid"], d.uid);
      pods[d.name]["metadata"]["deletionTimestamp"] = api::FormatKubeTime(facts.now);
    }
    for (const Deletion& d : plan.services_to_delete) services.erase(d.name);
    if (plan.pod_group_to_create) pod_group = *plan.pod_group_to_create;
    if (plan.pod_group_to_update) pod_group = *plan.pod_group_to_update;
    if (plan.status_changed) job.status = plan.status;
  }

  // Terminating pods finish terminating.
  void Collect() {
    for (auto it = pods.begin(); it != pods.end();) {
      it = it->second["metadata"].contains("deletionTimestamp") ? pods.erase(it) : std::next(it);
    }
  }

  void SetAll(const std::string& phase) {
    for (auto& [name, pod] : pods) {
      if (!pod["metadata"].contains("deletionTimestamp")) SetPhase(&pod, phase);
    }
  }

  Json& Pod(const std::string& name) {
    EXPECT_TRUE(pods.count(name)) << name;
    return pods[name];
  }

  bool Terminating(const std::string& name) const {
    auto it = pods.find(name);
    return it != pods.end() && it->second["metadata"].contains("deletionTimestamp");
  }
};

// The ConfigMaps of a World, by name, for KubeletEnv.
inline std::map<std::string, Json> ConfigMaps(const std::optional<Json>& config_map) {
  std::map<std::string, Json> out;
  if (config_map) out[(*config_map)["metadata"]["name"].get<std::string>()] = *config_map;
  return out;
}

inline std::vector<std::string> Names(const std::vector<Json>& objects) {
  std::vector<std::string> out;
  for (const Json& o : objects) out.push_back(o["metadata"]["name"]);
  return out;
}

inline std::vector<std::string> Names(const std::vector<Deletion>& deletions) {
  std::vector<std::string> out;
  for (const Deletion& d : deletions) out.push_back(d.name);
  return out;
}

inline std::vector<std::string> EventReasons(const Plan& plan) {
  std::vector<std::string> out;
  for (const Event& e : plan.events) out.push_back(e.reason);
  return out;
}

}  // namespace distrain::controller::testing

#endif  // DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_WORLD_H_

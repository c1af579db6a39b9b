// Secure-by-default training pods (pods.h "Pod security") and the job's
// NetworkPolicy (network_policy.h), through the pure reconcile.

#include "operator/controller/network_policy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/controller/pods.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using testing::Json;
using testing::MakeJob;
using testing::World;

constexpr char kPlainSpec[] = R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker: {replicas: 2}
  training: {globalBatchSize: 64}
)";

TEST(PodSecurityTest, APodWhoseTemplateSaysNothingGetsTheRestrictedProfile) {
  World w{MakeJob(kPlainSpec)};
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 2u);
  for (const Json& pod : plan.pods_to_create) {
    const Json& spec = pod["spec"];
    EXPECT_EQ(spec["automountServiceAccountToken"], false);
    EXPECT_EQ(spec["securityContext"]["runAsNonRoot"], true);
    EXPECT_EQ(spec["securityContext"]["seccompProfile"], Json({{"type", "RuntimeDefault"}}));
    EXPECT_FALSE(spec["securityContext"].contains("runAsUser"));  // the image's USER decides
    const Json& c = spec["containers"][0]["securityContext"];
    EXPECT_EQ(c["allowPrivilegeEscalation"], false);
    EXPECT_EQ(c["capabilities"]["drop"], Json::array({"ALL"}));
  }
}

TEST(PodSecurityTest, WhatTheTemplateSetsIsKeptFieldByField) {
  World w{MakeJob(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          automountServiceAccountToken: true
          securityContext:
            seccompProfile: {type: Localhost, localhostProfile: my.json}
            fsGroup: 1000
          initContainers:
          - name: fetch
            image: busybox
            securityContext: {allowPrivilegeEscalation: true}
          containers:
          - name: distrain
            image: my/tf:1
            securityContext:
              runAsUser: 1000
              capabilities: {add: [NET_BIND_SERVICE], drop: [NET_RAW]}
          - name: debugger
            image: my/debug:1
            securityContext: {privileged: true}
  training: {globalBatchSize: 64}
)")};
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 1u);
  const Json& spec = plan.pods_to_create[0]["spec"];
  EXPECT_EQ(spec["automountServiceAccountToken"], true);
  EXPECT_EQ(spec["securityContext"]["seccompProfile"]["type"], "Localhost");
  EXPECT_EQ(spec["securityContext"]["fsGroup"], 1000);
  // A non-root user: runAsNonRoot true is consistent with it and what the
  // restricted profile asks for.
  EXPECT_EQ(spec["securityContext"]["runAsNonRoot"], true);
  const Json& init = spec["initContainers"][0]["securityContext"];
  EXPECT_EQ(init["allowPrivilegeEscalation"], true);
  EXPECT_EQ(init["capabilities"]["drop"], Json::array({"ALL"}));
  const Json& main = spec["containers"][0]["securityContext"];
  EXPECT_EQ(main["capabilities"]["drop"], Json::array({"NET_RAW"}));
  EXPECT_EQ(main["capabilities"]["add"], Json::array({"NET_BIND_SERVICE"}));
  EXPECT_EQ(main["allowPrivilegeEscalation"], false);
  // Privileged: allowPrivilegeEscalation false would be refused by the API.
  const Json& debugger = spec["containers"][1]["securityContext"];
  EXPECT_TRUE(debugger["privileged"]);
  EXPECT_FALSE(debugger.contains("allowPrivilegeEscalation"));
}

TEST(PodSecurityTest, ATemplateThatAsksForRootGetsNoRunAsNonRoot) {
  for (const char* where : {"pod", "container", "explicit false"}) {
    const std::string pod_sc = std::string(where) == "pod"              ? "{runAsUser: 0}"
                               : std::string(where) == "explicit false" ? "{runAsNonRoot: false}"
                                                                        : "{}";
    const std::string container_sc = std::string(where) == "container"
                                         ? "{runAsUser: 0, capabilities: {add: [SYS_ADMIN]}}"
                                         : "{}";
    World w{MakeJob(absl::StrCat(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          securityContext: )", pod_sc, R"(
          containers:
          - name: distrain
            image: my/tf-root:1
            securityContext: )", container_sc, R"(
  training: {globalBatchSize: 64}
)"))};
    Plan plan = w.Step();
    ASSERT_EQ(plan.pods_to_create.size(), 1u) << where;
    const Json& spec = plan.pods_to_create[0]["spec"];
    EXPECT_NE(spec["securityContext"].value("runAsNonRoot", Json()), true) << where;
    // The other defaults still apply, except where the template rules them out.
    EXPECT_EQ(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault") << where;
    const Json& c = spec["containers"][0]["securityContext"];
    EXPECT_EQ(c.value("allowPrivilegeEscalation", Json()),
              std::string(where) == "container" ? Json() : Json(false))
        << where << ": CAP_SYS_ADMIN rules it out";
  }
}

TEST(PodSecurityTest, WindowsPodsGetOnlyTheTokenSetting) {
  World w{MakeJob(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          os: {name: windows}
          containers: [{name: distrain, image: my/tf-win:1}]
  training: {globalBatchSize: 64}
)")};
  Plan plan = w.Step();
  const Json& spec = plan.pods_to_create[0]["spec"];
  EXPECT_EQ(spec["automountServiceAccountToken"], false);
  EXPECT_FALSE(spec.contains("securityContext"));
  EXPECT_FALSE(spec["containers"][0].contains("securityContext"));
}

TEST(NetworkPolicyTest, SelectsTheJobsPodsAndAdmitsTheJobOnItsPortsAndThePeersOnMetrics) {
  World w{MakeJob(R"(  strategy: ParameterServer
  replicaSpecs:
    Chief: {replicas: 1}
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: distrain
            ports: [{name: distrain, containerPort: 3333}, {name: metrics, containerPort: 9400}]
    PS: {replicas: 1}
  training: {globalBatchSize: 64}
)")};
  const Json prometheus = {
      {"namespaceSelector", {{"matchLabels", {{"kubernetes.io/metadata.name", "monitoring"}}}}},
      {"podSelector", {{"matchLabels", {{"app.kubernetes.io/name", "prometheus"}}}}}};
  w.options.network_policy.metrics_peers = {prometheus};
  Plan plan = w.Step();
  ASSERT_TRUE(plan.network_policy_to_create);
  const Json& np = *plan.network_policy_to_create;
  EXPECT_EQ(np["kind"], "NetworkPolicy");
  EXPECT_EQ(np["apiVersion"], "networking.k8s.io/v1");
  EXPECT_EQ(np["metadata"]["name"], "mnist-network");
  EXPECT_EQ(np["metadata"]["namespace"], "team-a");
  EXPECT_EQ(np["metadata"]["labels"]["distrain.io/job-name"], "mnist");
  ASSERT_EQ(np["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(np["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  EXPECT_EQ(np["metadata"]["ownerReferences"][0]["controller"], true);
  const Json job_pods = {{"matchLabels", {{"distrain.io/job-name", "mnist"}}}};
  EXPECT_EQ(np["spec"]["podSelector"], job_pods);
  EXPECT_EQ(np["spec"]["policyTypes"], Json::array({"Ingress"}));
  const Json& ingress = np["spec"]["ingress"];
  ASSERT_EQ(ingress.size(), 2u);
  // 1. The job's own pods, on every replica type's TF_CONFIG port.
  EXPECT_EQ(ingress[0]["from"], Json::array({{{"podSelector", job_pods}}}));
  EXPECT_EQ(ingress[0]["ports"], Json::parse(R"([{"port":2222,"protocol":"TCP"},
                                                 {"port":3333,"protocol":"TCP"}])"));
  // 2. The metrics peers, on the metrics ports only.
  EXPECT_EQ(ingress[1]["from"], Json::array({prometheus}));
  EXPECT_EQ(ingress[1]["ports"], Json::parse(R"([{"port":9090,"protocol":"TCP"},
                                                 {"port":9400,"protocol":"TCP"}])"));
  // The policy's selector matches every pod of the job.
  for (const Json& pod : plan.pods_to_create) {
    EXPECT_EQ(pod["metadata"]["labels"]["distrain.io/job-name"], "mnist");
  }
}

TEST(NetworkPolicyTest, WithoutPeersTheMetricsPortAdmitsNobodyFromOutside) {
  World w{MakeJob(kPlainSpec)};
  Plan plan = w.Step();
  ASSERT_TRUE(plan.network_policy_to_create);
  EXPECT_EQ((*plan.network_policy_to_create)["spec"]["ingress"].size(), 1u);
}

TEST(NetworkPolicyTest, WrittenOnceRewrittenWhenTheDesiredPolicyChangesNeverWhenOff) {
  World w{MakeJob(kPlainSpec)};
  w.Step();
  ASSERT_TRUE(w.network_policy);
  (*w.network_policy)["metadata"]["resourceVersion"] = "5";
  // The API server's normalisation of the stored spec causes no write: the
  // hash annotation, not the stored spec, says what was written.
  (*w.network_policy)["spec"]["ingress"][0]["ports"][0].erase("protocol");
  Plan again = w.Step();
  EXPECT_FALSE(again.network_policy_to_create);
  EXPECT_FALSE(again.network_policy_to_update);
  // New metrics peers (a new operator configuration): the policy is updated
  // in place, from the observed object (its resourceVersion guards the PUT).
  w.options.network_policy.metrics_peers = {
      {{"namespaceSelector", {{"matchLabels", {{"kubernetes.io/metadata.name", "ops"}}}}}}};
  Plan update = w.Step();
  ASSERT_TRUE(update.network_policy_to_update);
  EXPECT_EQ((*update.network_policy_to_update)["metadata"]["resourceVersion"], "5");
  EXPECT_EQ((*update.network_policy_to_update)["spec"]["ingress"].size(), 2u);
  EXPECT_FALSE(w.Step().network_policy_to_update);

  World off{MakeJob(kPlainSpec)};
  off.options.network_policy.enabled = false;
  Plan plan = off.Step();
  EXPECT_FALSE(plan.network_policy_to_create);
  EXPECT_EQ(plan.pods_to_create.size(), 2u);
}

TEST(NetworkPolicyTest, AnEarlierJobsPolicyIsLeftAloneUntilItIsCollected) {
  World w{MakeJob(kPlainSpec)};
  World earlier{MakeJob(kPlainSpec)};
  earlier.job.metadata.uid = "uid-of-an-earlier-mnist";
  earlier.Step();
  w.network_policy = earlier.network_policy;
  Plan plan = w.Step();
  EXPECT_FALSE(plan.network_policy_to_create);
  EXPECT_FALSE(plan.network_policy_to_update);
  ASSERT_TRUE(plan.requeue_after);
  w.network_policy.reset();  // collected with its job
  EXPECT_TRUE(w.Step().network_policy_to_create);
}

}  // namespace
}  // namespace distrain::controller

// distrain-operator against the real API server (tests/kube/with_control_plane.sh).
// There are no nodes: the tests play the kubelet by writing pod status through
// the API, and check what the operator makes of it. Each test runs its own
// operator process restricted to a namespace of its own.

#include <signal.h>

#include <fstream>
#include <set>

#include "common/cluster_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kube/kube_test_util.h"
#include "tests/unit/operator/controller/kubelet_env.h"

namespace distrain::kubetest {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

kube::Resource Jobs() { return {"distrain.io", "v1alpha1", "distributedtrainingjobs", true}; }

Json MakeJob(const std::string& ns, const std::string& name, const std::string& strategy,
             int workers, bool chief, const std::string& restart_policy = "ExitCode",
             Json run_policy = Json::object()) {
  Json replicas = {{"Worker", {{"replicas", workers}, {"restartPolicy", restart_policy}}}};
  if (chief) replicas["Chief"] = {{"replicas", 1}, {"restartPolicy", restart_policy}};
  if (strategy == "ParameterServer") replicas["PS"] = {{"replicas", 1}, {"restartPolicy", restart_policy}};
  Json job = {{"apiVersion", "distrain.io/v1alpha1"},
              {"kind", "DistributedTrainingJob"},
              {"metadata", {{"name", name}, {"namespace", ns}}},
              {"spec",
               {{"strategy", strategy},
                {"replicaSpecs", replicas},
                {"training",
                 {{"model", {{"type", "mlp"}, {"hiddenUnits", {16}}}},
                  {"dataset", {{"type", "synthetic"}, {"numFeatures", 8}, {"numClasses", 2}, {"numExamples", 256}}},
                  {"optimizer", {{"type", "sgd"}, {"learningRate", 0.1}}},
                  {"globalBatchSize", 16 * std::max(1, workers + (chief ? 1 : 0))},
                  {"steps", 10}}}}}};
  if (!run_policy.empty()) job["spec"]["runPolicy"] = run_policy;
  return job;
}

class OperatorKubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = AdminClient();
    ASSERT_NE(client_, nullptr);
    ns_ = std::make_unique<TestNamespace>(*client_, "op-test");
  }
  void TearDown() override {
    if (HasFailure() && op_ != nullptr) {
      std::cerr << "---- operator output ----\n" << op_->process().output() << "\n----\n";
    }
    op_.reset();
    ns_.reset();
  }
  const std::string& ns() const { return ns_->name(); }

  void StartOperator(std::vector<std::string> args = {}) {
    op_ = std::make_unique<OperatorProcess>(ns(), std::move(args));
    ASSERT_TRUE(WaitUntil([&] { return op_->Ready(); }, 30)) << op_->process().output();
  }

  void CreateJob(const Json& job) {
    auto r = client_->Request("POST", kube::ResourcePath(Jobs(), ns()), &job);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << r->status_code << " " << r->message();
  }
  Json GetJob(const std::string& name) {
    auto r = client_->Request("GET", kube::ResourcePath(Jobs(), ns(), name));
    if (!r.ok() || !r->ok()) return Json();
    return r->body;
  }
  std::vector<Json> List(const kube::Resource& resource, const std::string& job) {
    auto r = client_->Request(
        "GET", kube::WithQuery(kube::ResourcePath(resource, ns()),
                               {.label_selector = "distrain.io/job-name=" + job}));
    if (!r.ok() || !r->ok()) return {};
    return r->body["items"].get<std::vector<Json>>();
  }
  std::vector<Json> Pods(const std::string& job) { return List(kube::PodsResource(), job); }
  std::vector<Json> Services(const std::string& job) { return List(kube::ServicesResource(), job); }
  std::vector<Json> ConfigMaps(const std::string& job) {
    return List(kube::ConfigMapsResource(), job);
  }
  // The job's cluster-spec ConfigMap, or null.
  Json ClusterConfigMap(const std::string& job) {
    auto r = client_->Request(
        "GET", kube::ResourcePath(kube::ConfigMapsResource(), ns(), job + "-cluster-spec"));
    if (!r.ok() || !r->ok()) return Json();
    return r->body;
  }
  // TF_CONFIG as the pod's container would see it: its env expanded as the
  // kubelet does, with the job's ConfigMap (there is no kubelet here).
  std::string TfConfig(const std::string& job, const Json& pod) {
    const Json cm = ClusterConfigMap(job);
    std::map<std::string, Json> cms;
    if (!cm.is_null()) cms[cm["metadata"]["name"]] = cm;
    return controller::testing::KubeletEnv(pod, cms)["TF_CONFIG"];
  }

  // Plays the kubelet: sets a pod's phase, with the main container terminated
  // with `exit_code` for Succeeded/Failed.
  void SetPhase(const std::string& pod, const std::string& phase, int exit_code = 0) {
    Json status = {{"phase", phase}};
    Json container = {{"name", "distrain"}, {"ready", phase == "Running"}, {"restartCount", 0},
                      {"image", "localhost/distrain/worker:latest"}, {"imageID", ""}};
    if (phase == "Running") {
      container["state"] = {{"running", {{"startedAt", "2026-11-22T00:00:00Z"}}}};
    } else if (phase == "Succeeded" || phase == "Failed") {
      container["state"] = {{"terminated",
                             {{"exitCode", exit_code},
                              {"reason", exit_code == 0 ? "Completed" : "Error"},
                              {"startedAt", "2026-11-22T00:00:00Z"},
                              {"finishedAt", "2026-11-22T00:00:01Z"}}}};
    } else {
      container["state"] = {{"waiting", {{"reason", "ContainerCreating"}}}};
    }
    status["containerStatuses"] = Json::array({container});
    Json patch = {{"status", status}};
    auto r = client_->Request("PATCH", kube::ResourcePath(kube::PodsResource(), ns(), pod, "status"),
                              &patch, "application/merge-patch+json");
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << pod << ": " << r->status_code << " " << r->message();
  }

  std::string ConditionStatus(const Json& job, const std::string& type) {
    if (!job.contains("status") || !job["status"].contains("conditions")) return "";
    for (const Json& c : job["status"]["conditions"]) {
      if (c.value("type", "") == type) return c.value("status", "");
    }
    return "";
  }
  bool WaitCondition(const std::string& job, const std::string& type, double seconds = 20) {
    return WaitUntil([&] { return ConditionStatus(GetJob(job), type) == "True"; }, seconds);
  }
  static std::set<std::string> Names(const std::vector<Json>& objects) {
    std::set<std::string> out;
    for (const Json& o : objects) out.insert(o["metadata"]["name"].get<std::string>());
    return out;
  }
  static std::map<std::string, std::string> Uids(const std::vector<Json>& objects) {
    std::map<std::string, std::string> out;
    for (const Json& o : objects) out[o["metadata"]["name"]] = o["metadata"]["uid"];
    return out;
  }

  std::unique_ptr<kube::RestClient> client_;
  std::unique_ptr<TestNamespace> ns_;
  std::unique_ptr<OperatorProcess> op_;
};

TEST_F(OperatorKubeTest, CreatesExactlyTheExpectedPodsServicesAndTfConfig) {
  StartOperator();
  CreateJob(MakeJob(ns(), "mwms", "MultiWorkerMirrored", 3, /*chief=*/true));
  ASSERT_TRUE(WaitUntil([&] { return Pods("mwms").size() == 4 && Services("mwms").size() == 4; }, 20))
      << Pods("mwms").size() << " pods";
  const std::set<std::string> want = {"mwms-chief-0", "mwms-worker-0", "mwms-worker-1", "mwms-worker-2"};
  EXPECT_EQ(Names(Pods("mwms")), want);
  EXPECT_EQ(Names(Services("mwms")), want);
  const Json job = GetJob("mwms");
  for (const Json& pod : Pods("mwms")) {
    const std::string name = pod["metadata"]["name"];
    ASSERT_EQ(pod["metadata"]["ownerReferences"].size(), 1u);
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"]);
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["controller"], true);
    EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
    auto spec = ClusterSpec::Parse(TfConfig("mwms", pod));
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->num_tasks("chief"), 1);
    EXPECT_EQ(spec->num_tasks("worker"), 3);
    EXPECT_EQ(name, "mwms-" + spec->task().type + "-" + std::to_string(spec->task().index));
    EXPECT_THAT(spec->addresses("worker")[2], HasSubstr("mwms-worker-2." + ns()));
  }
  for (const Json& svc : Services("mwms")) EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  // The cluster lives once, in the job's ConfigMap, written before any pod:
  // etcd's revisions order writes, and a pod's resourceVersion is at least
  // its creation's.
  const Json cm = ClusterConfigMap("mwms");
  ASSERT_TRUE(cm.is_object());
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(cm["metadata"]["labels"]["distrain.io/job-name"], "mwms");
  const int64_t cm_version = std::stoll(cm["metadata"]["resourceVersion"].get<std::string>());
  for (const Json& pod : Pods("mwms")) {
    EXPECT_LT(cm_version, std::stoll(pod["metadata"]["resourceVersion"].get<std::string>()))
        << pod["metadata"]["name"] << " was written before the ConfigMap";
    EXPECT_THAT(pod.dump(), Not(HasSubstr("mwms-worker-2." + ns())))
        << "a pod carries the cluster itself";
  }
  EXPECT_TRUE(WaitCondition("mwms", "Created"));
  // Nothing more appears later (no duplicate, no stray Service).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(Pods("mwms").size(), 4u);
  EXPECT_EQ(Services("mwms").size(), 4u);
  EXPECT_THAT(op_->Metrics(), HasSubstr("controller_runtime_reconcile_total{"));
}

TEST_F(OperatorKubeTest, PodPhasesMoveTheJobToRunningThenSucceeded) {
  StartOperator();
  CreateJob(MakeJob(ns(), "ok", "MultiWorkerMirrored", 2, /*chief=*/true));
  ASSERT_TRUE(WaitUntil([&] { return Pods("ok").size() == 3; }, 20));
  for (const Json& pod : Pods("ok")) SetPhase(pod["metadata"]["name"], "Running");
  ASSERT_TRUE(WaitCondition("ok", "Running")) << GetJob("ok").dump(2);
  EXPECT_EQ(GetJob("ok")["status"]["replicaStatuses"]["Worker"]["active"], 2);
  SetPhase("ok-worker-0", "Succeeded", 0);
  SetPhase("ok-worker-1", "Succeeded", 0);
  SetPhase("ok-chief-0", "Succeeded", 0);
  ASSERT_TRUE(WaitCondition("ok", "Succeeded")) << GetJob("ok").dump(2);
  const Json job = GetJob("ok");
  EXPECT_TRUE(job["status"].contains("completionTime"));
  EXPECT_EQ(job["status"]["observedGeneration"], job["metadata"]["generation"]);
  // A succeeded job ran every step, even if it ended between two scrapes.
  EXPECT_TRUE(WaitUntil(
      [&] {
        const Json j = GetJob("ok");
        return j.is_object() && j.value("/status/progress/step"_json_pointer, 0) == 10;
      },
      15))
      << GetJob("ok")["status"].dump();
  std::string events = Kubectl("-n " + ns() + " get events.events.k8s.io -o json");
  EXPECT_THAT(events, HasSubstr("Succeeded"));
}

// recoveryPolicy RestartGroup (TensorFlow's recovery): a ring that lost a
// member restarts as one generation.
TEST_F(OperatorKubeTest, RetryableExitRestartsAllWorkersOfASyncJobTogether) {
  StartOperator();
  CreateJob(MakeJob(ns(), "rs", "MultiWorkerMirrored", 3, /*chief=*/false, "ExitCode",
                    {{"recoveryPolicy", "RestartGroup"}}));
  ASSERT_TRUE(WaitUntil([&] { return Pods("rs").size() == 3; }, 20));
  const auto before = Uids(Pods("rs"));
  for (const auto& [name, uid] : before) SetPhase(name, "Running");
  ASSERT_TRUE(WaitCondition("rs", "Running"));
  SetPhase("rs-worker-1", "Failed", 137);
  // Every worker is replaced (a ring cannot lose a member), as one generation.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto now = Uids(Pods("rs"));
        if (now.size() != 3) return false;
        for (const auto& [name, uid] : now) {
          if (before.at(name) == uid) return false;
        }
        return true;
      },
      30))
      << Pods("rs").size();
  const Json job = GetJob("rs");
  EXPECT_EQ(job["status"].value("restartCount", 0), 1) << job["status"].dump(2);
  std::string events = Kubectl("-n " + ns() + " get events.events.k8s.io -o json");
  EXPECT_THAT(events, HasSubstr("137"));
}

// recoveryPolicy InPlace (the default): only the lost worker's pod is
// replaced; its survivors keep running and take the replacement back in.
TEST_F(OperatorKubeTest, RetryableExitReplacesOnlyTheLostWorkerUnderInPlaceRecovery) {
  StartOperator();
  CreateJob(MakeJob(ns(), "ip", "MultiWorkerMirrored", 3, /*chief=*/false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("ip").size() == 3; }, 20));
  const auto before = Uids(Pods("ip"));
  for (const auto& [name, uid] : before) SetPhase(name, "Running");
  ASSERT_TRUE(WaitCondition("ip", "Running"));
  SetPhase("ip-worker-1", "Failed", 137);
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto now = Uids(Pods("ip"));
        return now.size() == 3 && now.count("ip-worker-1") &&
               now.at("ip-worker-1") != before.at("ip-worker-1");
      },
      30))
      << Pods("ip").size();
  const auto after = Uids(Pods("ip"));
  EXPECT_EQ(after.at("ip-worker-0"), before.at("ip-worker-0"));
  EXPECT_EQ(after.at("ip-worker-2"), before.at("ip-worker-2"));
  EXPECT_EQ(GetJob("ip")["status"].value("restartCount", 0), 1);
}

TEST_F(OperatorKubeTest, PermanentExitCodeFailsTheJob) {
  StartOperator();
  CreateJob(MakeJob(ns(), "perm", "MultiWorkerMirrored", 2, /*chief=*/false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("perm").size() == 2; }, 20));
  const auto before = Uids(Pods("perm"));
  SetPhase("perm-worker-0", "Running");
  SetPhase("perm-worker-1", "Failed", 1);
  ASSERT_TRUE(WaitCondition("perm", "Failed")) << GetJob("perm").dump(2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(GetJob("perm")["status"].value("restartCount", 0), 0);
  // No replacement pod was created.
  for (const auto& [name, uid] : Uids(Pods("perm"))) EXPECT_EQ(before.count(name) ? before.at(name) : "", uid);
}

TEST_F(OperatorKubeTest, BackoffLimitExceededFailsTheJob) {
  StartOperator();
  CreateJob(MakeJob(ns(), "bo", "MultiWorkerMirrored", 1, false, "OnFailure", {{"backoffLimit", 1}}));
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string uid;
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto pods = Pods("bo");
          if (pods.size() != 1 || pods[0]["metadata"].contains("deletionTimestamp")) return false;
          if (pods[0].value("/status/phase"_json_pointer, std::string()) == "Failed") return false;
          uid = pods[0]["metadata"]["uid"];
          return true;
        },
        20))
        << "attempt " << attempt;
    SetPhase("bo-worker-0", "Failed", 2);
    if (attempt == 0) {
      ASSERT_TRUE(WaitUntil([&] { auto p = Pods("bo"); return p.size() == 1 && p[0]["metadata"]["uid"] != uid; }, 20));
    }
  }
  ASSERT_TRUE(WaitCondition("bo", "Failed")) << GetJob("bo").dump(2);
  EXPECT_THAT(GetJob("bo").dump(), HasSubstr("BackoffLimitExceeded"));
}

TEST_F(OperatorKubeTest, DeletingTheJobGarbageCollectsItsPodsAndServices) {
  StartOperator();
  CreateJob(MakeJob(ns(), "gc", "MultiWorkerMirrored", 2, true));
  ASSERT_TRUE(WaitUntil([&] { return Pods("gc").size() == 3 && Services("gc").size() == 3; }, 20));
  auto r = client_->Request("DELETE", kube::ResourcePath(Jobs(), ns(), "gc"));
  ASSERT_TRUE(r.ok() && r->ok());
  EXPECT_TRUE(WaitUntil(
      [&] { return Pods("gc").empty() && Services("gc").empty() && ConfigMaps("gc").empty(); },
      60))
      << Pods("gc").size() << " pods, " << Services("gc").size() << " services, "
      << ConfigMaps("gc").size() << " ConfigMaps left";
}

TEST_F(OperatorKubeTest, AnElasticMultiWorkerMirroredScaleAddsAPodAndKeepsTheOthers) {
  StartOperator();
  Json job = MakeJob(ns(), "el", "MultiWorkerMirrored", 2, /*chief=*/false);
  job["spec"]["training"]["globalBatchSize"] = 48;  // divides by 2 and 3 workers
  job["spec"]["elasticPolicy"] = {{"minReplicas", 1}, {"maxReplicas", 4}};
  CreateJob(job);
  ASSERT_TRUE(WaitUntil([&] { return Pods("el").size() == 2; }, 20));
  const auto before = Uids(Pods("el"));
  Kubectl("-n " + ns() + " scale dtj/el --replicas=3");
  // distrain-worker resizes in place (controller/elastic.h): the two pods
  // stay, and the third sees three workers in its TF_CONFIG.
  ASSERT_TRUE(WaitUntil([&] { return Pods("el").size() == 3; }, 30)) << Pods("el").size() << " pods";
  std::this_thread::sleep_for(std::chrono::seconds(2));  // nothing else happens
  const auto after = Uids(Pods("el"));
  ASSERT_EQ(after.size(), 3u);
  for (const auto& [name, uid] : before) EXPECT_EQ(after.at(name), uid) << name << " was replaced";
  for (const Json& pod : Pods("el")) {
    if (pod["metadata"]["name"] != "el-worker-2") continue;
    auto spec = ClusterSpec::Parse(TfConfig("el", pod));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->num_tasks("worker"), 3);
  }
  EXPECT_EQ(ConfigMaps("el").size(), 1u);
}

TEST_F(OperatorKubeTest, NeverCreatesAPodTwiceWhenKilledMidCreation) {
  StartOperator({"--kube-api-qps=20", "--kube-api-burst=5"});  // slow, so the kill lands mid-way
  constexpr int kWorkers = 40;
  CreateJob(MakeJob(ns(), "big", "ParameterServer", kWorkers, true));  // + chief + 1 ps
  ASSERT_TRUE(WaitUntil([&] { return Pods("big").size() >= 8; }, 30));
  op_->process().Signal(SIGKILL);
  op_->process().Wait(5);
  const auto before = Uids(Pods("big"));
  ASSERT_LT(before.size(), size_t{kWorkers + 2}) << "the operator finished before the kill";
  StartOperator();
  ASSERT_TRUE(WaitUntil([&] { return Pods("big").size() == kWorkers + 2; }, 60)) << Pods("big").size();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto after = Uids(Pods("big"));
  EXPECT_EQ(after.size(), size_t{kWorkers + 2});
  for (const auto& [name, uid] : before) {
    ASSERT_TRUE(after.count(name)) << name << " disappeared";
    EXPECT_EQ(after.at(name), uid) << name << " was created again";
  }
}

TEST_F(OperatorKubeTest, ReconcilesAgainAfterTheApiServerRestarts) {
  const std::string cp = Env("DISTRAIN_CONTROL_PLANE");
  if (cp.empty()) GTEST_SKIP() << "needs DISTRAIN_CONTROL_PLANE (tests/kube/with_control_plane.sh)";
  StartOperator();
  CreateJob(MakeJob(ns(), "before", "MultiWorkerMirrored", 1, false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("before").size() == 1; }, 20));
  std::string out;
  ASSERT_EQ(Shell(cp + " restart kube-apiserver", &out), 0) << out;
  ASSERT_TRUE(WaitUntil([&] { return client_->Request("GET", "/readyz").ok(); }, 60));
  CreateJob(MakeJob(ns(), "after", "MultiWorkerMirrored", 2, false));
  EXPECT_TRUE(WaitUntil([&] { return Pods("after").size() == 2; }, 60)) << op_->process().output();
  EXPECT_EQ(Pods("before").size(), 1u);
}

TEST_F(OperatorKubeTest, OnlyTheLeaderReconcilesAndTheStandbyTakesOverWithin20s) {
  const std::vector<std::string> elect = {"--leader-elect", "--leader-election-namespace=" + ns(),
                                          "--leader-election-id=distrain-test"};
  auto a = std::make_unique<OperatorProcess>(ns(), elect);
  auto b = std::make_unique<OperatorProcess>(ns(), elect);
  auto leading = [](OperatorProcess& op) {
    return op.Metrics().find("leader_election_master_status{name=\"distrain-test\"} 1") != std::string::npos;
  };
  ASSERT_TRUE(WaitUntil([&] { return leading(*a) || leading(*b); }, 30))
      << a->process().output() << b->process().output();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_NE(leading(*a), leading(*b)) << "exactly one operator leads";
  OperatorProcess& leader = leading(*a) ? *a : *b;
  OperatorProcess& standby = leading(*a) ? *b : *a;
  CreateJob(MakeJob(ns(), "one", "MultiWorkerMirrored", 1, false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("one").size() == 1; }, 20));
  EXPECT_THAT(standby.Metrics(), Not(HasSubstr("controller_runtime_reconcile_total{controller=\"distributedtrainingjob\",result=\"success\"} 1")));

  leader.process().Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  CreateJob(MakeJob(ns(), "two", "MultiWorkerMirrored", 1, false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("two").size() == 1; }, 25)) << standby.process().output();
  const double takeover = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LE(takeover, 20.0);
  EXPECT_TRUE(leading(standby));
  std::cerr << "[ takeover ] " << takeover << " s after SIGKILL of the leader\n";
}

TEST_F(OperatorKubeTest, WorksAsAServiceAccountBoundOnlyToTheChartsRbac) {
  // The chart's RBAC, rendered by the real helm for this namespace.
  std::string helm, rbac;
  ASSERT_EQ(Shell(Env("DISTRAIN_CONTROL_PLANE") + " helmbin 2>/dev/null | tail -n1", &helm), 0) << helm;
  while (!helm.empty() && (helm.back() == '\n' || helm.back() == ' ')) helm.pop_back();
  const std::string chart = std::string(DISTRAIN_SOURCE_DIR) + "/charts/distrain";
  const std::string rbac_file = ::testing::TempDir() + "/rbac-" + ns() + ".yaml";
  ASSERT_EQ(Shell(helm + " template t " + chart + " -n " + ns() + " --kube-version v1.36.0" +
                      " --set rbac.aggregateToDefaultRoles=false --set serviceAccount.name=op" +
                      " --set fullnameOverride=x --show-only templates/rbac.yaml --show-only templates/serviceaccount.yaml > " +
                      rbac_file,
                  &rbac),
            0)
      << rbac;
  // Cluster-scoped names must not collide across test runs.
  std::string sed_out;
  ASSERT_EQ(Shell("sed -i 's/name: x-operator$/name: " + ns() + "-operator/' " + rbac_file, &sed_out), 0);
  Kubectl("apply -n " + ns() + " -f " + rbac_file);
  std::string token = Kubectl("-n " + ns() + " create token op --duration=1h");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  auto admin = kube::LoadRestConfig({});
  ASSERT_TRUE(admin.ok());
  const std::string ca_file = ::testing::TempDir() + "/ca-" + ns() + ".crt";
  std::ofstream(ca_file) << admin->ca_pem;
  const std::string kubeconfig = ::testing::TempDir() + "/sa-" + ns() + ".kubeconfig";
  std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "
                            << admin->server << "\n    certificate-authority: " << ca_file
                            << "\nusers:\n- name: op\n  user:\n    token: " << token
                            << "\ncontexts:\n- name: op\n  context: {cluster: c, user: op, namespace: " << ns()
                            << "}\ncurrent-context: op\n";
  StartOperator({"--kubeconfig=" + kubeconfig, "--leader-elect", "--leader-election-namespace=" + ns()});
  CreateJob(MakeJob(ns(), "sa", "MultiWorkerMirrored", 2, true));
  ASSERT_TRUE(WaitUntil([&] { return Pods("sa").size() == 3 && Services("sa").size() == 3; }, 30))
      << op_->process().output();
  ASSERT_TRUE(WaitCondition("sa", "Created")) << op_->process().output();
  EXPECT_TRUE(ClusterConfigMap("sa").is_object()) << "the ConfigMap was written as the ServiceAccount";
  // No RBAC denial (a 403 for a missing default ServiceAccount is not one).
  EXPECT_THAT(op_->process().output(), Not(HasSubstr("is forbidden: User")));
  // And nothing beyond: the same identity cannot read secrets.
  std::string out;
  EXPECT_NE(Shell(KubectlPath() + " --kubeconfig=" + kubeconfig + " get secrets", &out), 0);
  EXPECT_THAT(out, HasSubstr("forbidden"));
  // ConfigMaps are written, never deleted (the garbage collector does that).
  EXPECT_NE(Shell(KubectlPath() + " --kubeconfig=" + kubeconfig + " delete configmap sa-cluster-spec",
                  &out),
            0);
  EXPECT_THAT(out, HasSubstr("forbidden"));
  Kubectl("delete clusterrolebinding " + ns() + "-operator --ignore-not-found");
  Kubectl("delete clusterrole " + ns() + "-operator --ignore-not-found");
}

TEST_F(OperatorKubeTest, PodsPassRestrictedPodSecurityAndANetworkPolicyIsolatesEachJob) {
  // The namespace enforces the restricted Pod Security Standard: the API
  // server refuses any pod of the job that does not meet it.
  Json labels = {{"metadata",
                  {{"labels", {{"pod-security.kubernetes.io/enforce", "restricted"},
                               {"pod-security.kubernetes.io/enforce-version", "latest"}}}}}};
  auto labelled = client_->Request("PATCH", kube::ResourcePath(kube::NamespacesResource(), "", ns()),
                                   &labels, "application/merge-patch+json");
  ASSERT_TRUE(labelled.ok() && labelled->ok());
  const Json prometheus = {
      {"namespaceSelector", {{"matchLabels", {{"kubernetes.io/metadata.name", "monitoring"}}}}},
      {"podSelector", {{"matchLabels", {{"app.kubernetes.io/name", "prometheus"}}}}}};
  StartOperator({"--network-policy-metrics-peer=" + prometheus.dump()});
  CreateJob(MakeJob(ns(), "ps", "ParameterServer", 2, /*chief=*/true));
  CreateJob(MakeJob(ns(), "other", "MultiWorkerMirrored", 1, /*chief=*/false));
  ASSERT_TRUE(WaitUntil([&] { return Pods("ps").size() == 4 && Pods("other").size() == 1; }, 30))
      << op_->process().output();
  for (const Json& pod : Pods("ps")) {
    EXPECT_EQ(pod["spec"]["automountServiceAccountToken"], false);
    EXPECT_EQ(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    // No projected token volume: the ServiceAccount admission honoured it.
    EXPECT_THAT(pod["spec"].value("volumes", Json::array()).dump(), Not(HasSubstr("kube-api-access")));
  }

  auto get_policy = [&](const std::string& name) {
    auto r = client_->Request("GET", kube::ResourcePath({"networking.k8s.io", "v1", "networkpolicies", true},
                                                        ns(), name));
    return r.ok() && r->ok() ? r->body : Json();
  };
  const Json np = get_policy("ps-network");
  ASSERT_TRUE(np.is_object()) << op_->process().output();
  const Json job = GetJob("ps");
  ASSERT_EQ(np["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(np["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"]);
  EXPECT_EQ(np["spec"]["policyTypes"], Json::array({"Ingress"}));
  // Its selector, asked of the API server, selects exactly the job's pods.
  const Json selector = np["spec"]["podSelector"]["matchLabels"];
  ASSERT_EQ(selector.size(), 1u);
  auto selected = client_->Request(
      "GET", kube::WithQuery(kube::ResourcePath(kube::PodsResource(), ns()),
                             {.label_selector = "distrain.io/job-name=" +
                                                selector["distrain.io/job-name"].get<std::string>()}));
  ASSERT_TRUE(selected.ok() && selected->ok());
  EXPECT_EQ(Names(selected->body["items"].get<std::vector<Json>>()), Names(Pods("ps")));
  // Ingress: the job's own pods on the TF_CONFIG port; Prometheus on the metrics port.
  const Json& ingress = np["spec"]["ingress"];
  ASSERT_EQ(ingress.size(), 2u);
  EXPECT_EQ(ingress[0]["from"], Json::array({{{"podSelector", np["spec"]["podSelector"]}}}));
  EXPECT_EQ(ingress[0]["ports"], Json::parse(R"([{"port":2222,"protocol":"TCP"}])"));
  EXPECT_EQ(ingress[1]["from"], Json::array({prometheus}));
  EXPECT_EQ(ingress[1]["ports"], Json::parse(R"([{"port":9090,"protocol":"TCP"}])"));
  // Written before any pod of the job.
  const int64_t np_version = std::stoll(np["metadata"]["resourceVersion"].get<std::string>());
  for (const Json& pod : Pods("ps")) {
    EXPECT_LT(np_version, std::stoll(pod["metadata"]["resourceVersion"].get<std::string>()));
  }
  // Each job has its own; they do not select each other's pods.
  const Json other = get_policy("other-network");
  ASSERT_TRUE(other.is_object());
  EXPECT_EQ(other["spec"]["podSelector"]["matchLabels"]["distrain.io/job-name"], "other");

  // Owned by the job: the garbage collector removes it with the job.
  auto deleted = client_->Request("DELETE", kube::ResourcePath(Jobs(), ns(), "ps"));
  ASSERT_TRUE(deleted.ok() && deleted->ok());
  EXPECT_TRUE(WaitUntil([&] { return get_policy("ps-network").is_null(); }, 60))
      << "the garbage collector did not remove the job's NetworkPolicy";
  EXPECT_TRUE(get_policy("other-network").is_object());
}

}  // namespace
}  // namespace distrain::kubetest

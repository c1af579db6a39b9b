// kubectl-dtj (cli/kubectl_dtj) against the real API server
// (tests/kube/with_control_plane.sh) with a distrain-operator running: the
// tests play the kubelet by writing pod phases through the API, as
// operator_test.cc does, and run the plugin binary as a user would, once
// through the real kubectl's plugin lookup.

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kube/kube_test_util.h"

namespace distrain::kubetest {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

kube::Resource Jobs() { return {"distrain.io", "v1alpha1", "distributedtrainingjobs", true}; }

std::string PluginDir() { return std::string(DISTRAIN_BINARY_DIR) + "/cli/kubectl_dtj"; }
std::string PluginBinary() { return PluginDir() + "/kubectl-dtj"; }

Json MakeJob(const std::string& ns, const std::string& name, int workers, bool chief,
             const std::string& restart_policy) {
  Json replicas = {{"Worker", {{"replicas", workers}, {"restartPolicy", restart_policy}}}};
  if (chief) replicas["Chief"] = {{"replicas", 1}, {"restartPolicy", restart_policy}};
  return {{"apiVersion", "distrain.io/v1alpha1"},
          {"kind", "DistributedTrainingJob"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"strategy", "MultiWorkerMirrored"},
            {"replicaSpecs", replicas},
            {"training",
             {{"model", {{"type", "mlp"}, {"hiddenUnits", {16}}}},
              {"dataset", {{"type", "synthetic"}, {"numFeatures", 8}, {"numClasses", 2}, {"numExamples", 256}}},
              {"optimizer", {{"type", "sgd"}, {"learningRate", 0.1}}},
              {"globalBatchSize", 16 * (workers + (chief ? 1 : 0))},
              {"steps", 10}}}}}};
}

class KubectlDtjTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(PluginBinary())) << "build the kubectl-dtj target first";
    client_ = AdminClient();
    ASSERT_NE(client_, nullptr);
    ns_ = std::make_unique<TestNamespace>(*client_, "dtj-test");
  }
  void TearDown() override {
    if (HasFailure() && op_ != nullptr) {
      std::cerr << "---- operator output ----\n" << op_->process().output() << "\n----\n";
    }
    op_.reset();
    ns_.reset();
  }
  const std::string& ns() const { return ns_->name(); }

  void StartOperator() {
    op_ = std::make_unique<OperatorProcess>(ns());
    ASSERT_TRUE(WaitUntil([&] { return op_->Ready(); }, 30)) << op_->process().output();
  }

  // Creates the job and waits for its pods.
  void CreateJob(const std::string& name, int workers, bool chief, const std::string& restart_policy) {
    Json job = MakeJob(ns(), name, workers, chief, restart_policy);
    auto r = client_->Request("POST", kube::ResourcePath(Jobs(), ns()), &job);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << r->status_code << " " << r->message();
    const size_t want = workers + (chief ? 1 : 0);
    ASSERT_TRUE(WaitUntil([&] { return PodNames(name).size() == want; }, 20));
  }
  std::vector<std::string> PodNames(const std::string& job) {
    auto r = client_->Request("GET", kube::WithQuery(kube::ResourcePath(kube::PodsResource(), ns()),
                                                     {.label_selector = "distrain.io/job-name=" + job}));
    std::vector<std::string> out;
    if (!r.ok() || !r->ok()) return out;
    for (const Json& p : r->body["items"]) out.push_back(p["metadata"]["name"]);
    return out;
  }
  std::string State(const std::string& job) {
    auto r = client_->Request("GET", kube::ResourcePath(Jobs(), ns(), job));
    if (!r.ok() || !r->ok() || !r->body.contains("status")) return "";
    return r->body["status"].value("state", "");
  }

  // Plays the kubelet (see operator_test.cc).
  void SetPhase(const std::string& pod, const std::string& phase, int exit_code = 0) {
    Json container = {{"name", "distrain"}, {"ready", phase == "Running"}, {"restartCount", 0},
                      {"image", "localhost/distrain/worker:latest"}, {"imageID", ""}};
    if (phase == "Running") {
      container["state"] = {{"running", {{"startedAt", "2026-11-22T00:00:00Z"}}}};
    } else {
      container["state"] = {{"terminated",
                             {{"exitCode", exit_code},
                              {"reason", exit_code == 0 ? "Completed" : "Error"},
                              {"startedAt", "2026-11-22T00:00:00Z"},
                              {"finishedAt", "2026-11-22T00:00:01Z"}}}};
    }
    Json patch = {{"status", {{"phase", phase}, {"containerStatuses", Json::array({container})}}}};
    auto r = client_->Request("PATCH", kube::ResourcePath(kube::PodsResource(), ns(), pod, "status"),
                              &patch, "application/merge-patch+json");
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << pod << ": " << r->status_code << " " << r->message();
  }
  void RunAll(const std::string& job) {
    for (const std::string& pod : PodNames(job)) SetPhase(pod, "Running");
    ASSERT_TRUE(WaitUntil([&] { return State(job) == "Running"; }, 20)) << State(job);
  }

  // Runs the plugin with the admin kubeconfig; returns its exit code.
  int Dtj(const std::string& args, std::string* out) {
    return Shell(PluginBinary() + " " + args + " --kubeconfig=" + Env("KUBECONFIG"), out);
  }
  // The plugin as a Subprocess, for commands that block.
  std::unique_ptr<testing::Subprocess> StartDtj(std::vector<std::string> args) {
    args.insert(args.begin(), PluginBinary());
    args.push_back("--kubeconfig=" + Env("KUBECONFIG"));
    return std::make_unique<testing::Subprocess>(std::move(args));
  }

  std::unique_ptr<kube::RestClient> client_;
  std::unique_ptr<TestNamespace> ns_;
  std::unique_ptr<OperatorProcess> op_;
};

TEST_F(KubectlDtjTest, StatusShowsStrategyStateReplicasProgressPodsAndEvents) {
  StartOperator();
  CreateJob("st", 2, /*chief=*/true, "ExitCode");
  RunAll("st");
  // The chief's progress, as the worker reports it (the operator owns
  // totalSteps: spec.training.steps, 10).
  Json patch = {{"status", {{"progress", {{"step", 4}, {"loss", 0.25},
                                          {"examplesPerSecond", 1234.5}}}}}};
  auto r = client_->Request("PATCH", kube::ResourcePath(Jobs(), ns(), "st", "status"), &patch,
                            "application/merge-patch+json");
  ASSERT_TRUE(r.ok() && r->ok()) << (r.ok() ? r->message() : std::string(r.status().message()));
  // The operator's event about Running is posted asynchronously.
  std::string out;
  ASSERT_TRUE(WaitUntil([&] { return Dtj("status st -n " + ns(), &out) == 0 &&
                                     out.find("JobRunning") != std::string::npos &&
                                     out.find("Events:\n  <none>") == std::string::npos; },
                        20))
      << out;
  EXPECT_THAT(out, HasSubstr("Strategy:    MultiWorkerMirrored"));
  EXPECT_THAT(out, HasSubstr("State:       Running (JobRunning"));
  EXPECT_THAT(out, HasSubstr("step 4/10 (40.0%), loss 0.25, 1234.5 examples/s"));
  EXPECT_THAT(out, ::testing::ContainsRegex("Worker +2 +2 +0 +0 +0"));
  EXPECT_THAT(out, ::testing::ContainsRegex("Chief +1 +1 +0 +0 +0"));
  EXPECT_THAT(out, ::testing::ContainsRegex("st-worker-1 +Running"));
  EXPECT_THAT(out, ::testing::ContainsRegex("Normal +JobRunning"));

  // Through the real kubectl's plugin lookup, the namespace from the flag.
  std::string via_kubectl;
  const int rc = Shell("PATH=" + PluginDir() + ":$PATH KUBECONFIG=" + Env("KUBECONFIG") + " " +
                           KubectlPath() + " dtj status st -n " + ns(),
                       &via_kubectl);
  EXPECT_EQ(rc, 0) << via_kubectl;
  EXPECT_THAT(via_kubectl, HasSubstr("Strategy:    MultiWorkerMirrored"));
  EXPECT_THAT(via_kubectl, HasSubstr("step 4/10"));
}

// spec.strategy Auto: the operator's choice and its reason in status.strategy,
// and on the plugin's Strategy line (common/auto_strategy.h).
TEST_F(KubectlDtjTest, StatusShowsWhatAutoChoseAndWhy) {
  StartOperator();
  Json job = MakeJob(ns(), "au", 2, /*chief=*/false, "ExitCode");
  job["spec"]["strategy"] = "Auto";
  auto r = client_->Request("POST", kube::ResourcePath(Jobs(), ns()), &job);
  ASSERT_TRUE(r.ok() && r->ok()) << (r.ok() ? r->message() : std::string(r.status().message()));
  std::string out;
  ASSERT_TRUE(WaitUntil([&] { return Dtj("status au -n " + ns(), &out) == 0 &&
                                     out.find("-> MultiWorkerMirrored") != std::string::npos; },
                        20))
      << out;
  EXPECT_THAT(out, HasSubstr("Strategy:    Auto -> MultiWorkerMirrored (2 training tasks (Chief + "
                             "Workers), one per machine"));

  // The master's own choice, as the progress reporter patches it
  // (operator/progress_reporter.h): the API server keeps decidedBy (the CRD
  // declares it), the operator's reconciles leave it, the plugin says so.
  Json patch = {{"status",
                 {{"strategy",
                   {{"name", "MultiWorkerMirrored"},
                    {"reason", "2 training tasks (Chief + Workers), one per machine, as measured"},
                    {"decidedBy", "worker"}}}}}};
  r = client_->Request("PATCH", kube::ResourcePath(Jobs(), ns(), "au", "status"), &patch,
                       "application/merge-patch+json");
  ASSERT_TRUE(r.ok() && r->ok()) << (r.ok() ? r->message() : std::string(r.status().message()));
  ASSERT_TRUE(WaitUntil([&] { return Dtj("status au -n " + ns(), &out) == 0 &&
                                     out.find("measured by the master") != std::string::npos; },
                        20))
      << out;
  EXPECT_THAT(out, HasSubstr("as measured; measured by the master)"));
  // A reconcile later (a pod phase change) still shows the master's.
  SetPhase("au-worker-0", "Running");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_EQ(Dtj("status au -n " + ns(), &out), 0);
  EXPECT_THAT(out, HasSubstr("measured by the master")) << out;
}

TEST_F(KubectlDtjTest, WaitPrintsTransitionsAndExitsZeroWhenTheJobSucceeds) {
  StartOperator();
  CreateJob("ok", 1, /*chief=*/false, "ExitCode");
  auto wait = StartDtj({"wait", "ok", "-n", ns(), "--timeout", "60s"});
  SetPhase("ok-worker-0", "Running");
  ASSERT_TRUE(wait->WaitForOutput(": Running (JobRunning", 20)) << wait->output();
  SetPhase("ok-worker-0", "Succeeded", 0);
  std::optional<int> rc = wait->Wait(20);
  ASSERT_TRUE(rc.has_value()) << wait->output();
  EXPECT_EQ(*rc, 0) << wait->output();
  EXPECT_THAT(wait->output(), HasSubstr(ns() + "/ok: Succeeded (JobSucceeded"));
  // Already succeeded: returns at once from the LIST.
  std::string out;
  EXPECT_EQ(Dtj("wait ok -n " + ns(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("Succeeded"));
}

TEST_F(KubectlDtjTest, WaitExitsOneWithReasonAndMessageWhenTheJobFails) {
  StartOperator();
  CreateJob("bad", 1, /*chief=*/false, "Never");
  auto wait = StartDtj({"wait", "bad", "-n", ns(), "--timeout=60s"});
  SetPhase("bad-worker-0", "Running");
  ASSERT_TRUE(WaitUntil([&] { return State("bad") == "Running"; }, 20));
  SetPhase("bad-worker-0", "Failed", 3);
  std::optional<int> rc = wait->Wait(20);
  ASSERT_TRUE(rc.has_value()) << wait->output();
  EXPECT_EQ(*rc, 1) << wait->output();
  // "Failed (<Reason>: <message>)", the message naming the pod that failed.
  EXPECT_THAT(wait->output(), ::testing::ContainsRegex("/bad: Failed \\([A-Za-z]+: .*bad-worker-0"));
}

TEST_F(KubectlDtjTest, WaitExitsThreeOnTimeoutNamingTheLastState) {
  StartOperator();
  CreateJob("slow", 1, /*chief=*/false, "ExitCode");
  const auto start = std::chrono::steady_clock::now();
  std::string out;
  EXPECT_EQ(Dtj("wait slow -n " + ns() + " --timeout 2s", &out), 3) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_THAT(out, HasSubstr("timed out after 2s waiting for DistributedTrainingJob " + ns() + "/slow"));
  EXPECT_THAT(out, HasSubstr("raise --timeout"));
}

TEST_F(KubectlDtjTest, MissingJobNamesJobNamespaceAndTheFix) {
  const std::string want = "no DistributedTrainingJob nope in namespace " + ns() + "; kubectl get dtj -n " + ns();
  std::string out;
  EXPECT_EQ(Dtj("status nope -n " + ns(), &out), 1);
  EXPECT_THAT(out, HasSubstr(want));
  EXPECT_EQ(Dtj("wait nope -n " + ns(), &out), 4);
  EXPECT_THAT(out, HasSubstr(want));
  EXPECT_EQ(Dtj("logs nope -n " + ns(), &out), 1);
  EXPECT_THAT(out, HasSubstr(want));
}

TEST_F(KubectlDtjTest, LogsOfPodsWithoutANodeSayTheyAreNotRunningOnANodeYet) {
  StartOperator();
  CreateJob("lg", 2, /*chief=*/false, "ExitCode");
  std::string out;
  EXPECT_EQ(Dtj("logs lg -n " + ns(), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("pod lg-worker-0 is not running on a node yet (phase Pending)"));
  EXPECT_THAT(out, HasSubstr("pod lg-worker-1 is not running on a node yet"));
  // --replica-type filters the pods; -f with no node does not hang.
  EXPECT_EQ(Dtj("logs lg -f -n " + ns() + " --replica-type chief", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("has no chief pods"));
  EXPECT_EQ(Dtj("logs lg -f --tail 5 -n " + ns() + " --replica-type worker", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("pod lg-worker-1 is not running on a node yet"));
  EXPECT_THAT(out, Not(HasSubstr("Segmentation")));

  // Bound to a node that has no kubelet: the API server's answer, naming the
  // pod and the node, and the other pod's message still comes.
  Json binding = {{"apiVersion", "v1"}, {"kind", "Binding"}, {"metadata", {{"name", "lg-worker-0"}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "ghost"}}}};
  auto r = client_->Request("POST", kube::ResourcePath(kube::PodsResource(), ns(), "lg-worker-0", "binding"),
                            &binding);
  ASSERT_TRUE(r.ok() && r->ok()) << (r.ok() ? r->message() : std::string(r.status().message()));
  EXPECT_EQ(Dtj("logs lg -n " + ns(), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("error: logs of pod lg-worker-0"));
  EXPECT_THAT(out, HasSubstr("ghost"));
  EXPECT_THAT(out, HasSubstr("pod lg-worker-1 is not running on a node yet"));
}

TEST_F(KubectlDtjTest, BadUsageExitsTwoAndHelpExitsZero) {
  std::string out;
  EXPECT_EQ(Dtj("wait", &out), 2) << out;
  EXPECT_EQ(Dtj("wait j --timeout soon", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("--timeout soon is not a duration"));
  EXPECT_EQ(Dtj("logs j --replica-type boss", &out), 2) << out;
  EXPECT_EQ(Dtj("frobnicate j", &out), 2) << out;
  for (const char* cmd : {"status", "wait", "logs"}) {
    EXPECT_EQ(Dtj(std::string(cmd) + " --help", &out), 0) << out;
    EXPECT_THAT(out, HasSubstr("--namespace"));
  }
  EXPECT_EQ(Dtj("--help", &out), 0);
  EXPECT_THAT(out, HasSubstr("wait: 0 the job Succeeded, 1 it Failed, 3 timed out"));
}

// RestClient::Stream, added for `logs`: bytes as they come, error answers
// parsed, an endless stream ended by the callback.
TEST(RestClientStreamTest, DeliversBodiesReportsErrorsAndStopsEndlessStreams) {
  auto client = AdminClient();
  ASSERT_NE(client, nullptr);
  std::string body;
  auto version = client->Stream("/version", [&](std::string_view d) { body.append(d); return true; }, {});
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->status_code, 200);
  EXPECT_THAT(body, HasSubstr("gitVersion"));

  body.clear();
  auto missing = client->Stream(kube::ResourcePath(kube::PodsResource(), "default", "no-such-pod", "log"),
                                [&](std::string_view d) { body.append(d); return true; }, {});
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status_code, 404);
  EXPECT_THAT(missing->message(), HasSubstr("no-such-pod"));
  EXPECT_EQ(body, "");

  // A watch never ends by itself: returning false from the callback does.
  const auto start = std::chrono::steady_clock::now();
  auto endless = client->Stream(
      kube::WithQuery(kube::ResourcePath(kube::NamespacesResource()), {.watch = true}),
      [&](std::string_view d) { body.append(d); return false; }, {});
  ASSERT_TRUE(endless.ok()) << endless.status();
  EXPECT_EQ(endless->status_code, 200);
  EXPECT_THAT(body, HasSubstr("\"ADDED\""));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace distrain::kubetest

#include "operator/controller/reconciler.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/job_identity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/controller/job_identity_secret.h"
#include "operator/kube/clock.h"
#include "operator/kube/expectations.h"
#include "tests/unit/operator/controller/world.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain::controller {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using kube::testing::ScriptedClient;
using testing::Json;
using testing::MakeJob;
using testing::World;

constexpr char kKey[] = "team-a/mnist";
constexpr char kPods[] = "/api/v1/namespaces/team-a/pods";
constexpr char kServices[] = "/api/v1/namespaces/team-a/services";
constexpr char kConfigMaps[] = "/api/v1/namespaces/team-a/configmaps";
constexpr char kStatus[] =
    "/apis/distrain.io/v1alpha1/namespaces/team-a/distributedtrainingjobs/mnist/status";

const char kSpec[] =
    "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
    "    Worker: {replicas: 2}\n  training: {globalBatchSize: 60}\n";

// The job as the informer holds it, and the children it shows.
struct Fixture {
  Json job;
  Observed observed;
  std::vector<Event> events;
  std::mutex mu;
  kube::FakeClock clock{testing::T0()};
  kube::Expectations expectations{&clock};
  ScriptedClient client;
  // Without the NetworkPolicy and the checkpoint claim, so that each test
  // scripts only the requests its subject makes; their tests turn them on.
  ControllerOptions options = [] {
    ControllerOptions o;
    o.network_policy.enabled = false;
    o.checkpoint_storage.provision = false;
    return o;
  }();

  explicit Fixture(const std::string& spec = kSpec) {
    api::DistributedTrainingJob parsed = MakeJob(spec);
    parsed.metadata.resource_version = "7";
    // Without the identity Secret too (its tests below turn it back on).
    parsed.spec.transport = TransportMode::kPlaintext;
    job = api::ToJson(parsed);
    job.erase("status");
  }

  JobReconciler Make(bool pod_group_crd_installed = false) {
    ReconcilerHooks hooks;
    hooks.pod_group_crd_installed = [pod_group_crd_installed] { return pod_group_crd_installed; };
    hooks.get_job = [this](const std::string& key) -> std::optional<Json> {
      if (key == kKey && !job.is_null()) return job;
      return std::nullopt;
    };
    hooks.observe = [this](const Json&) { return observed; };
    hooks.record_event = [this](const Json& j, const Event& e) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(j["metadata"]["name"], "mnist");
      events.push_back(e);
    };
    return JobReconciler(&client, &expectations, std::move(hooks), options, &clock);
  }
};

ScriptedClient::Handler Created() {
  return [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(201, c.body); };
}

// Answers every request as the API server would on success.
ScriptedClient::Handler Echo() {
  return [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(c.method == "POST" ? 201 : 200, c.body);
  };
}

TEST(JobReconcilerTest, NewJobCreatesChildrenThenWritesStatusOnceThenWaitsForTheCache) {
  Fixture f;
  f.client.Expect("POST", kConfigMaps, Created());  // before any pod: pods read it
  // Then Services and pods (concurrently, so in no fixed order), then the status.
  f.client.SetFallback(Echo());
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_TRUE(result.ok()) << result.status();
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  ASSERT_EQ(calls.size(), 8u);
  EXPECT_EQ(calls[0].body["metadata"]["name"], "mnist-cluster-spec");
  EXPECT_EQ(calls[7].method, "PUT");
  EXPECT_EQ(calls[7].path, kStatus);
  EXPECT_TRUE(calls[0].body["data"]["cluster"].is_string());
  // The status is PUT once, with the cached resourceVersion for optimistic concurrency.
  EXPECT_EQ(calls[7].body["metadata"]["resourceVersion"], "7");
  EXPECT_EQ(calls[7].body["status"]["state"], "Created");
  EXPECT_EQ(calls[7].body["spec"]["strategy"], "MultiWorkerMirrored");
  std::vector<std::string> pods, services;
  for (int i = 1; i < 7; ++i) {
    EXPECT_EQ(calls[i].method, "POST");
    (calls[i].path == kPods ? pods : services).push_back(calls[i].body["metadata"]["name"]);
  }
  std::sort(services.begin(), services.end());
  EXPECT_THAT(services, ElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  std::sort(pods.begin(), pods.end());
  EXPECT_THAT(pods, ElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_EQ(f.events.size(), 1u);
  EXPECT_EQ(f.events[0].reason, "JobCreated");

  // The informer has not shown the pods yet: the next reconcile does nothing,
  // in particular it does not create them again.
  EXPECT_FALSE(f.expectations.SatisfiedExpectations(kKey));
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  EXPECT_EQ(f.client.num_calls(), 8u);
  for (int i = 0; i < 3; ++i) f.expectations.CreationObserved(kKey);
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
  // Nor while the ConfigMap's write is unseen (a stale cache would PUT it
  // again from an old resourceVersion).
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  EXPECT_EQ(f.client.num_calls(), 8u);
  f.expectations.CreationObserved(ConfigMapExpectationsKey(kKey));
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(ConfigMapExpectationsKey(kKey)));
}

TEST(JobReconcilerTest, AFailedConfigMapWriteCreatesNoPods) {
  Fixture f;
  f.client.Expect("POST", kConfigMaps,
                  ScriptedClient::Status(403, "Forbidden", "configmaps is forbidden"));
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("ConfigMap team-a/mnist-cluster-spec"));
  f.client.ExpectAllConsumed();  // in particular, no pod POST
  // No informer event will come for the refused write.
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(ConfigMapExpectationsKey(kKey)));
}

TEST(JobReconcilerTest, TheNetworkPolicyIsCreatedAfterTheConfigMapAndBeforeAnyPod) {
  Fixture f;
  f.options.network_policy.enabled = true;
  constexpr char kPolicies[] = "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies";
  f.client.Expect("POST", kConfigMaps, Created());
  // A 409 means it is there already (a cache that has not seen it yet).
  f.client.Expect("POST", kPolicies, ScriptedClient::Status(409, "AlreadyExists", "exists"));
  f.client.SetFallback(Echo());
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  ASSERT_EQ(calls.size(), 9u);
  EXPECT_EQ(calls[1].body["metadata"]["name"], "mnist-network");
  int pods = 0;
  for (size_t i = 2; i < calls.size(); ++i) pods += calls[i].path == kPods;
  EXPECT_EQ(pods, 3);
}

TEST(JobReconcilerTest, AFailedNetworkPolicyCreateCreatesNoPods) {
  Fixture f;
  f.options.network_policy.enabled = true;
  f.client.Expect("POST", kConfigMaps, Created());
  f.client.Expect("POST", "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies",
                  ScriptedClient::Status(403, "Forbidden", "networkpolicies is forbidden"));
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("NetworkPolicy team-a/mnist-network"));
  f.client.ExpectAllConsumed();  // in particular, no pod POST
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
}

constexpr char kClaims[] = "/api/v1/namespaces/team-a/persistentvolumeclaims";

TEST(JobReconcilerTest, TheCheckpointClaimIsCreatedBeforeAnyPodThatMountsIt) {
  Fixture f;
  f.options.checkpoint_storage.provision = true;
  f.client.Expect("POST", kConfigMaps, Created());
  // A 409 means it is there already (a cache that has not seen it yet).
  f.client.Expect("POST", kClaims, ScriptedClient::Status(409, "AlreadyExists", "exists"));
  f.client.SetFallback(Echo());
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  ASSERT_EQ(calls.size(), 9u);
  EXPECT_EQ(calls[1].body["metadata"]["name"], "mnist-checkpoints");
  EXPECT_EQ(calls[1].body["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  int pods = 0;
  for (size_t i = 2; i < calls.size(); ++i) {
    if (calls[i].path != kPods) continue;
    ++pods;
    const Json& volumes = calls[i].body["spec"]["volumes"];
    const bool chief = calls[i].body["metadata"]["name"] == "mnist-chief-0";
    // ReadWriteOnce by default: the chief mounts it, the other workers do not.
    EXPECT_EQ(volumes.is_array() && !volumes.empty(), chief) << calls[i].body["metadata"]["name"];
  }
  EXPECT_EQ(pods, 3);
}

TEST(JobReconcilerTest, AFailedCheckpointClaimCreateCreatesNoPods) {
  Fixture f;
  f.options.checkpoint_storage.provision = true;
  f.client.Expect("POST", kConfigMaps, Created());
  f.client.Expect("POST", kClaims,
                  ScriptedClient::Status(403, "Forbidden", "persistentvolumeclaims is forbidden"));
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("PersistentVolumeClaim team-a/mnist-checkpoints"));
  f.client.ExpectAllConsumed();  // in particular, no pod POST
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
}

TEST(JobReconcilerTest, AScaleUpdatesTheConfigMapFromTheCachedVersion) {
  Fixture f;
  World w(MakeJob(kSpec));
  w.Step();
  w.SetAll("Running");
  w.Step();
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 3;
  f.job = api::ToJson(w.job);
  f.job["metadata"]["resourceVersion"] = "9";
  f.job["spec"]["security"]["transport"] = "Plaintext";
  f.observed = w.Observe();
  f.client.Expect("PUT", std::string(kConfigMaps) + "/mnist-cluster-spec",
                  [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(200, c.body); });
  f.client.Expect("POST", kServices, Created());  // mnist-worker-2
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  for (const char* pod : {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1"}) {
    f.client.Expect("DELETE", std::string(kPods) + "/" + pod,
                    ScriptedClient::Reply(200, Json::object()));
  }
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const Json put = f.client.calls()[0].body;
  EXPECT_EQ(put["metadata"]["resourceVersion"], (*w.config_map)["metadata"]["resourceVersion"]);
  EXPECT_EQ(Json::parse(put["data"]["cluster"].get<std::string>())["worker"].size(), 3u);
  EXPECT_FALSE(f.expectations.SatisfiedExpectations(ConfigMapExpectationsKey(kKey)));
}

TEST(JobReconcilerTest, AScaledGangPutsTheNewMinMemberOnItsPodGroup) {
  const std::string spec =
      "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 2}\n    PS: {replicas: 1}\n"
      "  runPolicy:\n    scheduling: {gang: true}\n";
  Fixture f(spec);
  World w(MakeJob(spec));
  w.facts.pod_group_crd_installed = true;
  w.Step();
  w.SetAll("Running");
  w.Step();
  ASSERT_TRUE(w.pod_group.has_value());
  (*w.pod_group)["metadata"]["resourceVersion"] = "21";
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 3;
  f.job = api::ToJson(w.job);
  f.job["metadata"]["resourceVersion"] = "9";
  f.job["spec"]["security"]["transport"] = "Plaintext";
  f.observed = w.Observe();
  f.client.Expect("PUT", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/team-a/podgroups/mnist",
                  [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(200, c.body); });
  f.client.Expect("PUT", std::string(kConfigMaps) + "/mnist-cluster-spec",
                  [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(200, c.body); });
  f.client.Expect("POST", kServices, Created());  // mnist-worker-2
  f.client.Expect("POST", kPods, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make(/*pod_group_crd_installed=*/true);
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const Json put = f.client.calls()[0].body;
  EXPECT_EQ(put["spec"]["minMember"], 5);  // chief + 3 workers + 1 ps
  EXPECT_EQ(put["metadata"]["resourceVersion"], "21");
}

TEST(JobReconcilerTest, AGoneJobForgetsItsExpectations) {
  Fixture f;
  f.expectations.ExpectCreations(kKey, 2);
  f.job = Json();
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  EXPECT_EQ(f.client.num_calls(), 0u);
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
}

TEST(JobReconcilerTest, ACreateErrorStopsTheBatchAndLowersTheExpectations) {
  Fixture f;
  f.client.Expect("POST", kConfigMaps, Created());
  // The third pod POST is refused, whichever pod it is.
  std::atomic<int> pod_posts{0};
  f.client.SetFallback([&pod_posts](const ScriptedClient::Call& c) -> absl::StatusOr<kube::ApiResponse> {
    if (c.path == kPods && ++pod_posts == 3) {
      return ScriptedClient::Status(403, "Forbidden", "exceeded quota: pods=2");
    }
    return Echo()(c);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("exceeded quota"));
  f.client.ExpectAllConsumed();
  // Two pods were created; the failed one will never be observed.
  EXPECT_EQ(pod_posts.load(), 3);
  EXPECT_EQ(f.expectations.Get(kKey).creations, 2);
}

TEST(JobReconcilerTest, ServicesAndPodsGoOutInOneSlowStartStream) {
  Fixture f("  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
            "    Worker: {replicas: 60}\n    PS: {replicas: 2}\n");
  f.client.Expect("POST", kConfigMaps, Created());
  std::mutex mu;
  int in_flight = 0, most = 0;
  std::vector<int> in_flight_at_start;
  f.client.SetFallback([&](const ScriptedClient::Call& c) -> absl::StatusOr<kube::ApiResponse> {
    if (c.method != "POST") return Echo()(c);
    {
      std::lock_guard<std::mutex> lock(mu);
      in_flight_at_start.push_back(++in_flight);
      most = std::max(most, in_flight);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    {
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
    }
    return Echo()(c);
  });
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  const auto calls = f.client.calls();
  std::map<std::string, size_t> service_at, pod_at;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].path == kServices) service_at[calls[i].body["metadata"]["name"]] = i;
    if (calls[i].path == kPods) pod_at[calls[i].body["metadata"]["name"]] = i;
  }
  EXPECT_EQ(service_at.size(), 63u);
  EXPECT_EQ(pod_at.size(), 63u);
  // The first request goes alone (a refusal costs one request), then more at once.
  ASSERT_FALSE(in_flight_at_start.empty());
  EXPECT_EQ(in_flight_at_start[0], 1);
  EXPECT_GT(most, 1);
  EXPECT_LE(most, JobReconciler::kMaxBatch);
  for (const auto& [name, at] : pod_at) EXPECT_TRUE(service_at.count(name)) << name;
  EXPECT_EQ(f.expectations.Get(kKey).creations, 63);
}

// A job whose worker-1 failed with a retryable code: every pod is to be
// deleted for a restart.
void FailWorker(World* w, Fixture* f) {
  w->Step();
  w->SetAll("Running");
  w->Step();
  testing::SetPhase(&w->Pod("mnist-worker-1"), "Failed", 137);
  f->job = api::ToJson(w->job);
  f->job["metadata"]["resourceVersion"] = "9";
  f->observed = w->Observe();
}

TEST(JobReconcilerTest, RestartWritesTheStatusThenDeletesWithUidPreconditions) {
  // A group restart (TensorFlow's recovery): every pod of the generation goes.
  World w(MakeJob(absl::StrCat(kSpec, "  runPolicy: {recoveryPolicy: RestartGroup}\n")));
  Fixture f;
  FailWorker(&w, &f);
  const std::string chief_uid = w.Pod("mnist-chief-0")["metadata"]["uid"];
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-chief-0",
                  ScriptedClient::Reply(200, Json::object()));
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-worker-0",
                  ScriptedClient::Status(404, "NotFound", "gone"));
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-worker-1",
                  ScriptedClient::Reply(200, Json::object()));
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  // The restart is counted in the status before any pod is gone.
  EXPECT_EQ(calls[0].body["status"]["restartCount"], 1);
  std::set<std::string> deleted;
  for (const auto& c : calls) {
    if (c.method != "DELETE") continue;
    EXPECT_EQ(c.body["propagationPolicy"], "Background");
    EXPECT_TRUE(c.body["preconditions"]["uid"].is_string());
    deleted.insert(c.path);
  }
  EXPECT_EQ(deleted.size(), 3u);
  EXPECT_EQ(calls[1].body["preconditions"]["uid"], chief_uid);
  // The failed pod has nothing left running: it goes at once, freeing its name
  // for the replacement; the running ones get their grace period (SIGTERM).
  for (const auto& c : calls) {
    if (c.method != "DELETE") continue;
    if (c.path == std::string(kPods) + "/mnist-worker-1") {
      EXPECT_EQ(c.body.value("gracePeriodSeconds", -1), 0) << c.body.dump();
    } else {
      EXPECT_FALSE(c.body.contains("gracePeriodSeconds")) << c.path << ": " << c.body.dump();
    }
  }
  std::vector<std::string> reasons;
  for (const Event& e : f.events) reasons.push_back(e.reason);
  EXPECT_THAT(reasons, ::testing::Contains("Restarting"));
  // The 404 counts as observed; the two others wait for the informer.
  EXPECT_EQ(f.expectations.Get(kKey).deletions, 2);
}

TEST(JobReconcilerTest, AStatusConflictKeepsThePodsAndTheEventsForTheRetry) {
  World w(MakeJob(kSpec));
  Fixture f;
  FailWorker(&w, &f);
  f.client.Expect("PUT", kStatus,
                  ScriptedClient::Status(409, "Conflict", "the object has been modified"));
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  // No pod deleted: the restart they stand for is not recorded yet, and a
  // pod once gone could not be counted by the retry.
  f.client.ExpectAllConsumed();
  EXPECT_EQ(f.client.num_calls(), 1u);
  EXPECT_THAT(f.events, IsEmpty());
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
}

TEST(JobReconcilerTest, ExpiredTtlDeletesTheJob) {
  Fixture f(std::string(kSpec) + "  runPolicy: {ttlSecondsAfterFinished: 0}\n");
  api::DistributedTrainingJob parsed = *api::ParseJob(f.job);
  parsed.status.conditions.push_back({api::kConditionSucceeded, "True", "JobSucceeded", "done", 1,
                                      testing::T0()});
  parsed.status.completion_time = testing::T0();
  f.job = api::ToJson(parsed);
  f.client.Expect("DELETE",
                  "/apis/distrain.io/v1alpha1/namespaces/team-a/distributedtrainingjobs/mnist",
                  ScriptedClient::Reply(200, Json::object()));
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  EXPECT_EQ(f.client.calls()[0].body["preconditions"]["uid"], "uid-mnist");
}

// ---- The job's identity Secret (job_identity_secret.h) ----------------------

constexpr char kSecrets[] = "/api/v1/namespaces/team-a/secrets";
constexpr char kIdentitySecret[] = "/api/v1/namespaces/team-a/secrets/mnist-identity";

std::string Decoded(const Json& data, const std::string& key) {
  std::string raw;
  EXPECT_TRUE(data.contains(key)) << key;
  if (data.contains(key)) {
    EXPECT_TRUE(absl::Base64Unescape(data[key].get<std::string>(), &raw));
  }
  return raw;
}

TEST(JobIdentitySecretTest, ANewJobGetsACertificatePerPodBeforeAnyPodAndEachPodMountsOnlyItsOwn) {
  Fixture f;
  f.job["spec"]["security"]["transport"] = "MutualTLS";
  f.client.Expect("POST", kConfigMaps, Created());
  f.client.Expect("GET", kIdentitySecret, ScriptedClient::Status(404, "NotFound", "not found"));
  f.client.Expect("POST", kSecrets, Created());
  f.client.SetFallback(Echo());
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  const Json& secret = calls[2].body;
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
  const Json& data = secret["data"];
  const std::string ca = Decoded(data, "ca.crt");
  const std::string ring = Decoded(data, "ring.key");
  for (const char* task : {"chief-0", "worker-0", "worker-1"}) {
    const std::string type = std::string(task).substr(0, std::string(task).find('-'));
    const int index = std::string(task).back() - '0';
    auto loaded = CheckCredentials(
        ca, TaskCredentials{Decoded(data, std::string(task) + ".crt"),
                            Decoded(data, std::string(task) + ".key")},
        ring);
    ASSERT_TRUE(loaded.ok()) << task << ": " << loaded.status();
    EXPECT_EQ(loaded->task, (TaskId{type, index}));
  }
  int pods = 0;
  for (size_t i = 3; i < calls.size(); ++i) {
    if (calls[i].path != kPods) continue;
    ++pods;
    const Json& pod = calls[i].body;
    const std::string name = pod["metadata"]["name"];
    const std::string task = name.substr(std::string("mnist-").size());
    Json volume;
    for (const Json& v : pod["spec"]["volumes"]) {
      if (v["name"] == "distrain-identity") volume = v;
    }
    ASSERT_TRUE(volume.is_object()) << name;
    std::vector<std::string> keys;
    for (const Json& item : volume["secret"]["items"]) keys.push_back(item["key"]);
    // Never the CA's key, never another task's.
    EXPECT_THAT(keys, ::testing::UnorderedElementsAre("ca.crt", "ring.key", task + ".crt",
                                                      task + ".key"))
        << name;
    bool env = false;
    for (const Json& e : pod["spec"]["containers"][0]["env"]) {
      env = env || (e["name"] == "DISTRAIN_CREDENTIALS_DIR" &&
                    e["value"] == "/var/run/distrain/identity");
    }
    EXPECT_TRUE(env) << name;
  }
  EXPECT_EQ(pods, 3);
}

TEST(JobIdentitySecretTest, AScaleUpAddsCertificatesFromTheSameCaAndKeepsTheOthers) {
  Fixture f;
  f.job["spec"]["security"]["transport"] = "MutualTLS";
  auto authority = NewJobAuthority("team-a/mnist");
  ASSERT_TRUE(authority.ok());
  auto chief = IssueTaskCredentials(*authority, TaskId{"chief", 0});
  ASSERT_TRUE(chief.ok());
  Json existing = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"metadata", {{"name", "mnist-identity"}, {"resourceVersion", "3"}}},
                   {"data",
                    {{"ca.crt", absl::Base64Escape(authority->ca_cert_pem)},
                     {"ca.key", absl::Base64Escape(authority->ca_key_pem)},
                     {"ring.key", absl::Base64Escape(authority->ring_key_hex)},
                     {"chief-0.crt", absl::Base64Escape(chief->cert_pem)},
                     {"chief-0.key", absl::Base64Escape(chief->key_pem)}}}};
  f.client.Expect("POST", kConfigMaps, Created());
  f.client.Expect("GET", kIdentitySecret, ScriptedClient::Reply(200, existing));
  f.client.Expect("PUT", kIdentitySecret, Echo());
  f.client.SetFallback(Echo());
  JobReconciler r = f.Make();
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  ASSERT_GE(calls.size(), 3u);
  ASSERT_EQ(calls[2].method, "PUT");
  const Json& put = calls[2].body;
  EXPECT_EQ(put["metadata"]["resourceVersion"], "3");  // optimistic concurrency
  EXPECT_EQ(Decoded(put["data"], "chief-0.crt"), chief->cert_pem);  // kept, not reissued
  auto worker = CheckCredentials(
      authority->ca_cert_pem,
      TaskCredentials{Decoded(put["data"], "worker-1.crt"), Decoded(put["data"], "worker-1.key")},
      authority->ring_key_hex);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->task, (TaskId{"worker", 1}));
}

TEST(JobIdentitySecretTest, AFailedSecretCreateCreatesNoPods) {
  Fixture f;
  f.job["spec"]["security"]["transport"] = "MutualTLS";
  f.client.Expect("POST", kConfigMaps, Created());
  f.client.Expect("GET", kIdentitySecret, ScriptedClient::Status(404, "NotFound", "not found"));
  f.client.Expect("POST", kSecrets,
                  ScriptedClient::Status(403, "Forbidden", "secrets is forbidden"));
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("creating Secret team-a/mnist-identity"));
  f.client.ExpectAllConsumed();  // in particular, no pod POST
}

TEST(JobIdentitySecretTest, AJobTooLargeForOneSecretIsRefusedWithTheFixNotSentToTheApiServer) {
  Fixture f;
  f.job["spec"]["security"]["transport"] = "MutualTLS";
  std::vector<Json> pods;
  for (int i = 0; i < 1200; ++i) {
    pods.push_back({{"metadata",
                     {{"labels",
                       {{api::kLabelReplicaType, "worker"},
                        {api::kLabelReplicaIndex, std::to_string(i)}}}}}});
  }
  f.client.Expect("GET", kIdentitySecret, ScriptedClient::Status(404, "NotFound", "not found"));
  absl::Status s = EnsureJobIdentity(f.client, f.job, pods);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("1200 task certificates"), HasSubstr("transport: Plaintext")));
  f.client.ExpectAllConsumed();  // no POST
}

}  // namespace
}  // namespace distrain::controller

#include "operator/controller/reconciler.h"

#include <mutex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/clock.h"
#include "operator/kube/expectations.h"
#include "tests/unit/operator/controller/world.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain::controller {
namespace {

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

  explicit Fixture(const std::string& spec = kSpec) {
    api::DistributedTrainingJob parsed = MakeJob(spec);
    parsed.metadata.resource_version = "7";
    job = api::ToJson(parsed);
    job.erase("status");
  }

  JobReconciler Make() {
    ReconcilerHooks hooks;
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
    return JobReconciler(&client, &expectations, std::move(hooks), ControllerOptions{}, &clock);
  }
};

ScriptedClient::Handler Created() {
  return [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(201, c.body); };
}

TEST(JobReconcilerTest, NewJobCreatesChildrenThenWritesStatusOnceThenWaitsForTheCache) {
  Fixture f;
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kPods, Created());
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_TRUE(result.ok()) << result.status();
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  ASSERT_EQ(calls.size(), 7u);
  // The status is PUT once, with the cached resourceVersion for optimistic concurrency.
  EXPECT_EQ(calls[6].body["metadata"]["resourceVersion"], "7");
  EXPECT_EQ(calls[6].body["status"]["state"], "Created");
  EXPECT_EQ(calls[6].body["spec"]["strategy"], "MultiWorkerMirrored");
  std::vector<std::string> pods;
  for (int i = 3; i < 6; ++i) pods.push_back(calls[i].body["metadata"]["name"]);
  std::sort(pods.begin(), pods.end());
  EXPECT_THAT(pods, ElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_EQ(f.events.size(), 1u);
  EXPECT_EQ(f.events[0].reason, "JobCreated");

  // The informer has not shown the pods yet: the next reconcile does nothing,
  // in particular it does not create them again.
  EXPECT_FALSE(f.expectations.SatisfiedExpectations(kKey));
  ASSERT_TRUE(r.Reconcile(kKey).ok());
  EXPECT_EQ(f.client.num_calls(), 7u);
  for (int i = 0; i < 3; ++i) f.expectations.CreationObserved(kKey);
  EXPECT_TRUE(f.expectations.SatisfiedExpectations(kKey));
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
  for (int i = 0; i < 3; ++i) f.client.Expect("POST", kServices, Created());
  f.client.Expect("POST", kPods, Created());  // batch of 1
  f.client.Expect("POST", kPods, Created());  // batch of 2 ...
  f.client.Expect("POST", kPods,
                  ScriptedClient::Status(403, "Forbidden", "exceeded quota: pods=2"));
  f.client.Expect("PUT", kStatus, [](const ScriptedClient::Call& c) {
    return ScriptedClient::Reply(200, c.body);
  });
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("exceeded quota"));
  f.client.ExpectAllConsumed();
  // Two pods were created; the failed one will never be observed.
  EXPECT_EQ(f.expectations.Get(kKey).creations, 2);
}

TEST(JobReconcilerTest, DeletesWithUidPreconditionsAndKeepsEventsUntilTheStatusIsWritten) {
  Fixture f;
  World w(MakeJob(kSpec));
  w.Step();
  w.SetAll("Running");
  w.Step();
  testing::SetPhase(&w.Pod("mnist-worker-1"), "Failed", 137);
  f.job = api::ToJson(w.job);
  f.job["metadata"]["resourceVersion"] = "9";
  f.observed = w.Observe();
  const std::string chief_uid = w.Pod("mnist-chief-0")["metadata"]["uid"];
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-chief-0",
                  ScriptedClient::Reply(200, Json::object()));
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-worker-0",
                  ScriptedClient::Status(404, "NotFound", "gone"));
  f.client.Expect("DELETE", std::string(kPods) + "/mnist-worker-1",
                  ScriptedClient::Reply(200, Json::object()));
  f.client.Expect("PUT", kStatus,
                  ScriptedClient::Status(409, "Conflict", "the object has been modified"));
  JobReconciler r = f.Make();
  auto result = r.Reconcile(kKey);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  f.client.ExpectAllConsumed();
  const auto calls = f.client.calls();
  std::set<std::string> deleted;
  for (const auto& c : calls) {
    if (c.method != "DELETE") continue;
    EXPECT_EQ(c.body["propagationPolicy"], "Background");
    EXPECT_TRUE(c.body["preconditions"]["uid"].is_string());
    deleted.insert(c.path);
  }
  EXPECT_EQ(deleted.size(), 3u);
  EXPECT_EQ(calls[0].body["preconditions"]["uid"], chief_uid);
  EXPECT_THAT(f.events, IsEmpty());  // the status did not land
  // The 404 counts as observed; the two others wait for the informer.
  EXPECT_EQ(f.expectations.Get(kKey).deletions, 2);
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

}  // namespace
}  // namespace distrain::controller

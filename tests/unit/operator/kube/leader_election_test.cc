#include "operator/kube/leader_election.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/clock.h"
#include "operator/kube/event_recorder.h"
#include "prometheus/registry.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain::kube {
namespace {

using ::testing::HasSubstr;
using testing::ScriptedClient;

constexpr char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/op";
constexpr char kLeasesPath[] = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

LeaderElectionConfig Config(FakeClock* clock, std::string identity = "me") {
  LeaderElectionConfig c;
  c.lease_namespace = "ns";
  c.lease_name = "op";
  c.identity = std::move(identity);
  c.clock = clock;
  return c;
}

nlohmann::json Lease(const std::string& holder, int64_t transitions, const std::string& rv,
                     const std::string& renew = "2020-01-01T00:00:00.000000Z") {
  return {{"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", "op"}, {"namespace", "ns"}, {"resourceVersion", rv}}},
          {"spec",
           {{"holderIdentity", holder},
            {"leaseDurationSeconds", 15},
            {"acquireTime", "2020-01-01T00:00:00.000000Z"},
            {"renewTime", renew},
            {"leaseTransitions", transitions}}}};
}

// What the API server does with a successful write: the object back, with a
// new resourceVersion.
ScriptedClient::Handler Accept(int code = 200) {
  return [code](const ScriptedClient::Call& c) -> absl::StatusOr<ApiResponse> {
    nlohmann::json body = c.body;
    const std::string rv = body["metadata"].value("resourceVersion", "0");
    body["metadata"]["resourceVersion"] = std::to_string(std::stoll(rv) + 1);
    return ScriptedClient::Reply(code, body);
  };
}

std::unique_ptr<LeaderElector> MakeElector(Client* client, LeaderElectionConfig config) {
  auto e = LeaderElector::Create(client, std::move(config));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

struct BadConfig {
  std::string name;
  std::function<void(LeaderElectionConfig&)> change;
  std::string message;
};

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.name; }

class LeaderElectionConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(LeaderElectionConfigTest, RejectedWithFieldInMessage) {
  FakeClock clock;
  ScriptedClient client;
  LeaderElectionConfig c = Config(&clock);
  GetParam().change(c);
  auto e = LeaderElector::Create(&client, c);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Table, LeaderElectionConfigTest,
    ::testing::Values(
        BadConfig{"NoName", [](LeaderElectionConfig& c) { c.lease_name = ""; }, "lease_name"},
        BadConfig{"NoNamespace", [](LeaderElectionConfig& c) { c.lease_namespace = ""; },
                  "lease_namespace"},
        BadConfig{"ZeroRetry", [](LeaderElectionConfig& c) { c.retry_period = absl::ZeroDuration(); },
                  "must all be positive"},
        BadConfig{"LeaseNotLongerThanRenew",
                  [](LeaderElectionConfig& c) { c.lease_duration = absl::Seconds(10); },
                  "lease_duration (10s) must be greater than renew_deadline (10s)"},
        BadConfig{"RenewNotLongerThanJitteredRetry",
                  [](LeaderElectionConfig& c) { c.retry_period = absl::Seconds(9); },
                  "renew_deadline (10s) must be greater than 1.2 x retry_period (9s)"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

TEST(LeaderElectorTest, DefaultIdentityIsHostnameUnderscoreUuid) {
  const std::string a = DefaultLeaderIdentity();
  EXPECT_THAT(a, ::testing::MatchesRegex(
                     ".+_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
  EXPECT_NE(a, DefaultLeaderIdentity());
  FakeClock clock;
  ScriptedClient client;
  LeaderElectionConfig c = Config(&clock, "");
  auto e = MakeElector(&client, c);
  EXPECT_THAT(e->identity(), ::testing::MatchesRegex(".+_[0-9a-f-]{36}"));
}

TEST(LeaderElectorTest, CreatesAbsentLeaseHoldingIt) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Status(404, "NotFound", "not found"));
  client.Expect("POST", kLeasesPath, Accept(201));
  auto e = MakeElector(&client, Config(&clock));
  EXPECT_TRUE(e->TryAcquireOrRenew());
  EXPECT_EQ(e->GetLeader(), "me");
  client.ExpectAllConsumed();
  const nlohmann::json spec = client.calls()[1].body["spec"];
  EXPECT_EQ(spec["holderIdentity"], "me");
  EXPECT_EQ(spec["leaseDurationSeconds"], 15);
  EXPECT_EQ(spec["leaseTransitions"], 0);
  EXPECT_EQ(spec["acquireTime"], FormatMicroTime(clock.Now()));
  EXPECT_EQ(spec["renewTime"], FormatMicroTime(clock.Now()));
  EXPECT_EQ(client.calls()[1].body["metadata"]["name"], "op");
}

TEST(LeaderElectorTest, LosesCreateRaceOnConflict) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Status(404, "NotFound", "not found"));
  client.Expect("POST", kLeasesPath, ScriptedClient::Status(409, "AlreadyExists", "exists"));
  auto e = MakeElector(&client, Config(&clock));
  EXPECT_FALSE(e->TryAcquireOrRenew());
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, WaitsForOtherHoldersLeaseToExpireByItsOwnClock) {
  FakeClock clock;
  ScriptedClient client;
  // The holder's renewTime is years old, but expiry counts from when *we*
  // first saw this record: the holder's clock may simply be wrong.
  const nlohmann::json held = Lease("other", 3, "7");
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, held));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, held));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, held));
  client.Expect("PUT", kLeasePath, Accept());
  auto e = MakeElector(&client, Config(&clock));
  EXPECT_FALSE(e->TryAcquireOrRenew());
  EXPECT_EQ(e->GetLeader(), "other");
  clock.Advance(absl::Seconds(14));
  EXPECT_FALSE(e->TryAcquireOrRenew());
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(e->TryAcquireOrRenew());
  EXPECT_EQ(e->GetLeader(), "me");
  client.ExpectAllConsumed();
  const ScriptedClient::Call put = client.calls()[3];
  EXPECT_EQ(put.body["metadata"]["resourceVersion"], "7") << "optimistic concurrency";
  EXPECT_EQ(put.body["spec"]["holderIdentity"], "me");
  EXPECT_EQ(put.body["spec"]["leaseTransitions"], 4);
  EXPECT_EQ(put.body["spec"]["acquireTime"], FormatMicroTime(clock.Now()));
}

TEST(LeaderElectorTest, HolderThatKeepsRenewingIsNeverExpired) {
  FakeClock clock;
  ScriptedClient client;
  for (int i = 0; i < 5; ++i) {
    client.Expect("GET", kLeasePath,
                  ScriptedClient::Reply(200, Lease("other", 0, std::to_string(10 + i),
                                                   "2020-01-01T00:00:0" + std::to_string(i) +
                                                       ".000000Z")));
  }
  auto e = MakeElector(&client, Config(&clock));
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(e->TryAcquireOrRenew()) << i;
    clock.Advance(absl::Seconds(10));
  }
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, TakesReleasedLeaseAtOnce) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 2, "9")));
  client.Expect("PUT", kLeasePath, Accept());
  auto e = MakeElector(&client, Config(&clock));
  EXPECT_TRUE(e->TryAcquireOrRenew());
  EXPECT_EQ(client.calls()[1].body["spec"]["leaseTransitions"], 3);
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, LosesUpdateRaceOnConflict) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 0, "9")));
  client.Expect("PUT", kLeasePath, ScriptedClient::Status(409, "Conflict", "modified"));
  auto e = MakeElector(&client, Config(&clock));
  EXPECT_FALSE(e->TryAcquireOrRenew());
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, RenewsOptimisticallyKeepingAcquireTimeAndTransitions) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 5, "20")));
  client.Expect("PUT", kLeasePath, Accept());
  client.Expect("PUT", kLeasePath, Accept());  // no GET: the fast path
  auto e = MakeElector(&client, Config(&clock));
  ASSERT_TRUE(e->TryAcquireOrRenew());
  const std::string acquired = FormatMicroTime(clock.Now());
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(e->TryAcquireOrRenew());
  client.ExpectAllConsumed();
  const ScriptedClient::Call renew = client.calls()[2];
  EXPECT_EQ(renew.body["metadata"]["resourceVersion"], "21") << "the RV of our own last write";
  EXPECT_EQ(renew.body["spec"]["acquireTime"], acquired);
  EXPECT_EQ(renew.body["spec"]["renewTime"], FormatMicroTime(clock.Now()));
  EXPECT_EQ(renew.body["spec"]["leaseTransitions"], 6);
}

TEST(LeaderElectorTest, OptimisticRenewConflictRereadsAndSeesTakeover) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 0, "1")));
  client.Expect("PUT", kLeasePath, Accept());
  client.Expect("PUT", kLeasePath, ScriptedClient::Status(409, "Conflict", "modified"));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("usurper", 2, "5")));
  auto e = MakeElector(&client, Config(&clock));
  ASSERT_TRUE(e->TryAcquireOrRenew());
  clock.Advance(absl::Seconds(2));
  EXPECT_FALSE(e->TryAcquireOrRenew());
  EXPECT_EQ(e->GetLeader(), "usurper");
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, ReleaseClearsHolderAndShortensLease) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Status(404, "NotFound", "not found"));
  client.Expect("POST", kLeasesPath, Accept(201));
  client.Expect("PUT", kLeasePath, Accept());
  auto e = MakeElector(&client, Config(&clock));
  ASSERT_TRUE(e->TryAcquireOrRenew());
  EXPECT_TRUE(e->Release());
  client.ExpectAllConsumed();
  const nlohmann::json spec = client.calls()[2].body["spec"];
  EXPECT_EQ(spec["holderIdentity"], "");
  EXPECT_EQ(spec["leaseDurationSeconds"], 1);
  EXPECT_EQ(e->GetLeader(), "");
  // Not ours any more: nothing to release.
  EXPECT_TRUE(e->Release());
  EXPECT_EQ(client.num_calls(), 3u);
}

TEST(LeaderElectorTest, ReportsEachNewLeaderOnce) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("a", 0, "1")));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("a", 0, "2", "2020-01-01T00:00:01.000000Z")));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("b", 1, "3")));
  std::vector<std::string> leaders;
  LeaderElectionConfig c = Config(&clock);
  c.on_new_leader = [&](const std::string& id) { leaders.push_back(id); };
  auto e = MakeElector(&client, c);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(e->TryAcquireOrRenew());
  EXPECT_EQ(leaders, (std::vector<std::string>{"a", "b"}));
}

// Drives fake time forward in small steps until `done` or `limit`; the elector
// thread sleeps on the same fake clock.
void AdvanceUntil(FakeClock& clock, const std::function<bool()>& done, absl::Duration step,
                  absl::Duration limit) {
  const absl::Time end = clock.Now() + limit;
  while (!done() && clock.Now() < end) {
    clock.Advance(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

double MasterStatus(prometheus::Registry& registry) {
  for (const auto& f : registry.Collect()) {
    if (f.name == "leader_election_master_status" && !f.metric.empty()) {
      return f.metric[0].gauge.value;
    }
  }
  return -1;
}

TEST(LeaderElectorTest, RunLeadsRenewsAndReleasesOnStop) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Status(404, "NotFound", "not found"));
  client.Expect("POST", kLeasesPath, Accept(201));
  client.SetFallback(Accept());  // every renewal (and the release) succeeds
  auto registry = std::make_shared<prometheus::Registry>();
  absl::Notification started, work_stopped, stopped_leading;
  LeaderElectionConfig c = Config(&clock);
  c.registry = registry;
  c.on_started_leading = [&](std::stop_token token) {
    started.Notify();
    absl::Mutex mu;
    bool stop = false;
    std::stop_callback cb(token, [&] {
      absl::MutexLock l(&mu);
      stop = true;
    });
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&stop));
    work_stopped.Notify();
  };
  c.on_stopped_leading = [&] {
    EXPECT_TRUE(work_stopped.HasBeenNotified()) << "the work must end before the lease is given up";
    stopped_leading.Notify();
  };
  auto e = MakeElector(&client, c);
  EXPECT_EQ(MasterStatus(*registry), 0);
  std::jthread runner([&](std::stop_token stop) { e->Run(stop); });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(e->IsLeader());
  EXPECT_EQ(MasterStatus(*registry), 1);
  // A minute of renewals.
  AdvanceUntil(clock, [&] { return client.num_calls() >= 12; }, absl::Milliseconds(200),
               absl::Minutes(1));
  EXPECT_TRUE(e->IsLeader());
  EXPECT_GE(client.num_calls(), 12u);
  runner.request_stop();
  runner.join();
  EXPECT_TRUE(stopped_leading.HasBeenNotified());
  EXPECT_FALSE(e->IsLeader());
  EXPECT_EQ(MasterStatus(*registry), 0);
  const ScriptedClient::Call last = client.calls().back();
  EXPECT_EQ(last.method, "PUT");
  EXPECT_EQ(last.body["spec"]["holderIdentity"], "") << "released on a clean stop";
  for (size_t i = 2; i + 1 < client.calls().size(); ++i) {
    EXPECT_EQ(client.calls()[i].method, "PUT") << "renewals use the fast path";
    EXPECT_EQ(client.calls()[i].body["spec"]["holderIdentity"], "me");
  }
}

TEST(LeaderElectorTest, RunStepsDownWhenRenewalsFailPastTheDeadline) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Status(404, "NotFound", "not found"));
  client.Expect("POST", kLeasesPath, Accept(201));
  client.SetFallback([](const ScriptedClient::Call&) -> absl::StatusOr<ApiResponse> {
    return absl::UnavailableError("connection refused");
  });
  std::atomic<bool> lost{false};
  absl::Time lost_at;
  LeaderElectionConfig c = Config(&clock);
  c.on_stopped_leading = [&] {
    lost_at = clock.Now();
    lost = true;
  };
  auto e = MakeElector(&client, c);
  const absl::Time acquired = clock.Now();
  std::jthread runner([&](std::stop_token stop) { e->Run(stop); });
  ASSERT_TRUE(client.WaitForCalls(2));
  AdvanceUntil(clock, [&] { return lost.load(); }, absl::Milliseconds(100), absl::Minutes(1));
  runner.join();  // Run returns by itself on loss
  ASSERT_TRUE(lost);
  // One retry period of sleep, then renew_deadline of failing attempts.
  EXPECT_GE(lost_at - acquired, absl::Seconds(12));
  EXPECT_LT(lost_at - acquired, absl::Seconds(15)) << "must step down before a successor may take over";
  for (const auto& call : client.calls()) {
    EXPECT_FALSE(call.method == "PUT" && call.body["spec"]["holderIdentity"] == "")
        << "no release after a loss";
  }
}

TEST(LeaderElectorTest, RunStepsDownAtOnceWhenSomeoneElseHoldsTheLease) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 0, "1")));
  client.Expect("PUT", kLeasePath, Accept());
  client.Expect("PUT", kLeasePath, ScriptedClient::Status(409, "Conflict", "modified"));
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("usurper", 1, "9")));
  std::atomic<bool> lost{false};
  absl::Time lost_at;
  LeaderElectionConfig c = Config(&clock);
  c.on_stopped_leading = [&] {
    lost_at = clock.Now();
    lost = true;
  };
  auto e = MakeElector(&client, c);
  const absl::Time acquired = clock.Now();
  std::jthread runner([&](std::stop_token stop) { e->Run(stop); });
  AdvanceUntil(clock, [&] { return lost.load(); }, absl::Milliseconds(100), absl::Minutes(1));
  runner.join();
  ASSERT_TRUE(lost);
  EXPECT_LT(lost_at - acquired, absl::Seconds(4)) << "no waiting for the renew deadline";
  client.ExpectAllConsumed();
}

TEST(LeaderElectorTest, RenewalHungInTheClientCountsAgainstTheDeadline) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("GET", kLeasePath, ScriptedClient::Reply(200, Lease("", 0, "1")));
  client.Expect("PUT", kLeasePath, Accept());
  absl::Notification unblock;
  client.SetFallback([&](const ScriptedClient::Call& call) -> absl::StatusOr<ApiResponse> {
    unblock.WaitForNotification();  // an API server that never answers
    return absl::DeadlineExceededError("timed out");
  });
  std::atomic<bool> lost{false};
  LeaderElectionConfig c = Config(&clock);
  c.on_stopped_leading = [&] {
    lost = true;
    unblock.Notify();
  };
  auto e = MakeElector(&client, c);
  const absl::Time acquired = clock.Now();
  std::jthread runner([&](std::stop_token stop) { e->Run(stop); });
  AdvanceUntil(clock, [&] { return lost.load(); }, absl::Milliseconds(100), absl::Minutes(1));
  runner.join();
  ASSERT_TRUE(lost);
  EXPECT_LT(clock.Now() - acquired, absl::Seconds(15));
}

TEST(LeaderElectorTest, RunWaitsWhileAnotherLeadsAndStopsWithoutCallbacks) {
  FakeClock clock;
  ScriptedClient client;
  // The holder renews every time we look.
  std::atomic<int> rv{100};
  client.SetFallback([&](const ScriptedClient::Call& call) -> absl::StatusOr<ApiResponse> {
    const int v = rv++;
    return ScriptedClient::Reply(
        200, Lease("other", 0, std::to_string(v), "2020-01-01T00:00:00." + std::to_string(v) + "Z"));
  });
  bool started = false, stopped = false;
  LeaderElectionConfig c = Config(&clock);
  c.on_started_leading = [&](std::stop_token) { started = true; };
  c.on_stopped_leading = [&] { stopped = true; };
  auto e = MakeElector(&client, c);
  std::jthread runner([&](std::stop_token stop) { e->Run(stop); });
  AdvanceUntil(clock, [&] { return client.num_calls() >= 5; }, absl::Milliseconds(200),
               absl::Minutes(1));
  EXPECT_FALSE(e->IsLeader());
  EXPECT_EQ(e->GetLeader(), "other");
  runner.request_stop();
  runner.join();
  EXPECT_FALSE(started);
  EXPECT_FALSE(stopped);
  for (const auto& call : client.calls()) EXPECT_EQ(call.method, "GET");
}

}  // namespace
}  // namespace distrain::kube

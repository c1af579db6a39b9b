// LeaderElector against the real API server (run via
// tests/kube/with_control_plane.sh): candidates are separate RestClients on
// one Lease, as separate operator replicas would be.

#include "operator/kube/leader_election.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "operator/kube/paths.h"
#include "tests/kube/kube_test_util.h"

namespace distrain::kube {
namespace {

using kubetest::AdminClient;
using kubetest::TestNamespace;
using kubetest::WaitUntil;

// One candidate: its own client, its elector, the thread running it.
struct Candidate {
  std::unique_ptr<RestClient> client;
  std::unique_ptr<LeaderElector> elector;
  std::jthread runner;
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};

  void Start() {
    runner = std::jthread([this](std::stop_token stop) { elector->Run(stop); });
  }
};

std::unique_ptr<Candidate> MakeCandidate(const std::string& ns, const std::string& identity,
                                         absl::Duration lease, absl::Duration renew,
                                         absl::Duration retry, bool release_on_cancel) {
  auto c = std::make_unique<Candidate>();
  c->client = AdminClient();
  if (c->client == nullptr) return nullptr;
  LeaderElectionConfig config;
  config.lease_namespace = ns;
  config.lease_name = "distrain-operator";
  config.identity = identity;
  config.lease_duration = lease;
  config.renew_deadline = renew;
  config.retry_period = retry;
  config.release_on_cancel = release_on_cancel;
  Candidate* raw = c.get();
  config.on_started_leading = [raw](std::stop_token) { raw->started = true; };
  config.on_stopped_leading = [raw] { raw->stopped = true; };
  auto elector = LeaderElector::Create(c->client.get(), std::move(config));
  EXPECT_TRUE(elector.ok()) << elector.status();
  if (!elector.ok()) return nullptr;
  c->elector = std::move(*elector);
  return c;
}

nlohmann::json GetLease(Client& client, const std::string& ns) {
  auto r = client.Request("GET", ResourcePath(LeasesResource(), ns, "distrain-operator"));
  EXPECT_TRUE(r.ok() && r->ok());
  return r.ok() ? r->body : nlohmann::json();
}

class LeaderElectionKubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    admin_ = AdminClient();
    ASSERT_NE(admin_, nullptr);
    ns_ = std::make_unique<TestNamespace>(*admin_, "lease");
  }
  void TearDown() override { ns_.reset(); }

  // Short durations keep the suite fast; the protocol is the same.
  std::unique_ptr<Candidate> Short(const std::string& id, bool release_on_cancel) {
    return MakeCandidate(ns_->name(), id, absl::Seconds(3), absl::Seconds(2),
                         absl::Milliseconds(500), release_on_cancel);
  }

  std::unique_ptr<RestClient> admin_;
  std::unique_ptr<TestNamespace> ns_;
};

TEST_F(LeaderElectionKubeTest, TwoCandidatesExactlyOneLeads) {
  auto a = Short("candidate-a", true);
  auto b = Short("candidate-b", true);
  ASSERT_TRUE(a && b);
  a->Start();
  b->Start();
  ASSERT_TRUE(WaitUntil([&] { return a->elector->IsLeader() || b->elector->IsLeader(); }, 10));
  // Over several lease durations, never two leaders, never none.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (std::chrono::steady_clock::now() < end) {
    const bool la = a->elector->IsLeader(), lb = b->elector->IsLeader();
    ASSERT_NE(la, lb) << "leaders: a=" << la << " b=" << lb;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Candidate& leader = a->elector->IsLeader() ? *a : *b;
  Candidate& follower = a->elector->IsLeader() ? *b : *a;
  EXPECT_TRUE(leader.started);
  EXPECT_FALSE(follower.started);
  const nlohmann::json lease = GetLease(*admin_, ns_->name());
  EXPECT_EQ(lease["spec"]["holderIdentity"], leader.elector->identity());
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 3);
  EXPECT_EQ(follower.elector->GetLeader(), leader.elector->identity());
}

TEST_F(LeaderElectionKubeTest, LeaderStoppedWithoutReleaseIsReplacedAfterExpiry) {
  auto a = Short("candidate-a", /*release_on_cancel=*/false);
  ASSERT_TRUE(a);
  a->Start();
  ASSERT_TRUE(WaitUntil([&] { return a->elector->IsLeader(); }, 10));
  auto b = Short("candidate-b", false);
  ASSERT_TRUE(b);
  b->Start();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->GetLeader() == "candidate-a"; }, 10));
  const int64_t transitions = GetLease(*admin_, ns_->name())["spec"]["leaseTransitions"];

  // The leader vanishes without a word (as a killed process would).
  a->runner.request_stop();
  a->runner.join();
  EXPECT_TRUE(a->stopped);
  EXPECT_EQ(GetLease(*admin_, ns_->name())["spec"]["holderIdentity"], "candidate-a");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->IsLeader(); }, 20));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Not before the lease expired in b's eyes (3 s after its last renewal).
  EXPECT_GE(took, 2.0);
  const nlohmann::json lease = GetLease(*admin_, ns_->name());
  EXPECT_EQ(lease["spec"]["holderIdentity"], "candidate-b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], transitions + 1);
}

TEST_F(LeaderElectionKubeTest, CleanStopReleasesForAnImmediateSuccessor) {
  auto a = Short("candidate-a", /*release_on_cancel=*/true);
  ASSERT_TRUE(a);
  a->Start();
  ASSERT_TRUE(WaitUntil([&] { return a->elector->IsLeader(); }, 10));
  auto b = Short("candidate-b", true);
  ASSERT_TRUE(b);
  b->Start();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->GetLeader() == "candidate-a"; }, 10));
  a->runner.request_stop();
  a->runner.join();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->IsLeader(); }, 10));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Released: b need not wait out the 3 s lease, only its next retry (+1 s).
  EXPECT_LT(took, 2.5);
}

TEST_F(LeaderElectionKubeTest, DefaultDurationsTakeOverWithin20Seconds) {
  auto a = MakeCandidate(ns_->name(), "candidate-a", absl::Seconds(15), absl::Seconds(10),
                         absl::Seconds(2), /*release_on_cancel=*/false);
  ASSERT_TRUE(a);
  a->Start();
  ASSERT_TRUE(WaitUntil([&] { return a->elector->IsLeader(); }, 10));
  auto b = MakeCandidate(ns_->name(), "candidate-b", absl::Seconds(15), absl::Seconds(10),
                         absl::Seconds(2), false);
  ASSERT_TRUE(b);
  b->Start();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->GetLeader() == "candidate-a"; }, 10));
  a->runner.request_stop();
  a->runner.join();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return b->elector->IsLeader(); }, 20))
      << "the follower did not take over within 20 s of the leader's death";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 10.0) << "took over a live-looking lease";
}

}  // namespace
}  // namespace distrain::kube

// Rendezvous: every task of a TF_CONFIG cluster as a thread of this process,
// the coordinator on a free 127.0.0.1 port.

#include "worker/coordination/rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class RendezvousTest : public ::testing::Test {
 protected:
  // A cluster of `chiefs` (0 or 1) chief and `workers` workers on loopback.
  void MakeCluster(int chiefs, int workers) {
    jobs_.clear();
    tasks_.clear();
    for (int i = 0; i < chiefs; ++i) {
      jobs_["chief"].push_back(absl::StrCat("127.0.0.1:", FreePort()));
      tasks_.push_back({"chief", i});
    }
    for (int i = 0; i < workers; ++i) {
      jobs_["worker"].push_back(absl::StrCat("127.0.0.1:", FreePort()));
      tasks_.push_back({"worker", i});
    }
  }

  ClusterSpec Spec(const TaskId& task) {
    auto spec = ClusterSpec::Create(jobs_, task);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // Starts every task's Rendezvous from its own thread. () not {}: see
  // CoordinationService::Start (a GCC 12 false warning).
  std::vector<std::unique_ptr<Rendezvous>> StartAll(
      RendezvousOptions options = RendezvousOptions()) {
    std::vector<std::unique_ptr<Rendezvous>> out(tasks_.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      threads.emplace_back([&, i, options]() mutable {
        options.join_timeout = absl::Seconds(5);
        auto r = Rendezvous::Start(Spec(tasks_[i]), tasks_, options);
        ASSERT_TRUE(r.ok()) << tasks_[i].ToString() << ": " << r.status();
        out[i] = std::move(*r);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  std::map<std::string, std::vector<std::string>> jobs_;
  std::vector<TaskId> tasks_;
};

TEST_F(RendezvousTest, EveryTaskGetsItsRankSharesTheStoreAndShutsDownCleanly) {
  MakeCluster(1, 2);
  auto rv = StartAll();
  ASSERT_EQ(rv.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(rv[i], nullptr);
    EXPECT_EQ(rv[i]->rank(), i);
    EXPECT_EQ(rv[i]->size(), 3);
    EXPECT_EQ(rv[i]->generation(), 1);
    EXPECT_EQ(rv[i]->members(), tasks_);
    EXPECT_EQ(rv[i]->is_coordinator(), i == 0);
    EXPECT_EQ(rv[i]->peer_name(2), absl::StrCat("worker:1 (", jobs_["worker"][1], ")"));
  }
  ASSERT_TRUE(rv[1]->store().Set("addr/1", "127.0.0.1:9").ok());
  EXPECT_EQ(*rv[2]->store().Get("addr/1", absl::Seconds(1)), "127.0.0.1:9");

  std::vector<absl::Status> barrier(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] { barrier[i] = rv[i]->Barrier("ready", absl::Seconds(5)); });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : barrier) EXPECT_TRUE(s.ok()) << s;

  // The coordinator finishes first and must keep serving until the workers,
  // still busy for a moment, have left.
  absl::Notification workers_done;
  absl::Time last_worker_left;
  std::thread workers([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(rv[1]->store().Set("late", "still served").ok());
    const absl::Status s1 = rv[1]->Shutdown(absl::Seconds(5));
    EXPECT_TRUE(s1.ok()) << s1;
    last_worker_left = absl::Now();
    const absl::Status s2 = rv[2]->Shutdown(absl::Seconds(5));
    EXPECT_TRUE(s2.ok()) << s2;
    workers_done.Notify();
  });
  EXPECT_TRUE(rv[0]->Shutdown(absl::Seconds(5)).ok());
  const absl::Time coordinator_done = absl::Now();
  workers.join();
  EXPECT_GE(coordinator_done, last_worker_left);
  for (auto& r : rv) EXPECT_TRUE(r->health().ok()) << r->health();
}

TEST_F(RendezvousTest, WorkerZeroCoordinatesWhenThereIsNoChief) {
  MakeCluster(0, 2);
  auto rv = StartAll();
  ASSERT_NE(rv[0], nullptr);
  ASSERT_NE(rv[1], nullptr);
  EXPECT_TRUE(rv[0]->is_coordinator());
  EXPECT_FALSE(rv[1]->is_coordinator());
  EXPECT_EQ(rv[1]->rank(), 1);
  std::thread t([&] { EXPECT_TRUE(rv[1]->Shutdown(absl::Seconds(5)).ok()); });
  EXPECT_TRUE(rv[0]->Shutdown(absl::Seconds(5)).ok());
  t.join();
}

TEST_F(RendezvousTest, DestroyedWithoutShutdownIsReportedWithThePeerAddress) {
  MakeCluster(1, 2);
  // Declared before the rendezvous: their callbacks may run until they are destroyed.
  absl::Notification fired;
  absl::Status seen;
  absl::Status late;
  auto rv = StartAll();
  rv[0]->StartWatching([&](const absl::Status& s) {
    seen = s;
    fired.Notify();
  });
  rv[2].reset();  // worker:1 crashes
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(seen.message()),
              HasSubstr(absl::StrCat("worker:1 (", jobs_["worker"][1], ")")));

  // worker:0 registers its callback only now: the failure is delivered at once.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (rv[1]->health().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  rv[1]->StartWatching([&](const absl::Status& s) { late = s; });
  EXPECT_THAT(std::string(late.message()), HasSubstr("worker:1"));
  EXPECT_EQ(rv[1]->generation(), 2);
}

TEST_F(RendezvousTest, CoordinatorShutdownIsBoundedAndNamesWhoDidNotLeave) {
  MakeCluster(1, 1);
  absl::Notification lost;  // before the rendezvous: its callback may run until it is gone
  absl::Status seen;
  auto rv = StartAll();
  rv[1]->StartWatching([&](const absl::Status& s) {
    seen = s;
    lost.Notify();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = rv[0]->Shutdown(absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker:0"));
  // The worker that was still there learns that its coordinator is gone.
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_THAT(std::string(seen.message()), AllOf(HasSubstr("lost the coordinator chief:0"),
                                    HasSubstr(jobs_["chief"][0])));
}

TEST_F(RendezvousTest, MemberSetThatDoesNotFitTheClusterIsInvalidArgument) {
  MakeCluster(1, 2);
  const auto outside = Rendezvous::Start(Spec({"worker", 1}), {{"chief", 0}, {"worker", 0}});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("this task worker:1 is not a rendezvous member"));
  const auto unknown = Rendezvous::Start(Spec({"chief", 0}), {{"chief", 0}, {"worker", 5}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("worker:5 is not in the cluster"));
  const auto no_coordinator =
      Rendezvous::Start(Spec({"worker", 0}), {{"worker", 0}, {"worker", 1}});
  EXPECT_EQ(no_coordinator.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_coordinator.status().message()),
              HasSubstr("the coordinator chief:0 must be"));
}

TEST_F(RendezvousTest, JoinTimeoutNamesTheMissingTask) {
  MakeCluster(1, 1);
  RendezvousOptions options;
  options.join_timeout = absl::Milliseconds(500);
  const auto r = Rendezvous::Start(Spec({"chief", 0}), tasks_, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("still waiting for worker:0"));
}

}  // namespace
}  // namespace distrain

#include "worker/strategy/replica_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/barrier.h"

namespace distrain {
namespace {

TEST(ReplicaRunnerTest, RunsEveryReplicaConcurrentlyOnPersistentThreads) {
  constexpr int kReplicas = 4;
  ReplicaRunner runner(kReplicas);
  std::set<std::thread::id> first_ids;
  for (int step = 0; step < 50; ++step) {
    std::vector<std::thread::id> ids(kReplicas);
    std::vector<int> calls(kReplicas, 0);
    // Every replica must be running at the same time to pass the barrier.
    auto* barrier = new absl::Barrier(kReplicas);
    runner.Run([&](int r) {
      ids[r] = std::this_thread::get_id();
      ++calls[r];
      if (barrier->Block()) delete barrier;
    });
    for (int r = 0; r < kReplicas; ++r) EXPECT_EQ(calls[r], 1) << "replica " << r;
    EXPECT_EQ(ids[0], std::this_thread::get_id()) << "replica 0 runs on the caller";
    std::set<std::thread::id> unique(ids.begin(), ids.end());
    EXPECT_EQ(unique.size(), static_cast<size_t>(kReplicas));
    if (step == 0) {
      first_ids = unique;
    } else {
      EXPECT_EQ(unique, first_ids) << "threads must persist across steps";
    }
  }
}

TEST(ReplicaRunnerTest, OneReplicaRunsOnTheCaller) {
  ReplicaRunner runner(1);
  std::thread::id id;
  runner.Run([&](int r) {
    EXPECT_EQ(r, 0);
    id = std::this_thread::get_id();
  });
  EXPECT_EQ(id, std::this_thread::get_id());
}

}  // namespace
}  // namespace distrain

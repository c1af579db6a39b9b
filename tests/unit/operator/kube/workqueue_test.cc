#include "operator/kube/workqueue.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "operator/kube/clock.h"
#include "prometheus/registry.h"

namespace distrain::kube {
namespace {

WorkQueueOptions FakeOptions(FakeClock* clock) {
  WorkQueueOptions o;
  o.name = "test";
  o.clock = clock;
  return o;
}

TEST(WorkQueueTest, DeduplicatesKeysWaitingInQueue) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.Add("ns/a");
  q.Add("ns/b");
  q.Add("ns/a");
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Get(), "ns/a");
  EXPECT_EQ(q.Get(), "ns/b");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueueTest, KeyReaddedWhileProcessingComesBackOnlyAfterDone) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.Add("ns/a");
  ASSERT_EQ(q.Get(), "ns/a");
  q.Add("ns/a");
  q.Add("ns/a");
  // Still processing: a second worker must not get it.
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.GetWithDeadline(clock.Now()), std::nullopt);
  q.Done("ns/a");
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Get(), "ns/a");
  q.Done("ns/a");
  EXPECT_EQ(q.Len(), 0u);  // not re-added twice
}

TEST(WorkQueueTest, DoneWithoutReaddDoesNotRequeue) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.Add("ns/a");
  ASSERT_EQ(q.Get(), "ns/a");
  q.Done("ns/a");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueueTest, ConcurrentWorkersNeverProcessOneKeyTwiceAtOnce) {
  WorkQueueOptions o;
  o.name = "concurrent";
  WorkQueue q(o);
  absl::Mutex mu;
  absl::flat_hash_set<std::string> in_flight;
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (std::optional<std::string> key = q.Get()) {
        {
          absl::MutexLock lock(&mu);
          if (!in_flight.insert(*key).second) overlap = true;
        }
        std::this_thread::yield();
        {
          absl::MutexLock lock(&mu);
          in_flight.erase(*key);
        }
        ++processed;
        q.Done(*key);
      }
    });
  }
  for (int i = 0; i < 4000; ++i) q.Add("ns/job-" + std::to_string(i % 3));
  // Let the workers drain, then stop them.
  while (q.Len() > 0) std::this_thread::yield();
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_FALSE(overlap.load());
  EXPECT_GE(processed.load(), 3);
}

TEST(WorkQueueTest, AddAfterWaitsForTheClock) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/a", absl::Seconds(5));
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(absl::Milliseconds(4999));
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Get(), "ns/a");
}

TEST(WorkQueueTest, AddAfterNonPositiveDelayAddsAtOnce) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/a", absl::ZeroDuration());
  q.AddAfter("ns/b", -absl::Seconds(1));
  EXPECT_EQ(q.Len(), 2u);
}

TEST(WorkQueueTest, AddAfterKeepsTheEarlierTimeOfOneKey) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/a", absl::Seconds(10));
  q.AddAfter("ns/a", absl::Seconds(2));
  q.AddAfter("ns/a", absl::Seconds(7));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(q.Len(), 1u);
  ASSERT_EQ(q.Get(), "ns/a");
  q.Done("ns/a");
  clock.Advance(absl::Seconds(20));
  EXPECT_EQ(q.Len(), 0u) << "stale later entries must not add the key again";
}

TEST(WorkQueueTest, DelayedKeysComeOutInReadyOrder) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/late", absl::Seconds(3));
  q.AddAfter("ns/early", absl::Seconds(1));
  q.AddAfter("ns/middle", absl::Seconds(2));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(q.Get(), "ns/early");
  EXPECT_EQ(q.Get(), "ns/middle");
  EXPECT_EQ(q.Get(), "ns/late");
}

TEST(WorkQueueTest, BlockedGetWakesWhenDelayedKeyBecomesReady) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/a", absl::Minutes(1));
  std::optional<std::string> got;
  std::thread worker([&] { got = q.Get(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it block on ns/a's minute
  // A key added later with a shorter delay must not wait behind the first.
  q.AddAfter("ns/b", absl::Seconds(1));
  clock.Advance(absl::Seconds(1));
  worker.join();
  EXPECT_EQ(got, "ns/b");
}

TEST(WorkQueueTest, GetWithDeadlineGivesUpAtTheDeadline) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddAfter("ns/a", absl::Seconds(10));
  std::optional<std::string> got = std::string("unset");
  const absl::Time deadline = clock.Now() + absl::Seconds(1);
  std::thread worker([&] { got = q.GetWithDeadline(deadline); });
  clock.Advance(absl::Seconds(2));
  worker.join();
  EXPECT_EQ(got, std::nullopt);
}

struct BackoffCase {
  int failures_before;
  absl::Duration want;
};

class WorkQueueBackoffTest : public ::testing::TestWithParam<BackoffCase> {};

TEST_P(WorkQueueBackoffTest, PerKeyExponentialBackoffFrom5msCappedAt1000s) {
  FakeClock clock;
  WorkQueueOptions o = FakeOptions(&clock);
  o.qps = 0;  // isolate the per-key limiter
  WorkQueue q(o);
  for (int i = 0; i < GetParam().failures_before; ++i) q.When("ns/a");
  EXPECT_EQ(q.When("ns/a"), GetParam().want);
  EXPECT_EQ(q.NumRequeues("ns/a"), GetParam().failures_before + 1);
}

INSTANTIATE_TEST_SUITE_P(Table, WorkQueueBackoffTest,
                         ::testing::Values(BackoffCase{0, absl::Milliseconds(5)},
                                           BackoffCase{1, absl::Milliseconds(10)},
                                           BackoffCase{2, absl::Milliseconds(20)},
                                           BackoffCase{10, absl::Milliseconds(5120)},
                                           BackoffCase{17, absl::Milliseconds(655360)},
                                           BackoffCase{18, absl::Seconds(1000)},
                                           BackoffCase{200, absl::Seconds(1000)}));

TEST(WorkQueueTest, BackoffIsPerKeyAndForgetResetsIt) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  EXPECT_EQ(q.When("ns/a"), absl::Milliseconds(5));
  EXPECT_EQ(q.When("ns/a"), absl::Milliseconds(10));
  EXPECT_EQ(q.When("ns/b"), absl::Milliseconds(5));
  EXPECT_EQ(q.NumRequeues("ns/a"), 2);
  q.Forget("ns/a");
  EXPECT_EQ(q.NumRequeues("ns/a"), 0);
  EXPECT_EQ(q.When("ns/a"), absl::Milliseconds(5));
}

TEST(WorkQueueTest, TokenBucketAllowsBurstThenPacesAtQps) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));  // 10 qps, burst 100
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(q.When("ns/job-" + std::to_string(i)), absl::Milliseconds(5)) << i;
  }
  // The bucket is empty: new keys wait for their booked token, 100 ms apart.
  EXPECT_EQ(q.When("ns/x1"), absl::Milliseconds(100));
  EXPECT_EQ(q.When("ns/x2"), absl::Milliseconds(200));
  // One second refills ten tokens, two of which were already booked.
  clock.Advance(absl::Seconds(1));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.When("ns/y" + std::to_string(i)), absl::Milliseconds(5));
  EXPECT_EQ(q.When("ns/z"), absl::Milliseconds(100));
}

TEST(WorkQueueTest, AddRateLimitedAddsAfterTheBackoff) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.AddRateLimited("ns/a");  // 5 ms
  q.AddRateLimited("ns/a");  // 10 ms, but the key keeps its earlier 5 ms
  EXPECT_EQ(q.NumRequeues("ns/a"), 2);
  clock.Advance(absl::Milliseconds(4));
  EXPECT_EQ(q.Len(), 0u);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(q.Len(), 1u);
}

TEST(WorkQueueTest, ShutDownWakesBlockedGet) {
  WorkQueue q;
  std::optional<std::string> got = std::string("unset");
  std::thread worker([&] { got = q.Get(); });
  q.ShutDown();
  worker.join();
  EXPECT_EQ(got, std::nullopt);
  EXPECT_TRUE(q.ShuttingDown());
}

TEST(WorkQueueTest, ShutDownDrainsWaitingKeysThenIgnoresAdds) {
  FakeClock clock;
  WorkQueue q(FakeOptions(&clock));
  q.Add("ns/a");
  q.ShutDown();
  q.Add("ns/b");
  q.AddAfter("ns/c", absl::Seconds(1));
  q.AddRateLimited("ns/d");
  EXPECT_EQ(q.Get(), "ns/a");
  EXPECT_EQ(q.Get(), std::nullopt);
}

double Value(prometheus::Registry& registry, const std::string& family, const std::string& name) {
  for (const auto& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      bool match = false;
      for (const auto& l : m.label) match |= l.name == "name" && l.value == name;
      if (!match) continue;
      switch (f.type) {
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        case prometheus::MetricType::Counter:
          return m.counter.value;
        case prometheus::MetricType::Histogram:
          return m.histogram.sample_sum;
        default:
          return -1;
      }
    }
  }
  return -1;
}

TEST(WorkQueueTest, ExportsDepthAddsRetriesAndDurations) {
  FakeClock clock;
  auto registry = std::make_shared<prometheus::Registry>();
  WorkQueueOptions o = FakeOptions(&clock);
  o.name = "jobs";
  o.registry = registry;
  WorkQueue q(o);
  // A second queue on the same registry gets its own series.
  WorkQueueOptions o2 = o;
  o2.name = "other";
  WorkQueue other(o2);

  q.Add("ns/a");
  q.Add("ns/a");  // deduplicated: not an add
  q.Add("ns/b");
  EXPECT_EQ(Value(*registry, "workqueue_depth", "jobs"), 2);
  EXPECT_EQ(Value(*registry, "workqueue_adds_total", "jobs"), 2);
  clock.Advance(absl::Seconds(3));
  ASSERT_EQ(q.Get(), "ns/a");
  EXPECT_EQ(Value(*registry, "workqueue_depth", "jobs"), 1);
  EXPECT_DOUBLE_EQ(Value(*registry, "workqueue_queue_duration_seconds", "jobs"), 3);
  clock.Advance(absl::Seconds(2));
  q.Done("ns/a");
  EXPECT_DOUBLE_EQ(Value(*registry, "workqueue_work_duration_seconds", "jobs"), 2);
  q.AddRateLimited("ns/a");
  EXPECT_EQ(Value(*registry, "workqueue_retries_total", "jobs"), 1);
  EXPECT_EQ(Value(*registry, "workqueue_adds_total", "other"), 0);
}

}  // namespace
}  // namespace distrain::kube

#include "operator/kube/rate_limiter.h"

#include <atomic>
#include <chrono>
#include <stop_token>
#include <thread>

#include "gtest/gtest.h"
#include "operator/kube/clock.h"

namespace distrain::kube {
namespace {

TEST(TokenBucketRateLimiterTest, BurstIsAvailableAtOnceThenEmpty) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(10, 3, &clock);
  EXPECT_TRUE(limiter.TryAccept());
  EXPECT_TRUE(limiter.TryAccept());
  EXPECT_TRUE(limiter.TryAccept());
  EXPECT_FALSE(limiter.TryAccept());
}

TEST(TokenBucketRateLimiterTest, RefillsAtQps) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(10, 1, &clock);
  ASSERT_TRUE(limiter.TryAccept());
  clock.Advance(absl::Milliseconds(99));
  EXPECT_FALSE(limiter.TryAccept());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(limiter.TryAccept());
  EXPECT_FALSE(limiter.TryAccept());
}

TEST(TokenBucketRateLimiterTest, IdleTimeNeverStoresMoreThanBurst) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(100, 5, &clock);
  clock.Advance(absl::Hours(1));
  int accepted = 0;
  while (limiter.TryAccept()) ++accepted;
  EXPECT_EQ(accepted, 5);
}

TEST(TokenBucketRateLimiterTest, ReservationsQueueInArrivalOrder) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(2, 1, &clock);
  EXPECT_EQ(limiter.Reserve(), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(), absl::Milliseconds(500));
  EXPECT_EQ(limiter.Reserve(), absl::Milliseconds(1000));
  clock.Advance(absl::Milliseconds(1000));
  // Two of the reserved tokens came due; the third is still owed 500 ms.
  EXPECT_EQ(limiter.Reserve(), absl::Milliseconds(500));
}

TEST(TokenBucketRateLimiterTest, NonPositiveQpsIsUnlimited) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(0, 1, &clock);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.TryAccept());
  EXPECT_EQ(limiter.Reserve(), absl::ZeroDuration());
}

TEST(TokenBucketRateLimiterTest, WaitBlocksUntilTheClockReachesTheToken) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(1, 1, &clock);
  ASSERT_TRUE(limiter.TryAccept());
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(limiter.Wait());
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(done.load()) << "Wait returned before its token was due";
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_TRUE(done.load());
}

TEST(TokenBucketRateLimiterTest, StoppedWaitReturnsFalseAndGivesTheTokenBack) {
  FakeClock clock;
  TokenBucketRateLimiter limiter(1, 1, &clock);
  ASSERT_TRUE(limiter.TryAccept());
  std::stop_source stop;
  std::atomic<int> result{-1};
  std::thread waiter([&] { result = limiter.Wait(stop.get_token()) ? 1 : 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.request_stop();
  waiter.join();
  EXPECT_EQ(result.load(), 0);
  // Had the stopped waiter kept its reservation, one second would not refill a token.
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(limiter.TryAccept());
}

TEST(SleepOnTest, StopWakesARealSleepPromptly) {
  std::stop_source stop;
  auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stop.request_stop();
  });
  EXPECT_FALSE(SleepOn(Clock::Real(), absl::Seconds(30), stop.get_token()));
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace distrain::kube

#include "worker/collective/in_process.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tests/unit/worker/collective/collective_test_util.h"

namespace distrain {
namespace {

using Group = std::vector<std::unique_ptr<InProcessCollective>>;

using collective_testing::ExpectSeveralBuffersReduceAsOneVector;
using collective_testing::OnEveryRank;
using collective_testing::Value;

CollectiveOptions Quick(absl::Duration timeout = absl::Seconds(20)) {
  CollectiveOptions o;
  o.timeout = timeout;
  o.tag = "test";
  return o;
}

TEST(InProcessCollectiveTest, AllReduceMatchesElementwiseSumAndMean) {
  for (int n : {1, 2, 3, 5}) {
    for (int64_t elements : {0, 1, 7, 1003}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        Group group = InProcessCollective::CreateGroup(n);
        std::vector<std::vector<float>> data(n, std::vector<float>(elements));
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < elements; ++i) data[r][i] = Value(r, i);
        }
        std::vector<absl::Status> status(n);
        OnEveryRank(n, [&](int r) {
          status[r] = group[r]->AllReduce(absl::MakeSpan(data[r]), op, Quick());
        });
        for (int r = 0; r < n; ++r) {
          ASSERT_TRUE(status[r].ok()) << status[r];
          for (int64_t i = 0; i < elements; ++i) {
            float sum = 0;
            for (int k = 0; k < n; ++k) sum += Value(k, i);
            const float want = op == ReduceOp::kMean ? sum / n : sum;
            ASSERT_EQ(data[r][i], want) << "n=" << n << " rank=" << r << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(InProcessCollectiveTest, AllReduceIsBitIdenticalOnEveryRankWithRoundingValues) {
  constexpr int kRanks = 4;
  constexpr int kElements = 10007;
  Group group = InProcessCollective::CreateGroup(kRanks);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(kElements));
  for (auto& d : data) {
    for (float& x : d) x = dist(rng) * 1e3f;
  }
  // What a fixed rank order 0..N-1 gives; any other order would round differently.
  std::vector<float> want(kElements);
  for (int i = 0; i < kElements; ++i) {
    float s = data[0][i];
    for (int r = 1; r < kRanks; ++r) s += data[r][i];
    want[i] = s / kRanks;
  }
  OnEveryRank(kRanks, [&](int r) {
    ASSERT_TRUE(group[r]->AllReduce(absl::MakeSpan(data[r]), ReduceOp::kMean, Quick()).ok());
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(std::memcmp(data[r].data(), want.data(), kElements * sizeof(float)), 0)
        << "rank " << r << " differs from the fixed-order reduction";
  }
}

TEST(InProcessCollectiveTest, AllReduceTreatsSeveralBuffersAsOneVector) {
  constexpr int kRanks = 3;
  Group group = InProcessCollective::CreateGroup(kRanks);
  ExpectSeveralBuffersReduceAsOneVector(
      kRanks, {3, 0, 500, 1}, ReduceOp::kSum,
      [&](int r, const std::vector<absl::Span<float>>& spans) {
        return group[r]->AllReduce(spans, ReduceOp::kSum, Quick());
      });
}

TEST(InProcessCollectiveTest, ReduceWritesOnlyTheRoot) {
  constexpr int kRanks = 3;
  Group group = InProcessCollective::CreateGroup(kRanks);
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(9));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 9; ++i) data[r][i] = Value(r, i);
  }
  OnEveryRank(kRanks, [&](int r) {
    absl::Span<float> span = absl::MakeSpan(data[r]);
    ASSERT_TRUE(group[r]->Reduce(absl::MakeConstSpan(&span, 1), ReduceOp::kSum, 1, Quick()).ok());
  });
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(data[1][i], Value(0, i) + Value(1, i) + Value(2, i));
    EXPECT_EQ(data[0][i], Value(0, i));
    EXPECT_EQ(data[2][i], Value(2, i));
  }
}

TEST(InProcessCollectiveTest, BroadcastCopiesFromEveryRoot) {
  constexpr int kRanks = 4;
  Group group = InProcessCollective::CreateGroup(kRanks);
  for (int root = 0; root < kRanks; ++root) {
    std::vector<std::vector<float>> data(kRanks, std::vector<float>(33));
    for (int r = 0; r < kRanks; ++r) {
      for (int i = 0; i < 33; ++i) data[r][i] = Value(r, i);
    }
    OnEveryRank(kRanks, [&](int r) {
      ASSERT_TRUE(group[r]->Broadcast(absl::MakeSpan(data[r]), root, Quick()).ok());
    });
    for (int r = 0; r < kRanks; ++r) {
      for (int i = 0; i < 33; ++i) ASSERT_EQ(data[r][i], Value(root, i)) << "root " << root;
    }
  }
}

TEST(InProcessCollectiveTest, AllGatherConcatenatesInRankOrder) {
  constexpr int kRanks = 3;
  Group group = InProcessCollective::CreateGroup(kRanks);
  std::vector<std::vector<float>> in(kRanks), out(kRanks, std::vector<float>(kRanks * 5));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 5; ++i) in[r].push_back(Value(r, i));
  }
  OnEveryRank(kRanks, [&](int r) {
    ASSERT_TRUE(group[r]->AllGather(in[r], absl::MakeSpan(out[r]), Quick()).ok());
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int k = 0; k < kRanks; ++k) {
      for (int i = 0; i < 5; ++i) EXPECT_EQ(out[r][k * 5 + i], Value(k, i));
    }
  }
}

TEST(InProcessCollectiveTest, BarrierReleasesNobodyBeforeTheLastArrives) {
  constexpr int kRanks = 4;
  Group group = InProcessCollective::CreateGroup(kRanks);
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  OnEveryRank(kRanks, [&](int r) {
    if (r == 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived.fetch_add(1);
    ASSERT_TRUE(group[r]->Barrier(Quick()).ok());
    if (arrived.load() != kRanks) early.fetch_add(1);
  });
  EXPECT_EQ(early.load(), 0);
}

TEST(InProcessCollectiveTest, TimeoutNamesTheReplicaThatNeverArrives) {
  constexpr int kRanks = 4;
  Group group = InProcessCollective::CreateGroup(kRanks);
  std::vector<absl::Status> status(kRanks);
  std::vector<absl::Duration> took(kRanks);
  const absl::Duration timeout = absl::Milliseconds(200);
  OnEveryRank(kRanks - 1, [&](int r) {  // replica 3 never calls
    std::vector<float> data(10, 1.0f);
    const absl::Time start = absl::Now();
    status[r] = group[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Quick(timeout));
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("replica 3"), std::string::npos) << status[r];
    EXPECT_LT(took[r], timeout + absl::Seconds(2));
  }
  // The group is dead afterwards: no later call hangs.
  EXPECT_FALSE(group[0]->Barrier(Quick()).ok());
}

TEST(InProcessCollectiveTest, AbortUnblocksAWaitingReplica) {
  Group group = InProcessCollective::CreateGroup(2);
  absl::Status status;
  const absl::Time start = absl::Now();
  std::thread waiter([&] { status = group[0]->Barrier(Quick(absl::Seconds(30))); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group[1]->Abort(absl::UnavailableError("worker:3 died"));
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("worker:3 died"), std::string::npos);
}

TEST(InProcessCollectiveTest, MismatchedCallsFailOnEveryReplica) {
  Group group = InProcessCollective::CreateGroup(2);
  std::vector<absl::Status> status(2);
  OnEveryRank(2, [&](int r) {
    std::vector<float> data(r == 0 ? 10 : 12, 1.0f);
    status[r] = group[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Quick());
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
}

TEST(InProcessCollectiveTest, StatsCountOperations) {
  Group group = InProcessCollective::CreateGroup(2);
  OnEveryRank(2, [&](int r) {
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(group[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Quick()).ok());
    ASSERT_TRUE(group[r]->Barrier(Quick()).ok());
  });
  EXPECT_EQ(group[0]->stats().operations, 2);
  EXPECT_EQ(group[0]->stats().bytes_received, 50 * 4);
}

}  // namespace
}  // namespace distrain

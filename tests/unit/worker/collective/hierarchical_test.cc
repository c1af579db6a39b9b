#include "worker/collective/hierarchical.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/collective/ring.h"

namespace distrain {
namespace {

constexpr int kWorkers = 2;
constexpr int kLocal = 3;
constexpr int kTotal = kWorkers * kLocal;

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 89) + rank); }

CollectiveOptions Timeout(absl::Duration timeout = absl::Seconds(20)) {
  CollectiveOptions o;
  o.timeout = timeout;
  o.tag = "bucket0";
  return o;
}

// members[global rank], for 2 "workers" (a ring of two over loopback) x 3
// local replicas (threads).
class HierarchicalCollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InMemoryStore store;
    std::vector<std::shared_ptr<Collective>> cross(kWorkers);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        RingOptions options;
        options.key_prefix = "hier";
        options.peer_names = {"worker:0", "worker:1"};
        auto ring = RingCollective::Create(store, w, kWorkers, options);
        ASSERT_TRUE(ring.ok()) << ring.status();
        cross[w] = std::move(*ring);
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_FALSE(HasFailure());
    for (int w = 0; w < kWorkers; ++w) {
      for (auto& m : HierarchicalCollective::CreateLocalGroup(cross[w], kLocal)) {
        members_.push_back(std::move(m));
      }
    }
  }

  void OnEveryReplica(const std::function<void(int)>& fn, int count = kTotal) {
    std::vector<std::thread> threads;
    for (int r = 0; r < count; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

  std::vector<std::unique_ptr<HierarchicalCollective>> members_;
};

TEST_F(HierarchicalCollectiveTest, PresentsOneGroupOfWorkersTimesLocalReplicas) {
  for (int r = 0; r < kTotal; ++r) {
    EXPECT_EQ(members_[r]->rank(), r);
    EXPECT_EQ(members_[r]->size(), kTotal);
  }
}

TEST_F(HierarchicalCollectiveTest, AllReduceEqualsTheFlatReferenceOnEveryReplica) {
  for (int64_t elements : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      std::vector<std::vector<float>> data(kTotal, std::vector<float>(elements));
      for (int r = 0; r < kTotal; ++r) {
        for (int64_t i = 0; i < elements; ++i) data[r][i] = Value(r, i);
      }
      OnEveryReplica([&](int r) {
        absl::Status s = members_[r]->AllReduce(absl::MakeSpan(data[r]), op, Timeout());
        ASSERT_TRUE(s.ok()) << s;
      });
      for (int r = 0; r < kTotal; ++r) {
        for (int64_t i = 0; i < elements; ++i) {
          float sum = 0;
          for (int k = 0; k < kTotal; ++k) sum += Value(k, i);
          ASSERT_EQ(data[r][i], op == ReduceOp::kMean ? sum / kTotal : sum)
              << "replica " << r << " i=" << i;
        }
        if (elements > 0) {
          EXPECT_EQ(std::memcmp(data[r].data(), data[0].data(), elements * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST_F(HierarchicalCollectiveTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < kTotal; ++root) {
    std::vector<std::vector<float>> data(kTotal, std::vector<float>(1001));
    for (int r = 0; r < kTotal; ++r) {
      for (int i = 0; i < 1001; ++i) data[r][i] = Value(r, i);
    }
    OnEveryReplica([&](int r) {
      absl::Status s = members_[r]->Broadcast(absl::MakeSpan(data[r]), root, Timeout());
      ASSERT_TRUE(s.ok()) << s;
    });
    for (int r = 0; r < kTotal; ++r) {
      for (int i = 0; i < 1001; ++i) ASSERT_EQ(data[r][i], Value(root, i)) << "root " << root;
    }
  }
}

TEST_F(HierarchicalCollectiveTest, AllGatherIsInGlobalRankOrder) {
  constexpr int kElements = 13;
  std::vector<std::vector<float>> in(kTotal), out(kTotal, std::vector<float>(kTotal * kElements));
  for (int r = 0; r < kTotal; ++r) {
    for (int i = 0; i < kElements; ++i) in[r].push_back(Value(r, i));
  }
  OnEveryReplica([&](int r) {
    absl::Status s = members_[r]->AllGather(in[r], absl::MakeSpan(out[r]), Timeout());
    ASSERT_TRUE(s.ok()) << s;
  });
  for (int r = 0; r < kTotal; ++r) {
    for (int k = 0; k < kTotal; ++k) {
      for (int i = 0; i < kElements; ++i) ASSERT_EQ(out[r][k * kElements + i], Value(k, i));
    }
  }
}

TEST_F(HierarchicalCollectiveTest, BarrierCompletesOnEveryReplica) {
  OnEveryReplica([&](int r) { ASSERT_TRUE(members_[r]->Barrier(Timeout()).ok()); });
  EXPECT_EQ(members_[4]->stats().operations, 1);
}

TEST_F(HierarchicalCollectiveTest, MissingWorkerFailsEveryLocalReplicaNamingIt) {
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<absl::Status> status(kLocal);
  std::vector<absl::Duration> took(kLocal);
  OnEveryReplica(
      [&](int r) {  // only worker 0's replicas call; worker 1 is stuck
        std::vector<float> data(100, 1.0f);
        const absl::Time start = absl::Now();
        status[r] = members_[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout(timeout));
        took[r] = absl::Now() - start;
      },
      kLocal);
  for (int r = 0; r < kLocal; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("worker:1"), std::string::npos) << status[r];
    EXPECT_LT(took[r], timeout + absl::Seconds(2));
  }
}

}  // namespace
}  // namespace distrain

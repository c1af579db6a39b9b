// HostStagedCollective: MultiWorkerMirrored's GPU replicas reduce through a
// host collective. The staging must be invisible: the same results as the
// inner collective on the same buffers, for every operation, and its errors
// unchanged. Here the "device" is the host (the copies are memcpys); on a GPU
// the last test runs the same all-reduce over device buffers.
#include "worker/strategy/host_staged_collective.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/unit/worker/collective/collective_test_util.h"
#include "worker/collective/in_process.h"
#include "worker/strategy/variable_state.h"

namespace distrain {
namespace {

using collective_testing::ExpectSeveralBuffersReduceAsOneVector;
using collective_testing::OnEveryRank;
using collective_testing::Value;

CollectiveOptions Quick() {
  CollectiveOptions o;
  o.timeout = absl::Seconds(20);
  o.tag = "test";
  return o;
}

struct StagedGroup {
  explicit StagedGroup(int n, DeviceId device = DeviceId::Cpu())
      : inner(InProcessCollective::CreateGroup(n)) {
    for (auto& c : inner) staged.push_back(std::make_unique<HostStagedCollective>(c.get(), device));
  }
  std::vector<std::unique_ptr<InProcessCollective>> inner;
  std::vector<std::unique_ptr<HostStagedCollective>> staged;
};

TEST(HostStagedCollectiveTest, SeveralBuffersReduceAsOneVectorLikeTheInnerCollective) {
  for (int n : {1, 2, 3}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      StagedGroup g(n);
      ExpectSeveralBuffersReduceAsOneVector(
          n, {0, 5, 1, 1000, 0, 37}, op, [&](int r, const std::vector<absl::Span<float>>& spans) {
            return g.staged[r]->AllReduce(absl::MakeConstSpan(spans), op, Quick());
          });
      // A second, smaller call reuses the staging buffer and must not see
      // the first call's leftovers.
      ExpectSeveralBuffersReduceAsOneVector(
          n, {3}, op, [&](int r, const std::vector<absl::Span<float>>& spans) {
            return g.staged[r]->AllReduce(absl::MakeConstSpan(spans), op, Quick());
          });
    }
  }
}

TEST(HostStagedCollectiveTest, BroadcastAndAllGatherGiveTheInnerCollectivesResults) {
  constexpr int kRanks = 3;
  StagedGroup g(kRanks);
  std::vector<std::vector<float>> bcast(kRanks, std::vector<float>(101));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 101; ++i) bcast[r][i] = Value(r, i);
  }
  std::vector<std::vector<float>> gathered(kRanks, std::vector<float>(kRanks * 7, -1.0f));
  std::vector<std::vector<float>> input(kRanks, std::vector<float>(7));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 7; ++i) input[r][i] = Value(r, i);
  }
  std::vector<absl::Status> b(kRanks), a(kRanks);
  OnEveryRank(kRanks, [&](int r) {
    b[r] = g.staged[r]->Broadcast(absl::MakeSpan(bcast[r]), /*root=*/1, Quick());
    a[r] = g.staged[r]->AllGather(input[r], absl::MakeSpan(gathered[r]), Quick());
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(b[r].ok()) << b[r];
    ASSERT_TRUE(a[r].ok()) << a[r];
    for (int i = 0; i < 101; ++i) ASSERT_EQ(bcast[r][i], Value(1, i)) << "rank " << r;
    for (int k = 0; k < kRanks; ++k) {
      for (int i = 0; i < 7; ++i) ASSERT_EQ(gathered[r][k * 7 + i], Value(k, i)) << "rank " << r;
    }
  }
}

TEST(HostStagedCollectiveTest, AnAbortReachesTheInnerCollectiveAndItsErrorComesBack) {
  StagedGroup g(2);
  g.staged[0]->Abort(absl::UnavailableError("worker:1 is gone"));
  std::vector<float> data(10, 1.0f);
  absl::Status s = g.staged[0]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Quick());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("worker:1 is gone"), std::string::npos) << s;
}

TEST(HostStagedCollectiveTest, GpuBuffersReduceThroughTheHost) {
  if (VisibleGpus() == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  constexpr int kRanks = 2;
  constexpr int64_t kElements = 1 << 16;
  StagedGroup g(kRanks, DeviceId::Cuda(0));
  std::vector<Tensor> device(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    Tensor host({kElements});
    for (int64_t i = 0; i < kElements; ++i) host.data()[i] = Value(r, i);
    device[r] = Tensor({kElements});
    device[r].Resize({kElements}, DeviceId::Cuda(0));
    CopyFloats(DeviceId::Cpu(), host.data(), DeviceId::Cuda(0), device[r].data(), kElements);
  }
  std::vector<absl::Status> status(kRanks);
  OnEveryRank(kRanks, [&](int r) {
    status[r] = g.staged[r]->AllReduce(absl::MakeSpan(device[r].data(), kElements),
                                       ReduceOp::kMean, Quick());
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    std::vector<float> back(kElements);
    CopyFloats(DeviceId::Cuda(0), device[r].data(), DeviceId::Cpu(), back.data(), kElements);
    for (int64_t i = 0; i < kElements; ++i) {
      ASSERT_EQ(back[i], (Value(0, i) + Value(1, i)) / 2) << "rank " << r << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace distrain

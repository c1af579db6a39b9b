// RingCollective's algorithms run over any Transport: here over bounded
// in-memory pipes (in_memory_transport.h), with no socket in sight. Tiny
// pipes and capped calls make short transfers, full links and waits the
// common case.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/worker/collective/collective_test_util.h"
#include "tests/unit/worker/collective/in_memory_transport.h"
#include "worker/collective/mesh_algorithms.h"
#include "worker/collective/operation.h"
#include "worker/collective/ring_allreduce.h"
#include "worker/collective/ring_pipeline.h"

namespace distrain {
namespace {

using collective_testing::InMemoryNetwork;
using collective_testing::OnEveryRank;
using collective_testing::Value;

const std::string kTag = "grads";

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

// One rank's side: its transport and the operation its algorithms share.
struct Rank {
  std::unique_ptr<Transport> transport;
  Operation op;
};

std::vector<std::unique_ptr<Rank>> Join(InMemoryNetwork& net, int n) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(std::make_unique<Rank>());
    ranks.back()->transport = net.Join(r);
  }
  return ranks;
}

// Joins `n` ranks to `net` and runs fn(rank, r) on a thread each; returns
// each rank's status.
std::vector<absl::Status> RunRanks(InMemoryNetwork& net, int n,
                                   const std::function<absl::Status(Rank&, int)>& fn) {
  auto ranks = Join(net, n);
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) { status[r] = fn(*ranks[r], r); });
  return status;
}

void ExpectOk(const std::vector<absl::Status>& status) {
  for (size_t r = 0; r < status.size(); ++r) {
    ASSERT_TRUE(status[r].ok()) << "worker:" << r << ": " << status[r];
  }
}

void Begin(Rank& rank, OpKind kind, ReduceOp op, int64_t payload_bytes) {
  rank.op.Begin(kind, op, 0, payload_bytes);
  rank.op.Name("all-reduce", &kTag);
}

// A sliced ring all-reduce (SUM) of `data` on `rank`.
absl::Status RingAllReduce(Rank& rank, std::vector<float>& data, absl::Time deadline,
                           ReduceOp op = ReduceOp::kSum, int64_t chunk_bytes = 1024,
                           int stage_slices = 4) {
  const int64_t bytes = static_cast<int64_t>(data.size() * sizeof(float));
  Begin(rank, OpKind::kAllReduce, op, bytes);
  SlicedRingAllReduce all_reduce(*rank.transport, rank.op, chunk_bytes, stage_slices);
  ByteVector vector;
  vector.Add(data.data(), bytes);
  return all_reduce.Run(vector, op, deadline);
}

std::vector<std::vector<float>> Inputs(int n, int64_t elements) {
  std::vector<std::vector<float>> data(n, std::vector<float>(elements));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < elements; ++i) data[r][i] = Value(r, i);
  }
  return data;
}

void ExpectReduced(const std::vector<std::vector<float>>& data, ReduceOp op) {
  const int n = static_cast<int>(data.size());
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < data[r].size(); ++i) {
      float sum = 0;
      for (int k = 0; k < n; ++k) sum += Value(k, static_cast<int64_t>(i));
      ASSERT_EQ(data[r][i], op == ReduceOp::kMean ? sum / n : sum)
          << "rank " << r << " i=" << i;
    }
  }
}

TEST(AlgorithmsOverInMemoryTransportTest, SlicedRingAllReduceReducesThroughTinyPipes) {
  struct Case {
    int ranks;
    int64_t elements;
    size_t pipe_bytes;
    size_t per_call;
  };
  for (const Case& c : {Case{2, 5001, 700, 333}, Case{3, 20011, 256, 100}, Case{4, 1003, 64, 7}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      SCOPED_TRACE(absl::StrCat(c.ranks, " ranks, ", c.elements, " elements, pipes of ",
                                c.pipe_bytes, " bytes, ", c.per_call, " per call"));
      InMemoryNetwork net(c.ranks, c.pipe_bytes, c.per_call, /*fully_connected=*/false);
      std::vector<std::vector<float>> data = Inputs(c.ranks, c.elements);
      ExpectOk(RunRanks(net, c.ranks, [&](Rank& rank, int r) {
        return RingAllReduce(rank, data[r], Deadline(), op, /*chunk_bytes=*/256,
                             /*stage_slices=*/2);
      }));
      ASSERT_FALSE(HasFailure());
      ExpectReduced(data, op);
    }
  }
}

TEST(AlgorithmsOverInMemoryTransportTest, RingPipelineGathersEveryBlockInRankOrder) {
  constexpr int kRanks = 5;
  constexpr int64_t kBlock = 1001;
  InMemoryNetwork net(kRanks, 300, 64, /*fully_connected=*/false);
  std::vector<std::vector<float>> out(kRanks, std::vector<float>(kRanks * kBlock, -1));
  ExpectOk(RunRanks(net, kRanks, [&](Rank& rank, int r) {
    for (int64_t i = 0; i < kBlock; ++i) out[r][r * kBlock + i] = Value(r, i);
    Begin(rank, OpKind::kAllGather, ReduceOp::kSum, kBlock * 4);
    RingPipeline pipeline(*rank.transport, rank.op);
    ByteVector vector;
    vector.Add(out[r].data(), kRanks * kBlock * 4);
    pipeline.PlanAllGather(&vector, kBlock * 4);
    return pipeline.Run(Deadline());
  }));
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < kRanks; ++r) {
    for (int k = 0; k < kRanks; ++k) {
      for (int64_t i = 0; i < kBlock; ++i) ASSERT_EQ(out[r][k * kBlock + i], Value(k, i));
    }
  }
}

TEST(AlgorithmsOverInMemoryTransportTest, RecursiveDoublingFoldsNonPowersOfTwo) {
  for (int n : {2, 3, 5, 6}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    InMemoryNetwork net(n, 128, 40, /*fully_connected=*/true);
    std::vector<std::vector<float>> data = Inputs(n, 301);
    ExpectOk(RunRanks(net, n, [&](Rank& rank, int r) {
      Begin(rank, OpKind::kAllReduce, ReduceOp::kMean, 301 * 4);
      MeshAlgorithms mesh(*rank.transport, rank.op, absl::Microseconds(20), /*slice_bytes=*/64);
      absl::Span<float> span = absl::MakeSpan(data[r]);
      return mesh.DoublingAllReduce({&span, 1}, 301, ReduceOp::kMean, Deadline());
    }));
    ASSERT_FALSE(HasFailure());
    ExpectReduced(data, ReduceOp::kMean);
  }
}

// Halving and doubling: odd sizes split unevenly at every level, powers of
// two and not (folded), through pipes smaller than one segment, with the
// received halves added piece by piece (slices smaller than a segment, and
// not dividing it) or whole, in place or gathered from several spans; every
// rank ends bit-identical and exact.
TEST(AlgorithmsOverInMemoryTransportTest, HalvingDoublingReducesEveryGroupAndOddSize) {
  for (int n : {2, 3, 4, 5, 7, 8}) {
    for (int64_t elements : {1, 3, 301, 4099}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        const int64_t slice_bytes = op == ReduceOp::kSum ? 64 : 100 * 4;
        const bool split = elements > 1 && n % 2 == 1;
        SCOPED_TRACE(
            absl::StrCat(n, " ranks, ", elements, " elements, ", split ? "2 spans" : "1 span"));
        InMemoryNetwork net(n, 128, 40, /*fully_connected=*/true);
        std::vector<std::vector<float>> data = Inputs(n, elements);
        ExpectOk(RunRanks(net, n, [&](Rank& rank, int r) {
          Begin(rank, OpKind::kAllReduce, op, elements * 4);
          MeshAlgorithms mesh(*rank.transport, rank.op, absl::Microseconds(20), slice_bytes);
          absl::Span<float> spans[2] = {absl::MakeSpan(data[r]), {}};
          if (split) {
            spans[0] = absl::MakeSpan(data[r].data(), elements / 2);
            spans[1] = absl::MakeSpan(data[r].data() + elements / 2, elements - elements / 2);
          }
          return mesh.HalvingDoublingAllReduce({spans, split ? 2u : 1u}, elements, op, Deadline());
        }));
        ASSERT_FALSE(HasFailure());
        ExpectReduced(data, op);
      }
    }
  }
}

TEST(AlgorithmsOverInMemoryTransportTest, OneHopBroadcastReachesEveryRank) {
  constexpr int kRanks = 4;
  constexpr int kRoot = 2;
  InMemoryNetwork net(kRanks, 100, 30, /*fully_connected=*/true);
  std::vector<std::vector<float>> data = Inputs(kRanks, 77);
  ExpectOk(RunRanks(net, kRanks, [&](Rank& rank, int r) {
    rank.op.Begin(OpKind::kBroadcast, ReduceOp::kSum, kRoot, 77 * 4);
    MeshAlgorithms mesh(*rank.transport, rank.op, absl::ZeroDuration(), /*slice_bytes=*/64);
    std::vector<char*> in(kRanks, nullptr);
    in[kRoot] = reinterpret_cast<char*>(data[r].data());
    return mesh.OneHop(reinterpret_cast<const char*>(data[r].data()), in.data(), 77 * 4, kRoot,
                       Deadline());
  }));
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < kRanks; ++r) {
    for (int64_t i = 0; i < 77; ++i) ASSERT_EQ(data[r][i], Value(kRoot, i)) << "rank " << r;
  }
}

// The transport only says "closed"; the algorithm names the peer and the
// operation.
TEST(AlgorithmsOverInMemoryTransportTest, APeerThatGoesAwayIsNamedAsUnavailable) {
  InMemoryNetwork net(2, 1 << 10, 1 << 10, /*fully_connected=*/false);
  auto ranks = Join(net, 2);
  ranks[1]->transport.reset();  // worker:1's process is gone
  Rank& rank = *ranks[0];
  std::vector<float> data(4000, 1.0f);
  const absl::Status status = RingAllReduce(rank, data, Deadline());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("all-reduce 'grads' #1"), std::string::npos) << status;
  EXPECT_NE(status.message().find("worker:1"), std::string::npos) << status;
}

TEST(AlgorithmsOverInMemoryTransportTest, MismatchedCallsFailNamingThePeer) {
  InMemoryNetwork net(2, 1 << 10, 1 << 10, /*fully_connected=*/false);
  const std::vector<absl::Status> status = RunRanks(net, 2, [&](Rank& rank, int r) {
    const int64_t elements = r == 0 ? 10 : 12;
    Begin(rank, OpKind::kAllGather, ReduceOp::kSum, elements * 4);
    std::vector<float> out(2 * elements);
    ByteVector vector;
    vector.Add(out.data(), 2 * elements * 4);
    RingPipeline pipeline(*rank.transport, rank.op);
    pipeline.PlanAllGather(&vector, elements * 4);
    const absl::Status result = pipeline.Run(Deadline());
    // The other rank may wait for bytes this one will never send.
    if (!result.ok()) rank.transport->Abort();
    return result;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_NE(status[r].message().find(absl::StrCat("worker:", 1 - r)), std::string::npos)
        << status[r];
  }
}

TEST(AlgorithmsOverInMemoryTransportTest, AWaitThatPassesItsDeadlineBlamesTheLeftNeighbour) {
  InMemoryNetwork net(3, 1 << 10, 1 << 10, /*fully_connected=*/false);
  auto ranks = Join(net, 3);
  Rank& rank = *ranks[1];  // its left neighbour, worker:0, never calls
  std::vector<float> data(3000, 1.0f);
  const absl::Status status = RingAllReduce(rank, data, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("on worker:1 timed out waiting for worker:0 to send"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace distrain

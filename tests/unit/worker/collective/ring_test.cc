#include "worker/collective/ring.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/worker/collective/collective_test_util.h"
#include "worker/collective/tcp_socket.h"

namespace distrain {
namespace {

using Ring = std::vector<std::unique_ptr<RingCollective>>;

using collective_testing::ExpectSeveralBuffersReduceAsOneVector;
using collective_testing::OnEveryRank;
using collective_testing::Value;

RingOptions Options(int n, const std::string& prefix = "test") {
  RingOptions o;
  o.key_prefix = prefix;
  o.setup_timeout = absl::Seconds(20);
  for (int r = 0; r < n; ++r) o.peer_names.push_back(absl::StrCat("worker:", r));
  return o;
}

// Ranks as threads over loopback, bootstrapped through an InMemoryStore.
Ring MakeRing(int n, const RingOptions& options) {
  InMemoryStore store;
  Ring ring(n);
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) {
    auto created = RingCollective::Create(store, r, n, options);
    if (created.ok()) {
      ring[r] = std::move(*created);
    } else {
      status[r] = created.status();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return ring;
}

CollectiveOptions Timeout(absl::Duration timeout = absl::Seconds(20)) {
  CollectiveOptions o;
  o.timeout = timeout;
  o.tag = "grads";
  return o;
}

// All-reduces `elements` per rank and checks every rank against the reference.
void CheckAllReduce(Ring& ring, int64_t elements, ReduceOp op) {
  const int n = static_cast<int>(ring.size());
  std::vector<std::vector<float>> data(n, std::vector<float>(elements));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < elements; ++i) data[r][i] = Value(r, i);
  }
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) {
    status[r] = ring[r]->AllReduce(absl::MakeSpan(data[r]), op, Timeout());
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    for (int64_t i = 0; i < elements; ++i) {
      float sum = 0;
      for (int k = 0; k < n; ++k) sum += Value(k, i);
      const float want = op == ReduceOp::kMean ? sum / n : sum;
      ASSERT_EQ(data[r][i], want) << "n=" << n << " elements=" << elements << " rank=" << r
                                  << " i=" << i;
    }
  }
}

// The three ways an operation can travel: -1 forces the bandwidth path
// (reduce-scatter/all-gather ring, chain broadcast) for every size; with the
// default threshold small payloads take the one-hop mesh, or the ring
// all-gather when the mesh is off.
struct PathCase {
  const char* name;
  int64_t small_bytes;
  int mesh_max_ranks;
  int64_t halving_doubling_bytes = 0;  // > 0: medium payloads halve and double
};

void PrintTo(const PathCase& c, std::ostream* os) { *os << c.name; }

class RingPathTest : public ::testing::TestWithParam<PathCase> {
 protected:
  RingOptions PathOptions(int n) const {
    RingOptions options = Options(n);
    options.small_allreduce_bytes = GetParam().small_bytes;
    options.mesh_max_ranks = GetParam().mesh_max_ranks;
    options.halving_doubling_bytes = GetParam().halving_doubling_bytes;
    return options;
  }
};

TEST_P(RingPathTest, AllReduceMatchesSumAndMeanForEveryGroupAndOddSizes) {
  for (int n = 1; n <= 8; ++n) {
    Ring ring = MakeRing(n, PathOptions(n));
    ASSERT_FALSE(HasFailure());
    for (int64_t elements : {0, 1, 7, 4099}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        CheckAllReduce(ring, elements, op);
        ASSERT_FALSE(HasFailure());
      }
    }
  }
}

TEST_P(RingPathTest, AllReduceMatchesSumForAMillionAndThreeElements) {
  for (int n : {2, 3, 4}) {
    RingOptions options = PathOptions(n);
    options.chunk_bytes = 64 << 10;  // many chunks per segment
    Ring ring = MakeRing(n, options);
    ASSERT_FALSE(HasFailure());
    CheckAllReduce(ring, (1 << 20) + 3, n == 3 ? ReduceOp::kMean : ReduceOp::kSum);
  }
}

// Above 8 MiB the results are written with non-temporal stores, below with
// plain ones: both paths give the exact sums.
TEST_P(RingPathTest, AllReduceMatchesSumAboveTheStreamingThreshold) {
  Ring ring = MakeRing(3, PathOptions(3));
  ASSERT_FALSE(HasFailure());
  CheckAllReduce(ring, (9 << 20) / 4 + 5, ReduceOp::kSum);
}

TEST_P(RingPathTest, SeveralBuffersAreOneLogicalVector) {
  constexpr int kRanks = 3;
  Ring ring = MakeRing(kRanks, PathOptions(kRanks));
  ASSERT_FALSE(HasFailure());
  ExpectSeveralBuffersReduceAsOneVector(
      kRanks, {3, 0, 5000, 1, 17}, ReduceOp::kSum,
      [&](int r, const std::vector<absl::Span<float>>& spans) {
        return ring[r]->AllReduce(spans, ReduceOp::kSum, Timeout());
      });
}

TEST_P(RingPathTest, BroadcastCopiesFromEveryRoot) {
  for (int n : {2, 4}) {
    Ring ring = MakeRing(n, PathOptions(n));
    ASSERT_FALSE(HasFailure());
    for (int64_t elements : {int64_t{0}, int64_t{5}, int64_t{200003}}) {
      for (int root = 0; root < n; ++root) {
        std::vector<std::vector<float>> data(n, std::vector<float>(elements));
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < elements; ++i) data[r][i] = Value(r, i);
        }
        OnEveryRank(n, [&](int r) {
          absl::Status s = ring[r]->Broadcast(absl::MakeSpan(data[r]), root, Timeout());
          ASSERT_TRUE(s.ok()) << s;
        });
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < elements; ++i) {
            ASSERT_EQ(data[r][i], Value(root, i)) << "n=" << n << " root " << root << " rank " << r;
          }
        }
      }
    }
  }
}

TEST_P(RingPathTest, AllGatherConcatenatesInRankOrder) {
  for (int n : {1, 2, 5}) {
    Ring ring = MakeRing(n, PathOptions(n));
    ASSERT_FALSE(HasFailure());
    for (int64_t elements : {int64_t{0}, int64_t{3}, int64_t{70001}}) {
      std::vector<std::vector<float>> in(n), out(n, std::vector<float>(n * elements, -1.0f));
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < elements; ++i) in[r].push_back(Value(r, i));
      }
      OnEveryRank(n, [&](int r) {
        absl::Status s = ring[r]->AllGather(in[r], absl::MakeSpan(out[r]), Timeout());
        ASSERT_TRUE(s.ok()) << s;
      });
      for (int r = 0; r < n; ++r) {
        for (int k = 0; k < n; ++k) {
          for (int64_t i = 0; i < elements; ++i) {
            ASSERT_EQ(out[r][k * elements + i], Value(k, i)) << "n=" << n << " rank " << r;
          }
        }
      }
    }
  }
}

TEST_P(RingPathTest, BarrierReleasesNobodyBeforeTheLastArrives) {
  constexpr int kRanks = 4;
  Ring ring = MakeRing(kRanks, PathOptions(kRanks));
  ASSERT_FALSE(HasFailure());
  for (int late = 0; late < kRanks; ++late) {
    std::atomic<int> arrived{0};
    std::atomic<int> early{0};
    OnEveryRank(kRanks, [&](int r) {
      if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      arrived.fetch_add(1);
      ASSERT_TRUE(ring[r]->Barrier(Timeout()).ok());
      if (arrived.load() != kRanks) early.fetch_add(1);
    });
    EXPECT_EQ(early.load(), 0) << "late rank " << late;
  }
}

TEST_P(RingPathTest, OperationsInterleaveOnTheSameLinks) {
  // Mesh and ring traffic share the neighbour sockets; a mixed sequence must
  // keep every stream in step.
  constexpr int kRanks = 4;
  Ring ring = MakeRing(kRanks, PathOptions(kRanks));
  ASSERT_FALSE(HasFailure());
  for (int64_t elements : {int64_t{10}, int64_t{100000}, int64_t{3}, int64_t{50000}}) {
    CheckAllReduce(ring, elements, ReduceOp::kSum);
    ASSERT_FALSE(HasFailure());
    OnEveryRank(kRanks, [&](int r) { ASSERT_TRUE(ring[r]->Barrier(Timeout()).ok()); });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Paths, RingPathTest,
    ::testing::Values(PathCase{"BandwidthPathOnly", -1, 16}, PathCase{"SmallViaMesh", 32768, 16},
                      PathCase{"SmallViaRingAllGather", 32768, 0},
                      PathCase{"EveryAllReduceHalvesAndDoubles", -1, 16, int64_t{1} << 40}),
    [](const ::testing::TestParamInfo<PathCase>& info) { return std::string(info.param.name); });

TEST(RingCollectiveTest, ReductionReassemblesFloatsSplitAcrossReads) {
  // A scratch of an odd number of bytes makes nearly every read end inside a
  // float, whatever the kernel delivers.
  constexpr int kRanks = 3;
  RingOptions options = Options(kRanks);
  options.small_allreduce_bytes = -1;
  options.chunk_bytes = 4099;
  Ring ring = MakeRing(kRanks, options);
  ASSERT_FALSE(HasFailure());
  CheckAllReduce(ring, 100003, ReduceOp::kSum);
  CheckAllReduce(ring, 100003, ReduceOp::kMean);
}

// The bandwidth path streams each segment in slices of chunk_bytes through a
// staging ring of four slices. Tiny slices make every boundary case happen
// many times per operation: segments one float longer than the others (an
// extra round in which the shorter ones send nothing), a last slice shorter
// than the rest, sizes divisible by neither N nor the slice, and the stage
// wrapping around.
TEST(RingCollectiveTest, SlicedAllReduceHandlesUnequalSegmentsAndStageWrap) {
  struct Case {
    int ranks;
    int64_t elements;
    int64_t chunk_bytes;
    int stage_slices = 4;
  };
  // Stages of 1 (raised to the minimum, 2), 2 and 16 slices too: any depth
  // must neither deadlock nor reorder.
  for (const Case& c : {Case{2, 4097, 64}, Case{3, 193, 64}, Case{3, 20011, 100},
                        Case{4, 10003, 1000}, Case{5, 5 * 16 * 7 + 4, 64}, Case{8, 13, 64},
                        Case{4, 10003, 64, 1}, Case{3, 20011, 100, 2}, Case{4, 10003, 64, 16}}) {
    RingOptions options = Options(c.ranks);
    options.small_allreduce_bytes = -1;
    options.chunk_bytes = c.chunk_bytes;
    options.stage_slices = c.stage_slices;
    Ring ring = MakeRing(c.ranks, options);
    ASSERT_FALSE(HasFailure());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      SCOPED_TRACE(absl::StrCat("ranks ", c.ranks, ", elements ", c.elements, ", chunk_bytes ",
                                c.chunk_bytes, ", stage_slices ", c.stage_slices,
                                op == ReduceOp::kMean ? ", mean" : ", sum"));
      CheckAllReduce(ring, c.elements, op);
      ASSERT_FALSE(HasFailure());
    }
  }
}

TEST(RingCollectiveTest, SlicesSpanSeveralBuffers) {
  constexpr int kRanks = 4;
  RingOptions options = Options(kRanks);
  options.small_allreduce_bytes = -1;
  options.chunk_bytes = 64;  // 16 floats: most slices cross a buffer boundary
  Ring ring = MakeRing(kRanks, options);
  ASSERT_FALSE(HasFailure());
  ExpectSeveralBuffersReduceAsOneVector(
      kRanks, {3, 0, 50, 1, 17, 200, 5, 33}, ReduceOp::kMean,
      [&](int r, const std::vector<absl::Span<float>>& spans) {
        return ring[r]->AllReduce(spans, ReduceOp::kMean, Timeout());
      });
}

TEST(RingCollectiveTest, AllReduceIsBitIdenticalOnEveryRank) {
  constexpr int kRanks = 3;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  for (int64_t elements : {int64_t{1000}, int64_t{300001}}) {
    std::vector<std::vector<float>> data(kRanks, std::vector<float>(elements));
    for (int r = 0; r < kRanks; ++r) {
      for (int64_t i = 0; i < elements; ++i) data[r][i] = 0.1f * (r + 1) + 1e-3f * (i % 1013);
    }
    OnEveryRank(kRanks, [&](int r) {
      ASSERT_TRUE(ring[r]->AllReduce(absl::MakeSpan(data[r]), ReduceOp::kMean, Timeout()).ok());
    });
    for (int r = 1; r < kRanks; ++r) {
      EXPECT_EQ(std::memcmp(data[0].data(), data[r].data(), elements * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 for " << elements << " elements";
    }
  }
}

TEST(RingCollectiveTest, CreateTimesOutNamingTheRankThatNeverJoins) {
  constexpr int kRanks = 3;
  RingOptions options = Options(kRanks);
  options.setup_timeout = absl::Milliseconds(300);
  InMemoryStore store;
  std::vector<absl::Status> status(kRanks);
  std::vector<absl::Duration> took(kRanks);
  OnEveryRank(kRanks - 1, [&](int r) {  // worker:2 never starts
    const absl::Time start = absl::Now();
    status[r] = RingCollective::Create(store, r, kRanks, options).status();
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("worker:2"), std::string::npos) << status[r];
    EXPECT_NE(status[r].message().find("test/ring/2"), std::string::npos) << status[r];
    EXPECT_LT(took[r], absl::Seconds(3));
  }
}

TEST(RingCollectiveTest, RankThatStopsMidOperationIsNamedWhenTheTimeoutFires) {
  constexpr int kRanks = 3;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  CheckAllReduce(ring, 1000, ReduceOp::kSum);  // healthy first
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<absl::Status> status(kRanks);
  std::vector<absl::Duration> took(kRanks);
  OnEveryRank(kRanks - 1, [&](int r) {  // worker:2 stays alive but skips the call
    std::vector<float> data(50000, 1.0f);
    const absl::Time start = absl::Now();
    status[r] = ring[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout(timeout));
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_GE(took[r], timeout);
    EXPECT_LT(took[r], timeout + absl::Seconds(2));
    EXPECT_NE(status[r].message().find("grads"), std::string::npos) << status[r];
  }
  // worker:0 receives from worker:2, so it names it (worker:1 names its own
  // left neighbour, through which the stall reached it).
  EXPECT_NE(status[0].message().find("worker:2 (127.0.0.1:"), std::string::npos) << status[0];
  // The group is dead afterwards.
  EXPECT_FALSE(ring[0]->Barrier(Timeout()).ok());
}

// Every wait polls for RingOptions::busy_poll before it sleeps; a peer that
// is still computing (a straggler) must not cost the waiting ranks a core for
// the whole wait. Both paths: the ring (50,000 floats) and the mesh's
// recursive doubling (100 floats).
TEST(RingCollectiveTest, WaitingForASilentPeerSleepsAfterPolling) {
  constexpr int kRanks = 2;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  for (int64_t elements : {int64_t{50000}, int64_t{100}}) {
    SCOPED_TRACE(absl::StrCat(elements, " floats"));
    std::vector<float> data(elements, 1.0f);
    timespec cpu0{}, cpu1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    const absl::Status status =  // worker:1 never calls
        ring[0]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout(absl::Milliseconds(400)));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    const double cpu_s = (cpu1.tv_sec - cpu0.tv_sec) + (cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
    EXPECT_LT(cpu_s, 0.1) << "a 400 ms wait used " << cpu_s << " s of CPU";
    ring = MakeRing(kRanks, Options(kRanks));  // the failed group is dead
    ASSERT_FALSE(HasFailure());
  }
}

TEST(RingCollectiveTest, MeshNamesTheStoppedRankOnEveryOtherRank) {
  constexpr int kRanks = 4;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<absl::Status> status(kRanks);
  OnEveryRank(kRanks, [&](int r) {
    if (r == 1) return;  // worker:1 skips the barrier
    status[r] = ring[r]->Barrier(Timeout(timeout));
  });
  for (int r : {0, 2, 3}) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("waiting for worker:1 (127.0.0.1:"), std::string::npos)
        << status[r];
  }
}

TEST(RingCollectiveTest, SmallAllReduceTimesOutWhenARankStops) {
  constexpr int kRanks = 4;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<absl::Status> status(kRanks);
  std::vector<absl::Duration> took(kRanks);
  OnEveryRank(kRanks, [&](int r) {
    if (r == 3) return;  // worker:3 skips the call
    std::vector<float> data(100, 1.0f);  // recursive doubling over the mesh
    const absl::Time start = absl::Now();
    status[r] = ring[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout(timeout));
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_LT(took[r], timeout + absl::Seconds(2));
  }
  // worker:2 exchanges with worker:3 first, so it names it.
  EXPECT_NE(status[2].message().find("waiting for worker:3 (127.0.0.1:"), std::string::npos)
      << status[2];
}

TEST(RingCollectiveTest, PeerWhoseSocketClosesIsNamedAsUnavailable) {
  Ring ring = MakeRing(2, Options(2));
  ASSERT_FALSE(HasFailure());
  CheckAllReduce(ring, 100, ReduceOp::kSum);
  ring[1].reset();  // worker:1's process is gone
  std::vector<float> data(1 << 20, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status status = ring[0]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("worker:1"), std::string::npos) << status;
}

TEST(RingCollectiveTest, AbortFromAnotherThreadEndsAnInFlightOperation) {
  constexpr int kRanks = 3;
  Ring ring = MakeRing(kRanks, Options(kRanks));
  ASSERT_FALSE(HasFailure());
  std::vector<absl::Status> status(kRanks);
  std::vector<absl::Duration> took(kRanks);
  std::thread watcher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ring[0]->Abort(absl::UnavailableError("coordinator: worker:2 missed its heartbeats"));
  });
  OnEveryRank(kRanks - 1, [&](int r) {  // worker:2 never calls
    // Ring path: worker:1 waits on data from worker:0.
    std::vector<float> data(200000, 1.0f);
    const absl::Time start = absl::Now();
    status[r] = ring[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout());
    took[r] = absl::Now() - start;
  });
  watcher.join();
  EXPECT_EQ(status[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status[0].message().find("missed its heartbeats"), std::string::npos) << status[0];
  // The aborted rank shut its sockets, so the neighbour waiting on it fails
  // too, long before the 20 s timeout.
  EXPECT_FALSE(status[1].ok());
  for (int r = 0; r < kRanks - 1; ++r) EXPECT_LT(took[r], absl::Seconds(5)) << "rank " << r;
  // Later operations fail with the same reason.
  EXPECT_NE(ring[0]->Barrier(Timeout()).message().find("missed its heartbeats"),
            std::string::npos);
}

TEST(RingCollectiveTest, AbortEndsASmallAllReduceBlockedInReceive) {
  Ring ring = MakeRing(2, Options(2));
  ASSERT_FALSE(HasFailure());
  absl::Status status;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {  // worker:1 never calls, so worker:0 blocks in recvmsg
    std::vector<float> data(16, 1.0f);
    status = ring[0]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ring[0]->Abort(absl::AbortedError("shutting down"));
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(status.message().find("shutting down"), std::string::npos) << status;
}

TEST(RingCollectiveTest, MismatchedCollectivesFailInsteadOfReducingGarbage) {
  Ring ring = MakeRing(2, Options(2));
  ASSERT_FALSE(HasFailure());
  std::vector<absl::Status> status(2);
  OnEveryRank(2, [&](int r) {
    std::vector<float> data(r == 0 ? 10 : 12, 1.0f);
    status[r] = ring[r]->AllReduce(absl::MakeSpan(data), ReduceOp::kSum, Timeout());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_NE(status[r].message().find(absl::StrCat("worker:", 1 - r)), std::string::npos)
        << status[r];
  }
}

std::shared_ptr<const TransportSecurity> RingKeyOnly(char fill) {
  LoadedCredentials creds;
  creds.task = TaskId{"worker", 0};
  creds.ring_key = std::string(32, fill);
  return std::make_shared<TransportSecurity>(std::move(creds));
}

// A stranger that reaches a ring port before the real left neighbour: one
// connection that says nothing, one with another job's key, one replaying a
// hello made for an earlier setup (its MAC covers that setup's nonce). None
// takes the neighbour's place; the ring forms with the real peer and every
// impostor is closed.
TEST(RingCollectiveTest, StrayForgedAndReplayedHellosDoNotTakeTheLeftNeighboursPlace) {
  RingOptions options = Options(2);
  options.security = RingKeyOnly('k');
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<RingCollective>> rank0;
  std::thread t0([&] { rank0 = RingCollective::Create(store, 0, 2, options); });
  absl::StatusOr<std::string> value = store.Get("test/ring/0", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  absl::StatusOr<RingAddress> published = ParseRingAddress(*value);
  ASSERT_TRUE(published.ok()) << published.status();
  auto connect = [&] {
    return tcp::Connect(published->address, 0, absl::Now() + absl::Seconds(5), -1, "rank 0");
  };
  auto silent = connect();
  auto foreign = connect();
  auto replay = connect();
  ASSERT_TRUE(silent.ok() && foreign.ok() && replay.ok());
  // Both carry the real group id, so only the MAC can refuse them.
  const std::string other_key(32, 'x');
  const std::string real_key(32, 'k');
  const std::string stale_nonce = NewRingNonce();
  const uint64_t group_id = RingGroupId(options.key_prefix, 2);
  const std::string forged =
      MakeRingHello(group_id, 1, 0, 2, other_key, NewRingNonce(), published->nonce);
  const std::string replayed =
      MakeRingHello(group_id, 1, 0, 2, real_key, NewRingNonce(), stale_nonce);
  for (auto [fd, bytes] : {std::pair{foreign->get(), &forged}, std::pair{replay->get(), &replayed}}) {
    ASSERT_TRUE(
        tcp::SendAll(fd, bytes->data(), bytes->size(), absl::Now() + absl::Seconds(5), -1, "rank 0")
            .ok());
  }
  absl::StatusOr<std::unique_ptr<RingCollective>> rank1 =
      RingCollective::Create(store, 1, 2, options);
  t0.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  Ring ring;
  ring.push_back(std::move(*rank0));
  ring.push_back(std::move(*rank1));
  CheckAllReduce(ring, 1000, ReduceOp::kSum);
  // The impostors that spoke were closed without an ack: reading ends with EOF.
  for (int fd : {foreign->get(), replay->get()}) {
    char byte;
    absl::Status eof =
        tcp::RecvAll(fd, &byte, 1, absl::Now() + absl::Seconds(5), -1, "rank 0");
    EXPECT_EQ(eof.code(), absl::StatusCode::kUnavailable) << eof;
  }
}

// Two ranks of different jobs (different ring keys) never form a ring: the
// acceptor refuses the hello, the dialler never gets its ack.
TEST(RingCollectiveTest, RanksWithDifferentJobKeysDoNotConnect) {
  RingOptions a = Options(2);
  a.security = RingKeyOnly('a');
  a.setup_timeout = absl::Seconds(2);
  RingOptions b = a;
  b.security = RingKeyOnly('b');
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<RingCollective>> rank0;
  std::thread t0([&] { rank0 = RingCollective::Create(store, 0, 2, a); });
  absl::StatusOr<std::unique_ptr<RingCollective>> rank1 = RingCollective::Create(store, 1, 2, b);
  t0.join();
  EXPECT_FALSE(rank0.ok());
  EXPECT_FALSE(rank1.ok());
}

TEST(RingCollectiveTest, StatsCountBytesOnTheWire) {
  Ring ring = MakeRing(2, Options(2));
  ASSERT_FALSE(HasFailure());
  CheckAllReduce(ring, 100000, ReduceOp::kSum);
  const CollectiveStats s = ring[0]->stats();
  EXPECT_EQ(s.operations, 1);
  // Ring with N=2: half the vector each way twice, plus a 24-byte header.
  EXPECT_EQ(s.bytes_sent, 100000 * 4 / 2 * 2 + 24);
  EXPECT_EQ(s.bytes_received, 100000 * 4 / 2 * 2 + 24);
}

TEST(RingCollectiveTest, RejectsWildcardBindWithoutAdvertisedHost) {
  RingOptions options = Options(2);
  options.bind_host = "0.0.0.0";
  InMemoryStore store;
  absl::Status s = RingCollective::Create(store, 0, 2, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("advertised_host"), std::string::npos) << s;
}

}  // namespace
}  // namespace distrain

// NCCL across the visible GPUs of this process (Mirrored's group): every
// rank ends with the same sum or mean, broadcast and all-gather move root's
// and every rank's data, a barrier completes, and Abort fails the next call
// instead of hanging. CUDA builds with a GPU only; skips elsewhere.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/collective/nccl/nccl_collective.h"
#include "worker/tensor/cuda/device_memory.h"
#include "worker/tensor/ops.h"
#endif

namespace distrain {
namespace {

#ifdef DISTRAIN_HAVE_CUDA
// Runs fn(rank) on one thread per rank, as LocalReplicas does.
template <typename Fn>
void OnEveryRank(int ranks, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

Tensor OnDevice(int device, const std::vector<float>& values) {
  Tensor host({static_cast<int64_t>(values.size())}, values);
  Tensor d(host.shape(), DeviceId::Cuda(device));
  ops::Copy(host, &d);
  return d;
}

std::vector<float> ToHost(const Tensor& t) {
  Tensor host;
  ops::Copy(t, &host);
  return std::vector<float>(host.span().begin(), host.span().end());
}
#endif

TEST(NcclCollectiveTest, EveryGpuEndsWithTheSameSumMeanBroadcastAndGather) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int n = cuda::VisibleDeviceCount();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  auto group = NcclCollective::CreateLocalGroup(n);
  ASSERT_TRUE(group.ok()) << group.status();
  const int64_t elements = 1 << 20 | 3;  // not a multiple of anything NCCL likes
  std::vector<std::vector<float>> sums(n), means(n), broadcast(n), gathered(n);
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) {
    NcclCollective& c = *(*group)[r];
    std::vector<float> mine(elements), other(7);
    for (int64_t i = 0; i < elements; ++i) mine[i] = static_cast<float>((i % 1000) * (r + 1));
    for (int i = 0; i < 7; ++i) other[i] = static_cast<float>(r * 10 + i);
    Tensor a = OnDevice(r, mine), b = OnDevice(r, other);
    const std::vector<absl::Span<float>> bucket = {absl::MakeSpan(a.data(), a.size()),
                                                   absl::MakeSpan(b.data(), b.size())};
    CollectiveOptions options;
    absl::Status s = c.AllReduce(bucket, ReduceOp::kSum, options);
    if (s.ok()) sums[r] = ToHost(a);
    Tensor m = OnDevice(r, other);
    if (s.ok()) s = c.AllReduce(absl::MakeSpan(m.data(), m.size()), ReduceOp::kMean, options);
    if (s.ok()) means[r] = ToHost(m);
    Tensor root = OnDevice(r, std::vector<float>(5, static_cast<float>(r + 100)));
    if (s.ok()) s = c.Broadcast(absl::MakeSpan(root.data(), root.size()), n - 1, options);
    if (s.ok()) broadcast[r] = ToHost(root);
    Tensor in = OnDevice(r, {static_cast<float>(r), static_cast<float>(-r)});
    Tensor out({2 * static_cast<int64_t>(n)}, DeviceId::Cuda(r));
    if (s.ok()) {
      s = c.AllGather(absl::MakeConstSpan(in.data(), in.size()),
                      absl::MakeSpan(out.data(), out.size()), options);
    }
    if (s.ok()) gathered[r] = ToHost(out);
    if (s.ok()) s = c.Barrier(options);
    status[r] = s;
  });
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    for (int64_t i = 0; i < elements; i += 4099) {
      ASSERT_EQ(sums[r][i], static_cast<float>(i % 1000) * rank_sum) << "rank " << r << " at " << i;
    }
    EXPECT_EQ(sums[r], sums[0]) << "rank " << r << " differs from rank 0";
    for (int i = 0; i < 7; ++i) {
      EXPECT_FLOAT_EQ(means[r][i], 10.0f * (n - 1) / 2.0f + i) << "rank " << r;
    }
    EXPECT_EQ(broadcast[r], std::vector<float>(5, static_cast<float>(n - 1 + 100)));
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(gathered[r][2 * q], static_cast<float>(q));
      EXPECT_EQ(gathered[r][2 * q + 1], static_cast<float>(-q));
    }
  }
#endif
}

TEST(NcclCollectiveTest, AnAbortedCollectiveFailsItsNextCallWithTheReason) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (cuda::VisibleDeviceCount() == 0) GTEST_SKIP() << "no GPU visible";
  auto group = NcclCollective::CreateLocalGroup(1);
  ASSERT_TRUE(group.ok()) << group.status();
  (*group)[0]->Abort(absl::UnavailableError("worker:1 is gone"));
  Tensor t = OnDevice(0, {1.0f});
  const absl::Status s =
      (*group)[0]->AllReduce(absl::MakeSpan(t.data(), t.size()), ReduceOp::kSum, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "worker:1 is gone");
#endif
}

}  // namespace
}  // namespace distrain

namespace distrain {
namespace {

// MultiWorkerMirrored's NCCL: ranks made from a unique id that travels as
// bytes, several of them in one NCCL group (CreateRanks), here every visible
// GPU of this process joined as ranks 0..n-1, which is what each worker does
// for its own GPUs. The sum reaches every rank. Needs a GPU; with one it is a
// group of one rank (NCCL allows one rank per GPU, so ranks of separate
// processes need separate GPUs: the multi-process case needs two).
TEST(NcclCollectiveTest, RanksFromAUniqueIdSumAcrossTheGroup) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int n = cuda::VisibleDeviceCount();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  absl::StatusOr<std::string> id = NcclCollective::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_FALSE(NcclCollective::CreateRanks("short", 0, n, n).ok());  // a damaged id
  auto ranks = NcclCollective::CreateRanks(*id, 0, n, n);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(static_cast<int>(ranks->size()), n);
  std::vector<std::vector<float>> sums(n);
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) {
    EXPECT_EQ((*ranks)[r]->rank(), r);
    EXPECT_EQ((*ranks)[r]->size(), n);
    Tensor a = OnDevice(r, {1.0f * (r + 1), 2.0f, 3.0f});
    status[r] = (*ranks)[r]->AllReduce(absl::MakeSpan(a.data(), a.size()), ReduceOp::kSum,
                                       CollectiveOptions{});
    if (status[r].ok()) sums[r] = ToHost(a);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(sums[r], (std::vector<float>{n * (n + 1) / 2.0f, 2.0f * n, 3.0f * n}));
  }
#endif
}

}  // namespace
}  // namespace distrain

#ifndef DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_
#define DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_

// Shared by the collective tests: ranks as threads, exact test values, and the
// "several buffers are one logical vector" property every AllReduce must keep.
// Header-only test support; each function is called from the test thread.

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/collective/collective.h"

namespace distrain::collective_testing {

// Runs fn(rank) on one thread per rank and waits for all.
inline void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Integer-valued so sums and means are exact whatever the summation order.
inline float Value(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * (i % 97) + rank);
}

// Every rank passes buffers of `sizes` (empty ones included) holding
// Value(rank, i) for the running index i across them; afterwards each element
// must be the reduction of element i over all ranks, as if the buffers were
// one vector. `all_reduce(rank, spans)` runs the collective under test.
inline void ExpectSeveralBuffersReduceAsOneVector(
    int ranks, const std::vector<size_t>& sizes, ReduceOp op,
    const std::function<absl::Status(int, const std::vector<absl::Span<float>>&)>& all_reduce) {
  std::vector<std::vector<std::vector<float>>> data(ranks);
  for (int r = 0; r < ranks; ++r) {
    int64_t i = 0;
    for (size_t s : sizes) {
      std::vector<float> b(s);
      for (float& x : b) x = Value(r, i++);
      data[r].push_back(b);
    }
  }
  std::vector<absl::Status> status(ranks);
  OnEveryRank(ranks, [&](int r) {
    std::vector<absl::Span<float>> spans;
    for (auto& b : data[r]) spans.push_back(absl::MakeSpan(b));
    status[r] = all_reduce(r, spans);
  });
  for (int r = 0; r < ranks; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  for (int r = 0; r < ranks; ++r) {
    int64_t i = 0;
    for (const auto& b : data[r]) {
      for (float x : b) {
        float sum = 0;
        for (int k = 0; k < ranks; ++k) sum += Value(k, i);
        ASSERT_EQ(x, op == ReduceOp::kMean ? sum / ranks : sum) << "rank " << r << " i=" << i;
        ++i;
      }
    }
  }
}

}  // namespace distrain::collective_testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_

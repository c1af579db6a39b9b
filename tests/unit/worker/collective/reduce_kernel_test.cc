#include "worker/collective/reduce_kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <vector>

namespace distrain::collective_internal {
namespace {

constexpr float kGuard = -12345.0f;

// Every start offset (the streaming path needs 16-byte alignment and takes
// the head with plain stores) and lengths around the 4- and 16-float steps.
TEST(ReduceKernelTest, StreamCopyCopiesExactlyTheRangeAtAnyAlignment) {
  for (size_t offset = 0; offset < 5; ++offset) {
    for (size_t n : {0, 1, 3, 4, 5, 15, 16, 17, 20, 33, 100, 1001}) {
      std::vector<float> src(n + 5);
      for (size_t i = 0; i < src.size(); ++i) src[i] = 0.5f * static_cast<float>(i) + 1;
      std::vector<float> dst(n + 10, kGuard);
      StreamCopy(dst.data() + offset, src.data() + 1, n);
      for (size_t i = 0; i < dst.size(); ++i) {
        const bool inside = i >= offset && i < offset + n;
        ASSERT_EQ(dst[i], inside ? src[i - offset + 1] : kGuard)
            << "offset " << offset << " n " << n << " i " << i;
      }
    }
  }
}

TEST(ReduceKernelTest, AddIntoAndAddIntoAndDivideCoverVectorBodyAndTail) {
  for (size_t n : {0, 1, 3, 4, 15, 16, 17, 35}) {
    std::vector<float> a(n + 1, kGuard), b(n + 1, kGuard), src(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = b[i] = static_cast<float>(i);
      src[i] = static_cast<float>(3 * i + 1);
    }
    AddInto(a.data(), src.data(), n);
    AddIntoAndDivide(b.data(), src.data(), n, 4.0f);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], static_cast<float>(4 * i + 1)) << "n " << n << " i " << i;
      ASSERT_EQ(b[i], static_cast<float>(4 * i + 1) / 4.0f) << "n " << n << " i " << i;
    }
    EXPECT_EQ(a[n], kGuard) << "n " << n;
    EXPECT_EQ(b[n], kGuard) << "n " << n;
  }
}

// Every instruction set this CPU runs gives the generic kernels' results bit
// for bit (the same IEEE adds and divides), at every offset and around every
// vector width's body and tail: a job's all-reduce does not depend on the
// machine kind its processes landed on.
TEST(ReduceKernelTest, EveryInstructionSetTheCpuHasMatchesTheGenericKernelsBitForBit) {
  const ReduceKernels* generic = ReduceKernelsFor(ReduceIsa::kGeneric);
  ASSERT_NE(generic, nullptr);
  int sets = 0;
  for (ReduceIsa isa : {ReduceIsa::kSse2, ReduceIsa::kAvx2, ReduceIsa::kAvx512}) {
    const ReduceKernels* k = ReduceKernelsFor(isa);
    if (k == nullptr) continue;  // this CPU lacks it
    ++sets;
    SCOPED_TRACE(k->name);
    for (size_t offset = 0; offset < 17; offset += 3) {
      for (size_t n : {0, 1, 7, 8, 15, 16, 31, 32, 63, 64, 65, 127, 129, 1000}) {
        std::vector<float> src(n + offset), want(n + offset + 1, kGuard);
        for (size_t i = 0; i < src.size(); ++i) src[i] = 0.1f * static_cast<float>((i * 7919) % 103) - 3;
        for (size_t i = 0; i < n + offset; ++i) want[i] = 1.0f / static_cast<float>(i + 1);
        std::vector<float> got = want;
        generic->add_into(want.data() + offset, src.data(), n);
        k->add_into(got.data() + offset, src.data(), n);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "add_into offset " << offset << " n " << n;
        generic->add_into_and_divide(want.data() + offset, src.data(), n, 3.0f);
        k->add_into_and_divide(got.data() + offset, src.data(), n, 3.0f);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "add_into_and_divide offset " << offset << " n " << n;
        generic->divide_in_place(want.data() + offset, n, 7.0f);
        k->divide_in_place(got.data() + offset, n, 7.0f);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "divide_in_place offset " << offset << " n " << n;
        k->stream_copy(got.data() + offset, src.data(), n);
        generic->stream_copy(want.data() + offset, src.data(), n);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "stream_copy offset " << offset << " n " << n;
      }
    }
  }
#if defined(__x86_64__)
  EXPECT_GE(sets, 1) << "SSE2 is the x86-64 baseline";
#endif
  std::cout << "reduce kernels in use: " << ActiveReduceKernels().name << " (" << sets
            << " instruction sets checked)\n";
}

}  // namespace
}  // namespace distrain::collective_internal

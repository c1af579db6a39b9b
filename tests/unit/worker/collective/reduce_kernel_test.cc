#include "worker/collective/reduce_kernel.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace distrain::collective_internal

// The shape cuDNN's batch norm sees for x[m, c] (worker/tensor/cuda/
// cudnn_batch_norm_shape.h): the same rows, and an N that cuDNN accepts for
// any m a model can produce. Arithmetic only, so it runs without a GPU.

#include "worker/tensor/cuda/cudnn_batch_norm_shape.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace distrain::cuda {
namespace {

TEST(CudnnBatchNormShapeTest, KeepsEveryRowAndAnNCudnnAccepts) {
  const int64_t cases[] = {1,        2,          64,         65535,       65536,
                           64 * 32 * 32,         128 * 112 * 112,         256 * 224 * 224,
                           65537,    2147483647, 3 * 65537,  1000003LL * 2};
  for (const int64_t m : cases) {
    SCOPED_TRACE(m);
    const BatchNormNH s = BatchNormShape(m);
    EXPECT_EQ(s.n * s.h, m);
    EXPECT_GE(s.n, 1);
    EXPECT_LE(s.n, kMaxBatchNormN);
  }
}

TEST(CudnnBatchNormShapeTest, SmallBatchesKeepTheRowsAsNAndLargeOnesSplitEvenly) {
  EXPECT_EQ(BatchNormShape(4096).n, 4096);
  EXPECT_EQ(BatchNormShape(4096).h, 1);
  // 64 images of 32x32: two rows of H, the largest N in reach.
  EXPECT_EQ(BatchNormShape(65536).n, 32768);
  EXPECT_EQ(BatchNormShape(65536).h, 2);
  // 128 images of 112x112 = 1605632 = 2^15 * 7^2: the first divisor of
  // at least 25 is 28.
  EXPECT_EQ(BatchNormShape(128 * 112 * 112).h, 28);
  // A prime over the bound has no split: one image of m rows.
  EXPECT_EQ(BatchNormShape(65537).n, 1);
  EXPECT_EQ(BatchNormShape(65537).h, 65537);
}

}  // namespace
}  // namespace distrain::cuda

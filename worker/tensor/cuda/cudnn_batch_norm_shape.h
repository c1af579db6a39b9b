#ifndef DISTRAIN_WORKER_TENSOR_CUDA_CUDNN_BATCH_NORM_SHAPE_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_CUDNN_BATCH_NORM_SHAPE_H_

#include <cstdint>

namespace distrain::cuda {

// How cudnn_ops.cc describes batch norm's x[m, c] to cuDNN's spatial mode:
// as NHWC [n, h, 1, c] with n * h = m, the same memory (rows of c floats)
// and the same statistics (spatial mode reduces over N, H and W alike).
// m is batch x height x width after a Conv2D, and cuDNN refuses a large N:
// its spatial training and backward passes reject N > 880801, inference
// N > 65535, with CUDNN_STATUS_NOT_SUPPORTED (pytorch/pytorch#19911, and
// PyTorch #32763's measurements). So n is the largest divisor of m that is
// at most kMaxBatchNormN: m itself up to there (today's shape, H = 1),
// else a split such as 65536 -> 32768 x 2. A number with no divisor in
// reach (a large prime) becomes [1, m]. Pure arithmetic, so the unit tests
// check it without a GPU.
struct BatchNormNH {
  int64_t n = 0;
  int64_t h = 0;
};

inline constexpr int64_t kMaxBatchNormN = 65535;

constexpr BatchNormNH BatchNormShape(int64_t m) {
  if (m <= kMaxBatchNormN) return {m, 1};
  // The smallest h >= m / kMaxBatchNormN that divides m gives the largest
  // n. Products of image sizes have small factors, so the search is short;
  // it is bounded all the same.
  const int64_t first = (m + kMaxBatchNormN - 1) / kMaxBatchNormN;
  for (int64_t h = first; h < first + 4096 && h <= m; ++h) {
    if (m % h == 0) return {m / h, h};
  }
  return {1, m};
}

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_CUDNN_BATCH_NORM_SHAPE_H_

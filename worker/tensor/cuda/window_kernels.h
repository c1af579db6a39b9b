#ifndef DISTRAIN_WORKER_TENSOR_CUDA_WINDOW_KERNELS_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_WINDOW_KERNELS_H_

// Own kernels around cuDNN for the windowed and normalisation ops
// (window_kernels.cu), for cudnn_ops.cc only: what cuDNN's legacy API cannot
// express in this backend's layouts and semantics.
//   * explicit padding of NHWC images and the crop back (cuDNN pads
//     symmetrically; Keras' 'same' may pad one more row or column at the
//     bottom or right);
//   * the 2-D transpose between Keras' HWIO kernels ([kh*kw*in, out]) and
//     cuDNN's KRSC filters ([out, kh*kw*in]);
//   * average pooling with asymmetric padding (divides by the real inputs
//     of each window, which no cuDNN mode does once the padding is
//     explicit);
//   * batch-norm helpers: scaling a vector, 1 / sqrt(var + eps), inference
//     (an element-wise map, free of cuDNN's limit on N), and the one-row
//     (m == 1) batch, where cuDNN's unbiased statistics divide by 0.
//
// Every launcher queues on `stream` and returns; none allocates, none
// waits. Sizes are element counts, buffers device pointers; an output never
// aliases an input. Thread-safety: reentrant.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/tensor/ops.h"

namespace distrain::cuda::window_kernels {

// dst[n, h + pad_top + pad_bottom, w + pad_left + pad_right, c]: src[n, h, w, c]
// in the middle, `value` in the border.
void PadNhwc(cudaStream_t stream, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pad_top,
             int64_t pad_bottom, int64_t pad_left, int64_t pad_right, float value,
             const float* src, float* dst);
// dst[n, h, w, c] = the middle of src[n, h + pad_top + pad_bottom, w + pad_left + pad_right, c]
// (PadNhwc's inverse: gradients computed on a padded image, cropped back).
void CropNhwc(cudaStream_t stream, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pad_top,
              int64_t pad_bottom, int64_t pad_left, int64_t pad_right, const float* src,
              float* dst);

// dst[cols, rows] = transpose of src[rows, cols].
void Transpose(cudaStream_t stream, int64_t rows, int64_t cols, const float* src, float* dst);

// Average pooling over x[N, H, W, C] with any padding: y = the mean of the
// real (unpadded) inputs of each window, as ops.h defines it; a window with
// none gives 0. Backward: dx[i] = sum over the windows holding i of
// dy / (that window's count); dx is overwritten.
void AveragePoolForward(cudaStream_t stream, const ops::Window2D& w, const float* x, float* y);
void AveragePoolBackward(cudaStream_t stream, const ops::Window2D& w, const float* dy,
                         float* dx);

// x[i] *= factor.
void Scale(cudaStream_t stream, int64_t n, float factor, float* x);
// inv[i] = 1 / sqrt(var[i] + epsilon), rounded as IEEE float operations.
void InverseStd(cudaStream_t stream, int64_t n, const float* var, float epsilon, float* inv);

// y[r, k] = gamma[k] (x[r, k] - mean[k]) / sqrt(var[k] + epsilon) + beta[k] over x[m, c].
void BatchNormApply(cudaStream_t stream, int64_t m, int64_t c, const float* x,
                    const float* gamma, const float* beta, const float* mean, const float* var,
                    float epsilon, float* y);
// Batch-norm gradients of a batch of one row (x, dy: [1, c]) with the given
// statistics: dbeta = dy, dgamma = dy * xhat, dx = gamma / sqrt(var + eps) *
// (dy - dbeta - xhat * dgamma) — the general formula with m = 1.
void BatchNormBackwardOneRow(cudaStream_t stream, int64_t c, const float* x, const float* dy,
                             const float* gamma, const float* mean, const float* var,
                             float epsilon, float* dx, float* dgamma, float* dbeta);

}  // namespace distrain::cuda::window_kernels

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_WINDOW_KERNELS_H_

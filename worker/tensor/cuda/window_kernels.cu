// Own kernels for cudnn_ops.cc (window_kernels.h): padding and cropping of
// NHWC images, the HWIO <-> KRSC kernel transpose, average pooling with
// asymmetric padding, and small batch-norm helpers. cudnn_ops.cc calls the
// launchers under its device context's op lock; they only queue work on the
// stream they are given.
//
// Every kernel is a grid-stride loop over the elements it writes, one thread
// per output element and no atomics, so results do not depend on the launch
// geometry and are the same on every run. The arithmetic ones (average
// pooling, batch norm) round every step as IEEE float with the __f*_rn
// intrinsics, which nvcc never contracts into FMAs: the CPU backend rounds
// each product on its own, and these stay as close to it as the operation
// order allows.
//
// Thread-safety: the launchers are reentrant.

#include <cstdint>

#include "worker/tensor/cuda/device_context.h"
#include "worker/tensor/cuda/window_kernels.h"

namespace distrain::cuda::window_kernels {
namespace {

constexpr unsigned kThreads = 256;

__device__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t GridThreads() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

// ---- Padding ---------------------------------------------------------------------

// Over dst[n, ph, pw, c] with ph = h + top + bottom, pw = w + left + right.
__global__ void PadKernel(int64_t total, int64_t h, int64_t w, int64_t c, int64_t ph,
                          int64_t pw, int64_t top, int64_t left, float value, const float* src,
                          float* dst) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t ch = i % c;
    int64_t t = i / c;
    const int64_t col = t % pw - left;
    t /= pw;
    const int64_t row = t % ph - top;
    const int64_t b = t / ph;
    dst[i] = (row >= 0 && row < h && col >= 0 && col < w) ? src[((b * h + row) * w + col) * c + ch]
                                                          : value;
  }
}

// Over dst[n, h, w, c], reading the middle of src[n, ph, pw, c].
__global__ void CropKernel(int64_t total, int64_t h, int64_t w, int64_t c, int64_t ph,
                           int64_t pw, int64_t top, int64_t left, const float* src, float* dst) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t ch = i % c;
    int64_t t = i / c;
    const int64_t col = t % w;
    t /= w;
    const int64_t row = t % h;
    const int64_t b = t / h;
    dst[i] = src[((b * ph + row + top) * pw + col + left) * c + ch];
  }
}

// ---- Transpose -------------------------------------------------------------------
// 32 x 32 tiles through shared memory, so both the reads of src's rows and
// the writes of dst's rows are coalesced; the extra column keeps the
// column-wise reads of the tile free of bank conflicts. A 1-D grid strides
// over the tiles, so neither extent is bound by the grid's y limit.

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // threads per tile column: blockDim = (32, 8)

__global__ void TransposeKernel(int64_t rows, int64_t cols, int64_t tile_cols, int64_t tiles,
                                const float* src, float* dst) {
  __shared__ float tile[kTile][kTile + 1];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tile_cols) * kTile;
    const int64_t c0 = (t % tile_cols) * kTile;
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is refilled for the block's next t
  }
}

// ---- Average pooling -------------------------------------------------------------
// The window geometry, passed by value (Window2D itself is host code).
struct PoolGeometry {
  int64_t batch, in_h, in_w, c, out_h, out_w;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left;
};

// The real rows [*lo, *hi) of the window that starts at `start` (padded
// coordinates shifted to the image's), clipped to [0, size).
__device__ void Clip(int64_t start, int64_t window, int64_t size, int64_t* lo, int64_t* hi) {
  *lo = start > 0 ? start : 0;
  *hi = start + window < size ? start + window : size;
}

// Over y[n, oh, ow, c]: the sum of the window's real inputs in row-major
// window order, divided by their count.
__global__ void AveragePoolForwardKernel(int64_t total, PoolGeometry g, const float* x,
                                         float* y) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t ch = i % g.c;
    int64_t t = i / g.c;
    const int64_t ow = t % g.out_w;
    t /= g.out_w;
    const int64_t oh = t % g.out_h;
    const int64_t b = t / g.out_h;
    int64_t h_lo, h_hi, w_lo, w_hi;
    Clip(oh * g.stride_h - g.pad_top, g.kernel_h, g.in_h, &h_lo, &h_hi);
    Clip(ow * g.stride_w - g.pad_left, g.kernel_w, g.in_w, &w_lo, &w_hi);
    float sum = 0.0f;
    for (int64_t r = h_lo; r < h_hi; ++r) {
      const float* row = x + ((b * g.in_h + r) * g.in_w) * g.c + ch;
      for (int64_t q = w_lo; q < w_hi; ++q) sum = __fadd_rn(sum, row[q * g.c]);
    }
    const int64_t count = (h_hi > h_lo && w_hi > w_lo) ? (h_hi - h_lo) * (w_hi - w_lo) : 0;
    y[i] = count > 0 ? __fdiv_rn(sum, static_cast<float>(count)) : 0.0f;
  }
}

// The first and last output index whose window [o * stride - pad, + window)
// holds input index `in`, clipped to [0, out).
__device__ void Covering(int64_t in, int64_t window, int64_t stride, int64_t pad, int64_t out,
                         int64_t* first, int64_t* last) {
  // o * stride - pad <= in  <=>  o <= (in + pad) / stride (in + pad >= 0);
  // o * stride - pad + window - 1 >= in  <=>  o >= ceil((in + pad - window + 1) / stride).
  const int64_t lo_num = in + pad - window + 1;
  *first = lo_num > 0 ? (lo_num + stride - 1) / stride : 0;
  const int64_t hi = (in + pad) / stride;
  *last = hi < out - 1 ? hi : out - 1;
}

// Over dx[n, h, w, c]: a gather over the windows holding each input, in
// row-major output order, each adding its dy / count.
__global__ void AveragePoolBackwardKernel(int64_t total, PoolGeometry g, const float* dy,
                                          float* dx) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t ch = i % g.c;
    int64_t t = i / g.c;
    const int64_t col = t % g.in_w;
    t /= g.in_w;
    const int64_t row = t % g.in_h;
    const int64_t b = t / g.in_h;
    int64_t oh_first, oh_last, ow_first, ow_last;
    Covering(row, g.kernel_h, g.stride_h, g.pad_top, g.out_h, &oh_first, &oh_last);
    Covering(col, g.kernel_w, g.stride_w, g.pad_left, g.out_w, &ow_first, &ow_last);
    float sum = 0.0f;
    for (int64_t oh = oh_first; oh <= oh_last; ++oh) {
      int64_t h_lo, h_hi;
      Clip(oh * g.stride_h - g.pad_top, g.kernel_h, g.in_h, &h_lo, &h_hi);
      for (int64_t ow = ow_first; ow <= ow_last; ++ow) {
        int64_t w_lo, w_hi;
        Clip(ow * g.stride_w - g.pad_left, g.kernel_w, g.in_w, &w_lo, &w_hi);
        // The window holds (row, col), so its count is at least 1.
        const float count = static_cast<float>((h_hi - h_lo) * (w_hi - w_lo));
        const float g_out = dy[((b * g.out_h + oh) * g.out_w + ow) * g.c + ch];
        sum = __fadd_rn(sum, __fdiv_rn(g_out, count));
      }
    }
    dx[i] = sum;
  }
}

PoolGeometry Geometry(const ops::Window2D& w) {
  return {w.batch,    w.in_h,     w.in_w,     w.in_c,     w.out_h,   w.out_w,
          w.kernel_h, w.kernel_w, w.stride_h, w.stride_w, w.pad_top, w.pad_left};
}

// ---- Batch-norm helpers ----------------------------------------------------------

__device__ float InvStd(float var, float epsilon) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, epsilon)));
}

__global__ void ScaleKernel(int64_t n, float factor, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) x[i] = __fmul_rn(x[i], factor);
}

__global__ void InverseStdKernel(int64_t n, const float* var, float epsilon, float* inv) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) inv[i] = InvStd(var[i], epsilon);
}

__global__ void BatchNormApplyKernel(int64_t total, int64_t c, const float* x, const float* gamma,
                                     const float* beta, const float* mean, const float* var,
                                     float epsilon, float* y) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t k = i % c;
    const float scale = __fmul_rn(gamma[k], InvStd(var[k], epsilon));
    y[i] = __fadd_rn(__fmul_rn(scale, __fsub_rn(x[i], mean[k])), beta[k]);
  }
}

__global__ void BatchNormBackwardOneRowKernel(int64_t c, const float* x, const float* dy,
                                              const float* gamma, const float* mean,
                                              const float* var, float epsilon, float* dx,
                                              float* dgamma, float* dbeta) {
  for (int64_t k = GlobalThread(); k < c; k += GridThreads()) {
    const float inv = InvStd(var[k], epsilon);
    const float xhat = __fmul_rn(__fsub_rn(x[k], mean[k]), inv);
    const float g = dy[k];
    const float dg = __fmul_rn(g, xhat);
    dbeta[k] = g;
    dgamma[k] = dg;
    // gamma * inv * (dy - mean(dy) - xhat * mean(dy * xhat)), the means over one row.
    dx[k] = __fmul_rn(__fmul_rn(gamma[k], inv), __fsub_rn(__fsub_rn(g, g), __fmul_rn(xhat, dg)));
  }
}

void CheckLaunch() { DISTRAIN_CUDA_CHECK(cudaGetLastError()); }

}  // namespace

void PadNhwc(cudaStream_t stream, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pad_top,
             int64_t pad_bottom, int64_t pad_left, int64_t pad_right, float value,
             const float* src, float* dst) {
  const int64_t ph = h + pad_top + pad_bottom, pw = w + pad_left + pad_right;
  const int64_t total = n * ph * pw * c;
  if (total <= 0) return;
  PadKernel<<<BlocksFor(total, kThreads), kThreads, 0, stream>>>(total, h, w, c, ph, pw, pad_top,
                                                                 pad_left, value, src, dst);
  CheckLaunch();
}

void CropNhwc(cudaStream_t stream, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pad_top,
              int64_t pad_bottom, int64_t pad_left, int64_t pad_right, const float* src,
              float* dst) {
  const int64_t ph = h + pad_top + pad_bottom, pw = w + pad_left + pad_right;
  const int64_t total = n * h * w * c;
  if (total <= 0) return;
  CropKernel<<<BlocksFor(total, kThreads), kThreads, 0, stream>>>(total, h, w, c, ph, pw,
                                                                  pad_top, pad_left, src, dst);
  CheckLaunch();
}

void Transpose(cudaStream_t stream, int64_t rows, int64_t cols, const float* src, float* dst) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t tile_cols = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tile_cols;
  const unsigned blocks = static_cast<unsigned>(tiles < 65535 ? tiles : 65535);
  TransposeKernel<<<blocks, dim3(kTile, kTileRows), 0, stream>>>(rows, cols, tile_cols, tiles,
                                                                 src, dst);
  CheckLaunch();
}

void AveragePoolForward(cudaStream_t stream, const ops::Window2D& w, const float* x, float* y) {
  const int64_t total = w.batch * w.out_h * w.out_w * w.in_c;
  if (total <= 0) return;
  AveragePoolForwardKernel<<<BlocksFor(total, kThreads), kThreads, 0, stream>>>(
      total, Geometry(w), x, y);
  CheckLaunch();
}

void AveragePoolBackward(cudaStream_t stream, const ops::Window2D& w, const float* dy,
                         float* dx) {
  const int64_t total = w.batch * w.in_h * w.in_w * w.in_c;
  if (total <= 0) return;
  AveragePoolBackwardKernel<<<BlocksFor(total, kThreads), kThreads, 0, stream>>>(
      total, Geometry(w), dy, dx);
  CheckLaunch();
}

void Scale(cudaStream_t stream, int64_t n, float factor, float* x) {
  if (n <= 0) return;
  ScaleKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, factor, x);
  CheckLaunch();
}

void InverseStd(cudaStream_t stream, int64_t n, const float* var, float epsilon, float* inv) {
  if (n <= 0) return;
  InverseStdKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, var, epsilon, inv);
  CheckLaunch();
}

void BatchNormApply(cudaStream_t stream, int64_t m, int64_t c, const float* x,
                    const float* gamma, const float* beta, const float* mean, const float* var,
                    float epsilon, float* y) {
  const int64_t total = m * c;
  if (total <= 0) return;
  BatchNormApplyKernel<<<BlocksFor(total, kThreads), kThreads, 0, stream>>>(
      total, c, x, gamma, beta, mean, var, epsilon, y);
  CheckLaunch();
}

void BatchNormBackwardOneRow(cudaStream_t stream, int64_t c, const float* x, const float* dy,
                             const float* gamma, const float* mean, const float* var,
                             float epsilon, float* dx, float* dgamma, float* dbeta) {
  if (c <= 0) return;
  BatchNormBackwardOneRowKernel<<<BlocksFor(c, kThreads), kThreads, 0, stream>>>(
      c, x, dy, gamma, mean, var, epsilon, dx, dgamma, dbeta);
  CheckLaunch();
}

}  // namespace distrain::cuda::window_kernels

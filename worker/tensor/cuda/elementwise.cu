// The CUDA backend's own kernels (backend.h, the "elementwise.cu" section):
// fills, bias broadcasts and sums, the activations other than softmax,
// dropout, global average pooling, layer and RMS normalisation, the losses with their accuracy counts and
// the optimizer updates. worker/tensor/ops.cc and ops_window.cc call them for
// tensors on a GPU, worker/model/optimizer.cc for variables on one.
//
// The CPU backend is the reference. Element-wise math runs elementwise.h's
// functors, the very code cpu/elementwise_cpu.cc runs; the row and column
// reductions and the optimizer rules follow cpu/elementwise_loss_cpu.cc,
// cpu_math.cc and cpu/window_ops.cc operation for operation. Where the two
// backends may still round differently, and why that is accepted:
//   * libm: CUDA's expf, logf, log1pf, erff and tanhf are within a few ulp of
//     glibc's, not equal to them (elementwise.h says as much).
//   * Reductions (BiasGrad, GlobalAveragePool2D, the per-row sums of the
//     losses) add in a fixed tree order rather than the CPU's sequential
//     one: deterministic run to run, in float where the CPU adds in float
//     and in double where it adds in double, but not bit-identical.
//   * Contraction: nvcc fuses a * b + c into one FMA by default, while the
//     CPU rounds the product first (cpu_math.cc is built -ffp-contract=off
//     and the generic x86-64 build has no FMA elsewhere). This file's own
//     formulas therefore use the __fmul_rn / __fadd_rn / __fsub_rn /
//     __fdiv_rn / __fsqrt_rn intrinsics, which nvcc never fuses and which
//     round exactly as IEEE float, so by construction the optimizer updates
//     round as cpu_math.cc's do. The shared functors are host code too and cannot use
//     them, so nvcc may fuse inside the activations' formulas (GeluGrad,
//     SiluGrad, MishGrad, ...), ScaleShift and the binary cross-entropies;
//     building this file with -fmad=false would close that last gap at no
//     cost that matters for memory-bound kernels.
//
// Every function makes its device current (DeviceContext::Get) and queues
// its kernels on the device's compute stream; only Loss waits for the device.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/tensor/cuda/backend.h"
#include "worker/tensor/cuda/device_context.h"
#include "worker/tensor/elementwise.h"

namespace distrain::cuda {
namespace {

constexpr unsigned kThreads = 256;  // element-wise blocks
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Element-wise launchers ----------------------------------------------------
// One grid-stride kernel over indices; everything element-wise is a functor
// of the index, so the launch geometry (BlocksFor) never changes a result.

template <typename F>
__global__ void ForEachKernel(int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    f(i);
  }
}

template <typename F>
void ForEach(cudaStream_t stream, int64_t n, const F& f) {
  if (n <= 0) return;
  ForEachKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, f);
  DISTRAIN_CUDA_CHECK(cudaGetLastError());
}

// No __restrict__ on these: the seam lets outputs alias inputs (y = f(y)),
// and each index is read before it is written by the same thread.
template <typename F>
struct UnaryMap {
  F f;
  const float* x;
  float* y;
  __device__ void operator()(int64_t i) const { y[i] = f(x[i]); }
};

template <typename F>
struct BinaryMap {
  F f;
  const float* a;
  const float* b;
  float* out;
  __device__ void operator()(int64_t i) const { out[i] = f(a[i], b[i]); }
};

template <typename F>
void Map1(cudaStream_t stream, int64_t n, F f, const float* x, float* y) {
  ForEach(stream, n, UnaryMap<F>{f, x, y});
}

template <typename F>
void Map2(cudaStream_t stream, int64_t n, F f, const float* a, const float* b, float* out) {
  ForEach(stream, n, BinaryMap<F>{f, a, b, out});
}

// The identity activation (and its gradient) is a copy, or nothing in place.
void CopyUnlessSame(cudaStream_t stream, int64_t n, const float* src, float* dst) {
  if (n <= 0 || src == dst) return;
  DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
}

struct Constant {
  float value;
  float* dst;
  __device__ void operator()(int64_t i) const { dst[i] = value; }
};

struct Product {
  DISTRAIN_HOST_DEVICE float operator()(float a, float b) const { return a * b; }
};

// y[r, c] += bias[c] over the flattened matrix: the row length need not be
// a multiple of anything, so every thread stays busy whatever cols is.
struct AddRowVector {
  const float* bias;
  float* y;
  int64_t cols;
  __device__ void operator()(int64_t i) const { y[i] += bias[i % cols]; }
};

struct BroadcastRow {
  const float* bias;
  float* y;
  int64_t cols;
  __device__ void operator()(int64_t i) const { y[i] = bias[i % cols]; }
};

struct Dropout {
  elementwise::DropoutMask keep;
  const float* x;
  float* y;  // may be x
  float* mask;
  __device__ void operator()(int64_t i) const {
    const float m = keep(static_cast<uint64_t>(i));
    mask[i] = m;
    y[i] = x[i] * m;
  }
};

// dx[b, p, k] = dy[b, k] * inv over x[n, hw, c] flattened.
struct SpreadMean {
  const float* dy;
  float* dx;
  int64_t hw_c;
  int64_t c;
  float inv;
  __device__ void operator()(int64_t i) const { dx[i] = dy[(i / hw_c) * c + i % c] * inv; }
};

// ---- Column sums (BiasGrad, GlobalAveragePool2D) ----------------------------------
// out[b, c] = scale * sum_r x[b, r, c] over `batch` row-major matrices.
// A block covers 32 adjacent columns (coalesced loads) of one chunk of rows;
// its 8 row lanes take interleaved rows, then lane 0 adds the 8 partials in
// lane order. The partition depends only on the shape, so the sum is the
// same on every run. Tall matrices are cut into chunks whose partial sums a
// second pass adds, so a handful of columns still fills the GPU.

constexpr int kTileCols = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kMinRowsPerChunk = 1024;
constexpr int64_t kMaxChunks = 4096;  // keeps the second pass to one chunk

// The summed element: x[b, r, c] of row-major matrices.
struct MatrixElement {
  const float* x;
  int64_t rows;
  int64_t cols;
  __device__ float operator()(int64_t b, int64_t r, int64_t c) const {
    return x[(b * rows + r) * cols + c];
  }
};

// Grid: x over column tiles, y over row chunks, z (strided) over matrices;
// writes out[b, chunk, c] for chunk = blockIdx.y of gridDim.y. `value(b, r,
// c)` is the summed element (MatrixElement, or a product formed on the fly).
template <typename Value>
__global__ void ColumnSumsKernel(int64_t batch, int64_t rows, int64_t cols,
                                 int64_t rows_per_chunk, float scale, Value value, float* out) {
  __shared__ float partial[kRowLanes][kTileCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    float acc = 0.0f;
    if (c < cols) {
      for (int64_t r = first + threadIdx.y; r < end; r += kRowLanes) acc += value(b, r, c);
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      float sum = partial[0][threadIdx.x];
      for (int lane = 1; lane < kRowLanes; ++lane) sum += partial[lane][threadIdx.x];
      out[(b * gridDim.y + blockIdx.y) * cols + c] = sum * scale;
    }
    __syncthreads();  // `partial` is rewritten for the next matrix
  }
}

template <typename Value>
void LaunchColumnSums(cudaStream_t stream, int64_t batch, int64_t rows, int64_t cols,
                      int64_t rows_per_chunk, int64_t chunks, float scale, Value value,
                      float* out) {
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, kTileCols)), static_cast<unsigned>(chunks),
                  static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  ColumnSumsKernel<<<grid, dim3(kTileCols, kRowLanes), 0, stream>>>(batch, rows, cols,
                                                                    rows_per_chunk, scale, value,
                                                                    out);
  DISTRAIN_CUDA_CHECK(cudaGetLastError());
}

// out[b, c] = scale * sum_r value(b, r, c); batch, rows and cols > 0.
// `scale` multiplies each final sum once, as the CPU's GlobalAveragePool2D
// multiplies its float sum by 1 / hw.
template <typename Value>
void ColumnSumsOf(DeviceContext& ctx, int64_t batch, int64_t rows, int64_t cols, float scale,
                  Value value, float* out) {
  const cudaStream_t stream = ctx.compute_stream();
  const int64_t rows_per_chunk = std::max(kMinRowsPerChunk, CeilDiv(rows, kMaxChunks));
  const int64_t chunks = CeilDiv(rows, rows_per_chunk);
  if (chunks == 1) {
    LaunchColumnSums(stream, batch, rows, cols, rows, 1, scale, value, out);
    return;
  }
  absl::MutexLock lock(&ctx.op_mutex());
  float* partials = static_cast<float*>(
      ctx.Scratch(static_cast<size_t>(batch * chunks * cols) * sizeof(float)));
  LaunchColumnSums(stream, batch, rows, cols, rows_per_chunk, chunks, 1.0f, value, partials);
  // chunks <= kMaxChunks rows per matrix: one chunk in the second pass.
  LaunchColumnSums(stream, batch, chunks, cols, chunks, 1, scale,
                   MatrixElement{partials, chunks, cols}, out);
}

void ColumnSums(DeviceContext& ctx, int64_t batch, int64_t rows, int64_t cols, float scale,
                const float* x, float* out) {
  ColumnSumsOf(ctx, batch, rows, cols, scale, MatrixElement{x, rows, cols}, out);
}

// ---- Block reductions (the row-wise losses) -------------------------------------
// Warp shuffles then one warp over the warps' results: a fixed order for a
// given block size, which the launcher derives from the row width alone.

// A first-argmax candidate; index < 0 means none yet. No constructors, so it
// can live in __shared__ memory.
struct ArgMax {
  float value;
  int64_t index;
};

struct FirstMax {
  // Larger value wins, equal values go to the lower index: associative and
  // commutative, so any tree gives tf.argmax's (and the CPU's) first index.
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
};

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

__device__ float ShuffleDown(float v, int delta) { return __shfl_down_sync(kFullWarp, v, delta); }
__device__ double ShuffleDown(double v, int delta) {
  return __shfl_down_sync(kFullWarp, v, delta);
}
__device__ ArgMax ShuffleDown(const ArgMax& v, int delta) {
  const long long index = __shfl_down_sync(kFullWarp, static_cast<long long>(v.index), delta);
  return ArgMax{__shfl_down_sync(kFullWarp, v.value, delta), static_cast<int64_t>(index)};
}

template <typename T, typename Op>
__device__ T WarpReduce(T v, Op op) {
  for (int delta = kWarpSize / 2; delta > 0; delta /= 2) v = op(v, ShuffleDown(v, delta));
  return v;  // complete in lane 0
}

// The whole block's reduction, returned to every thread. blockDim.x is a
// multiple of 32 (RowThreads), so every warp is full for the shuffles.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T identity) {
  __shared__ T per_warp[kWarpSize];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = WarpReduce(v, op);
  if (lane == 0) per_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? per_warp[lane] : identity;
    v = WarpReduce(v, op);
  }
  __syncthreads();  // every read of per_warp is done before thread 0 reuses it
  if (threadIdx.x == 0) per_warp[0] = v;
  __syncthreads();
  v = per_warp[0];
  __syncthreads();  // the next call may overwrite per_warp
  return v;
}

__device__ bool IsNan(float v) { return v != v; }

// The CPU's first argmax (`if (x[c] > x[argmax]) argmax = c`) of one row,
// NaN rules included: a NaN never beats the running maximum and nothing
// beats a NaN, so a NaN at index 0 keeps index 0 and NaNs elsewhere are
// skipped. Every thread of the block calls it and gets the answer.
__device__ int64_t RowArgmax(const float* x, int64_t width) {
  ArgMax best{0.0f, -1};
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const float v = x[c];
    if (!IsNan(v)) best = FirstMax()(best, ArgMax{v, c});
  }
  best = BlockReduce(best, FirstMax(), ArgMax{0.0f, -1});
  return IsNan(x[0]) || best.index < 0 ? 0 : best.index;
}

// elementwise_loss_cpu.cc's clip to [eps, 1 - eps] and tf.clip_by_value's
// gradient mask (the closed interval passes).
__device__ float Clip(float p) {
  using elementwise::kProbEpsilon;
  using elementwise::kProbOneMinusEpsilon;
  return p < kProbEpsilon ? kProbEpsilon : (p > kProbOneMinusEpsilon ? kProbOneMinusEpsilon : p);
}
__device__ bool Inside(float p) {
  return p >= elementwise::kProbEpsilon && p <= elementwise::kProbOneMinusEpsilon;
}

// ---- Loss kernels ---------------------------------------------------------------
// One block per row (strided over the rows). Each writes its row's loss as
// the double the CPU adds to its loss sum, and 1 or 0 for the accuracy
// metric; the host adds both in row order. grad, when not null, gets
// grad_scale * d(row loss)/d(out), rounded as the CPU rounds it.

// cpu::SoftmaxCrossEntropy: softmax shifted by the row's first maximum,
// exp in float, the sum in double; loss log(sum) - (x_label - max).
__global__ void SoftmaxCrossEntropyRows(int64_t batch, int64_t width, const float* logits,
                                        const int32_t* labels, float grad_scale, float* grad,
                                        double* row_loss, int32_t* row_hit) {
  for (int64_t r = blockIdx.x; r < batch; r += gridDim.x) {
    const float* x = logits + r * width;
    const int64_t label = labels[r];
    const int64_t argmax = RowArgmax(x, width);
    const float max = x[argmax];
    double partial = 0.0;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) partial += expf(x[c] - max);
    const double sum = BlockReduce(partial, Sum(), 0.0);
    if (grad != nullptr) {
      // The CPU stores exp, scales it by float(grad_scale / sum) and then
      // subtracts grad_scale at the label: two roundings, never one FMA.
      float* g = grad + r * width;
      const float inv = static_cast<float>(static_cast<double>(grad_scale) / sum);
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
        const float scaled = __fmul_rn(expf(x[c] - max), inv);
        g[c] = c == label ? __fsub_rn(scaled, grad_scale) : scaled;
      }
    }
    if (threadIdx.x == 0) {
      row_loss[r] = log(sum) - (static_cast<double>(x[label]) - static_cast<double>(max));
      row_hit[r] = argmax == label ? 1 : 0;
    }
  }
}

// cpu::SparseCrossentropyFromProbs: the clipped row renormalised,
// log(sum c) - log(c_label), the sum in double.
__global__ void SparseCrossentropyFromProbsRows(int64_t batch, int64_t width, const float* probs,
                                                const int32_t* labels, float grad_scale,
                                                float* grad, double* row_loss,
                                                int32_t* row_hit) {
  for (int64_t r = blockIdx.x; r < batch; r += gridDim.x) {
    const float* p = probs + r * width;
    const int64_t label = labels[r];
    const int64_t argmax = RowArgmax(p, width);
    double partial = 0.0;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) partial += Clip(p[c]);
    const double sum = BlockReduce(partial, Sum(), 0.0);
    const float c_label = Clip(p[label]);
    if (grad != nullptr) {
      float* g = grad + r * width;
      const float inv_sum = static_cast<float>(1.0 / sum);
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
        const float d = c == label ? __fsub_rn(inv_sum, __fdiv_rn(1.0f, c_label)) : inv_sum;
        g[c] = Inside(p[c]) ? __fmul_rn(grad_scale, d) : 0.0f;
      }
    }
    if (threadIdx.x == 0) {
      row_loss[r] = log(sum) - log(static_cast<double>(c_label));
      row_hit[r] = argmax == label ? 1 : 0;
    }
  }
}

// cpu::CategoricalCrossentropyFromProbs: -log(clip(p_label / sum)), the sum
// in float as on the CPU.
__global__ void CategoricalCrossentropyFromProbsRows(int64_t batch, int64_t width,
                                                     const float* probs, const int32_t* labels,
                                                     float grad_scale, float* grad,
                                                     double* row_loss, int32_t* row_hit) {
  for (int64_t r = blockIdx.x; r < batch; r += gridDim.x) {
    const float* p = probs + r * width;
    const int64_t label = labels[r];
    const int64_t argmax = RowArgmax(p, width);
    float partial = 0.0f;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) partial += p[c];
    const float sum = BlockReduce(partial, Sum(), 0.0f);
    const float q = __fdiv_rn(p[label], sum);
    if (grad != nullptr) {
      // (q - [c == label]) / (q sum), zero where the clip cut q.
      float* g = grad + r * width;
      const bool inside = Inside(q);
      const float base = inside ? __fdiv_rn(grad_scale, __fmul_rn(q, sum)) : 0.0f;
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
        g[c] = inside ? __fmul_rn(base, c == label ? __fsub_rn(q, 1.0f) : q) : 0.0f;
      }
    }
    if (threadIdx.x == 0) {
      // The CPU subtracts log(c) from its sum; adding its negation rounds
      // the same (a - b is a + (-b) in IEEE arithmetic).
      row_loss[r] = -log(static_cast<double>(Clip(q)));
      row_hit[r] = argmax == label ? 1 : 0;
    }
  }
}

// cpu::MeanSquaredError for width > 1: one-hot targets, the row's squared
// errors summed in double and divided by the width.
__global__ void MeanSquaredErrorRows(int64_t batch, int64_t width, const float* out,
                                     const int32_t* labels, float grad_scale_over_width,
                                     float* grad, double* row_loss, int32_t* row_hit) {
  for (int64_t r = blockIdx.x; r < batch; r += gridDim.x) {
    const float* o = out + r * width;
    const int64_t label = labels[r];
    const int64_t argmax = RowArgmax(o, width);
    double partial = 0.0;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const elementwise::LossAndGrad lg =
          elementwise::SquaredError()(o[c], c == label ? 1.0f : 0.0f);
      partial += lg.loss;
      if (grad != nullptr) grad[r * width + c] = __fmul_rn(grad_scale_over_width, lg.grad);
    }
    const double row = BlockReduce(partial, Sum(), 0.0);
    if (threadIdx.x == 0) {
      row_loss[r] = row / static_cast<double>(width);
      row_hit[r] = argmax == label ? 1 : 0;
    }
  }
}

// Width-1 outputs, one thread per row: the binary cross-entropies and
// MeanSquaredError against the label's value (whose 1 / width is 1, so its
// gradient scale is grad_scale exactly). Accuracy is cpu::ThresholdHits.
template <typename F>
__global__ void WidthOneRows(int64_t batch, F f, const float* out, const int32_t* labels,
                             float grad_scale, float* grad, double* row_loss,
                             int32_t* row_hit) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < batch;
       r += stride) {
    const elementwise::LossAndGrad lg = f(out[r], static_cast<float>(labels[r]));
    row_loss[r] = lg.loss;
    if (grad != nullptr) grad[r] = __fmul_rn(grad_scale, lg.grad);
    row_hit[r] = (out[r] > 0.5f) == (labels[r] != 0) ? 1 : 0;
  }
}

// Threads per row block: a warp multiple near the width, so narrow rows
// (10 classes) do not idle 256 threads; a function of the width only, which
// keeps each width's reduction order fixed.
unsigned RowThreads(int64_t width) {
  return static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(width, kWarpSize) * kWarpSize,
                                                   kWarpSize, 256));
}
unsigned RowBlocks(int64_t batch) { return static_cast<unsigned>(std::min<int64_t>(batch, 65535)); }

// ---- Layer and RMS normalisation ---------------------------------------------------
// One block per row (strided), as the losses: the row's sums in double over
// the block tree, then elementwise.h's per-element math, the functions
// cpu/elementwise_cpu.cc runs. The parameter gradients are column sums
// (ColumnSumsOf) of dy * xhat, formed on the fly, and of dy.

__device__ float RowScale(double squares, int64_t cols, float epsilon) {
  const float var = static_cast<float>(squares / static_cast<double>(cols));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, epsilon)));
}

__global__ void LayerNormForwardRows(int64_t rows, int64_t cols, const float* x,
                                     const float* gamma, const float* beta, float epsilon,
                                     bool rms, float* y, float* row_mean, float* row_rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float mean = 0.0f;
    if (!rms) {
      double sum = 0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
      mean = static_cast<float>(BlockReduce(sum, Sum(), 0.0) / static_cast<double>(cols));
    }
    double squares = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const double d = static_cast<double>(xr[c]) - mean;
      squares += d * d;
    }
    const elementwise::NormRow row{mean,
                                   RowScale(BlockReduce(squares, Sum(), 0.0), cols, epsilon)};
    if (threadIdx.x == 0) {
      row_mean[r] = row.mean;
      row_rstd[r] = row.rstd;
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      y[r * cols + c] = elementwise::NormOutput(rms, xr[c], row, gamma ? gamma[c] : 1.0f,
                                                beta ? beta[c] : 0.0f);
    }
  }
}

__global__ void LayerNormInputGradRows(int64_t rows, int64_t cols, const float* x,
                                       const float* dy, const float* gamma,
                                       const float* row_mean, const float* row_rstd, bool rms,
                                       float* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const elementwise::NormRow row{row_mean[r], row_rstd[r]};
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = gamma ? __fmul_rn(dyr[c], gamma[c]) : dyr[c];
      sum_g += g;
      sum_g_xhat += static_cast<double>(g) * elementwise::NormNormalized(xr[c], row);
    }
    sum_g = BlockReduce(sum_g, Sum(), 0.0);
    sum_g_xhat = BlockReduce(sum_g_xhat, Sum(), 0.0);
    const float mean_g = rms ? 0.0f : static_cast<float>(sum_g / static_cast<double>(cols));
    const float mean_g_xhat = static_cast<float>(sum_g_xhat / static_cast<double>(cols));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = gamma ? __fmul_rn(dyr[c], gamma[c]) : dyr[c];
      dx[r * cols + c] = elementwise::NormInputGrad(g, elementwise::NormNormalized(xr[c], row),
                                                    row, mean_g, mean_g_xhat);
    }
  }
}

// dy[r, c] * xhat[r, c], the summand of dgamma.
struct OutputGradTimesNormalized {
  const float* x;
  const float* dy;
  const float* row_mean;
  const float* row_rstd;
  int64_t cols;
  __device__ float operator()(int64_t, int64_t r, int64_t c) const {
    const elementwise::NormRow row{row_mean[r], row_rstd[r]};
    return dy[r * cols + c] * elementwise::NormNormalized(x[r * cols + c], row);
  }
};

// ---- Embedding ---------------------------------------------------------------------
// The gradient is cpu::EmbeddingBackward's loop: a thread per column adds
// the positions' rows in order, so the sums are the CPU's bit for bit and
// the same on every run (atomics would reorder them). Its parallelism is the
// embedding width; the pass is small next to the layers after it.

__device__ int64_t TokenRowOrMinusOne(float id, int64_t vocab) {
  const auto row = static_cast<int64_t>(id);
  return static_cast<float>(row) == id && row >= 0 && row < vocab ? row : -1;
}

struct EmbeddingGather {
  const float* ids;
  const float* table;
  float* y;
  int64_t vocab;
  int64_t dim;
  __device__ void operator()(int64_t k) const {
    const int64_t row = TokenRowOrMinusOne(ids[k / dim], vocab);
    y[k] = row < 0 ? 0.0f : table[row * dim + k % dim];
  }
};

__global__ void EmbeddingGradColumns(int64_t n, int64_t vocab, int64_t dim, const float* ids,
                                     const float* dy, float* dtable) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = TokenRowOrMinusOne(ids[i], vocab);
    if (row >= 0) dtable[row * dim + j] += dy[i * dim + j];
  }
}

// ---- Optimizer updates ------------------------------------------------------------
// cpu_math.cc's formulas in its operation order, each product rounded before
// it is added (that file is built -ffp-contract=off).

struct SgdStep {
  float neg_lr;  // cpu::SgdUpdate is Axpy(-lr): w += (-lr) g
  const float* g;
  float* w;
  __device__ void operator()(int64_t i) const { w[i] = __fadd_rn(w[i], __fmul_rn(neg_lr, g[i])); }
};

struct MomentumStep {
  float lr;
  float momentum;
  bool nesterov;
  const float* g;
  float* v;
  float* w;
  __device__ void operator()(int64_t i) const {
    const float gi = g[i];
    const float vi = __fsub_rn(__fmul_rn(momentum, v[i]), __fmul_rn(lr, gi));
    v[i] = vi;
    const float step = nesterov ? __fsub_rn(__fmul_rn(momentum, vi), __fmul_rn(lr, gi)) : vi;
    w[i] = __fadd_rn(w[i], step);
  }
};

struct AdamStep {
  float lr_t;
  float beta1;
  float beta2;
  float one_minus_b1;
  float one_minus_b2;
  float epsilon;
  const float* g;
  float* m;
  float* v;
  float* w;
  __device__ void operator()(int64_t i) const {
    const float gi = g[i];
    const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_b1, gi));
    const float vi =
        __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(one_minus_b2, __fmul_rn(gi, gi)));
    m[i] = mi;
    v[i] = vi;
    const float step = __fdiv_rn(__fmul_rn(lr_t, mi), __fadd_rn(__fsqrt_rn(vi), epsilon));
    w[i] = __fsub_rn(w[i], step);
  }
};

// cpu::RmspropUpdate, operation for operation; a is null unless centered.
struct RmspropStep {
  float lr;
  float rho;
  float one_minus_rho;
  float epsilon;
  const float* g;
  float* v;
  float* a;
  float* w;
  __device__ void operator()(int64_t i) const {
    const float gi = g[i];
    const float vi = __fadd_rn(__fmul_rn(rho, v[i]), __fmul_rn(one_minus_rho, __fmul_rn(gi, gi)));
    v[i] = vi;
    float denominator = __fadd_rn(vi, epsilon);
    if (a != nullptr) {
      const float ai = __fadd_rn(__fmul_rn(rho, a[i]), __fmul_rn(one_minus_rho, gi));
      a[i] = ai;
      denominator = __fadd_rn(__fsub_rn(vi, __fmul_rn(ai, ai)), epsilon);
    }
    w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, gi), __fsqrt_rn(denominator)));
  }
};

struct WeightDecayStep {
  float decay;
  float lr;
  float* w;
  __device__ void operator()(int64_t i) const {
    w[i] = __fsub_rn(w[i], __fmul_rn(__fmul_rn(w[i], decay), lr));
  }
};

}  // namespace

void Fill(int device, int64_t n, float value, float* dst) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (n <= 0) return;
  if (value == 0.0f && !std::signbit(value)) {
    // +0.0f is all zero bytes, which the runtime's memset writes fastest.
    DISTRAIN_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(float),
                                        ctx.compute_stream()));
    return;
  }
  ForEach(ctx.compute_stream(), n, Constant{value, dst});
}

void BiasAdd(int device, int64_t rows, int64_t cols, const float* bias, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  ForEach(ctx.compute_stream(), rows * cols, AddRowVector{bias, y, cols});
}

void BroadcastBias(int device, int64_t rows, int64_t cols, const float* bias, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  ForEach(ctx.compute_stream(), rows * cols, BroadcastRow{bias, y, cols});
}

void BiasGrad(int device, int64_t rows, int64_t cols, const float* dy, float* dbias) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (cols <= 0) return;
  if (rows <= 0) {
    // cpu::ColumnSums of no rows: zeros.
    DISTRAIN_CUDA_CHECK(cudaMemsetAsync(dbias, 0, static_cast<size_t>(cols) * sizeof(float),
                                        ctx.compute_stream()));
    return;
  }
  ColumnSums(ctx, 1, rows, cols, 1.0f, dy, dbias);
}

void LayerNormForward(int device, int64_t rows, int64_t cols, const float* x,
                      const float* gamma, const float* beta, float epsilon, bool rms, float* y,
                      float* mean, float* rstd) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  LayerNormForwardRows<<<RowBlocks(rows), RowThreads(cols), 0, ctx.compute_stream()>>>(
      rows, cols, x, gamma, beta, epsilon, rms, y, mean, rstd);
  DISTRAIN_CUDA_CHECK(cudaGetLastError());
}

void LayerNormBackward(int device, int64_t rows, int64_t cols, const float* x, const float* dy,
                       const float* gamma, const float* mean, const float* rstd, bool rms,
                       float* dx, float* dgamma, float* dbeta) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  LayerNormInputGradRows<<<RowBlocks(rows), RowThreads(cols), 0, ctx.compute_stream()>>>(
      rows, cols, x, dy, gamma, mean, rstd, rms, dx);
  DISTRAIN_CUDA_CHECK(cudaGetLastError());
  if (dgamma != nullptr) {
    ColumnSumsOf(ctx, 1, rows, cols, 1.0f, OutputGradTimesNormalized{x, dy, mean, rstd, cols},
                 dgamma);
  }
  if (dbeta != nullptr) ColumnSums(ctx, 1, rows, cols, 1.0f, dy, dbeta);
}

void EmbeddingForward(int device, int64_t n, int64_t vocab, int64_t dim, const float* ids,
                      const float* table, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (n <= 0 || dim <= 0) return;
  ForEach(ctx.compute_stream(), n * dim, EmbeddingGather{ids, table, y, vocab, dim});
}

void EmbeddingBackward(int device, int64_t n, int64_t vocab, int64_t dim, const float* ids,
                       const float* dy, float* dtable) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (vocab <= 0 || dim <= 0) return;
  DISTRAIN_CUDA_CHECK(cudaMemsetAsync(dtable, 0,
                                      static_cast<size_t>(vocab * dim) * sizeof(float),
                                      ctx.compute_stream()));
  if (n <= 0) return;
  constexpr unsigned kColumnThreads = 64;
  EmbeddingGradColumns<<<static_cast<unsigned>(CeilDiv(dim, kColumnThreads)), kColumnThreads, 0,
                         ctx.compute_stream()>>>(n, vocab, dim, ids, dy, dtable);
  DISTRAIN_CUDA_CHECK(cudaGetLastError());
}

void ActivationForward(int device, ActivationFunction f, int64_t n, const float* x, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const cudaStream_t stream = ctx.compute_stream();
  DISTRAIN_CHECK(f.kind != ActivationKind::kSoftmax)
      << "cuda::ActivationForward got softmax: ops.cc routes softmax to cuda::SoftmaxForward";
  if (f.kind == ActivationKind::kLinear) {
    CopyUnlessSame(stream, n, x, y);
    return;
  }
  const bool known =
      elementwise::WithForwardFunctor(f, [&](auto functor) { Map1(stream, n, functor, x, y); });
  DISTRAIN_CHECK(known) << "unknown activation " << static_cast<int>(f.kind);
}

void ActivationBackward(int device, ActivationFunction f, int64_t n, const float* x,
                        const float* y, const float* dy, float* dx) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const cudaStream_t stream = ctx.compute_stream();
  DISTRAIN_CHECK(f.kind != ActivationKind::kSoftmax)
      << "cuda::ActivationBackward got softmax: ops.cc routes softmax to cuda::SoftmaxBackward";
  if (f.kind == ActivationKind::kLinear) {
    CopyUnlessSame(stream, n, dy, dx);
    return;
  }
  const float* saved = elementwise::GradientReadsInput(f.kind) ? x : y;
  const bool known = elementwise::WithGradientFunctor(
      f, [&](auto functor) { Map2(stream, n, functor, saved, dy, dx); });
  DISTRAIN_CHECK(known) << "unknown activation " << static_cast<int>(f.kind);
}

void ScaleShift(int device, int64_t n, float scale, float offset, const float* x, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  Map1(ctx.compute_stream(), n, elementwise::ScaleShift{scale, offset}, x, y);
}

void DropoutForward(int device, int64_t n, uint64_t stream, uint64_t threshold, float scale,
                    const float* x, float* y, float* mask) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n,
          Dropout{elementwise::DropoutMask{stream, threshold, scale}, x, y, mask});
}

namespace {

struct ScaleBy {
  float factor;
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x * factor; }
};

// Raises *flag when x[i] is NaN or infinite; every writer writes the same
// value, so the race between them is benign.
struct FlagNonFinite {
  const float* x;
  int* flag;
  __device__ void operator()(int64_t i) const {
    if (!isfinite(x[i])) *flag = 1;
  }
};

}  // namespace

void RoundTo(int device, ComputeType type, int64_t n, const float* x, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  switch (type) {
    case ComputeType::kBfloat16:
      Map1(ctx.compute_stream(), n, elementwise::RoundToBfloat16(), x, y);
      return;
    case ComputeType::kFloat16:
      Map1(ctx.compute_stream(), n, elementwise::RoundToFloat16(), x, y);
      return;
    case ComputeType::kFloat32:
      CopyUnlessSame(ctx.compute_stream(), n, x, y);
      return;
  }
}

void Scale(int device, int64_t n, float factor, float* x) {
  DeviceContext& ctx = DeviceContext::Get(device);
  Map1(ctx.compute_stream(), n, ScaleBy{factor}, x, x);
}

bool AllFinite(int device, const std::vector<std::pair<const float*, int64_t>>& buffers) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const cudaStream_t stream = ctx.compute_stream();
  int flag = 0;
  {
    absl::MutexLock lock(&ctx.op_mutex());
    int* d_flag = static_cast<int*>(ctx.Scratch(sizeof(int)));
    DISTRAIN_CUDA_CHECK(cudaMemsetAsync(d_flag, 0, sizeof(int), stream));
    for (const auto& [x, n] : buffers) ForEach(stream, n, FlagNonFinite{x, d_flag});
    DISTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(&flag, d_flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  }
  // The scratch is stream-ordered, so the lock need not cover the wait.
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return flag == 0;
}

void Multiply(int device, int64_t n, const float* a, const float* b, float* out) {
  DeviceContext& ctx = DeviceContext::Get(device);
  Map2(ctx.compute_stream(), n, Product(), a, b, out);
}

void GlobalAveragePool2DForward(int device, int64_t n, int64_t hw, int64_t c, const float* x,
                                float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (n <= 0 || c <= 0 || hw <= 0) return;
  // cpu::GlobalAveragePool2DForward's float sum over the positions, times
  // the float 1 / hw.
  ColumnSums(ctx, n, hw, c, 1.0f / static_cast<float>(hw), x, y);
}

void GlobalAveragePool2DBackward(int device, int64_t n, int64_t hw, int64_t c, const float* dy,
                                 float* dx) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (hw <= 0 || c <= 0) return;
  ForEach(ctx.compute_stream(), n * hw * c,
          SpreadMean{dy, dx, hw * c, c, 1.0f / static_cast<float>(hw)});
}

ops::LossSums Loss(int device, LossKind kind, bool from_logits, int64_t batch, int64_t width,
                   const float* out, const int32_t* host_labels, float grad_scale, float* grad) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const cudaStream_t stream = ctx.compute_stream();
  ops::LossSums sums;
  if (batch <= 0 || width <= 0) return sums;
  std::vector<double> row_loss(static_cast<size_t>(batch));
  std::vector<int32_t> row_hit(static_cast<size_t>(batch));
  {
    absl::MutexLock lock(&ctx.op_mutex());
    // One scratch block: per-row losses (doubles first, for alignment), the
    // per-row hits, then the labels.
    const size_t rows = static_cast<size_t>(batch);
    char* scratch = static_cast<char*>(
        ctx.Scratch(rows * (sizeof(double) + sizeof(int32_t) + sizeof(int32_t))));
    double* d_loss = reinterpret_cast<double*>(scratch);
    int32_t* d_hit = reinterpret_cast<int32_t*>(scratch + rows * sizeof(double));
    int32_t* d_labels = d_hit + rows;
    DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(d_labels, host_labels, rows * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream));

    const unsigned threads = RowThreads(width);
    const unsigned blocks = RowBlocks(batch);
    switch (kind) {
      case LossKind::kSparseCategoricalCrossentropy:
      case LossKind::kCategoricalCrossentropy:
        if (from_logits) {
          // Both are softmax cross-entropy from logits with one-hot targets.
          SoftmaxCrossEntropyRows<<<blocks, threads, 0, stream>>>(
              batch, width, out, d_labels, grad_scale, grad, d_loss, d_hit);
        } else if (kind == LossKind::kSparseCategoricalCrossentropy) {
          SparseCrossentropyFromProbsRows<<<blocks, threads, 0, stream>>>(
              batch, width, out, d_labels, grad_scale, grad, d_loss, d_hit);
        } else {
          CategoricalCrossentropyFromProbsRows<<<blocks, threads, 0, stream>>>(
              batch, width, out, d_labels, grad_scale, grad, d_loss, d_hit);
        }
        break;
      case LossKind::kBinaryCrossentropy:  // width 1 (ops::Loss checks it)
        if (from_logits) {
          WidthOneRows<<<BlocksFor(batch, kThreads), kThreads, 0, stream>>>(
              batch, elementwise::BinaryCrossentropyFromLogits(), out, d_labels, grad_scale,
              grad, d_loss, d_hit);
        } else {
          WidthOneRows<<<BlocksFor(batch, kThreads), kThreads, 0, stream>>>(
              batch, elementwise::BinaryCrossentropyFromProbs(), out, d_labels, grad_scale,
              grad, d_loss, d_hit);
        }
        break;
      case LossKind::kMeanSquaredError:  // from_logits does not apply
        if (width == 1) {
          WidthOneRows<<<BlocksFor(batch, kThreads), kThreads, 0, stream>>>(
              batch, elementwise::SquaredError(), out, d_labels, grad_scale, grad, d_loss,
              d_hit);
        } else {
          // The CPU's grad_scale * inv_width, one float product on the host.
          const float inv_width = 1.0f / static_cast<float>(width);
          MeanSquaredErrorRows<<<blocks, threads, 0, stream>>>(
              batch, width, out, d_labels, grad_scale * inv_width, grad, d_loss, d_hit);
        }
        break;
      default:
        DISTRAIN_CHECK(false) << "unknown loss " << static_cast<int>(kind);
    }
    DISTRAIN_CUDA_CHECK(cudaGetLastError());
    DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(row_loss.data(), d_loss, rows * sizeof(double),
                                        cudaMemcpyDeviceToHost, stream));
    DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(row_hit.data(), d_hit, rows * sizeof(int32_t),
                                        cudaMemcpyDeviceToHost, stream));
  }
  // The scratch is stream-ordered, so the lock need not cover the wait.
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  // In row order, as the CPU adds its per-row values.
  for (size_t r = 0; r < row_loss.size(); ++r) {
    sums.loss_sum += row_loss[r];
    sums.correct += row_hit[r];
  }
  return sums;
}

void SgdUpdate(int device, int64_t n, float lr, const float* g, float* w) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n, SgdStep{-lr, g, w});
}

void MomentumUpdate(int device, int64_t n, float lr, float momentum, bool nesterov,
                    const float* g, float* v, float* w) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n, MomentumStep{lr, momentum, nesterov, g, v, w});
}

void AdamUpdate(int device, int64_t n, float lr_t, float beta1, float beta2, float epsilon,
                const float* g, float* m, float* v, float* w) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n,
          AdamStep{lr_t, beta1, beta2, 1.0f - beta1, 1.0f - beta2, epsilon, g, m, v, w});
}

void RmspropUpdate(int device, int64_t n, float lr, float rho, float epsilon, const float* g,
                   float* v, float* a, float* w) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n, RmspropStep{lr, rho, 1.0f - rho, epsilon, g, v, a, w});
}

void WeightDecay(int device, int64_t n, float decay, float lr, float* w) {
  DeviceContext& ctx = DeviceContext::Get(device);
  ForEach(ctx.compute_stream(), n, WeightDecayStep{decay, lr, w});
}

}  // namespace distrain::cuda

#ifndef DISTRAIN_WORKER_TENSOR_CPU_MATH_H_
#define DISTRAIN_WORKER_TENSOR_CPU_MATH_H_

// Host math kernels on raw row-major float32 buffers: the one set of
// primitives layers, losses and optimizers are written against, so the CUDA
// device (worker/tensor/cuda, a later issue) mirrors this file function for
// function. Matrix products go to oneDNN (dnnl_sgemm) on CPUs with AVX-512
// and to OpenBLAS (cblas_sgemm) elsewhere (internal::OneDnnRunsProducts says
// why), except products of few rows with a weight matrix on one BLAS thread,
// which go to hand-written AVX-512/AVX2 kernels (small_gemm.h); everything
// else is a plain loop the compiler vectorises.
//
// Conventions: every matrix is row-major and dense (leading dimension = its
// column count); sizes are element counts; outputs may not alias inputs unless
// a function says so. No function allocates.
// Thread-safety: the functions are reentrant; a product runs on the calling
// thread's OpenMP team (oneDNN) or OpenBLAS's pool, either sized to
// SetBlasThreads' budget.

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace distrain::cpu {

// C[m, n] = alpha * op(A) * op(B) + beta * C, where op(A) is [m, k] and op(B)
// is [k, n]. A is stored [m, k] (or [k, m] when trans_a), B is stored [k, n]
// (or [n, k] when trans_b). With beta == 0, C's old contents are ignored (may
// be uninitialised, even NaN). Equal inputs give bit-identical C on every call
// with the same BLAS thread count, but not across thread counts: a parallel
// product splits its work differently, and with one BLAS thread, products of
// few rows (!trans_a, see small_gemm.h's SmallGemmRoutes) run hand-written
// AVX-512/AVX2 kernels.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

// dst[cols, rows] = src[rows, cols]^T, in cache-sized tiles (a plain loop
// reads or writes one of them a whole row apart on every element).
void Transpose(int64_t rows, int64_t cols, const float* src, float* dst);

// x[r, :] = v for every row of x[rows, cols].
void BroadcastRow(int64_t rows, int64_t cols, const float* v, float* x);
// x[r, :] += v for every row of x[rows, cols].
void AddRowVector(int64_t rows, int64_t cols, const float* v, float* x);
// out[c] = sum_r x[r, c]; out is overwritten. Summed in chunks of
// kColumnSumChunkRows rows, each in row order, the chunks then in order, on
// the calling thread's OpenMP team: the same bits on any thread count.
inline constexpr int64_t kColumnSumChunkRows = 4096;
void ColumnSums(int64_t rows, int64_t cols, const float* x, float* out);
// x rounded to bfloat16 (round to nearest even; exact where x holds bfloat16
// values, as under mixed_bfloat16) into x_bf16, and, when out is not null,
// ColumnSums(rows, cols, x, out) with the same bits, in one pass over x: a
// convolution's output gradient staged for oneDNN's bfloat16 kernels while
// its bias gradient is summed. With `relu_output` (same shape as x), x is
// first masked by ReLU's gradient, as ReluGrad(relu_output, x) would: the
// gradient behind a convolution's ReLU, never written in float32.
void ColumnSumsAndBfloat16(int64_t rows, int64_t cols, const float* x, float* out,
                           uint16_t* x_bf16, const float* relu_output = nullptr);
// y += alpha * x.
void Axpy(int64_t n, float alpha, const float* x, float* y);
// x *= alpha.
void Scale(int64_t n, float alpha, float* x);

// out = max(in, 0). out may alias in.
void Relu(int64_t n, const float* in, float* out);
// grad_in = grad_out where out > 0, else 0 (`out` is the forward output).
// grad_in may alias grad_out.
void ReluGrad(int64_t n, const float* out, const float* grad_out, float* grad_in);

// Softmax + sparse cross-entropy over logits[batch, classes], one pass per
// row. Returns the summed (not mean) loss in double and adds the number of
// rows whose first argmax equals the label to *correct. When grad is not
// null, grad = (softmax - onehot) * grad_scale. Labels must be in range.
double SoftmaxCrossEntropy(int64_t batch, int64_t classes, const float* logits,
                           const int32_t* labels, float grad_scale, float* grad,
                           int64_t* correct);

// Runs fn(begin, end) over [0, n) split across the calling thread's OpenMP
// team — its share of the cores (ops::SetCpuThreadsForThisThread): all of
// them for OneDevice, one per replica thread for Mirrored, so nothing is
// oversubscribed — once a pass is long enough to pay for waking the team.
// Only for work whose split cannot change a result: element-wise passes
// (the chunks are whole cache lines, so no two threads write one line), or
// independent rows or columns of `elements_per_item` elements each (layer
// norm, embedding lookups), where the threshold counts their elements.
// Measured on the guide CNN at batch 256 (2-core Zen 5): ReLU, its gradient
// and the mixed-precision rounding were a fifth of the busy time, on one core.
inline constexpr int64_t kParallelElements = int64_t{1} << 16;
template <typename Fn>
void ParallelRange(int64_t n, const Fn& fn, int64_t elements_per_item = 1) {
  const int threads = omp_get_max_threads();
  if (threads <= 1 || n * elements_per_item < kParallelElements) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t parts = omp_get_num_threads();
    const int64_t chunk = ((n + parts - 1) / parts + 15) / 16 * 16;
    const int64_t begin = std::min(n, chunk * omp_get_thread_num());
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  }
}

// Optimizer updates (Keras rules, see worker/model/optimizer.h), each one
// fused pass over the variable, split across the thread's team
// (ParallelRange: every element's arithmetic is the same however it is
// split). Adam over the guide CNN's 0.5 M parameters was 4% of the CPU at
// batch 64 with the other core idle.
// w -= lr * g
void SgdUpdate(int64_t n, float lr, const float* g, float* w);
// v = momentum * v - lr * g; w += v (nesterov: w += momentum * v - lr * g).
void MomentumUpdate(int64_t n, float lr, float momentum, bool nesterov, const float* g,
                    float* v, float* w);
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr_t * m / (sqrt(v) + eps).
// lr_t already carries Adam's bias correction.
void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2, float epsilon, const float* g,
                float* m, float* v, float* w);
// Keras' RMSprop: v = rho v + (1-rho) g^2; centered (a not null): a = rho a +
// (1-rho) g and d = v - a^2 + eps, else d = v + eps; w -= lr g / sqrt(d).
void RmspropUpdate(int64_t n, float lr, float rho, float epsilon, const float* g, float* v,
                   float* a, float* w);
// Keras' decoupled weight decay, before an update: w -= (w * decay) * lr.
void WeightDecay(int64_t n, float decay, float lr, float* w);

// The thread budget of a matrix product (process-wide; kept in OpenBLAS's
// setting, which OPENBLAS_NUM_THREADS initialises, and applied to oneDNN's
// team per call). Strategies that run several
// replicas as threads in one process call this so they do not oversubscribe
// the cores; the default is one BLAS thread per core.
void SetBlasThreads(int threads);
int BlasThreads();

namespace internal {
// True when Gemm's products (those not routed to small_gemm.h) run on oneDNN,
// false when on OpenBLAS; decided once per process from the instruction set.
bool OneDnnRunsProducts();
}  // namespace internal
// "oneDNN (AVX-512 kernels)" or "OpenBLAS (<its kernel set> kernels)".
const char* ProductLibraryName();

}  // namespace distrain::cpu

#endif  // DISTRAIN_WORKER_TENSOR_CPU_MATH_H_

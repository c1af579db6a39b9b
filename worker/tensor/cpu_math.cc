#include "worker/tensor/cpu_math.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/check.h"
#include "oneapi/dnnl/dnnl.h"
#include "worker/tensor/elementwise.h"
#include "worker/tensor/small_gemm.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace distrain::cpu {

namespace internal {

// Which library runs the products cpu::Gemm does not route to the small-M
// kernels, decided once from the instruction set oneDNN will use (which
// honours ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA). With AVX-512, oneDNN: it
// picks its kernels from the CPU's feature flags, while OpenBLAS 0.3.21 picks
// them from a model table that predates recent cores and that
// OPENBLAS_CORETYPE can pin (some hosts pin the AVX2 kernels because newer
// ones misbehave there). Without AVX-512, OpenBLAS: its AVX2 kernels beat
// oneDNN 2.6's. Measured with bench/gemm_small on a Zen 5 EPYC (host pinning
// OpenBLAS to its Haswell kernels), one thread, the MLP's 256-row products,
// GFLOP/s: oneDNN 224-243 against OpenBLAS 123-125; oneDNN limited to AVX2
// 77-79 (126 for dy W^T) against the same OpenBLAS 129-135
// (bench/README.md, "GEMM backend").
bool OneDnnRunsProducts() {
  static const bool one_dnn = [] {
    const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const auto avx512 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
    return (isa & avx512) == avx512;
  }();
  return one_dnn;
}

}  // namespace internal

const char* ProductLibraryName() {
  static const std::string name =
      internal::OneDnnRunsProducts()
          ? std::string("oneDNN (AVX-512 kernels)")
          : std::string("OpenBLAS (") + openblas_get_corename() + " kernels)";
  return name.c_str();
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  DISTRAIN_CHECK(m >= 0 && n >= 0 && k >= 0) << "m=" << m << " n=" << n << " k=" << k;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves C untouched when k == 0 only if beta == 1; be explicit.
    if (beta == 0.0f) {
      std::fill(c, c + m * n, 0.0f);
    } else {
      Scale(m * n, beta, c);
    }
    return;
  }
  // Few rows times a weight matrix on a single BLAS thread (parameter-server
  // workers): OpenBLAS would pack all of B for a handful of rows. With more
  // BLAS threads OpenBLAS keeps the call: on 2 threads it beat the
  // single-threaded kernels on the batch-32 forward product.
  if (BlasThreads() == 1 && internal::SmallGemmRoutes(trans_a, trans_b, m, n, k)) {
    internal::SmallGemm(internal::DetectSmallGemmIsa(), trans_b, m, n, k, alpha, a, b, beta, c);
    return;
  }
  if (internal::OneDnnRunsProducts()) {
    // oneDNN runs on the calling thread's OpenMP team, sized to the BLAS
    // budget the strategies set (SetBlasThreads): the parallelism OpenBLAS's
    // pool had.
    const int threads = BlasThreads();
    if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
    const dnnl_status_t status =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, trans_a ? m : k,
                   b, trans_b ? k : n, beta, c, n);
    DISTRAIN_CHECK(status == dnnl_success)
        << "dnnl_sgemm failed (status " << static_cast<int>(status) << ") for m=" << m
        << " n=" << n << " k=" << k;
    return;
  }
  const blasint lda = static_cast<blasint>(trans_a ? m : k);
  const blasint ldb = static_cast<blasint>(trans_b ? k : n);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, lda, b, ldb, beta, c,
              static_cast<blasint>(n));
}

void Transpose(int64_t rows, int64_t cols, const float* src, float* dst) {
  // 32 x 32 floats: 4 KiB read and 4 KiB written per tile, well inside L1.
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

void BroadcastRow(int64_t rows, int64_t cols, const float* v, float* x) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(x + r * cols, v, cols * sizeof(float));
}

void AddRowVector(int64_t rows, int64_t cols, const float* v, float* x) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += v[c];
  }
}

namespace {

// out[c] = sum of x[r, c] over the rows [r0, r1), in row order.
void ColumnSumsOfRows(int64_t cols, int64_t r0, int64_t r1, const float* x, float* out) {
  std::fill(out, out + cols, 0.0f);
  float* __restrict o = out;
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] += row[c];
  }
}

// The chunked order ColumnSums promises: sum_rows(r0, r1, partial) for each
// chunk of kColumnSumChunkRows rows on the thread's team (partial: that
// chunk's row of sums, or null when out is null), then the chunks added in
// order into out. sum_rows may do more with its rows (ColumnSumsAndBfloat16).
template <typename SumRows>
void InColumnSumChunks(int64_t rows, int64_t cols, float* out, const SumRows& sum_rows) {
  const int64_t chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  if (chunks <= 1) {
    sum_rows(int64_t{0}, rows, out);
    return;
  }
  std::vector<float> partial(out != nullptr ? static_cast<size_t>(chunks * cols) : 0);
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), chunks));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    sum_rows(k * kColumnSumChunkRows, std::min(rows, (k + 1) * kColumnSumChunkRows),
             out != nullptr ? partial.data() + k * cols : nullptr);
  }
  if (out == nullptr) return;
  std::copy(partial.begin(), partial.begin() + cols, out);
  for (int64_t k = 1; k < chunks; ++k) Axpy(cols, 1.0f, partial.data() + k * cols, out);
}

}  // namespace

// The rows go in fixed chunks of kColumnSumChunkRows, each summed in row
// order, and the chunks' sums are added in chunk order: the same bits
// whatever the thread count, since the threads only decide who sums which
// chunk. A convolution's bias gradient over batch x height x width rows was
// a single-threaded pass over its whole output gradient (conv1 of the guide
// CNN: 22 MB at batch 256) with the other core idle. (Splitting the columns
// between threads instead kept the serial order but was slower: two threads
// each reading half of every 128-byte row pulled every cache line twice.)
void ColumnSums(int64_t rows, int64_t cols, const float* x, float* out) {
  InColumnSumChunks(rows, cols, out, [&](int64_t r0, int64_t r1, float* sums) {
    ColumnSumsOfRows(cols, r0, r1, x, sums);
  });
}

namespace {

// ColumnSumsOfRows (when out is not null) and x's bfloat16 encoding, for
// the rows [r0, r1), of x masked by (relu_output > 0) when relu_output is
// not null (a select, +0 where masked, as ReluGrad). Cloned per ISA: the
// rounding is integer arithmetic that vectorises only in wide registers.
template <bool kMasked, bool kSums>
[[gnu::always_inline]] inline void ColumnSumsAndBfloat16Rows(int64_t cols, int64_t r0,
                                                             int64_t r1, const float* x,
                                                             float* out, uint16_t* x_bf16,
                                                             const float* relu_output) {
  const elementwise::RoundToBfloat16 round;
  // Row by row through restrict pointers: the loops vectorise only when GCC
  // knows the output does not alias the inputs.
  float* __restrict o = out;
  if constexpr (kSums) std::fill(out, out + cols, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict row = x + r * cols;
    const float* __restrict mask = kMasked ? relu_output + r * cols : nullptr;
    uint16_t* __restrict row16 = x_bf16 + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float v = row[c];
      if constexpr (kMasked) {
        // The select as a mask-and (+0 where masked): written as ?: GCC
        // branched per element and the loop ran scalar, 3x slower.
        const uint32_t keep = 0u - static_cast<uint32_t>(mask[c] > 0.0f);
        v = elementwise::BitsFloat(elementwise::FloatBits(v) & keep);
      }
      if constexpr (kSums) o[c] += v;
      row16[c] = static_cast<uint16_t>(elementwise::FloatBits(round(v)) >> 16);
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void ColumnSumsAndBfloat16OfRows(
    int64_t cols, int64_t r0, int64_t r1, const float* x, float* out, uint16_t* x_bf16,
    const float* relu_output) {
  if (relu_output != nullptr) {
    if (out != nullptr) {
      return ColumnSumsAndBfloat16Rows<true, true>(cols, r0, r1, x, out, x_bf16, relu_output);
    }
    return ColumnSumsAndBfloat16Rows<true, false>(cols, r0, r1, x, out, x_bf16, relu_output);
  }
  if (out != nullptr) {
    return ColumnSumsAndBfloat16Rows<false, true>(cols, r0, r1, x, out, x_bf16, nullptr);
  }
  ColumnSumsAndBfloat16Rows<false, false>(cols, r0, r1, x, out, x_bf16, nullptr);
}

}  // namespace

// ColumnSums's chunks, order and final additions, so the sums are its bits
// whatever the thread count.
void ColumnSumsAndBfloat16(int64_t rows, int64_t cols, const float* x, float* out,
                           uint16_t* x_bf16, const float* relu_output) {
  InColumnSumChunks(rows, cols, out, [&](int64_t r0, int64_t r1, float* sums) {
    ColumnSumsAndBfloat16OfRows(cols, r0, r1, x, sums, x_bf16, relu_output);
  });
}

void Axpy(int64_t n, float alpha, const float* x, float* y) {
  const float* __restrict xs = x;
  float* __restrict ys = y;
  for (int64_t i = 0; i < n; ++i) ys[i] += alpha * xs[i];
}

void Scale(int64_t n, float alpha, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

// Both as a mask and an AND, 4 floats at a time: written as the plain select,
// GCC emitted a compare and a branch per element (its operands may alias, so
// it would not vectorise), and ReLU's signs are a coin toss for the branch
// predictor: ReluGrad alone was 4.7% of ParameterServer training's CPU at 256
// examples per closure. The results are the select's, bit for bit (a NaN
// input compares false and gives +0, as the select does).
void Relu(int64_t n, const float* in, float* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_loadu_ps(in + i);
    _mm_storeu_ps(out + i, _mm_and_ps(_mm_cmpgt_ps(x, zero), x));
  }
#endif
  for (; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void ReluGrad(int64_t n, const float* out, const float* grad_out, float* grad_in) {
  int64_t i = 0;
#if defined(__x86_64__)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 keep = _mm_cmpgt_ps(_mm_loadu_ps(out + i), zero);
    _mm_storeu_ps(grad_in + i, _mm_and_ps(keep, _mm_loadu_ps(grad_out + i)));
  }
#endif
  for (; i < n; ++i) grad_in[i] = out[i] > 0.0f ? grad_out[i] : 0.0f;
}

double SoftmaxCrossEntropy(int64_t batch, int64_t classes, const float* logits,
                           const int32_t* labels, float grad_scale, float* grad,
                           int64_t* correct) {
  double loss_sum = 0;
  int64_t hits = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* x = logits + r * classes;
    const int32_t label = labels[r];
    DISTRAIN_CHECK(label >= 0 && label < classes) << "label " << label << " at row " << r;
    // First argmax, like tf.argmax; also the shift that keeps exp() finite.
    int64_t argmax = 0;
    float max = x[0];
    for (int64_t c = 1; c < classes; ++c) {
      if (x[c] > max) {
        max = x[c];
        argmax = c;
      }
    }
    if (argmax == label) ++hits;
    double sum = 0;
    if (grad != nullptr) {
      float* g = grad + r * classes;
      for (int64_t c = 0; c < classes; ++c) {
        g[c] = std::exp(x[c] - max);
        sum += g[c];
      }
      const float inv = static_cast<float>(grad_scale / sum);
      for (int64_t c = 0; c < classes; ++c) g[c] *= inv;
      g[label] -= grad_scale;
    } else {
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
    }
    // -log softmax[label] = log(sum exp(x - max)) - (x[label] - max)
    loss_sum += std::log(sum) - (static_cast<double>(x[label]) - max);
  }
  *correct += hits;
  return loss_sum;
}

void SgdUpdate(int64_t n, float lr, const float* g, float* w) { Axpy(n, -lr, g, w); }

namespace {

void MomentumUpdateRange(int64_t n, float lr, float momentum, bool nesterov, const float* g,
                         float* v, float* w) {
  const float* __restrict gs = g;
  float* __restrict vs = v;
  float* __restrict ws = w;
  if (nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      const float vi = momentum * vs[i] - lr * gs[i];
      vs[i] = vi;
      ws[i] += momentum * vi - lr * gs[i];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float vi = momentum * vs[i] - lr * gs[i];
      vs[i] = vi;
      ws[i] += vi;
    }
  }
}

}  // namespace

void MomentumUpdate(int64_t n, float lr, float momentum, bool nesterov, const float* g,
                    float* v, float* w) {
  ParallelRange(n, [&](int64_t b, int64_t e) {
    MomentumUpdateRange(e - b, lr, momentum, nesterov, g + b, v + b, w + b);
  });
}

namespace {

#if defined(__x86_64__)
// Adam's body on 16 or 8 floats at a time, for CPUs that have the wider
// registers (chosen at run time: the build targets generic x86-64). A ps
// task spends about a tenth of its CPU here, bound by the divide and square
// root, whose throughput per element scales with the width. Same operations
// in the same order as the 4-wide and scalar code, and this file is built
// with -ffp-contract=off, so no multiply-add is fused: every element is
// rounded exactly as the generic path rounds it, on any CPU.
__attribute__((target("avx512f"))) int64_t AdamUpdate16(int64_t n, float lr_t, float beta1,
                                                        float beta2, float epsilon,
                                                        const float* __restrict g,
                                                        float* __restrict m, float* __restrict v,
                                                        float* __restrict w) {
  const __m512 b1 = _mm512_set1_ps(beta1), b2 = _mm512_set1_ps(beta2);
  const __m512 c1 = _mm512_set1_ps(1.0f - beta1), c2 = _mm512_set1_ps(1.0f - beta2);
  const __m512 lr = _mm512_set1_ps(lr_t), eps = _mm512_set1_ps(epsilon);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(c1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(c2, _mm512_mul_ps(gi, gi)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    // maskz with every lane selected is _mm512_sqrt_ps, bit for bit; GCC 12's
    // _mm512_sqrt_ps passes _mm512_undefined_ps() through, which it then warns
    // about as uninitialised (a false positive in avx512fintrin.h).
    const __m512 sqrt_v = _mm512_maskz_sqrt_ps(0xFFFF, vi);
    const __m512 step = _mm512_div_ps(_mm512_mul_ps(lr, mi), _mm512_add_ps(sqrt_v, eps));
    _mm512_storeu_ps(w + i, _mm512_sub_ps(_mm512_loadu_ps(w + i), step));
  }
  return i;
}

__attribute__((target("avx"))) int64_t AdamUpdate8(int64_t n, float lr_t, float beta1,
                                                   float beta2, float epsilon,
                                                   const float* __restrict g, float* __restrict m,
                                                   float* __restrict v, float* __restrict w) {
  const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2);
  const __m256 c1 = _mm256_set1_ps(1.0f - beta1), c2 = _mm256_set1_ps(1.0f - beta2);
  const __m256 lr = _mm256_set1_ps(lr_t), eps = _mm256_set1_ps(epsilon);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(c2, _mm256_mul_ps(gi, gi)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 step =
        _mm256_div_ps(_mm256_mul_ps(lr, mi), _mm256_add_ps(_mm256_sqrt_ps(vi), eps));
    _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), step));
  }
  return i;
}

enum class Width { k4, k8, k16 };
Width WidestAdam() {
  static const Width width = __builtin_cpu_supports("avx512f") ? Width::k16
                             : __builtin_cpu_supports("avx") ? Width::k8
                                                              : Width::k4;
  return width;
}
#endif

void AdamUpdateRange(int64_t n, float lr_t, float beta1, float beta2, float epsilon,
                     const float* g, float* m, float* v, float* w) {
  int64_t done = 0;
#if defined(__x86_64__)
  switch (WidestAdam()) {
    case Width::k16:
      done = AdamUpdate16(n, lr_t, beta1, beta2, epsilon, g, m, v, w);
      break;
    case Width::k8:
      done = AdamUpdate8(n, lr_t, beta1, beta2, epsilon, g, m, v, w);
      break;
    case Width::k4:
      break;
  }
#endif
  n -= done;
  g += done;
  m += done;
  v += done;
  w += done;
  const float* __restrict gs = g;
  float* __restrict ms = m;
  float* __restrict vs = v;
  float* __restrict ws = w;
  const float one_minus_b1 = 1.0f - beta1;
  const float one_minus_b2 = 1.0f - beta2;
  int64_t i = 0;
#if defined(__SSE2__)
  // Explicit SIMD: std::sqrt may set errno, which stops GCC from vectorising
  // the scalar loop unless the whole build uses -fno-math-errno. _mm_sqrt_ps
  // is IEEE-exact like sqrtf, so both paths round identically.
  const __m128 b1 = _mm_set1_ps(beta1), b2 = _mm_set1_ps(beta2);
  const __m128 c1 = _mm_set1_ps(one_minus_b1), c2 = _mm_set1_ps(one_minus_b2);
  const __m128 lr = _mm_set1_ps(lr_t), eps = _mm_set1_ps(epsilon);
  for (; i + 4 <= n; i += 4) {
    const __m128 gi = _mm_loadu_ps(gs + i);
    const __m128 mi =
        _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(ms + i)), _mm_mul_ps(c1, gi));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(vs + i)),
                                 _mm_mul_ps(c2, _mm_mul_ps(gi, gi)));
    _mm_storeu_ps(ms + i, mi);
    _mm_storeu_ps(vs + i, vi);
    const __m128 step = _mm_div_ps(_mm_mul_ps(lr, mi), _mm_add_ps(_mm_sqrt_ps(vi), eps));
    _mm_storeu_ps(ws + i, _mm_sub_ps(_mm_loadu_ps(ws + i), step));
  }
#endif
  for (; i < n; ++i) {
    const float gi = gs[i];
    const float mi = beta1 * ms[i] + one_minus_b1 * gi;
    const float vi = beta2 * vs[i] + one_minus_b2 * (gi * gi);
    ms[i] = mi;
    vs[i] = vi;
    ws[i] -= (lr_t * mi) / (std::sqrt(vi) + epsilon);
  }
}

}  // namespace

void AdamUpdate(int64_t n, float lr_t, float beta1, float beta2, float epsilon, const float* g,
                float* m, float* v, float* w) {
  ParallelRange(n, [&](int64_t b, int64_t e) {
    AdamUpdateRange(e - b, lr_t, beta1, beta2, epsilon, g + b, m + b, v + b, w + b);
  });
}

void RmspropUpdate(int64_t n, float lr, float rho, float epsilon, const float* g, float* v,
                   float* a, float* w) {
  const float one_minus_rho = 1.0f - rho;
  ParallelRange(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i];
      const float vi = rho * v[i] + one_minus_rho * (gi * gi);
      v[i] = vi;
      float denominator = vi + epsilon;
      if (a != nullptr) {
        const float ai = rho * a[i] + one_minus_rho * gi;
        a[i] = ai;
        denominator = (vi - ai * ai) + epsilon;
      }
      w[i] -= (lr * gi) / std::sqrt(denominator);
    }
  });
}

void WeightDecay(int64_t n, float decay, float lr, float* w) {
  ParallelRange(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] -= (w[i] * decay) * lr;
  });
}

void SetBlasThreads(int threads) {
  DISTRAIN_CHECK_GE(threads, 1);
  openblas_set_num_threads(threads);
}

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace distrain::cpu

#include "worker/tensor/cpu/elementwise_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "worker/tensor/cpu_math.h"

namespace distrain::cpu {
namespace {

// One pass of a unary functor. Plain indexed loops: GCC vectorises the
// arithmetic ones (with a run-time overlap check, as y may alias x); the
// transcendental ones run libm per element either way.
template <typename F>
void Map(int64_t n, F f, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

template <typename F>
void Map2(int64_t n, F f, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

void SoftmaxRows(int64_t rows, int64_t cols, const float* x, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float max = xr[0];
    for (int64_t c = 1; c < cols; ++c) max = xr[c] > max ? xr[c] : max;
    // Shifted by the row maximum: every exponent is <= 0, so nothing
    // overflows and the largest term is exactly 1 (the sum is >= 1).
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      yr[c] = std::exp(xr[c] - max);
      sum += yr[c];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

// dx = y * (dy - <dy, y>) per row: the softmax Jacobian applied to dy.
void SoftmaxGradRows(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(dyr[c]) * yr[c];
    const float d = static_cast<float>(dot);
    for (int64_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - d);
  }
}

}  // namespace

// Mixed precision rounds every activation and gradient: wide registers
// where the CPU has them (the functors are branch-free, so each clone
// vectorises; integer and float selects round the same in every width).
namespace {
__attribute__((target_clones("avx512f", "avx2", "default"))) void RoundToBfloat16Range(
    int64_t n, const float* x, float* y) {
  Map(n, elementwise::RoundToBfloat16(), x, y);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void RoundToFloat16Range(
    int64_t n, const float* x, float* y) {
  Map(n, elementwise::RoundToFloat16(), x, y);
}

// ReLU as a select (x > 0 ? x : +0, NaN to 0, as cpu_math's Relu), then the
// rounding: one pass where Relu then RoundTo made two over the same tensor.
template <typename Round>
struct ReluThen {
  float operator()(float x) const { return Round()(x > 0.0f ? x : 0.0f); }
};

__attribute__((target_clones("avx512f", "avx2", "default"))) void ReluRoundToBfloat16Range(
    int64_t n, const float* x, float* y) {
  Map(n, ReluThen<elementwise::RoundToBfloat16>(), x, y);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void ReluRoundToFloat16Range(
    int64_t n, const float* x, float* y) {
  Map(n, ReluThen<elementwise::RoundToFloat16>(), x, y);
}
}  // namespace

void RoundToBfloat16(int64_t n, const float* x, float* y) {
  ParallelRange(n, [&](int64_t b, int64_t e) { RoundToBfloat16Range(e - b, x + b, y + b); });
}

void RoundToFloat16(int64_t n, const float* x, float* y) {
  ParallelRange(n, [&](int64_t b, int64_t e) { RoundToFloat16Range(e - b, x + b, y + b); });
}

void ReluRoundToBfloat16(int64_t n, const float* x, float* y) {
  ParallelRange(n, [&](int64_t b, int64_t e) { ReluRoundToBfloat16Range(e - b, x + b, y + b); });
}

void ReluRoundToFloat16(int64_t n, const float* x, float* y) {
  ParallelRange(n, [&](int64_t b, int64_t e) { ReluRoundToFloat16Range(e - b, x + b, y + b); });
}

// ---- Layer and RMS normalisation ----------------------------------------------
// Rows are independent, so the forward pass and dx split the rows across the
// thread's team; the parameter gradients split the columns instead, each
// column summed over every row in row order, so no result depends on the
// team's size (cpu_math.h's ParallelRange, counting each row's or column's
// elements).
namespace {

// The statistics of one row, summed in double (Keras' float32 reductions
// are tree sums; double keeps this side within a rounding of the exact
// value, whatever the width).
elementwise::NormRow RowStatistics(int64_t cols, const float* x, float epsilon, bool rms) {
  double sum = 0;
  if (!rms) {
    for (int64_t c = 0; c < cols; ++c) sum += x[c];
  }
  const float mean = rms ? 0.0f : static_cast<float>(sum / static_cast<double>(cols));
  double squares = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const double d = static_cast<double>(x[c]) - mean;
    squares += d * d;
  }
  const float var = static_cast<float>(squares / static_cast<double>(cols));
  return {mean, 1.0f / std::sqrt(var + epsilon)};
}

}  // namespace

void LayerNormForward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                      const float* beta, float epsilon, bool rms, float* y, float* mean,
                      float* rstd) {
  ParallelRange(rows, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const elementwise::NormRow row = RowStatistics(cols, xr, epsilon, rms);
      mean[r] = row.mean;
      rstd[r] = row.rstd;
      for (int64_t c = 0; c < cols; ++c) {
        yr[c] = elementwise::NormOutput(rms, xr[c], row, gamma ? gamma[c] : 1.0f,
                                        beta ? beta[c] : 0.0f);
      }
    }
  }, cols);
}

void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* dy,
                       const float* gamma, const float* mean, const float* rstd, bool rms,
                       float* dx, float* dgamma, float* dbeta) {
  const double inv_cols = 1.0 / static_cast<double>(cols);
  ParallelRange(rows, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      const elementwise::NormRow row{mean[r], rstd[r]};
      double sum_g = 0, sum_g_xhat = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const float g = gamma ? dyr[c] * gamma[c] : dyr[c];
        sum_g += g;
        sum_g_xhat += static_cast<double>(g) * elementwise::NormNormalized(xr[c], row);
      }
      const float mean_g = rms ? 0.0f : static_cast<float>(sum_g * inv_cols);
      const float mean_g_xhat = static_cast<float>(sum_g_xhat * inv_cols);
      for (int64_t c = 0; c < cols; ++c) {
        const float g = gamma ? dyr[c] * gamma[c] : dyr[c];
        dxr[c] = elementwise::NormInputGrad(g, elementwise::NormNormalized(xr[c], row), row,
                                            mean_g, mean_g_xhat);
      }
    }
  }, cols);
  if (dgamma == nullptr && dbeta == nullptr) return;
  ParallelRange(cols, [&](int64_t first, int64_t end) {
    std::vector<double> sum_dy_xhat(static_cast<size_t>(end - first), 0.0);
    std::vector<double> sum_dy(static_cast<size_t>(end - first), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const elementwise::NormRow row{mean[r], rstd[r]};
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      for (int64_t c = first; c < end; ++c) {
        sum_dy_xhat[c - first] +=
            static_cast<double>(dyr[c]) * elementwise::NormNormalized(xr[c], row);
        sum_dy[c - first] += dyr[c];
      }
    }
    for (int64_t c = first; c < end; ++c) {
      if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xhat[c - first]);
      if (dbeta) dbeta[c] = static_cast<float>(sum_dy[c - first]);
    }
  }, rows);
}

// ---- Embedding ------------------------------------------------------------------

namespace {
int64_t TokenRow(float id, int64_t vocab) {
  const auto row = static_cast<int64_t>(id);
  DISTRAIN_CHECK(static_cast<float>(row) == id && row >= 0 && row < vocab)
      << "embedding id " << id << " outside [0, " << vocab << ")";
  return row;
}
}  // namespace

void EmbeddingForward(int64_t n, int64_t vocab, int64_t dim, const float* ids,
                      const float* table, float* y) {
  ParallelRange(n, [&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) {
      std::memcpy(y + i * dim, table + TokenRow(ids[i], vocab) * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    }
  }, dim);
}

void EmbeddingBackward(int64_t n, int64_t vocab, int64_t dim, const float* ids,
                       const float* dy, float* dtable) {
  std::fill(dtable, dtable + vocab * dim, 0.0f);
  // Columns across the team, positions in order within each: no two threads
  // touch one element, and every sum is added in the ids' order.
  ParallelRange(dim, [&](int64_t first, int64_t end) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = dtable + TokenRow(ids[i], vocab) * dim;
      const float* g = dy + i * dim;
      for (int64_t j = first; j < end; ++j) row[j] += g[j];
    }
  }, n);
}

void CopyFloats(int64_t n, const float* src, float* dst) {
  ParallelRange(n, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

bool AllFinite(int64_t n, const float* x) {
  // x - x is 0 for every finite x and NaN for inf and NaN; summing without a
  // branch lets the loop vectorise, and NaN survives any sum.
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == 0.0f;
}

void ActivationForward(ActivationFunction f, int64_t rows, int64_t cols, const float* x,
                       float* y) {
  const int64_t n = rows * cols;
  switch (f.kind) {
    case ActivationKind::kLinear:
      if (y != x) CopyFloats(n, x, y);
      return;
    case ActivationKind::kRelu:
      // cpu_math's mask-and kernel, same results as elementwise::Relu.
      ParallelRange(n, [&](int64_t b, int64_t e) { Relu(e - b, x + b, y + b); });
      return;
    case ActivationKind::kSoftmax:
      SoftmaxRows(rows, cols, x, y);
      return;
    default:
      break;
  }
  const bool known = elementwise::WithForwardFunctor(f, [&](auto functor) {
    ParallelRange(n, [&](int64_t b, int64_t e) { Map(e - b, functor, x + b, y + b); });
  });
  DISTRAIN_CHECK(known) << "unknown activation " << static_cast<int>(f.kind);
}

void ActivationBackward(ActivationFunction f, int64_t rows, int64_t cols, const float* x,
                        const float* y, const float* dy, float* dx) {
  const int64_t n = rows * cols;
  switch (f.kind) {
    case ActivationKind::kLinear:
      if (dx != dy) CopyFloats(n, dy, dx);
      return;
    case ActivationKind::kRelu:
      ParallelRange(n, [&](int64_t b, int64_t e) { ReluGrad(e - b, y + b, dy + b, dx + b); });
      return;
    case ActivationKind::kSoftmax:
      SoftmaxGradRows(rows, cols, y, dy, dx);
      return;
    default:
      break;
  }
  const float* saved = elementwise::GradientReadsInput(f.kind) ? x : y;
  const bool known = elementwise::WithGradientFunctor(f, [&](auto functor) {
    ParallelRange(n, [&](int64_t b, int64_t e) { Map2(e - b, functor, saved + b, dy + b, dx + b); });
  });
  DISTRAIN_CHECK(known) << "unknown activation " << static_cast<int>(f.kind);
}

void ScaleShift(int64_t n, float scale, float offset, const float* x, float* y) {
  ParallelRange(n, [&](int64_t b, int64_t e) {
    Map(e - b, elementwise::ScaleShift{scale, offset}, x + b, y + b);
  });
}

void DropoutForward(int64_t n, const elementwise::DropoutMask& f, const float* x, float* y,
                    float* mask) {
  for (int64_t i = 0; i < n; ++i) {
    const float m = f(static_cast<uint64_t>(i));
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

void Multiply(int64_t n, const float* a, const float* b, float* out) {
  Map2(n, [](float u, float v) { return u * v; }, a, b, out);
}

}  // namespace distrain::cpu

#include "worker/tensor/small_gemm.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>

#include "common/check.h"
#include "worker/tensor/cpu_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DISTRAIN_SMALL_GEMM_X86 1
#include <immintrin.h>
#endif

namespace distrain::cpu::internal {
namespace {

// A * B^T with k at most this goes through a transposed copy of B (RunNtSmallK).
constexpr int64_t kSmallK = 32;

}  // namespace

#if DISTRAIN_SMALL_GEMM_X86
namespace {

// Two tile shapes, both with alpha/beta applied once at the end:
//
//  * NN (C += A * B, B [k, n]): an MR x NV-vector block of C lives in
//    registers while k runs; each step loads NV vectors of one row of B and
//    broadcasts MR scalars of A. B is read in place (no packing); the column
//    panel (k rows x NV vectors) is reused by the m / MR row blocks from cache.
//  * NT (C = A * B^T, B [n, k]): every C element is a dot product of two
//    contiguous rows, so an MR x NR block of dot products is accumulated
//    lane-wise along k and reduced once at the end.
//
// The bodies are written once per instruction set rather than shared through
// a template: GCC refuses to inline target-specific intrinsics into code
// compiled for another target, and an AVX2 tile must not contain AVX-512.

using NnFn = void (*)(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, int last_cols, float alpha, float beta);
using NtFn = void (*)(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, float alpha, float beta);

// Name = {&Tile<1, ARGS>, &Tile<2, ARGS>, ..., &Tile<kRows, ARGS>}: one tile
// function per row count, so partial row blocks run unrolled code too.
#define DISTRAIN_TILE_ROWS(Name, Fn, Tile, kRows, ...)                                     \
  template <std::size_t... R>                                                              \
  constexpr std::array<Fn, sizeof...(R)> Name##Of(std::index_sequence<R...>) {             \
    return {{&Tile<static_cast<int>(R) + 1, __VA_ARGS__>...}};                             \
  }                                                                                        \
  constexpr auto Name = Name##Of(std::make_index_sequence<kRows>());

// ---------------------------------------------------------------- AVX-512F
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_*
// placeholders (GCC PR 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {

#define DISTRAIN_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))

constexpr int kW = 16;  // floats per vector
// NN: 8 rows x 3 vectors = 24 of the 32 registers accumulate. Two-vector
// panels take 12 rows; one-vector panels stay at 8: 12, 16 and 24 rows were
// measured slower (the row pointers of A run out of general registers).
constexpr int kNnNv = 3;
constexpr int NnRows(int nv) { return nv == 2 ? 12 : 8; }
constexpr int kNtMr = 4;  // 4 x 4 dot products + 4 + 4 loaded vectors
constexpr int kNtNr = 4;

template <int MR, int NV>
DISTRAIN_TARGET_AVX512 void NnTile(int64_t k, const float* a, int64_t lda, const float* b,
                                   int64_t ldb, float* c, int64_t ldc, int last_cols,
                                   float alpha, float beta) {
  const __mmask16 last = static_cast<__mmask16>((1u << last_cols) - 1u);
  __m512 acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* brow = b + p * ldb;
    __m512 bv[NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(brow + v * kW);
    // Masked-off lanes are not read, so the panel may end at the matrix's end.
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, brow + (NV - 1) * kW);

#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    float* crow = c + r * ldc;
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mask = v == NV - 1 ? last : static_cast<__mmask16>(0xffff);
      __m512 out = _mm512_mul_ps(va, acc[r][v]);
      // beta == 0 must not read C: it may hold NaN.
      if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, crow + v * kW), out);
      _mm512_mask_storeu_ps(crow + v * kW, mask, out);
    }
  }
}

// _mm512_reduce_add_ps would do, but GCC 12's version trips -Wuninitialized.
DISTRAIN_TARGET_AVX512 inline float HorizontalSum(__m512 v) {
  const __m512 s8 = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 s4 = _mm512_add_ps(s8, _mm512_shuffle_f32x4(s8, s8, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m128 x = _mm512_castps512_ps128(s4);
  const __m128 s2 = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int MR, int NR>
DISTRAIN_TARGET_AVX512 void NtTile(int64_t k, const float* a, int64_t lda, const float* b,
                                   int64_t ldb, float* c, int64_t ldc, float alpha,
                                   float beta) {
  __m512 acc[MR][NR];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  int64_t p = 0;
  for (; p + kW <= k; p += kW) {
    __m512 av[MR];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) av[r] = _mm512_loadu_ps(a + r * lda + p);
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m512 bj = _mm512_loadu_ps(b + j * ldb + p);
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], bj, acc[r][j]);
    }
  }
  if (p < k) {
    // The tail's missing lanes load as 0 and add 0 * 0.
    const __mmask16 tail = static_cast<__mmask16>((1u << (k - p)) - 1u);
    __m512 av[MR];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) av[r] = _mm512_maskz_loadu_ps(tail, a + r * lda + p);
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m512 bj = _mm512_maskz_loadu_ps(tail, b + j * ldb + p);
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], bj, acc[r][j]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const float sum = HorizontalSum(acc[r][j]);
      float* out = c + r * ldc + j;
      *out = beta == 0.0f ? alpha * sum : alpha * sum + beta * *out;
    }
  }
}

DISTRAIN_TILE_ROWS(kNn1, NnFn, NnTile, NnRows(1), 1)
DISTRAIN_TILE_ROWS(kNn2, NnFn, NnTile, NnRows(2), 2)
DISTRAIN_TILE_ROWS(kNn3, NnFn, NnTile, NnRows(3), 3)
DISTRAIN_TILE_ROWS(kNt1, NtFn, NtTile, kNtMr, 1)
DISTRAIN_TILE_ROWS(kNt2, NtFn, NtTile, kNtMr, 2)
DISTRAIN_TILE_ROWS(kNt3, NtFn, NtTile, kNtMr, 3)
DISTRAIN_TILE_ROWS(kNt4, NtFn, NtTile, kNtMr, 4)

// The mask register makes partial and full panels the same code.
inline NnFn PickNn(int nv, int mr, bool /*partial*/) {
  return nv == 1 ? kNn1[mr - 1] : nv == 2 ? kNn2[mr - 1] : kNn3[mr - 1];
}
inline NtFn PickNt(int nr, int mr) {
  return nr == 1 ? kNt1[mr - 1] : nr == 2 ? kNt2[mr - 1] : nr == 3 ? kNt3[mr - 1] : kNt4[mr - 1];
}

}  // namespace avx512
#pragma GCC diagnostic pop

// ------------------------------------------------------------ AVX2 + FMA
namespace avx2 {

#define DISTRAIN_TARGET_AVX2 __attribute__((target("avx2,fma")))

constexpr int kW = 8;
// 12 accumulators + the B vectors + 1 broadcast of 16 registers.
constexpr int kNnNv = 3;
constexpr int NnRows(int nv) { return nv == 1 ? 12 : nv == 2 ? 6 : 4; }
constexpr int kNtMr = 3;  // 3 x 4 dot products + 3 A vectors + 1 B vector
constexpr int kNtNr = 4;

DISTRAIN_TARGET_AVX2 inline __m256i LaneMask(int lanes) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

DISTRAIN_TARGET_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

// kPartial: the last vector is masked. Full panels use plain loads and
// stores because the mask costs a register (there are only 16) and
// vmaskmovps stores are microcoded on AMD.
template <int MR, int NV, bool kPartial>
DISTRAIN_TARGET_AVX2 void NnTile(int64_t k, const float* a, int64_t lda, const float* b,
                                 int64_t ldb, float* c, int64_t ldc, int last_cols, float alpha,
                                 float beta) {
  const __m256i last = LaneMask(last_cols);
  __m256 acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* brow = b + p * ldb;
    __m256 bv[NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm256_loadu_ps(brow + v * kW);
    bv[NV - 1] = kPartial ? _mm256_maskload_ps(brow + (NV - 1) * kW, last)
                          : _mm256_loadu_ps(brow + (NV - 1) * kW);

#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha);
  const __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    float* crow = c + r * ldc;
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      __m256 out = _mm256_mul_ps(va, acc[r][v]);
      if (kPartial && v == NV - 1) {
        if (beta != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_maskload_ps(crow + v * kW, last), out);
        _mm256_maskstore_ps(crow + v * kW, last, out);
      } else {
        if (beta != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_loadu_ps(crow + v * kW), out);
        _mm256_storeu_ps(crow + v * kW, out);
      }
    }
  }
}

template <int MR, int NR>
DISTRAIN_TARGET_AVX2 void NtTile(int64_t k, const float* a, int64_t lda, const float* b,
                                 int64_t ldb, float* c, int64_t ldc, float alpha, float beta) {
  __m256 acc[MR][NR];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  int64_t p = 0;
  for (; p + kW <= k; p += kW) {
    __m256 av[MR];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) av[r] = _mm256_loadu_ps(a + r * lda + p);
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m256 bj = _mm256_loadu_ps(b + j * ldb + p);
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm256_fmadd_ps(av[r], bj, acc[r][j]);
    }
  }
  if (p < k) {
    const __m256i tail = LaneMask(static_cast<int>(k - p));
    __m256 av[MR];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) av[r] = _mm256_maskload_ps(a + r * lda + p, tail);
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m256 bj = _mm256_maskload_ps(b + j * ldb + p, tail);
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm256_fmadd_ps(av[r], bj, acc[r][j]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const float sum = HorizontalSum(acc[r][j]);
      float* out = c + r * ldc + j;
      *out = beta == 0.0f ? alpha * sum : alpha * sum + beta * *out;
    }
  }
}

DISTRAIN_TILE_ROWS(kNn1, NnFn, NnTile, NnRows(1), 1, false)
DISTRAIN_TILE_ROWS(kNn1Partial, NnFn, NnTile, NnRows(1), 1, true)
DISTRAIN_TILE_ROWS(kNn2, NnFn, NnTile, NnRows(2), 2, false)
DISTRAIN_TILE_ROWS(kNn2Partial, NnFn, NnTile, NnRows(2), 2, true)
DISTRAIN_TILE_ROWS(kNn3, NnFn, NnTile, NnRows(3), 3, false)
DISTRAIN_TILE_ROWS(kNn3Partial, NnFn, NnTile, NnRows(3), 3, true)
DISTRAIN_TILE_ROWS(kNt1, NtFn, NtTile, kNtMr, 1)
DISTRAIN_TILE_ROWS(kNt2, NtFn, NtTile, kNtMr, 2)
DISTRAIN_TILE_ROWS(kNt3, NtFn, NtTile, kNtMr, 3)
DISTRAIN_TILE_ROWS(kNt4, NtFn, NtTile, kNtMr, 4)

inline NnFn PickNn(int nv, int mr, bool partial) {
  if (nv == 1) return partial ? kNn1Partial[mr - 1] : kNn1[mr - 1];
  if (nv == 2) return partial ? kNn2Partial[mr - 1] : kNn2[mr - 1];
  return partial ? kNn3Partial[mr - 1] : kNn3[mr - 1];
}
inline NtFn PickNt(int nr, int mr) {
  return nr == 1 ? kNt1[mr - 1] : nr == 2 ? kNt2[mr - 1] : nr == 3 ? kNt3[mr - 1] : kNt4[mr - 1];
}

}  // namespace avx2

#undef DISTRAIN_TILE_ROWS

// ---------------------------------------------------------------- drivers

// Scalar loops over tiles, shared by both instruction sets (K is avx512 or
// avx2 wrapped in a struct below); the tile order is fixed, so it has no
// bearing on the bits.

// Column panel outer, row blocks inner: the panel of B (k x NV vectors) is
// fetched from memory once and then served from cache to the other row blocks.
template <class K>
void RunNn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c) {
  constexpr int64_t kPanel = K::kNnNv * K::kW;
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int cols = static_cast<int>(std::min(kPanel, n - j0));
    const int nv = (cols + K::kW - 1) / K::kW;
    const int last = cols - (nv - 1) * K::kW;
    const int rows = K::NnRows(nv);
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
      const int mr = static_cast<int>(std::min<int64_t>(rows, m - i0));
      K::PickNn(nv, mr, last != K::kW)(k, a + i0 * lda, lda, b + j0, ldb, c + i0 * n + j0, n,
                                        last, alpha, beta);
    }
  }
}

// Only for k <= kSmallK: copies a column panel of B^T (k x NV vectors) into
// an L1 buffer and runs the NN tiles on it. With so short a k, lane-wise dot
// products would waste most lanes and spend their time in the reductions.
template <class K>
void RunNtSmallK(int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
                 float beta, float* c) {
  constexpr int64_t kPanel = K::kNnNv * K::kW;
  alignas(64) float bt[kSmallK * kPanel];
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int cols = static_cast<int>(std::min(kPanel, n - j0));
    for (int jj = 0; jj < cols; ++jj) {
      const float* brow = b + (j0 + jj) * k;
      for (int64_t p = 0; p < k; ++p) bt[p * kPanel + jj] = brow[p];
    }
    const int nv = (cols + K::kW - 1) / K::kW;
    const int last = cols - (nv - 1) * K::kW;
    const int rows = K::NnRows(nv);
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
      const int mr = static_cast<int>(std::min<int64_t>(rows, m - i0));
      K::PickNn(nv, mr, last != K::kW)(k, a + i0 * k, k, bt, kPanel, c + i0 * n + j0, n, last,
                                        alpha, beta);
    }
  }
}

// Blocks of B rows outer (they stay in L1 while every row block of A streams
// past), row blocks of A inner.
template <class K>
void RunNt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
           float beta, float* c) {
  if (k <= kSmallK) {
    RunNtSmallK<K>(m, n, k, alpha, a, b, beta, c);
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += K::kNtNr) {
    const int nr = static_cast<int>(std::min<int64_t>(K::kNtNr, n - j0));
    for (int64_t i0 = 0; i0 < m; i0 += K::kNtMr) {
      const int mr = static_cast<int>(std::min<int64_t>(K::kNtMr, m - i0));
      K::PickNt(nr, mr)(k, a + i0 * k, k, b + j0 * k, k, c + i0 * n + j0, n, alpha, beta);
    }
  }
}

struct Avx512Kernels {
  static constexpr int kW = avx512::kW, kNnNv = avx512::kNnNv;
  static constexpr int kNtMr = avx512::kNtMr, kNtNr = avx512::kNtNr;
  static constexpr int NnRows(int nv) { return avx512::NnRows(nv); }
  static NnFn PickNn(int nv, int mr, bool partial) { return avx512::PickNn(nv, mr, partial); }
  static NtFn PickNt(int nr, int mr) { return avx512::PickNt(nr, mr); }
};
struct Avx2Kernels {
  static constexpr int kW = avx2::kW, kNnNv = avx2::kNnNv;
  static constexpr int kNtMr = avx2::kNtMr, kNtNr = avx2::kNtNr;
  static constexpr int NnRows(int nv) { return avx2::NnRows(nv); }
  static NnFn PickNn(int nv, int mr, bool partial) { return avx2::PickNn(nv, mr, partial); }
  static NtFn PickNt(int nr, int mr) { return avx2::PickNt(nr, mr); }
};

template <class K>
void Run(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
         const float* b, float beta, float* c) {
  if (trans_b) {
    RunNt<K>(m, n, k, alpha, a, b, beta, c);
  } else {
    RunNn<K>(m, n, k, alpha, a, k, b, n, beta, c);
  }
}

SmallGemmIsa Detect() {
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the vector state.
  if (__builtin_cpu_supports("avx512f")) return SmallGemmIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return SmallGemmIsa::kAvx2;
  }
  return SmallGemmIsa::kNone;
}

}  // namespace
#endif  // DISTRAIN_SMALL_GEMM_X86

SmallGemmIsa DetectSmallGemmIsa() {
#if DISTRAIN_SMALL_GEMM_X86
  static const SmallGemmIsa isa = Detect();
  return isa;
#else
  return SmallGemmIsa::kNone;
#endif
}

const char* SmallGemmIsaName(SmallGemmIsa isa) {
  switch (isa) {
    case SmallGemmIsa::kAvx512:
      return "avx512f";
    case SmallGemmIsa::kAvx2:
      return "avx2+fma";
    case SmallGemmIsa::kNone:
      break;
  }
  return "none";
}

bool SmallGemmRoutes(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  if (trans_a || m < 1 || n < 1 || k < 1) return false;
  // Thresholds from bench/gemm_small.cc on a Zen 4 core against OpenBLAS
  // 0.3.21 on one thread, with both its default kernels there (Cooperlake)
  // and its Haswell ones (what an AVX2-only CPU gets): a shape is routed
  // where the kernels won against both (bench/README.md, "Small-M GEMM").
  switch (DetectSmallGemmIsa()) {
    case SmallGemmIsa::kAvx512: {
      // AVX-512 CPUs fall back to oneDNN (cpu_math.cc) unless its ISA is
      // capped below AVX-512; against oneDNN, measured on a Zen 5 EPYC
      // (bench/README.md, "GEMM backend"), the two shapes below moved.
      const bool against_onednn = cpu::internal::OneDnnRunsProducts();
      if (trans_b) {
        // Short dot products: the transposed-panel path; OpenBLAS wins below
        // 16 rows, oneDNN below 256 (the kernels were 0.65-0.87x of it for
        // 16 to 128 rows, 1.48x at 256).
        if (k <= kSmallK) return m >= (against_onednn ? 256 : 16);
        return m <= 48;
      }
      // One partial vector of columns (n = 10 logits) wastes lanes; OpenBLAS's
      // Cooperlake kernel was 5-11% faster for 24..96 rows, oneDNN 6-12% for
      // 16 to 256 rows.
      if (n < 16) return !against_onednn && (m <= 16 || m >= 128);
      // A short inner dimension (a parameter server forming x^T dy over a
      // batch of 32: K = 32) keeps the A tile in L1 and B in L2 at any row
      // count: 1.19-1.29x OpenBLAS (which also zero-fills C first) for 64 to
      // 1024 rows.
      if (k <= 32) return m >= 4;
      // Beyond 64 rows the lead over OpenBLAS shrinks to 3-20% (and its
      // Haswell kernels draw level); against oneDNN at 32 rows 0.97-1.07x.
      return m >= 4 && m <= 64;
    }
    case SmallGemmIsa::kAvx2:
      if (trans_b) {
        if (k <= kSmallK) return m >= 16;
        return m <= 32;
      }
      // With 16 registers and B read in place, the wide NN tile stayed at
      // 55-60% of OpenBLAS's packed Haswell kernel; only narrow B wins.
      return n <= 16;
    case SmallGemmIsa::kNone:
      break;
  }
  return false;
}

void SmallGemm(SmallGemmIsa isa, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, const float* b, float beta, float* c) {
  DISTRAIN_CHECK(m >= 1 && n >= 1 && k >= 1) << "m=" << m << " n=" << n << " k=" << k;
#if DISTRAIN_SMALL_GEMM_X86
  DISTRAIN_CHECK(isa != SmallGemmIsa::kNone && isa <= DetectSmallGemmIsa())
      << SmallGemmIsaName(isa) << " kernels on a CPU with "
      << SmallGemmIsaName(DetectSmallGemmIsa());
  if (isa == SmallGemmIsa::kAvx512) {
    Run<Avx512Kernels>(trans_b, m, n, k, alpha, a, b, beta, c);
  } else {
    Run<Avx2Kernels>(trans_b, m, n, k, alpha, a, b, beta, c);
  }
#else
  DISTRAIN_CHECK(false) << "no small-GEMM kernels in this build";
#endif
}

}  // namespace distrain::cpu::internal

#include "worker/collective/reduce_kernel.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DISTRAIN_X86 1
#endif

namespace distrain::collective_internal {
namespace {

// One body per kernel, instantiated per vector width inside functions that
// carry the width's target attribute (so GCC emits that set's instructions
// for it). Loads and stores through memcpy: unaligned and alias-safe. They
// are always inlined into a function of their width's set, so the ABI of a
// wide vector passed between sets (what -Wpsabi warns about) never arises.
// Store takes its vector by reference all the same: for a 64-byte parameter
// by value GCC prints its -Wpsabi "ABI ... has changed" note despite the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <typename V>
__attribute__((always_inline)) inline V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
__attribute__((always_inline)) inline void Store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

template <typename V>
__attribute__((always_inline)) inline void AddIntoBody(float* __restrict dst, const float* __restrict src, size_t n) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
  size_t i = 0;
  // Four vectors a round: enough independent loads to cover their latency.
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const V a0 = Load<V>(dst + i) + Load<V>(src + i);
    const V a1 = Load<V>(dst + i + kLanes) + Load<V>(src + i + kLanes);
    const V a2 = Load<V>(dst + i + 2 * kLanes) + Load<V>(src + i + 2 * kLanes);
    const V a3 = Load<V>(dst + i + 3 * kLanes) + Load<V>(src + i + 3 * kLanes);
    Store<V>(dst + i, a0);
    Store<V>(dst + i + kLanes, a1);
    Store<V>(dst + i + 2 * kLanes, a2);
    Store<V>(dst + i + 3 * kLanes, a3);
  }
  for (; i + kLanes <= n; i += kLanes) Store<V>(dst + i, Load<V>(dst + i) + Load<V>(src + i));
  for (; i < n; ++i) dst[i] += src[i];
}

template <typename V>
__attribute__((always_inline)) inline void AddIntoAndDivideBody(float* __restrict dst, const float* __restrict src, size_t n,
                                 float divisor) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
  V d;
  for (size_t l = 0; l < kLanes; ++l) d[l] = divisor;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store<V>(dst + i, (Load<V>(dst + i) + Load<V>(src + i)) / d);
  for (; i < n; ++i) dst[i] = (dst[i] + src[i]) / divisor;
}

template <typename V>
__attribute__((always_inline)) inline void DivideInPlaceBody(float* dst, size_t n, float divisor) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
  V d;
  for (size_t l = 0; l < kLanes; ++l) d[l] = divisor;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store<V>(dst + i, Load<V>(dst + i) / d);
  for (; i < n; ++i) dst[i] /= divisor;
}
#pragma GCC diagnostic pop

using Generic4 = float __attribute__((vector_size(16)));

void AddIntoGeneric(float* __restrict dst, const float* __restrict src, size_t n) {
  AddIntoBody<Generic4>(dst, src, n);
}
void AddIntoAndDivideGeneric(float* __restrict dst, const float* __restrict src, size_t n,
                             float divisor) {
  AddIntoAndDivideBody<Generic4>(dst, src, n, divisor);
}
void DivideInPlaceGeneric(float* dst, size_t n, float divisor) {
  DivideInPlaceBody<Generic4>(dst, n, divisor);
}
void StreamCopyGeneric(float* __restrict dst, const float* __restrict src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

#ifdef DISTRAIN_X86
// The head up to the first `align`-byte boundary with plain stores (streaming
// stores need aligned addresses); floats are 4-byte aligned, so this ends.
inline size_t CopyHead(float* dst, const float* src, size_t n, uintptr_t align) {
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & (align - 1)) != 0; ++i) dst[i] = src[i];
  return i;
}

// SSE2: the x86-64 baseline (Generic4 compiles to it).
void StreamCopySse2(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = CopyHead(dst, src, n, 16);
  for (; i + 16 <= n; i += 16) {
    const __m128 a0 = _mm_loadu_ps(src + i);
    const __m128 a1 = _mm_loadu_ps(src + i + 4);
    const __m128 a2 = _mm_loadu_ps(src + i + 8);
    const __m128 a3 = _mm_loadu_ps(src + i + 12);
    _mm_stream_ps(dst + i, a0);
    _mm_stream_ps(dst + i + 4, a1);
    _mm_stream_ps(dst + i + 8, a2);
    _mm_stream_ps(dst + i + 12, a3);
  }
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}

using Avx8 = float __attribute__((vector_size(32)));
#define DISTRAIN_AVX2 __attribute__((target("avx2")))

DISTRAIN_AVX2 void AddIntoAvx2(float* __restrict dst, const float* __restrict src, size_t n) {
  AddIntoBody<Avx8>(dst, src, n);
}
DISTRAIN_AVX2 void AddIntoAndDivideAvx2(float* __restrict dst, const float* __restrict src,
                                        size_t n, float divisor) {
  AddIntoAndDivideBody<Avx8>(dst, src, n, divisor);
}
DISTRAIN_AVX2 void DivideInPlaceAvx2(float* dst, size_t n, float divisor) {
  DivideInPlaceBody<Avx8>(dst, n, divisor);
}
DISTRAIN_AVX2 void StreamCopyAvx2(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = CopyHead(dst, src, n, 32);
  for (; i + 32 <= n; i += 32) {
    const __m256 a0 = _mm256_loadu_ps(src + i);
    const __m256 a1 = _mm256_loadu_ps(src + i + 8);
    const __m256 a2 = _mm256_loadu_ps(src + i + 16);
    const __m256 a3 = _mm256_loadu_ps(src + i + 24);
    _mm256_stream_ps(dst + i, a0);
    _mm256_stream_ps(dst + i + 8, a1);
    _mm256_stream_ps(dst + i + 16, a2);
    _mm256_stream_ps(dst + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}

using Avx16 = float __attribute__((vector_size(64)));
#define DISTRAIN_AVX512 __attribute__((target("avx512f")))

DISTRAIN_AVX512 void AddIntoAvx512(float* __restrict dst, const float* __restrict src, size_t n) {
  AddIntoBody<Avx16>(dst, src, n);
}
DISTRAIN_AVX512 void AddIntoAndDivideAvx512(float* __restrict dst, const float* __restrict src,
                                            size_t n, float divisor) {
  AddIntoAndDivideBody<Avx16>(dst, src, n, divisor);
}
DISTRAIN_AVX512 void DivideInPlaceAvx512(float* dst, size_t n, float divisor) {
  DivideInPlaceBody<Avx16>(dst, n, divisor);
}
DISTRAIN_AVX512 void StreamCopyAvx512(float* __restrict dst, const float* __restrict src,
                                      size_t n) {
  // Loads through memcpy into locals (no call returning a 512-bit vector:
  // clang refuses that ABI outside an avx512f function, and GCC 12 warns
  // about _mm512_loadu_ps's own undefined-value idiom).
  size_t i = CopyHead(dst, src, n, 64);
  __m512 a0, a1, a2, a3;
  for (; i + 64 <= n; i += 64) {
    std::memcpy(&a0, src + i, sizeof(a0));
    std::memcpy(&a1, src + i + 16, sizeof(a1));
    std::memcpy(&a2, src + i + 32, sizeof(a2));
    std::memcpy(&a3, src + i + 48, sizeof(a3));
    _mm512_stream_ps(dst + i, a0);
    _mm512_stream_ps(dst + i + 16, a1);
    _mm512_stream_ps(dst + i + 32, a2);
    _mm512_stream_ps(dst + i + 48, a3);
  }
  for (; i + 16 <= n; i += 16) {
    std::memcpy(&a0, src + i, sizeof(a0));
    _mm512_stream_ps(dst + i, a0);
  }
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}
#endif  // DISTRAIN_X86

constexpr ReduceKernels kGeneric = {ReduceIsa::kGeneric, "generic", AddIntoGeneric,
                                    AddIntoAndDivideGeneric, DivideInPlaceGeneric,
                                    StreamCopyGeneric};
#ifdef DISTRAIN_X86
constexpr ReduceKernels kSse2 = {ReduceIsa::kSse2, "sse2", AddIntoGeneric, AddIntoAndDivideGeneric,
                                 DivideInPlaceGeneric, StreamCopySse2};
constexpr ReduceKernels kAvx2 = {ReduceIsa::kAvx2, "avx2", AddIntoAvx2, AddIntoAndDivideAvx2,
                                 DivideInPlaceAvx2, StreamCopyAvx2};
constexpr ReduceKernels kAvx512 = {ReduceIsa::kAvx512, "avx512", AddIntoAvx512,
                                   AddIntoAndDivideAvx512, DivideInPlaceAvx512, StreamCopyAvx512};
#endif

const ReduceKernels& Choose() {
  ReduceIsa ceiling = ReduceIsa::kAvx512;
  if (const char* forced = std::getenv("DISTRAIN_REDUCE_ISA"); forced != nullptr) {
    const std::string f = forced;
    if (f == "generic") ceiling = ReduceIsa::kGeneric;
    if (f == "sse2") ceiling = ReduceIsa::kSse2;
    if (f == "avx2") ceiling = ReduceIsa::kAvx2;
  }
  for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2, ReduceIsa::kSse2}) {
    if (isa > ceiling) continue;
    if (const ReduceKernels* k = ReduceKernelsFor(isa)) return *k;
  }
  return kGeneric;
}

}  // namespace

const ReduceKernels* ReduceKernelsFor(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kGeneric:
      return &kGeneric;
#ifdef DISTRAIN_X86
    case ReduceIsa::kSse2:
      return &kSse2;
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") ? &kAvx2 : nullptr;
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") ? &kAvx512 : nullptr;
#endif
    default:
      return nullptr;
  }
}

const ReduceKernels& ActiveReduceKernels() {
  static const ReduceKernels& kernels = Choose();
  return kernels;
}

}  // namespace distrain::collective_internal

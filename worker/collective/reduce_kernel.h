#ifndef DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_
#define DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

// Element-wise float kernels shared by the collectives. Written with GCC/Clang
// vector extensions because the build's -O2 does not auto-vectorise loops
// with an unknown trip count; 4-wide vectors are the SSE2/NEON baseline every
// x86-64/arm64 target has. Loads and stores go through memcpy, so no
// alignment is assumed.
//
// StreamCopy writes the caller's vector with non-temporal stores: the ring
// all-reduce writes each final value once and does not read it again, so
// going around the cache saves reading the destination line first (the
// read-for-ownership a plain store pays when the vector is larger than the
// cache) and keeps the staging buffer cached. SSE2 (baseline x86-64);
// elsewhere a plain copy.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace distrain::collective_internal {

using Float4 = float __attribute__((vector_size(16)));

inline Float4 Load4(const float* p) {
  Float4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store4(float* p, Float4 v) { std::memcpy(p, &v, sizeof(v)); }

// dst[i] += src[i].
inline void AddInto(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Float4 a0 = Load4(dst + i) + Load4(src + i);
    Float4 a1 = Load4(dst + i + 4) + Load4(src + i + 4);
    Float4 a2 = Load4(dst + i + 8) + Load4(src + i + 8);
    Float4 a3 = Load4(dst + i + 12) + Load4(src + i + 12);
    Store4(dst + i, a0);
    Store4(dst + i + 4, a1);
    Store4(dst + i + 8, a2);
    Store4(dst + i + 12, a3);
  }
  for (; i < n; ++i) dst[i] += src[i];
}

// dst[i] = (dst[i] + src[i]) / divisor: the last step of a mean.
inline void AddIntoAndDivide(float* __restrict dst, const float* __restrict src, size_t n,
                             float divisor) {
  const Float4 d = {divisor, divisor, divisor, divisor};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) Store4(dst + i, (Load4(dst + i) + Load4(src + i)) / d);
  for (; i < n; ++i) dst[i] = (dst[i] + src[i]) / divisor;
}

// dst[i] /= divisor.
inline void DivideInPlace(float* dst, size_t n, float divisor) {
  const Float4 d = {divisor, divisor, divisor, divisor};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) Store4(dst + i, Load4(dst + i) / d);
  for (; i < n; ++i) dst[i] /= divisor;
}

// dst[i] = src[i], bypassing the cache where the target has non-temporal
// stores. Fenced before returning, so the values are ordered like ordinary
// stores for whoever reads them next.
inline void StreamCopy(float* __restrict dst, const float* __restrict src, size_t n) {
#if defined(__SSE2__)
  size_t i = 0;
  // Up to the first 16-byte boundary with plain stores (streaming stores
  // need aligned addresses); floats are 4-byte aligned, so this ends.
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
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
#else
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
#endif
}

}  // namespace distrain::collective_internal

#endif  // DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

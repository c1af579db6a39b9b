#ifndef DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_
#define DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

// Element-wise float kernels shared by the collectives. Written with GCC/Clang
// vector extensions because the build's -O2 does not auto-vectorise loops
// with an unknown trip count; 4-wide vectors are the SSE2/NEON baseline every
// x86-64/arm64 target has. Loads and stores go through memcpy, so no
// alignment is assumed.

#include <cstddef>
#include <cstring>

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

}  // namespace distrain::collective_internal

#endif  // DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

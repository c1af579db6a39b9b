#ifndef DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_
#define DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

// Element-wise float kernels shared by the collectives, compiled for several
// instruction sets and chosen once per process from what the CPU reports
// (cpuid through __builtin_cpu_supports): AVX-512F, AVX2, else the SSE2
// baseline every x86-64 has (elsewhere: 4-wide generic vectors). One build
// runs at its best on a Zen 4 with AVX-512 and on an EPYC with AVX2 only,
// without -march flags that would make the binary unportable.
// DISTRAIN_REDUCE_ISA=sse2|avx2|avx512 forces a narrower set (benchmarks
// compare them on one machine); a set the CPU lacks falls back to the best
// it has.
//
// The math is the same for every set: element-wise IEEE single-precision add
// and divide, so results are bit-identical whichever runs (the tests check).
// Loads are unaligned; nothing assumes alignment.
//
// StreamCopy writes the caller's vector with non-temporal stores: the ring
// all-reduce writes each final value once and does not read it again, so
// going around the cache saves reading the destination line first (the
// read-for-ownership a plain store pays when the vector is larger than the
// cache) and keeps the staging buffer cached. Fenced before returning, so the
// values are ordered like ordinary stores for whoever reads them next.
//
// Thread-safety: the choice is made once (a function-local static); every
// kernel is reentrant.

#include <cstddef>

namespace distrain::collective_internal {

enum class ReduceIsa { kGeneric, kSse2, kAvx2, kAvx512 };

struct ReduceKernels {
  ReduceIsa isa;
  const char* name;  // "avx512", "avx2", "sse2", "generic"
  // dst[i] += src[i].
  void (*add_into)(float* __restrict dst, const float* __restrict src, size_t n);
  // dst[i] = (dst[i] + src[i]) / divisor: the last step of a mean.
  void (*add_into_and_divide)(float* __restrict dst, const float* __restrict src, size_t n,
                              float divisor);
  // dst[i] /= divisor.
  void (*divide_in_place)(float* dst, size_t n, float divisor);
  // dst[i] = src[i], bypassing the cache where the set has non-temporal stores.
  void (*stream_copy)(float* __restrict dst, const float* __restrict src, size_t n);
};

// The kernels this process uses (the widest set the CPU has, or the one
// DISTRAIN_REDUCE_ISA names).
const ReduceKernels& ActiveReduceKernels();
// The kernels of `isa`, or null when this CPU (or build) cannot run them.
const ReduceKernels* ReduceKernelsFor(ReduceIsa isa);

inline void AddInto(float* __restrict dst, const float* __restrict src, size_t n) {
  ActiveReduceKernels().add_into(dst, src, n);
}
inline void AddIntoAndDivide(float* __restrict dst, const float* __restrict src, size_t n,
                             float divisor) {
  ActiveReduceKernels().add_into_and_divide(dst, src, n, divisor);
}
inline void DivideInPlace(float* dst, size_t n, float divisor) {
  ActiveReduceKernels().divide_in_place(dst, n, divisor);
}
inline void StreamCopy(float* __restrict dst, const float* __restrict src, size_t n) {
  ActiveReduceKernels().stream_copy(dst, src, n);
}

}  // namespace distrain::collective_internal

#endif  // DISTRAIN_WORKER_COLLECTIVE_REDUCE_KERNEL_H_

#ifndef DISTRAIN_WORKER_TENSOR_SMALL_GEMM_H_
#define DISTRAIN_WORKER_TENSOR_SMALL_GEMM_H_

// A single-precision GEMM for few rows (a batch of 32-256 activations times a
// weight matrix), the shapes of Dense::Forward and of the input gradient in
// Dense::Backward. OpenBLAS packs all of B for every call, which for M = 32
// costs as much as a tenth of the product; these kernels read B (the weights)
// where it lies, once per column panel, and keep the M rows of A and the
// accumulators in registers and L1/L2.
//
// cpu::Gemm (cpu_math.cc) is the only production caller: with one BLAS thread
// it asks SmallGemmRoutes() and falls back to cblas_sgemm for everything else
// (OpenBLAS on several threads beat these single-threaded kernels). The
// rest of this header exists for the unit test and bench/gemm_small.cc, which
// run each instruction set side by side with OpenBLAS.
//
// Kernels: AVX-512F and AVX2+FMA, picked at run time (the build targets
// generic x86-64). Conventions are cpu::Gemm's: row-major, dense, C may not
// alias A or B, beta == 0 ignores C's contents (even NaN).
//
// Determinism: every element of C is computed by one fixed sequence of float
// operations that depends only on the shape and the instruction set, never on
// alignment, on the thread count or on what else runs, so equal inputs give
// bit-identical outputs (the kernels are single-threaded). For A*B (no
// transpose) the sequence is a plain
// k = 0, 1, ... chain of fused multiply-adds, so the AVX2 and AVX-512 kernels
// agree bit for bit too; for A*B^T the lanes of a dot product are summed in a
// width-dependent order, so the two instruction sets may differ in the last
// bits (one machine always uses the same one).
//
// Thread-safety: all functions are reentrant; nothing allocates, nothing is
// shared except the instruction set, detected once.

#include <cstdint>

namespace distrain::cpu::internal {

enum class SmallGemmIsa { kNone, kAvx2, kAvx512 };

// The best kernel set this CPU runs (kNone: neither AVX2+FMA nor AVX-512F,
// or a non-x86 build). Detected once, then constant.
SmallGemmIsa DetectSmallGemmIsa();
const char* SmallGemmIsaName(SmallGemmIsa isa);

// True when cpu::Gemm, on one BLAS thread, should use SmallGemm for this call:
// a kernel set exists, the combination is implemented (!trans_a) and the shape
// is one where the kernels measured faster than single-threaded OpenBLAS
// (bench/README.md, "Small-M GEMM"). Depends only on the shape and the CPU.
bool SmallGemmRoutes(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);

// C[m, n] = alpha * A * op(B) + beta * C with A [m, k] and B [k, n] (or [n, k]
// when trans_b), using `isa`'s kernels; any m, n, k >= 1. `isa` must be
// supported by this CPU (<= DetectSmallGemmIsa()) and not kNone.
void SmallGemm(SmallGemmIsa isa, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, const float* b, float beta, float* c);

}  // namespace distrain::cpu::internal

#endif  // DISTRAIN_WORKER_TENSOR_SMALL_GEMM_H_

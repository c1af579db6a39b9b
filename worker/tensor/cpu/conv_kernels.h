#ifndef DISTRAIN_WORKER_TENSOR_CPU_CONV_KERNELS_H_
#define DISTRAIN_WORKER_TENSOR_CPU_CONV_KERNELS_H_

// The Conv2D implementations window_ops.cc chooses among, by name, so the
// benchmark (bench/conv_ops.cc) can time each on the same buffers:
//   * Onednn: oneDNN primitives on the plain nhwc/hwio layouts (window_ops.cc);
//   * Gemm: im2col of a block of images, then one cpu::Gemm (OpenBLAS) per
//     block; the HWIO kernel is already the [kh*kw*c, f] matrix the product
//     needs.
// (Direct loops for one input channel, vectorised over the filters, were
// measured too and lost to oneDNN's blocked kernels: bench/README.md.)
// Same layouts and semantics as window_ops.h. Internal to the CPU backend
// and the benchmark. The own kernels are in conv_kernels.cc.
//
// Ownership: the Gemm kernels' scratch (the im2col blocks) is per thread,
// thread_local, grown on demand and kept. Thread-safety: reentrant. The Gemm
// kernels run on OpenBLAS's process-wide pool, the oneDNN ones on the calling
// thread's OpenMP team.

#include "worker/tensor/ops.h"

namespace distrain::cpu::internal {

// kPlain: oneDNN runs on the callers' nhwc/hwio buffers as they are.
// kChosen: oneDNN picks its layouts (format_tag::any, blocked for the
// direct JIT kernels); the arguments it wants otherwise are reordered into
// and out of per-thread staging memory around the primitive.
// kChosenWeights: images stay nhwc, oneDNN picks the kernel's layout only
// (a reorder of a few KiB per call instead of whole activations).
enum class ConvLayout { kPlain, kChosen, kChosenWeights };
// `bf16`: the float inputs hold bfloat16 values (mixed_bfloat16); they are
// converted (exactly) into bfloat16 staging copies and the convolution runs
// on oneDNN's bfloat16 kernels, accumulating and writing float32. Only where
// NativeBf16Convolutions().
void ConvForwardOnednn(const ops::Window2D& w, const float* x, const float* kernel,
                       const float* bias, float* y, ConvLayout layout, bool bf16 = false);
// `dy_bf16` (with bf16 only): dy already converted to bfloat16 (nhwc), which
// the pass reads instead of staging dy itself; dy is then unused.
void ConvBackwardDataOnednn(const ops::Window2D& w, const float* dy, const float* kernel,
                            float* dx, ConvLayout layout, bool bf16 = false,
                            const uint16_t* dy_bf16 = nullptr);
void ConvBackwardWeightsOnednn(const ops::Window2D& w, const float* x, const float* dy,
                               float* dkernel, float* dbias, ConvLayout layout, bool bf16 = false,
                               const uint16_t* dy_bf16 = nullptr);
// Whether this CPU has bfloat16 dot-product instructions oneDNN uses
// (AVX512-BF16 or AMX). Elsewhere oneDNN would emulate them, slower than
// float32, so mixed_bfloat16 stays on the float32 kernels there.
bool NativeBf16Convolutions();

void ConvForwardGemm(const ops::Window2D& w, const float* x, const float* kernel,
                     const float* bias, float* y);
void ConvBackwardDataGemm(const ops::Window2D& w, const float* dy, const float* kernel, float* dx);
void ConvBackwardWeightsGemm(const ops::Window2D& w, const float* x, const float* dy,
                             float* dkernel, float* dbias);

}  // namespace distrain::cpu::internal

#endif  // DISTRAIN_WORKER_TENSOR_CPU_CONV_KERNELS_H_

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
void ConvForwardOnednn(const ops::Window2D& w, const float* x, const float* kernel,
                       const float* bias, float* y, ConvLayout layout);
void ConvBackwardDataOnednn(const ops::Window2D& w, const float* dy, const float* kernel,
                            float* dx, ConvLayout layout);
void ConvBackwardWeightsOnednn(const ops::Window2D& w, const float* x, const float* dy,
                               float* dkernel, float* dbias, ConvLayout layout);

void ConvForwardGemm(const ops::Window2D& w, const float* x, const float* kernel,
                     const float* bias, float* y);
void ConvBackwardDataGemm(const ops::Window2D& w, const float* dy, const float* kernel, float* dx);
void ConvBackwardWeightsGemm(const ops::Window2D& w, const float* x, const float* dy,
                             float* dkernel, float* dbias);

}  // namespace distrain::cpu::internal

#endif  // DISTRAIN_WORKER_TENSOR_CPU_CONV_KERNELS_H_

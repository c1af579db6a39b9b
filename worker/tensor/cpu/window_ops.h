#ifndef DISTRAIN_WORKER_TENSOR_CPU_WINDOW_OPS_H_
#define DISTRAIN_WORKER_TENSOR_CPU_WINDOW_OPS_H_

// The CPU backend of ops.h's windowed and normalisation ops: Conv2D, 2-D
// pooling, batch norm and global average pooling on raw host buffers. ops.h
// (worker/tensor/ops_window.cc) checks shapes and sizes the outputs, then
// calls these; nothing else should.
//
// Convolution, pooling and batch norm run on oneDNN (the library under
// TensorFlow's own CPU path) over the callers' buffers in place — memory
// objects wrap the pointers, no copies; see window_ops.cc for where an own
// kernel was measured faster and replaces it. Global average pooling is a
// plain loop.
//
// Layouts are ops.h's: images NHWC, kernels HWIO, batch-norm data [m, c]
// row-major.
//
// Ownership: the functions own nothing the caller passes; each thread keeps
// its own cache of oneDNN primitives and scratch memory (thread_local,
// released at thread exit), keyed by geometry and by the thread's OpenMP
// thread count. Thread-safety: reentrant; distinct threads never share a
// primitive or a stream. The first call for a geometry on a thread builds
// the primitive (milliseconds), later calls reuse it.

#include <cstdint>

#include "worker/tensor/ops.h"

namespace distrain::cpu {

// y = conv(x, kernel) + bias (bias may be null). `compute` as ops.h's: under
// kBfloat16 the inputs hold bfloat16 values, and a CPU with bfloat16 dot
// products runs the pass on oneDNN's bfloat16 kernels (float32 out).
void Conv2DForward(const ops::Window2D& w, const float* x, const float* kernel, const float* bias,
                   float* y, ComputeType compute = ComputeType::kFloat32);
// dx from dy and the kernel; dx is overwritten.
void Conv2DBackwardData(const ops::Window2D& w, const float* dy, const float* kernel, float* dx,
                        ComputeType compute = ComputeType::kFloat32);
// dkernel (overwritten) and, when not null, dbias (overwritten).
void Conv2DBackwardWeights(const ops::Window2D& w, const float* x, const float* dy, float* dkernel,
                           float* dbias, ComputeType compute = ComputeType::kFloat32);
// Whether a convolution of this geometry runs on oneDNN's bfloat16 kernels
// under `compute` (else on the float32 ones, its inputs holding bfloat16
// values all the same): under kBfloat16 on a CPU with bfloat16 dot products
// (NativeBf16Convolutions), for more than one input channel (window_ops.cc,
// Conv2DForward's routing comment).
bool Bfloat16ConvolutionKernels(const ops::Window2D& w, ComputeType compute);
// Both passes under mixed_bfloat16, only where Bfloat16ConvolutionKernels
// (ops.h's Conv2DBackward routes): Conv2DBackwardWeights(kBfloat16), then, when dx is
// not null, Conv2DBackwardData(kBfloat16) — the same results, with dy read
// once. With relu_output, dy is first masked by ReLU's gradient in that read.
void Conv2DBackwardBf16(const ops::Window2D& w, const float* x, const float* dy,
                        const float* kernel, float* dkernel, float* dbias, float* dx,
                        const float* relu_output);

// c[m, n] = alpha op(a) op(b) + beta c (cpu::Gemm's semantics) for a and b
// holding bfloat16 values, on oneDNN's bfloat16 matrix product (operands
// staged to bfloat16 exactly, float32 accumulation and output). Only where
// CpuHasBfloat16Convolutions (ops.h): elsewhere oneDNN would emulate it.
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, const float* b, float beta, float* c);

// The number of floats Pool2DForward's workspace must hold (0 for average
// pooling, which needs none).
int64_t Pool2DWorkspaceFloats(ops::PoolKind kind, const ops::Window2D& w);
// y from x; workspace (Pool2DWorkspaceFloats floats, may be null when that
// is 0) receives the argmax record for max pooling.
void Pool2DForward(ops::PoolKind kind, const ops::Window2D& w, const float* x, float* y,
                   float* workspace);
// dx (overwritten) from dy and the forward call's workspace.
void Pool2DBackward(ops::PoolKind kind, const ops::Window2D& w, const float* dy,
                    const float* workspace, float* dx);

// Batch norm over x[m, c]'s rows, per column; see ops.h for the semantics.
void BatchNormForwardTraining(int64_t m, int64_t c, const float* x, const float* gamma,
                              const float* beta, float epsilon, float* y, float* batch_mean,
                              float* batch_var);
void BatchNormForwardInference(int64_t m, int64_t c, const float* x, const float* gamma,
                               const float* beta, const float* mean, const float* var,
                               float epsilon, float* y);
void BatchNormBackward(int64_t m, int64_t c, const float* x, const float* dy, const float* gamma,
                       const float* batch_mean, const float* batch_var, float epsilon, float* dx,
                       float* dgamma, float* dbeta);

// y[n, c] = mean over hw of x[n, hw, c]; dx[n, hw, c] = dy[n, c] / hw.
void GlobalAveragePool2DForward(int64_t n, int64_t hw, int64_t c, const float* x, float* y);
void GlobalAveragePool2DBackward(int64_t n, int64_t hw, int64_t c, const float* dy, float* dx);

// Sets the OpenMP thread count (oneDNN's team) of the calling thread.
void SetOmpThreadsForThisThread(int threads);

}  // namespace distrain::cpu

#endif  // DISTRAIN_WORKER_TENSOR_CPU_WINDOW_OPS_H_

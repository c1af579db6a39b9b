#ifndef DISTRAIN_WORKER_TENSOR_CUDA_BACKEND_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_BACKEND_H_

// The CUDA backend of ops.h (docs/architecture.md §6a): what
// worker/tensor/ops.cc and ops_window.cc call for tensors on a GPU, and
// worker/model/optimizer.cc for variables on one. Plain C++ over raw device
// pointers, like the CPU backend's cpu_math.h and cpu/window_ops.h; the
// callers have checked shapes and sized the outputs. Each function makes
// `device` current and queues its work on that device's compute stream
// (device_context.h); nothing waits unless it says so.
//
// Where the work happens:
//   cublas_ops.cc     MatMul (cuBLAS SGEMM)
//   cudnn_ops.cc      Conv2D, pooling, batch norm, softmax (cuDNN)
//   elementwise.cu    activations, dropout, bias broadcasts and sums, global
//                     average pooling, layer and RMS normalisation, losses and
//                     accuracy, optimizer updates
//                     — own kernels running the functors of
//                     worker/tensor/elementwise.h, the math the CPU backend
//                     runs and the unit tests check on any machine.
// Layouts are ops.h's: images NHWC, kernels HWIO, row-major matrices.
//
// Thread-safety: reentrant; library handles are used under the device
// context's op lock.

#include <cstdint>
#include <utility>
#include <vector>

#include "common/model_spec.h"
#include "worker/tensor/ops.h"

namespace distrain::cuda {

// ---- cublas_ops.cc -----------------------------------------------------------
// c[m, n] = alpha op(a) op(b) + beta c over row-major matrices. Under a
// 16-bit `compute` (a and b hold only such values) on tensor cores.
void Gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c, ComputeType compute);

// ---- cudnn_ops.cc --------------------------------------------------------------
// Under a 16-bit `compute` the convolutions may use tensor cores (TF32 on
// float data, exact for 16-bit values); under kFloat32 FP32 FMA only.
void Conv2DForward(int device, const ops::Window2D& w, const float* x, const float* kernel,
                   const float* bias, float* y, ComputeType compute);
void Conv2DBackwardData(int device, const ops::Window2D& w, const float* dy, const float* kernel,
                        float* dx, ComputeType compute);
void Conv2DBackwardWeights(int device, const ops::Window2D& w, const float* x, const float* dy,
                           float* dkernel, float* dbias, ComputeType compute);
// cuDNN's pooling backward reads the forward input and output, so the
// workspace is unused (0 floats) on this backend.
int64_t Pool2DWorkspaceFloats(ops::PoolKind kind, const ops::Window2D& w);
void Pool2DForward(int device, ops::PoolKind kind, const ops::Window2D& w, const float* x,
                   float* y, float* workspace);
void Pool2DBackward(int device, ops::PoolKind kind, const ops::Window2D& w, const float* x,
                    const float* y, const float* dy, const float* workspace, float* dx);
void BatchNormForwardTraining(int device, int64_t m, int64_t c, const float* x,
                              const float* gamma, const float* beta, float epsilon, float* y,
                              float* batch_mean, float* batch_var);
void BatchNormForwardInference(int device, int64_t m, int64_t c, const float* x,
                               const float* gamma, const float* beta, const float* mean,
                               const float* var, float epsilon, float* y);
void BatchNormBackward(int device, int64_t m, int64_t c, const float* x, const float* dy,
                       const float* gamma, const float* batch_mean, const float* batch_var,
                       float epsilon, float* dx, float* dgamma, float* dbeta);
// Softmax over each row of x[rows, cols]; y may alias x. Backward from y.
void SoftmaxForward(int device, int64_t rows, int64_t cols, const float* x, float* y);
void SoftmaxBackward(int device, int64_t rows, int64_t cols, const float* y, const float* dy,
                     float* dx);

// ---- elementwise.cu --------------------------------------------------------------
void Fill(int device, int64_t n, float value, float* dst);
// ops::LayerNormForward/Backward over x[rows, cols], cpu/elementwise_cpu.h's
// semantics; gamma, beta, dgamma and dbeta may be null.
void LayerNormForward(int device, int64_t rows, int64_t cols, const float* x,
                      const float* gamma, const float* beta, float epsilon, bool rms, float* y,
                      float* mean, float* rstd);
void LayerNormBackward(int device, int64_t rows, int64_t cols, const float* x, const float* dy,
                       const float* gamma, const float* mean, const float* rstd, bool rms,
                       float* dx, float* dgamma, float* dbeta);
// ops::EmbeddingForward/Backward: an id outside [0, vocab) reads a zero row
// and adds nothing (the loaders refuse such data first).
void EmbeddingForward(int device, int64_t n, int64_t vocab, int64_t dim, const float* ids,
                      const float* table, float* y);
void EmbeddingBackward(int device, int64_t n, int64_t vocab, int64_t dim, const float* ids,
                       const float* dy, float* dtable);
// y[r, c] += bias[c] / y[r, c] = bias[c] / dbias[c] = sum_r dy[r, c].
void BiasAdd(int device, int64_t rows, int64_t cols, const float* bias, float* y);
void BroadcastBias(int device, int64_t rows, int64_t cols, const float* bias, float* y);
void BiasGrad(int device, int64_t rows, int64_t cols, const float* dy, float* dbias);
// Every kind but softmax (SoftmaxForward/Backward above); y may alias x, dx
// may alias dy; x or y may be null where the kind does not read it (as
// cpu::ActivationBackward).
void ActivationForward(int device, ActivationFunction f, int64_t n, const float* x, float* y);
void ActivationBackward(int device, ActivationFunction f, int64_t n, const float* x,
                        const float* y, const float* dy, float* dx);
// y = x * scale + offset (Rescaling); y may alias x.
void ScaleShift(int device, int64_t n, float scale, float offset, const float* x, float* y);
// mask[i] = DropoutMask{stream, threshold, scale}(i); y = x * mask.
void DropoutForward(int device, int64_t n, uint64_t stream, uint64_t threshold, float scale,
                    const float* x, float* y, float* mask);
// y = x rounded to `type` (elementwise.h's RoundTo functors); y may alias x.
void RoundTo(int device, ComputeType type, int64_t n, const float* x, float* y);
// x *= factor.
void Scale(int device, int64_t n, float factor, float* x);
// Whether every element of every (pointer, count) buffer is finite: one
// kernel per buffer into one flag, then one wait for the device.
bool AllFinite(int device, const std::vector<std::pair<const float*, int64_t>>& buffers);
// out = a * b; out may alias either.
void Multiply(int device, int64_t n, const float* a, const float* b, float* out);
void GlobalAveragePool2DForward(int device, int64_t n, int64_t hw, int64_t c, const float* x,
                                float* y);
void GlobalAveragePool2DBackward(int device, int64_t n, int64_t hw, int64_t c, const float* dy,
                                 float* dx);

// Loss over out[batch, width] and host labels, ops::Loss's semantics for
// every (kind, from_logits): returns the loss summed over the rows (double,
// summed on the host from per-row values) and the rows the accuracy metric
// counts; grad, when not null, receives grad_scale * d(row loss)/d(out) on
// the device. Copies the labels in and the per-row results out, so it waits
// for the device: the step's one synchronisation point.
ops::LossSums Loss(int device, LossKind kind, bool from_logits, int64_t batch, int64_t width,
                   const float* out, const int32_t* host_labels, float grad_scale, float* grad);

// Optimizer updates, the same rules and argument order as cpu_math.h.
void SgdUpdate(int device, int64_t n, float lr, const float* g, float* w);
void MomentumUpdate(int device, int64_t n, float lr, float momentum, bool nesterov,
                    const float* g, float* v, float* w);
void AdamUpdate(int device, int64_t n, float lr_t, float beta1, float beta2, float epsilon,
                const float* g, float* m, float* v, float* w);
void RmspropUpdate(int device, int64_t n, float lr, float rho, float epsilon, const float* g,
                   float* v, float* a, float* w);
void WeightDecay(int device, int64_t n, float decay, float lr, float* w);

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_BACKEND_H_

#ifndef DISTRAIN_WORKER_TENSOR_OPS_H_
#define DISTRAIN_WORKER_TENSOR_OPS_H_

// The op seam (docs/architecture.md, "Tensors, ops and backends"). Layers,
// losses and optimizers call these functions and nothing below them; each
// op dispatches on its tensors' device to a backend:
//   * CPU (worker/tensor/cpu/): oneDNN for convolution, pooling and batch
//     norm — TensorFlow's own CPU path — OpenBLAS and the hand-written small
//     GEMM for matrix products (cpu_math.h), own vectorised loops for
//     element-wise math;
//   * CUDA (worker/tensor/cuda/backend.h): cuBLAS for matrix products, cuDNN
//     for convolution, pooling, batch norm and softmax, own kernels for the
//     rest.
// Element-wise math is written once, as functors in elementwise.h that the
// CPU loops and the CUDA launchers both run.
//
// Conventions: images are NHWC and Conv2D kernels HWIO ([kh, kw, in, out]),
// as Keras stores them; every tensor is dense row-major. Outputs are resized
// by the op, on the inputs' device (a default-constructed output follows
// them there); inputs and outputs of one call must not alias unless the op
// says so. All inputs of one call live on the same device. GPU work is
// queued on the device's compute stream and returns before it runs; Loss
// and copies to the host wait for it. Ops CHECK their
// shapes (a mismatch is a bug in the caller: user input is validated long
// before, in common/model_spec.h).
//
// Thread-safety: ops are reentrant. Backends may cache per-shape state (the
// CPU backend keeps oneDNN primitives per thread), so the first call for a
// shape on a thread is slower than the rest.

#include <array>
#include <cstdint>

#include "absl/types/span.h"
#include "common/model_spec.h"
#include "worker/tensor/tensor.h"

namespace distrain::ops {

// ---- Matrix products and broadcasts ----------------------------------------

// c[m, n] = alpha * op(a) * op(b) + beta * c on the first m*k / k*n / m*n
// elements of the tensors' storage (tensors of any rank are viewed as the
// row-major matrices the caller names). beta == 0 ignores c's contents.
// `compute`: what a and b hold (ComputeType); under a 16-bit type the caller
// has rounded both to it, and a GPU multiplies them on tensor cores.
void MatMul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, const Tensor& b, float beta, Tensor* c,
            ComputeType compute = ComputeType::kFloat32);
// y[..., c] += bias[c] over the last axis (size bias.size()).
void BiasAdd(const Tensor& bias, Tensor* y);
// y[..., c] = bias[c] (before a MatMul with beta = 1).
void BroadcastBias(const Tensor& bias, Tensor* y);
// dbias[c] = sum of dy[..., c] over every other axis; dbias is overwritten.
void BiasGrad(const Tensor& dy, Tensor* dbias);

// ---- Activations (elementwise.h has the math) ------------------------------

// y = f(x); softmax is over the last axis. y may alias x.
void ActivationForward(ActivationFunction f, const Tensor& x, Tensor* y);
// The same, rounded to `round_to` (ActivationForward, then RoundTo): one
// pass for ReLU on the CPU, where the two commute; kFloat32 rounds nothing.
void ActivationForward(ActivationFunction f, const Tensor& x, Tensor* y, ComputeType round_to);
// dx = dy * f'(x), given the forward input x and output y (each kind reads
// the one it needs: elementwise::GradientReadsInput). dx may alias dy.
void ActivationBackward(ActivationFunction f, const Tensor& x, const Tensor& y, const Tensor& dy,
                        Tensor* dx);
// y = x * scale + offset (Keras' Rescaling). y may alias x.
void ScaleShift(float scale, float offset, const Tensor& x, Tensor* y);

// ---- Dropout ---------------------------------------------------------------

// Keras' Dropout while training: y = x * keep / (1 - rate), keep[i] drawn
// with probability 1 - rate from a counter-based generator of (stream, i),
// so the mask is a pure function of the stream and identical on every
// device. mask receives keep / (1 - rate) (0 or the scale) for Backward.
void DropoutForward(double rate, uint64_t stream, const Tensor& x, Tensor* y, Tensor* mask);
// dx = dy * mask.
void DropoutBackward(const Tensor& mask, const Tensor& dy, Tensor* dx);

// ---- Windowed ops over NHWC images (CPU: oneDNN) ---------------------------

// The geometry of a Conv2D or pooling call; KerasWindow2D fills it with
// Keras' padding arithmetic (common/model_spec.h).
struct Window2D {
  int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int64_t out_h = 0, out_w = 0, out_c = 0;  // pooling: out_c == in_c
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  bool operator==(const Window2D&) const = default;
  // Every field, in declaration order: the backends' per-geometry caches
  // key on it.
  std::array<int64_t, 15> Fields() const {
    return {batch,    in_h,     in_w,     in_c,       out_h,   out_w,    out_c,    kernel_h,
            kernel_w, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right};
  }
};
Window2D KerasWindow2D(int64_t batch, int64_t in_h, int64_t in_w, int64_t in_c, int64_t out_c,
                       std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
                       PaddingKind padding);

// y[N, OH, OW, F] = conv(x[N, H, W, C], kernel[KH, KW, C, F]) + bias[F];
// bias may be null. Cross-correlation, as TensorFlow's conv2d. `compute` as
// MatMul's: the tensor inputs of each call hold values of that type.
void Conv2DForward(const Window2D& w, const Tensor& x, const Tensor& kernel, const Tensor* bias,
                   Tensor* y, ComputeType compute = ComputeType::kFloat32);
// dx[N, H, W, C] from dy[N, OH, OW, F] and the kernel.
void Conv2DBackwardData(const Window2D& w, const Tensor& dy, const Tensor& kernel, Tensor* dx,
                        ComputeType compute = ComputeType::kFloat32);
// dkernel[KH, KW, C, F] (overwritten) and, when not null, dbias[F].
void Conv2DBackwardWeights(const Window2D& w, const Tensor& x, const Tensor& dy, Tensor* dkernel,
                           Tensor* dbias, ComputeType compute = ComputeType::kFloat32);
// Both backward passes of one convolution (dx when not null): the same
// results as Conv2DBackwardWeights and Conv2DBackwardData, with dy read once
// where the backend converts it (a CPU under mixed_bfloat16). With
// `relu_output`, the output of a ReLU on the convolution, dy is the gradient
// of that output and ReLU's gradient is applied first (ActivationBackward):
// within that one read where the backend fuses it, else into `scratch`.
void Conv2DBackward(const Window2D& w, const Tensor& x, const Tensor& dy, const Tensor& kernel,
                    Tensor* dkernel, Tensor* dbias, Tensor* dx, ComputeType compute,
                    const Tensor* relu_output = nullptr, Tensor* scratch = nullptr);

enum class PoolKind { kMax, kAverage };
// y[N, OH, OW, C]. Max pooling never selects padding; average pooling
// divides by the number of real (unpadded) inputs in the window, as
// TensorFlow does for padding 'same'. `workspace` receives what the backward
// pass needs (the backend's argmax record for max pooling); it is owned by
// the caller and opaque to it.
void Pool2DForward(PoolKind kind, const Window2D& w, const Tensor& x, Tensor* y,
                   Tensor* workspace);
// dx[N, H, W, C] (overwritten) from dy and the forward call's x, y and workspace.
void Pool2DBackward(PoolKind kind, const Window2D& w, const Tensor& x, const Tensor& y,
                    const Tensor& dy, const Tensor& workspace, Tensor* dx);

// ---- Batch normalisation over the last axis (CPU: oneDNN) ------------------
// x is viewed as [M, C], C = gamma.size(): every axis but the last is
// reduced, as Keras' BatchNormalization(axis=-1).

// Training: y = gamma (x - mean) / sqrt(var + eps) + beta with the batch's
// mean and biased variance, which are written to batch_mean and batch_var.
void BatchNormForwardTraining(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float epsilon, Tensor* y, Tensor* batch_mean, Tensor* batch_var);
// Inference: the same with the given (moving) mean and variance.
void BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& mean, const Tensor& var, float epsilon, Tensor* y);
// Gradients of the training forward pass: dx, dgamma, dbeta (overwritten).
void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                       const Tensor& batch_mean, const Tensor& batch_var, float epsilon,
                       Tensor* dx, Tensor* dgamma, Tensor* dbeta);

// ---- Layer and RMS normalisation over the last axis (own kernels) -----------
// x is viewed as [M, C], C its last dimension; each row is normalised on its
// own (Keras' LayerNormalization(axis=-1): y = gamma (x - mean) / sqrt(var +
// eps) + beta with the row's mean and biased variance; `rms`, Keras'
// RMSNormalization: y = gamma x / sqrt(mean(x^2) + eps)). gamma and beta
// ([C]) may be null: Keras' center=False / scale=False. mean and rstd
// ([M]) receive the rows' statistics (mean 0 under rms) for the backward pass.
void LayerNormForward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float epsilon,
                      bool rms, Tensor* y, Tensor* mean, Tensor* rstd);
// dx (overwritten) from dy and the forward pass's statistics; dgamma and
// dbeta, when not null, are overwritten with their gradients.
void LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor* gamma,
                       const Tensor& mean, const Tensor& rstd, bool rms, Tensor* dx,
                       Tensor* dgamma, Tensor* dbeta);

// ---- Embedding lookup -------------------------------------------------------
// ids holds token ids as floats (whole numbers in [0, V), which the data
// loaders check against the layer; an id outside gives a zero row on a GPU
// and fails a CHECK on the CPU). y[..., D] = table[id, :] per id; the
// backward pass overwrites dtable [V, D] with the sum of dy's rows per id,
// added in the ids' order (so both backends give the same bits).
void EmbeddingForward(const Tensor& table, const Tensor& ids, Tensor* y);
void EmbeddingBackward(const Tensor& ids, const Tensor& dy, Tensor* dtable);

// ---- Pooling without a window ----------------------------------------------

// y[N, C] = mean of x[N, H, W, C] over H and W; dx spreads dy evenly back.
void GlobalAveragePool2DForward(const Tensor& x, Tensor* y);
void GlobalAveragePool2DBackward(const Tensor& dy, int64_t h, int64_t w, Tensor* dx);

// ---- Losses ----------------------------------------------------------------

struct LossSums {
  double loss_sum = 0;  // summed over the rows (the caller divides by the batch)
  int64_t correct = 0;  // rows the accuracy metric counts as right
};
// Loss over a batch of outputs [batch, width] and integer labels, Keras'
// semantics for (kind, from_logits) (common/model_spec.h: LossKind). When
// grad is not null it receives d(loss_sum * grad_scale)/d(output).
LossSums Loss(LossKind kind, bool from_logits, const Tensor& output,
              absl::Span<const int32_t> labels, float grad_scale, Tensor* grad);

// ---- Mixed precision (worker/model/loss_scale.h, Model) --------------------

// y = x with every element rounded to the nearest value of `type`
// (elementwise.h: RoundToBfloat16 / RoundToFloat16; float16 overflows to
// infinity); kFloat32 copies. y may alias x.
void RoundTo(ComputeType type, const Tensor& x, Tensor* y);
// t *= factor.
void Scale(float factor, Tensor* t);
// Whether this CPU runs bfloat16 convolutions and matrix products on bfloat16
// dot-product instructions (AVX512-BF16 or AMX), which mixed_bfloat16 then
// uses; without them the CPU computes 16-bit values on float32 kernels.
bool CpuHasBfloat16Convolutions();
// Which library runs this CPU's float32 matrix products (those the small-M
// kernels do not take), for the start-up log: "oneDNN (AVX-512 kernels)" or
// "OpenBLAS (Haswell kernels)" with the kernel set OpenBLAS picked or was
// pinned to (OPENBLAS_CORETYPE).
const char* CpuMatrixProductLibrary();
// Whether every element of every tensor is finite. The tensors may live on
// different devices; waits for each device once.
bool AllFinite(absl::Span<const Tensor* const> tensors);

// ---- Device transfers -------------------------------------------------------

// Copies src into dst, resized on dst's own device: across devices when they
// differ (to the host: waits for the copy).
void Copy(const Tensor& src, Tensor* dst);
// Moves t's contents to `device` (nothing when it is there already).
void MoveTo(DeviceId device, Tensor* t);

// How many cores the calling thread's windowed and normalisation ops may use
// (oneDNN's OpenMP team of this thread). Every thread that runs ops sets it
// to its share — the same share the process gives OpenBLAS, which is
// process-wide (cpu::SetBlasThreads) — because an unset team is one thread
// per core in every replica thread and process: on 2 cores, 4 replica
// threads would run 8 spinning OpenMP threads (measured: 5x slower).
void SetCpuThreadsForThisThread(int threads);

}  // namespace distrain::ops

#endif  // DISTRAIN_WORKER_TENSOR_OPS_H_

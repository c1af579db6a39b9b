// ops.h's windowed ops (Conv2D, pooling), batch, layer and RMS
// normalisation, global average pooling and SetCpuThreadsForThisThread:
// shape checks, output sizing and dispatch on the tensors' device. The CPU
// backend is worker/tensor/cpu/window_ops.h (oneDNN; layer norm's own loops
// in cpu/elementwise_cpu.h), the CUDA backend worker/tensor/cuda/backend.h
// (cuDNN; layer norm's own kernels). Outputs are sized on the inputs' device.
//
// Thread-safety: reentrant (the backend keeps per-thread state).

#include <algorithm>
#include <array>
#include <initializer_list>
#include <vector>

#include "common/check.h"
#include "worker/tensor/cpu/conv_kernels.h"
#include "worker/tensor/cpu/elementwise_cpu.h"
#include "worker/tensor/cpu/window_ops.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"
#include "worker/tensor/ops_dispatch.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/backend.h"
#endif

namespace distrain::ops {
namespace {

void CheckShape(const Tensor& t, const std::vector<int64_t>& want, const char* what) {
  DISTRAIN_CHECK(t.shape() == want) << what << " is " << t.ShapeString() << ", expected "
                                    << Tensor(want).ShapeString();
}

void CheckWindow(const Window2D& w) {
  DISTRAIN_CHECK(w.batch > 0 && w.in_h > 0 && w.in_w > 0 && w.in_c > 0 && w.out_h > 0 &&
                 w.out_w > 0 && w.out_c > 0 && w.kernel_h > 0 && w.kernel_w > 0 &&
                 w.stride_h > 0 && w.stride_w > 0 && w.pad_top >= 0 && w.pad_bottom >= 0 &&
                 w.pad_left >= 0 && w.pad_right >= 0)
      << "degenerate window";
  // The output size the padding implies (floor division, as oneDNN and TF).
  DISTRAIN_CHECK_EQ(w.out_h, (w.in_h + w.pad_top + w.pad_bottom - w.kernel_h) / w.stride_h + 1);
  DISTRAIN_CHECK_EQ(w.out_w, (w.in_w + w.pad_left + w.pad_right - w.kernel_w) / w.stride_w + 1);
}

std::vector<int64_t> InShape(const Window2D& w) { return {w.batch, w.in_h, w.in_w, w.in_c}; }
std::vector<int64_t> OutShape(const Window2D& w) { return {w.batch, w.out_h, w.out_w, w.out_c}; }
std::vector<int64_t> KernelShape(const Window2D& w) {
  return {w.kernel_h, w.kernel_w, w.in_c, w.out_c};
}

}  // namespace

Window2D KerasWindow2D(int64_t batch, int64_t in_h, int64_t in_w, int64_t in_c, int64_t out_c,
                       std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
                       PaddingKind padding) {
  Window2D w;
  w.batch = batch;
  w.in_h = in_h;
  w.in_w = in_w;
  w.in_c = in_c;
  w.out_c = out_c;
  w.kernel_h = kernel[0];
  w.kernel_w = kernel[1];
  w.stride_h = strides[0];
  w.stride_w = strides[1];
  // Keras' padding arithmetic, the one the model's validation uses.
  const AxisWindow rows = KerasAxisWindow(in_h, kernel[0], strides[0], padding);
  const AxisWindow cols = KerasAxisWindow(in_w, kernel[1], strides[1], padding);
  w.out_h = rows.out;
  w.pad_top = rows.pad_before;
  w.pad_bottom = rows.pad_after;
  w.out_w = cols.out;
  w.pad_left = cols.pad_before;
  w.pad_right = cols.pad_after;
  return w;
}

bool CpuHasBfloat16Convolutions() { return cpu::internal::NativeBf16Convolutions(); }

const char* CpuMatrixProductLibrary() { return cpu::ProductLibraryName(); }

void Conv2DForward(const Window2D& w, const Tensor& x, const Tensor& kernel, const Tensor* bias,
                   Tensor* y, ComputeType compute) {
  CheckWindow(w);
  CheckShape(x, InShape(w), "Conv2D input");
  CheckShape(kernel, KernelShape(w), "Conv2D kernel");
  if (bias != nullptr) CheckShape(*bias, {w.out_c}, "Conv2D bias");
  DISTRAIN_CHECK(y != &x) << "Conv2D output aliases its input";
  const DeviceId d = CallDevice({&x, &kernel, bias});
  y->Resize(OutShape(w), d);
  const float* b = bias != nullptr ? bias->data() : nullptr;
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::Conv2DForward(d.ordinal, w, x.data(), kernel.data(), b, y->data(),
                                             compute));
    return;
  }
  cpu::Conv2DForward(w, x.data(), kernel.data(), b, y->data(), compute);
}

void Conv2DBackwardData(const Window2D& w, const Tensor& dy, const Tensor& kernel, Tensor* dx,
                        ComputeType compute) {
  CheckWindow(w);
  CheckShape(dy, OutShape(w), "Conv2D output gradient");
  CheckShape(kernel, KernelShape(w), "Conv2D kernel");
  DISTRAIN_CHECK(dx != &dy);
  const DeviceId d = CallDevice({&dy, &kernel});
  dx->Resize(InShape(w), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(
        cuda::Conv2DBackwardData(d.ordinal, w, dy.data(), kernel.data(), dx->data(), compute));
    return;
  }
  cpu::Conv2DBackwardData(w, dy.data(), kernel.data(), dx->data(), compute);
}

void Conv2DBackwardWeights(const Window2D& w, const Tensor& x, const Tensor& dy, Tensor* dkernel,
                           Tensor* dbias, ComputeType compute) {
  CheckWindow(w);
  CheckShape(x, InShape(w), "Conv2D input");
  CheckShape(dy, OutShape(w), "Conv2D output gradient");
  const DeviceId d = CallDevice({&x, &dy});
  dkernel->Resize(KernelShape(w), d);
  if (dbias != nullptr) dbias->Resize({w.out_c}, d);
  float* db = dbias != nullptr ? dbias->data() : nullptr;
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(
        cuda::Conv2DBackwardWeights(d.ordinal, w, x.data(), dy.data(), dkernel->data(), db,
                                    compute));
    return;
  }
  cpu::Conv2DBackwardWeights(w, x.data(), dy.data(), dkernel->data(), db, compute);
}

void Conv2DBackward(const Window2D& w, const Tensor& x, const Tensor& dy, const Tensor& kernel,
                    Tensor* dkernel, Tensor* dbias, Tensor* dx, ComputeType compute,
                    const Tensor* relu_output, Tensor* scratch) {
  DISTRAIN_CHECK(relu_output == nullptr || scratch != nullptr)
      << "Conv2DBackward: ReLU's gradient needs a scratch tensor";
  const DeviceId d = CallDevice({&x, &dy, &kernel, relu_output});
  if (!OnGpu(d) && cpu::Bfloat16ConvolutionKernels(w, compute)) {
    // The one fused route: dy read once (cpu::Conv2DBackwardBf16).
    CheckWindow(w);
    CheckShape(x, InShape(w), "Conv2D input");
    CheckShape(dy, OutShape(w), "Conv2D output gradient");
    CheckShape(kernel, KernelShape(w), "Conv2D kernel");
    if (relu_output != nullptr) CheckShape(*relu_output, OutShape(w), "Conv2D ReLU output");
    DISTRAIN_CHECK(dx != &dy);
    dkernel->Resize(KernelShape(w), d);
    if (dbias != nullptr) dbias->Resize({w.out_c}, d);
    if (dx != nullptr) dx->Resize(InShape(w), d);
    cpu::Conv2DBackwardBf16(w, x.data(), dy.data(), kernel.data(), dkernel->data(),
                            dbias != nullptr ? dbias->data() : nullptr,
                            dx != nullptr ? dx->data() : nullptr,
                            relu_output != nullptr ? relu_output->data() : nullptr);
    return;
  }
  // Every other backend and type: ReLU's gradient into `scratch`, then the
  // two passes.
  const Tensor* dz = &dy;
  if (relu_output != nullptr) {
    ActivationBackward(ActivationKind::kRelu, *relu_output, *relu_output, dy, scratch);
    dz = scratch;
  }
  Conv2DBackwardWeights(w, x, *dz, dkernel, dbias, compute);
  if (dx != nullptr) Conv2DBackwardData(w, *dz, kernel, dx, compute);
}

void Pool2DForward(PoolKind kind, const Window2D& w, const Tensor& x, Tensor* y,
                   Tensor* workspace) {
  CheckWindow(w);
  DISTRAIN_CHECK_EQ(w.in_c, w.out_c);
  CheckShape(x, InShape(w), "pooling input");
  DISTRAIN_CHECK(y != &x && workspace != nullptr);
  const DeviceId d = x.device_id();
  y->Resize(OutShape(w), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY({
      const int64_t ws = cuda::Pool2DWorkspaceFloats(kind, w);
      workspace->Resize({ws}, d);
      cuda::Pool2DForward(d.ordinal, kind, w, x.data(), y->data(),
                          ws > 0 ? workspace->data() : nullptr);
    });
    return;
  }
  const int64_t ws = cpu::Pool2DWorkspaceFloats(kind, w);
  workspace->Resize({ws}, d);
  cpu::Pool2DForward(kind, w, x.data(), y->data(), ws > 0 ? workspace->data() : nullptr);
}

void Pool2DBackward(PoolKind kind, const Window2D& w, const Tensor& x, const Tensor& y,
                    const Tensor& dy, const Tensor& workspace, Tensor* dx) {
  CheckWindow(w);
  DISTRAIN_CHECK_EQ(w.in_c, w.out_c);
  CheckShape(x, InShape(w), "pooling input");
  CheckShape(y, OutShape(w), "pooling output");
  CheckShape(dy, OutShape(w), "pooling output gradient");
  const DeviceId d = CallDevice({&x, &y, &dy, &workspace});
  dx->Resize(InShape(w), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY({
      const int64_t ws = cuda::Pool2DWorkspaceFloats(kind, w);
      DISTRAIN_CHECK_EQ(workspace.size(), ws) << "workspace not from Pool2DForward";
      cuda::Pool2DBackward(d.ordinal, kind, w, x.data(), y.data(), dy.data(),
                           ws > 0 ? workspace.data() : nullptr, dx->data());
    });
    return;
  }
  const int64_t ws = cpu::Pool2DWorkspaceFloats(kind, w);
  DISTRAIN_CHECK_EQ(workspace.size(), ws) << "workspace not from Pool2DForward";
  cpu::Pool2DBackward(kind, w, dy.data(), ws > 0 ? workspace.data() : nullptr, dx->data());
}

namespace {

// x viewed as [m, c], c = gamma.size().
int64_t BnRows(const Tensor& x, const Tensor& gamma) {
  DISTRAIN_CHECK(x.rank() >= 2 && x.dim(x.rank() - 1) == gamma.size())
      << "batch norm over " << x.ShapeString() << " with " << gamma.size() << " channels";
  DISTRAIN_CHECK_GT(x.size(), 0);
  return x.size() / gamma.size();
}

}  // namespace

void BatchNormForwardTraining(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float epsilon, Tensor* y, Tensor* batch_mean, Tensor* batch_var) {
  const int64_t m = BnRows(x, gamma), c = gamma.size();
  CheckShape(beta, gamma.shape(), "batch norm beta");
  DISTRAIN_CHECK(y != &x);
  const DeviceId d = CallDevice({&x, &gamma, &beta});
  y->Resize(x.shape(), d);
  batch_mean->Resize({c}, d);
  batch_var->Resize({c}, d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::BatchNormForwardTraining(d.ordinal, m, c, x.data(), gamma.data(),
                                                      beta.data(), epsilon, y->data(),
                                                      batch_mean->data(), batch_var->data()));
    return;
  }
  cpu::BatchNormForwardTraining(m, c, x.data(), gamma.data(), beta.data(), epsilon, y->data(),
                                batch_mean->data(), batch_var->data());
}

void BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& mean, const Tensor& var, float epsilon, Tensor* y) {
  const int64_t m = BnRows(x, gamma), c = gamma.size();
  CheckShape(beta, gamma.shape(), "batch norm beta");
  CheckShape(mean, gamma.shape(), "batch norm mean");
  CheckShape(var, gamma.shape(), "batch norm variance");
  DISTRAIN_CHECK(y != &x);
  const DeviceId d = CallDevice({&x, &gamma, &beta, &mean, &var});
  y->Resize(x.shape(), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::BatchNormForwardInference(d.ordinal, m, c, x.data(), gamma.data(),
                                                       beta.data(), mean.data(), var.data(),
                                                       epsilon, y->data()));
    return;
  }
  cpu::BatchNormForwardInference(m, c, x.data(), gamma.data(), beta.data(), mean.data(),
                                 var.data(), epsilon, y->data());
}

void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                       const Tensor& batch_mean, const Tensor& batch_var, float epsilon,
                       Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  const int64_t m = BnRows(x, gamma), c = gamma.size();
  CheckShape(dy, x.shape(), "batch norm output gradient");
  CheckShape(batch_mean, gamma.shape(), "batch norm mean");
  CheckShape(batch_var, gamma.shape(), "batch norm variance");
  DISTRAIN_CHECK(dx != &x && dx != &dy);
  const DeviceId d = CallDevice({&x, &dy, &gamma, &batch_mean, &batch_var});
  dx->Resize(x.shape(), d);
  dgamma->Resize({c}, d);
  dbeta->Resize({c}, d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::BatchNormBackward(d.ordinal, m, c, x.data(), dy.data(),
                                               gamma.data(), batch_mean.data(), batch_var.data(),
                                               epsilon, dx->data(), dgamma->data(),
                                               dbeta->data()));
    return;
  }
  cpu::BatchNormBackward(m, c, x.data(), dy.data(), gamma.data(), batch_mean.data(),
                         batch_var.data(), epsilon, dx->data(), dgamma->data(), dbeta->data());
}

namespace {

// Rows of x viewed as [M, C] with C = its last dimension; a present gamma
// or beta must be [C].
int64_t NormRows(const Tensor& x, const Tensor* gamma, const Tensor* beta) {
  DISTRAIN_CHECK(x.rank() >= 1 && x.size() > 0) << "layer norm over " << x.ShapeString();
  const int64_t c = x.dim(x.rank() - 1);
  if (gamma != nullptr) CheckShape(*gamma, {c}, "layer norm gamma");
  if (beta != nullptr) CheckShape(*beta, {c}, "layer norm beta");
  return x.size() / c;
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float epsilon,
                      bool rms, Tensor* y, Tensor* mean, Tensor* rstd) {
  const int64_t m = NormRows(x, gamma, beta), c = x.dim(x.rank() - 1);
  DISTRAIN_CHECK(y != &x);
  DISTRAIN_CHECK(epsilon > 0) << "layer norm epsilon " << epsilon;
  const DeviceId d = CallDevice({&x, gamma, beta});
  y->Resize(x.shape(), d);
  mean->Resize({m}, d);
  rstd->Resize({m}, d);
  const float* g = gamma != nullptr ? gamma->data() : nullptr;
  const float* b = beta != nullptr ? beta->data() : nullptr;
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::LayerNormForward(d.ordinal, m, c, x.data(), g, b, epsilon, rms,
                                              y->data(), mean->data(), rstd->data()));
    return;
  }
  cpu::LayerNormForward(m, c, x.data(), g, b, epsilon, rms, y->data(), mean->data(),
                        rstd->data());
}

void LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor* gamma,
                       const Tensor& mean, const Tensor& rstd, bool rms, Tensor* dx,
                       Tensor* dgamma, Tensor* dbeta) {
  const int64_t m = NormRows(x, gamma, nullptr), c = x.dim(x.rank() - 1);
  CheckShape(dy, x.shape(), "layer norm output gradient");
  CheckShape(mean, {m}, "layer norm row means");
  CheckShape(rstd, {m}, "layer norm row scales");
  DISTRAIN_CHECK(dx != &x && dx != &dy);
  const DeviceId d = CallDevice({&x, &dy, gamma, &mean, &rstd});
  dx->Resize(x.shape(), d);
  if (dgamma != nullptr) dgamma->Resize({c}, d);
  if (dbeta != nullptr) dbeta->Resize({c}, d);
  const float* g = gamma != nullptr ? gamma->data() : nullptr;
  float* dg = dgamma != nullptr ? dgamma->data() : nullptr;
  float* db = dbeta != nullptr ? dbeta->data() : nullptr;
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::LayerNormBackward(d.ordinal, m, c, x.data(), dy.data(), g,
                                               mean.data(), rstd.data(), rms, dx->data(), dg,
                                               db));
    return;
  }
  cpu::LayerNormBackward(m, c, x.data(), dy.data(), g, mean.data(), rstd.data(), rms,
                         dx->data(), dg, db);
}

void GlobalAveragePool2DForward(const Tensor& x, Tensor* y) {
  DISTRAIN_CHECK_EQ(x.rank(), 4) << x.ShapeString();
  DISTRAIN_CHECK(y != &x);
  const int64_t n = x.dim(0), hw = x.dim(1) * x.dim(2), c = x.dim(3);
  DISTRAIN_CHECK_GT(hw, 0);
  const DeviceId d = x.device_id();
  y->Resize({n, c}, d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(
        cuda::GlobalAveragePool2DForward(d.ordinal, n, hw, c, x.data(), y->data()));
    return;
  }
  cpu::GlobalAveragePool2DForward(n, hw, c, x.data(), y->data());
}

void GlobalAveragePool2DBackward(const Tensor& dy, int64_t h, int64_t w, Tensor* dx) {
  DISTRAIN_CHECK_EQ(dy.rank(), 2) << dy.ShapeString();
  DISTRAIN_CHECK(h > 0 && w > 0 && dx != &dy);
  const int64_t n = dy.dim(0), c = dy.dim(1);
  const DeviceId d = dy.device_id();
  dx->Resize({n, h, w, c}, d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(
        cuda::GlobalAveragePool2DBackward(d.ordinal, n, h * w, c, dy.data(), dx->data()));
    return;
  }
  cpu::GlobalAveragePool2DBackward(n, h * w, c, dy.data(), dx->data());
}

void SetCpuThreadsForThisThread(int threads) {
  DISTRAIN_CHECK_GE(threads, 1);
  // oneDNN runs on the calling thread's OpenMP team, so this governs the
  // windowed and normalisation ops of this thread alone. OpenBLAS's pool
  // (MatMul) is process-wide, not per thread, so it is not set here: the
  // strategies give it the per-replica share (cpu::SetBlasThreads), and
  // concurrent replica threads must not race to set it.
  cpu::SetOmpThreadsForThisThread(threads);
}

}  // namespace distrain::ops

// ops.h's matrix products, broadcasts, activations, embedding lookups,
// dropout, losses and copies: device dispatch plus shape checks, with the CPU work in
// cpu_math.h (GEMM, ReLU, softmax cross-entropy from logits) and
// cpu/elementwise_cpu.h (the elementwise.h functors), the GPU work in
// cuda/backend.h. The windowed ops, batch norm and pooling live in
// ops_window.cc.

#include "worker/tensor/ops.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "common/check.h"
#include "worker/tensor/cpu/elementwise_cpu.h"
#include "worker/tensor/cpu/window_ops.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/elementwise.h"
#include "worker/tensor/ops_dispatch.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/backend.h"
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain::ops {
namespace {

// Below this many multiply-adds the bfloat16 GEMM's operand staging costs
// more than its faster products save (the guide CNN's 64x10 output layer
// stays on SGEMM, its 7744x64 hidden layer does not).
constexpr int64_t kMinBf16GemmMacs = int64_t{1} << 18;

// The size of the last axis, for ops that work per row.
int64_t LastDim(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(t.rank() - 1); }

}  // namespace

// ---- Matrix products and broadcasts ----------------------------------------

void MatMul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, const Tensor& b, float beta, Tensor* c, ComputeType compute) {
  const DeviceId d = CallDevice({&a, &b, c});
  DISTRAIN_CHECK(a.size() >= m * k && b.size() >= k * n && c->size() >= m * n)
      << "MatMul m=" << m << " n=" << n << " k=" << k << " on a " << a.ShapeString() << ", b "
      << b.ShapeString() << ", c " << c->ShapeString();
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::Gemm(d.ordinal, trans_a, trans_b, m, n, k, alpha, a.data(), b.data(),
                                  beta, c->data(), compute));
    return;
  }
  // Under bfloat16 on a CPU with bfloat16 dot products, products large enough
  // to pay for staging the operands run on oneDNN's bfloat16 GEMM. Otherwise
  // FP32 products of 16-bit values are exact, so the CPU's SGEMM computes what
  // tensor cores do (up to the order of the FP32 sums).
  if (compute == ComputeType::kBfloat16 && m * n * k >= kMinBf16GemmMacs &&
      CpuHasBfloat16Convolutions()) {
    cpu::GemmBf16(trans_a, trans_b, m, n, k, alpha, a.data(), b.data(), beta, c->data());
    return;
  }
  cpu::Gemm(trans_a, trans_b, m, n, k, alpha, a.data(), b.data(), beta, c->data());
}

void BiasAdd(const Tensor& bias, Tensor* y) {
  const DeviceId d = CallDevice({&bias, y});
  const int64_t cols = bias.size();
  DISTRAIN_CHECK(cols > 0 && LastDim(*y) == cols)
      << "BiasAdd: bias " << bias.ShapeString() << " on " << y->ShapeString();
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::BiasAdd(d.ordinal, y->size() / cols, cols, bias.data(), y->data()));
    return;
  }
  cpu::AddRowVector(y->size() / cols, cols, bias.data(), y->data());
}

void BroadcastBias(const Tensor& bias, Tensor* y) {
  const DeviceId d = CallDevice({&bias, y});
  const int64_t cols = bias.size();
  DISTRAIN_CHECK(cols > 0 && LastDim(*y) == cols)
      << "BroadcastBias: bias " << bias.ShapeString() << " into " << y->ShapeString();
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(
        cuda::BroadcastBias(d.ordinal, y->size() / cols, cols, bias.data(), y->data()));
    return;
  }
  cpu::BroadcastRow(y->size() / cols, cols, bias.data(), y->data());
}

void BiasGrad(const Tensor& dy, Tensor* dbias) {
  const DeviceId d = CallDevice({&dy, dbias});
  const int64_t cols = dbias->size();
  DISTRAIN_CHECK(cols > 0 && LastDim(dy) == cols)
      << "BiasGrad: dy " << dy.ShapeString() << " into " << dbias->ShapeString();
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::BiasGrad(d.ordinal, dy.size() / cols, cols, dy.data(), dbias->data()));
    return;
  }
  cpu::ColumnSums(dy.size() / cols, cols, dy.data(), dbias->data());
}

// ---- Activations -----------------------------------------------------------

void ActivationForward(ActivationFunction f, const Tensor& x, Tensor* y) {
  const DeviceId d = x.device_id();
  if (y != &x) y->Resize(x.shape(), d);
  const int64_t cols = LastDim(x);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY({
      if (f.kind == ActivationKind::kSoftmax) {
        cuda::SoftmaxForward(d.ordinal, cols == 0 ? 0 : x.size() / cols, cols, x.data(),
                             y->data());
      } else {
        cuda::ActivationForward(d.ordinal, f, x.size(), x.data(), y->data());
      }
    });
    return;
  }
  cpu::ActivationForward(f, cols == 0 ? 0 : x.size() / cols, cols, x.data(), y->data());
}

void ActivationForward(ActivationFunction f, const Tensor& x, Tensor* y, ComputeType round_to) {
  if (round_to != ComputeType::kFloat32 && f.kind == ActivationKind::kRelu &&
      !OnGpu(x.device_id())) {
    if (y != &x) y->Resize(x.shape(), x.device_id());
    if (round_to == ComputeType::kBfloat16) {
      cpu::ReluRoundToBfloat16(x.size(), x.data(), y->data());
    } else {
      cpu::ReluRoundToFloat16(x.size(), x.data(), y->data());
    }
    return;
  }
  ActivationForward(f, x, y);
  if (round_to != ComputeType::kFloat32) RoundTo(round_to, *y, y);
}

void ActivationBackward(ActivationFunction f, const Tensor& x, const Tensor& y, const Tensor& dy,
                        Tensor* dx) {
  const DeviceId d = dy.device_id();
  const ActivationKind kind = f.kind;
  // The kinds whose derivative is cheapest in the input read x; the rest y.
  const bool reads_x = elementwise::GradientReadsInput(kind);
  const bool reads_y = !reads_x && kind != ActivationKind::kLinear;
  const Tensor& saved = reads_x ? x : y;
  if (reads_x || reads_y) {
    DISTRAIN_CHECK(saved.device_id() == d) << "tensors of one op on two devices";
    DISTRAIN_CHECK(saved.size() == dy.size())
        << "ActivationBackward(" << ActivationName(kind) << "): saved "
        << saved.ShapeString() << " vs dy " << dy.ShapeString();
  }
  if (dx != &dy) dx->Resize(dy.shape(), d);
  const int64_t cols = LastDim(dy);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY({
      if (kind == ActivationKind::kSoftmax) {
        cuda::SoftmaxBackward(d.ordinal, cols == 0 ? 0 : dy.size() / cols, cols, y.data(),
                              dy.data(), dx->data());
      } else {
        cuda::ActivationBackward(d.ordinal, f, dy.size(), reads_x ? x.data() : nullptr,
                                 reads_y ? y.data() : nullptr, dy.data(), dx->data());
      }
    });
    return;
  }
  cpu::ActivationBackward(f, cols == 0 ? 0 : dy.size() / cols, cols, x.data(), y.data(),
                          dy.data(), dx->data());
}

void ScaleShift(float scale, float offset, const Tensor& x, Tensor* y) {
  const DeviceId d = x.device_id();
  if (y != &x) y->Resize(x.shape(), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::ScaleShift(d.ordinal, x.size(), scale, offset, x.data(), y->data()));
    return;
  }
  cpu::ScaleShift(x.size(), scale, offset, x.data(), y->data());
}

// ---- Embedding -------------------------------------------------------------

void EmbeddingForward(const Tensor& table, const Tensor& ids, Tensor* y) {
  DISTRAIN_CHECK(table.rank() == 2 && y != &ids && y != &table) << table.ShapeString();
  const int64_t vocab = table.dim(0), dim = table.dim(1);
  const DeviceId d = CallDevice({&table, &ids});
  std::vector<int64_t> shape = ids.shape();
  shape.push_back(dim);
  y->Resize(shape, d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::EmbeddingForward(d.ordinal, ids.size(), vocab, dim, ids.data(),
                                              table.data(), y->data()));
    return;
  }
  cpu::EmbeddingForward(ids.size(), vocab, dim, ids.data(), table.data(), y->data());
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dy, Tensor* dtable) {
  DISTRAIN_CHECK(dtable->rank() == 2 && dtable != &dy) << dtable->ShapeString();
  const int64_t vocab = dtable->dim(0), dim = dtable->dim(1);
  std::vector<int64_t> want = ids.shape();
  want.push_back(dim);
  DISTRAIN_CHECK(dy.shape() == want) << "embedding gradient " << dy.ShapeString() << " for ids "
                                     << ids.ShapeString();
  const DeviceId d = CallDevice({&ids, &dy, dtable});
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::EmbeddingBackward(d.ordinal, ids.size(), vocab, dim, ids.data(),
                                               dy.data(), dtable->data()));
    return;
  }
  cpu::EmbeddingBackward(ids.size(), vocab, dim, ids.data(), dy.data(), dtable->data());
}

// ---- Dropout ---------------------------------------------------------------

void DropoutForward(double rate, uint64_t stream, const Tensor& x, Tensor* y, Tensor* mask) {
  const DeviceId d = x.device_id();
  DISTRAIN_CHECK(rate >= 0 && rate < 1) << "Dropout rate " << rate;
  if (y != &x) y->Resize(x.shape(), d);
  mask->Resize(x.shape(), d);
  const elementwise::DropoutMask f{stream, elementwise::DropThreshold(rate),
                                   static_cast<float>(1.0 / (1.0 - rate))};
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::DropoutForward(d.ordinal, x.size(), f.stream, f.threshold, f.scale,
                                            x.data(), y->data(), mask->data()));
    return;
  }
  cpu::DropoutForward(x.size(), f, x.data(), y->data(), mask->data());
}

void DropoutBackward(const Tensor& mask, const Tensor& dy, Tensor* dx) {
  const DeviceId d = CallDevice({&mask, &dy});
  DISTRAIN_CHECK(mask.size() == dy.size())
      << "DropoutBackward: mask " << mask.ShapeString() << " vs dy " << dy.ShapeString();
  if (dx != &dy) dx->Resize(dy.shape(), d);
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::Multiply(d.ordinal, dy.size(), dy.data(), mask.data(), dx->data()));
    return;
  }
  cpu::Multiply(dy.size(), dy.data(), mask.data(), dx->data());
}

// ---- Mixed precision ---------------------------------------------------------

void RoundTo(ComputeType type, const Tensor& x, Tensor* y) {
  const DeviceId d = x.device_id();
  if (y != &x) y->Resize(x.shape(), d);
  if (type == ComputeType::kFloat32) {
    if (y != &x) Copy(x, y);
    return;
  }
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(cuda::RoundTo(d.ordinal, type, x.size(), x.data(), y->data()));
    return;
  }
  if (type == ComputeType::kBfloat16) {
    cpu::RoundToBfloat16(x.size(), x.data(), y->data());
  } else {
    cpu::RoundToFloat16(x.size(), x.data(), y->data());
  }
}

void Scale(float factor, Tensor* t) {
  if (OnGpu(t->device_id())) {
    DISTRAIN_CUDA_ONLY(cuda::Scale(t->device_id().ordinal, t->size(), factor, t->data()));
    return;
  }
  cpu::Scale(t->size(), factor, t->data());
}

bool AllFinite(absl::Span<const Tensor* const> tensors) {
  bool finite = true;
#ifdef DISTRAIN_HAVE_CUDA
  // Per device: one flag every kernel of that device may clear, read once.
  std::vector<int> gpu_ordinals;
  for (const Tensor* t : tensors) {
    if (OnGpu(t->device_id())) gpu_ordinals.push_back(t->device_id().ordinal);
  }
  std::sort(gpu_ordinals.begin(), gpu_ordinals.end());
  gpu_ordinals.erase(std::unique(gpu_ordinals.begin(), gpu_ordinals.end()), gpu_ordinals.end());
  for (int ordinal : gpu_ordinals) {
    std::vector<std::pair<const float*, int64_t>> buffers;
    for (const Tensor* t : tensors) {
      if (t->device_id() == DeviceId::Cuda(ordinal)) buffers.emplace_back(t->data(), t->size());
    }
    finite = cuda::AllFinite(ordinal, buffers) && finite;
  }
#endif
  for (const Tensor* t : tensors) {
    if (t->on_host()) finite = cpu::AllFinite(t->size(), t->data()) && finite;
  }
  return finite;
}

// ---- Losses ----------------------------------------------------------------

LossSums Loss(LossKind kind, bool from_logits, const Tensor& output,
              absl::Span<const int32_t> labels, float grad_scale, Tensor* grad) {
  const DeviceId d = output.device_id();
  DISTRAIN_CHECK_EQ(output.rank(), 2) << LossKindName(kind) << ": output "
                                      << output.ShapeString();
  const int64_t batch = output.dim(0);
  const int64_t width = output.dim(1);
  DISTRAIN_CHECK_EQ(static_cast<int64_t>(labels.size()), batch) << "one label per output row";
  const bool binary = kind == LossKind::kBinaryCrossentropy;
  DISTRAIN_CHECK(binary ? width == 1 : width >= 1)
      << LossKindName(kind) << ": output " << output.ShapeString();
  // Labels index a class, except MeanSquaredError's width-1 regression
  // target (the label's value) and the binary 0/1 targets.
  const int64_t label_limit = binary ? 2 : width;
  if (!(kind == LossKind::kMeanSquaredError && width == 1)) {
    for (int64_t r = 0; r < batch; ++r) {
      DISTRAIN_CHECK(labels[r] >= 0 && labels[r] < label_limit)
          << LossKindName(kind) << ": label " << labels[r] << " at row " << r << " for output "
          << output.ShapeString();
    }
  }
  float* g = nullptr;
  if (grad != nullptr) {
    grad->Resize(output.shape(), d);
    g = grad->data();
  }
  LossSums sums;
  if (batch == 0) return sums;
  if (OnGpu(d)) {
    DISTRAIN_CUDA_ONLY(sums = cuda::Loss(d.ordinal, kind, from_logits, batch, width,
                                         output.data(), labels.data(), grad_scale, g));
    return sums;
  }
  const float* out = output.data();
  switch (kind) {
    case LossKind::kSparseCategoricalCrossentropy:
    case LossKind::kCategoricalCrossentropy:
      // With one-hot targets the two are the same function; from logits
      // both are tf.nn.(sparse_)softmax_cross_entropy_with_logits, here the
      // fused one-pass kernel (which also counts the argmax hits).
      if (from_logits) {
        sums.loss_sum = cpu::SoftmaxCrossEntropy(batch, width, out, labels.data(), grad_scale, g,
                                                 &sums.correct);
        return sums;
      }
      sums.loss_sum = kind == LossKind::kSparseCategoricalCrossentropy
                          ? cpu::SparseCrossentropyFromProbs(batch, width, out, labels.data(),
                                                             grad_scale, g)
                          : cpu::CategoricalCrossentropyFromProbs(batch, width, out,
                                                                  labels.data(), grad_scale, g);
      sums.correct = cpu::ArgmaxHits(batch, width, out, labels.data());
      return sums;
    case LossKind::kBinaryCrossentropy:
      sums.loss_sum =
          cpu::BinaryCrossentropy(from_logits, batch, out, labels.data(), grad_scale, g);
      // Keras' binary_accuracy thresholds the output at 0.5 whether or not
      // it is a logit (the metric does not know the loss's from_logits).
      sums.correct = cpu::ThresholdHits(batch, out, labels.data());
      return sums;
    case LossKind::kMeanSquaredError:
      sums.loss_sum = cpu::MeanSquaredError(batch, width, out, labels.data(), grad_scale, g);
      sums.correct = width == 1 ? cpu::ThresholdHits(batch, out, labels.data())
                                : cpu::ArgmaxHits(batch, width, out, labels.data());
      return sums;
  }
  DISTRAIN_CHECK(false) << "unknown loss " << static_cast<int>(kind);
  return sums;
}

// ---- Device transfers -------------------------------------------------------

void Copy(const Tensor& src, Tensor* dst) {
  if (dst == &src) return;
  const DeviceId from = src.device_id();
  const DeviceId to = dst->device_id();
  dst->Resize(src.shape(), to);
  if (src.size() == 0) return;
  if (!OnGpu(from) && !OnGpu(to)) {
    cpu::CopyFloats(src.size(), src.data(), dst->data());
    return;
  }
  DISTRAIN_CUDA_ONLY({
    if (!OnGpu(from)) {
      cuda::CopyHostToDevice(to.ordinal, src.data(), dst->data(), src.size());
    } else if (!OnGpu(to)) {
      cuda::CopyDeviceToHost(from.ordinal, src.data(), dst->data(), src.size());
    } else {
      cuda::CopyDeviceToDevice(from.ordinal, src.data(), to.ordinal, dst->data(), src.size());
    }
  });
}

void MoveTo(DeviceId device, Tensor* t) {
  if (t->device_id() == device) return;
  Tensor moved(t->shape(), device);
  Copy(*t, &moved);
  *t = std::move(moved);
}

}  // namespace distrain::ops

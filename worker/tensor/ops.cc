// ops.h's matrix products, broadcasts, activations, dropout, losses and
// copies: device dispatch plus shape checks, with the CPU work in
// cpu_math.h (GEMM, ReLU, softmax cross-entropy from logits) and
// cpu/elementwise_cpu.h (the elementwise.h functors). The windowed ops,
// batch norm and pooling live in ops_window.cc.

#include "worker/tensor/ops.h"

#include <cstring>

#include "common/check.h"
#include "worker/tensor/cpu/elementwise_cpu.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/elementwise.h"

namespace distrain::ops {
namespace {

// Every op calls this on each of its tensors: the CUDA backend is a later
// issue, and a CUDA tensor reaching an op before then is a bug in the caller.
void RequireCpu(const Tensor& t) {
  DISTRAIN_CHECK(t.device() == Device::kCpu) << "CUDA backend not built";
}

// The size of the last axis, for ops that work per row.
int64_t LastDim(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(t.rank() - 1); }

}  // namespace

// ---- Matrix products and broadcasts ----------------------------------------

void MatMul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, const Tensor& b, float beta, Tensor* c) {
  RequireCpu(a);
  RequireCpu(b);
  RequireCpu(*c);
  DISTRAIN_CHECK(a.size() >= m * k && b.size() >= k * n && c->size() >= m * n)
      << "MatMul m=" << m << " n=" << n << " k=" << k << " on a " << a.ShapeString() << ", b "
      << b.ShapeString() << ", c " << c->ShapeString();
  cpu::Gemm(trans_a, trans_b, m, n, k, alpha, a.data(), b.data(), beta, c->data());
}

void BiasAdd(const Tensor& bias, Tensor* y) {
  RequireCpu(bias);
  RequireCpu(*y);
  const int64_t cols = bias.size();
  DISTRAIN_CHECK(cols > 0 && LastDim(*y) == cols)
      << "BiasAdd: bias " << bias.ShapeString() << " on " << y->ShapeString();
  cpu::AddRowVector(y->size() / cols, cols, bias.data(), y->data());
}

void BroadcastBias(const Tensor& bias, Tensor* y) {
  RequireCpu(bias);
  RequireCpu(*y);
  const int64_t cols = bias.size();
  DISTRAIN_CHECK(cols > 0 && LastDim(*y) == cols)
      << "BroadcastBias: bias " << bias.ShapeString() << " into " << y->ShapeString();
  cpu::BroadcastRow(y->size() / cols, cols, bias.data(), y->data());
}

void BiasGrad(const Tensor& dy, Tensor* dbias) {
  RequireCpu(dy);
  RequireCpu(*dbias);
  const int64_t cols = dbias->size();
  DISTRAIN_CHECK(cols > 0 && LastDim(dy) == cols)
      << "BiasGrad: dy " << dy.ShapeString() << " into " << dbias->ShapeString();
  cpu::ColumnSums(dy.size() / cols, cols, dy.data(), dbias->data());
}

// ---- Activations -----------------------------------------------------------

void ActivationForward(ActivationKind kind, const Tensor& x, Tensor* y) {
  RequireCpu(x);
  RequireCpu(*y);
  if (y != &x) y->Resize(x.shape());
  const int64_t cols = LastDim(x);
  cpu::ActivationForward(kind, cols == 0 ? 0 : x.size() / cols, cols, x.data(), y->data());
}

void ActivationBackward(ActivationKind kind, const Tensor& x, const Tensor& y, const Tensor& dy,
                        Tensor* dx) {
  RequireCpu(dy);
  RequireCpu(*dx);
  // The kinds whose derivative is cheapest in the input read x; the rest y.
  const bool reads_x = kind == ActivationKind::kGelu;
  const bool reads_y = kind != ActivationKind::kGelu && kind != ActivationKind::kLinear;
  const Tensor& saved = reads_x ? x : y;
  if (reads_x || reads_y) {
    RequireCpu(saved);
    DISTRAIN_CHECK(saved.size() == dy.size())
        << "ActivationBackward(" << ActivationName(kind) << "): saved "
        << saved.ShapeString() << " vs dy " << dy.ShapeString();
  }
  if (dx != &dy) dx->Resize(dy.shape());
  const int64_t cols = LastDim(dy);
  cpu::ActivationBackward(kind, cols == 0 ? 0 : dy.size() / cols, cols, x.data(), y.data(),
                          dy.data(), dx->data());
}

// ---- Dropout ---------------------------------------------------------------

void DropoutForward(double rate, uint64_t stream, const Tensor& x, Tensor* y, Tensor* mask) {
  RequireCpu(x);
  RequireCpu(*y);
  RequireCpu(*mask);
  DISTRAIN_CHECK(rate >= 0 && rate < 1) << "Dropout rate " << rate;
  if (y != &x) y->Resize(x.shape());
  mask->Resize(x.shape());
  const elementwise::DropoutMask f{stream, elementwise::DropThreshold(rate),
                                   static_cast<float>(1.0 / (1.0 - rate))};
  cpu::DropoutForward(x.size(), f, x.data(), y->data(), mask->data());
}

void DropoutBackward(const Tensor& mask, const Tensor& dy, Tensor* dx) {
  RequireCpu(mask);
  RequireCpu(dy);
  RequireCpu(*dx);
  DISTRAIN_CHECK(mask.size() == dy.size())
      << "DropoutBackward: mask " << mask.ShapeString() << " vs dy " << dy.ShapeString();
  if (dx != &dy) dx->Resize(dy.shape());
  cpu::Multiply(dy.size(), dy.data(), mask.data(), dx->data());
}

// ---- Losses ----------------------------------------------------------------

LossSums Loss(LossKind kind, bool from_logits, const Tensor& output,
              absl::Span<const int32_t> labels, float grad_scale, Tensor* grad) {
  RequireCpu(output);
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
    RequireCpu(*grad);
    grad->Resize(output.shape());
    g = grad->data();
  }
  LossSums sums;
  if (batch == 0) return sums;
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
  RequireCpu(src);
  RequireCpu(*dst);
  if (dst == &src) return;
  dst->Resize(src.shape());
  if (src.size() > 0) std::memcpy(dst->data(), src.data(), src.bytes());
}

}  // namespace distrain::ops

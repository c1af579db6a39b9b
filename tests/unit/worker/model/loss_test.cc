#include "worker/model/loss.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

TEST(SoftmaxCrossEntropyTest, UniformLogitsGiveLogClassesAndKnownGradient) {
  const Tensor logits({2, 4}, std::vector<float>{0, 0, 0, 0, 3, 3, 3, 3});
  const std::vector<int32_t> labels = {1, 3};
  Tensor grad;
  const LossResult r = SoftmaxCrossEntropy(logits, labels, &grad);
  EXPECT_NEAR(r.loss, std::log(4.0), 1e-6);
  ASSERT_EQ(grad.shape(), logits.shape());
  // (softmax - onehot) / batch = (0.25 - [label]) / 2
  const std::vector<float> want = {0.125f, -0.375f, 0.125f, 0.125f,
                                   0.125f, 0.125f,  0.125f, -0.375f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(grad[i], want[i], 1e-6) << i;
}

TEST(SoftmaxCrossEntropyTest, HugeLogitsStayFinite) {
  const Tensor logits({2, 2}, std::vector<float>{1000, 0, 0, 1000});
  const std::vector<int32_t> labels = {0, 0};  // right (loss 0), wrong (loss 1000)
  Tensor grad;
  const LossResult r = SoftmaxCrossEntropy(logits, labels, &grad);
  EXPECT_NEAR(r.loss, 500.0, 1e-3);
  EXPECT_EQ(r.correct, 1);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(grad[i]));
  EXPECT_NEAR(grad[2], -0.5f, 1e-6);  // row 1: softmax = [0, 1], onehot = [1, 0], / 2
  EXPECT_NEAR(grad[3], 0.5f, 1e-6);
}

TEST(SoftmaxCrossEntropyTest, CorrectCountsFirstArgmax) {
  // Row 0 ties classes 0 and 2: the first one wins, like tf.argmax.
  const Tensor logits({3, 3}, std::vector<float>{5, 1, 5, 0, 2, 1, 3, 2, 1});
  EXPECT_EQ(SoftmaxCrossEntropy(logits, std::vector<int32_t>{0, 1, 2}, nullptr).correct, 2);
  EXPECT_EQ(SoftmaxCrossEntropy(logits, std::vector<int32_t>{2, 1, 0}, nullptr).correct, 2);
  EXPECT_EQ(SoftmaxCrossEntropy(logits, std::vector<int32_t>{1, 0, 1}, nullptr).correct, 0);
}

TEST(SoftmaxCrossEntropyTest, NullGradGivesSameLoss) {
  const Tensor logits({2, 3}, std::vector<float>{0.5f, -1, 2, 3, 0, -2});
  const std::vector<int32_t> labels = {2, 1};
  Tensor grad;
  EXPECT_DOUBLE_EQ(SoftmaxCrossEntropy(logits, labels, nullptr).loss,
                   SoftmaxCrossEntropy(logits, labels, &grad).loss);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t batch = 5, classes = 4;
  Tensor logits({batch, classes});
  for (int64_t i = 0; i < logits.size(); ++i) logits[i] = normal(gen);
  const std::vector<int32_t> labels = {0, 3, 1, 1, 2};
  Tensor grad;
  SoftmaxCrossEntropy(logits, labels, &grad);
  const float h = 1e-2f;
  for (int64_t i = 0; i < logits.size(); ++i) {
    Tensor plus = logits, minus = logits;
    plus[i] += h;
    minus[i] -= h;
    const double fd = (SoftmaxCrossEntropy(plus, labels, nullptr).loss -
                       SoftmaxCrossEntropy(minus, labels, nullptr).loss) /
                      (static_cast<double>(plus[i]) - minus[i]);
    EXPECT_NEAR(grad[i], fd, 1e-2 * std::abs(fd) + 1e-4) << "logit " << i;
  }
}


// ---- ops::Loss: every Keras loss x from_logits ----------------------------

struct LossCase {
  LossKind kind;
  bool from_logits;
  int64_t width;
};

std::string CaseName(const LossCase& c) {
  return std::string(LossKindName(c.kind)) + (c.from_logits ? " logits" : " probs") + " width " +
         std::to_string(c.width);
}

std::vector<LossCase> AllLossCases() {
  return {
      {LossKind::kSparseCategoricalCrossentropy, true, 4},
      {LossKind::kSparseCategoricalCrossentropy, false, 4},
      {LossKind::kCategoricalCrossentropy, true, 4},
      {LossKind::kCategoricalCrossentropy, false, 4},
      {LossKind::kBinaryCrossentropy, true, 1},
      {LossKind::kBinaryCrossentropy, false, 1},
      {LossKind::kMeanSquaredError, false, 4},
      {LossKind::kMeanSquaredError, false, 1},
  };
}

// Outputs a loss of that kind is meant for: logits anywhere; probabilities
// inside (0, 1), away from the clipping bounds.
Tensor Outputs(const LossCase& c, int64_t batch, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> logit(-3, 3), prob(0.05f, 0.95f);
  Tensor t({batch, c.width});
  for (int64_t i = 0; i < t.size(); ++i) t[i] = c.from_logits ? logit(gen) : prob(gen);
  return t;
}

std::vector<int32_t> Labels(const LossCase& c, int64_t batch, uint32_t seed) {
  std::mt19937 gen(seed);
  const int32_t n = c.width == 1 ? 2 : static_cast<int32_t>(c.width);
  std::vector<int32_t> labels(batch);
  for (auto& l : labels) l = static_cast<int32_t>(gen() % n);
  return labels;
}

TEST(OpsLossTest, GradientsMatchFiniteDifferencesForEveryLoss) {
  for (const LossCase& c : AllLossCases()) {
    SCOPED_TRACE(CaseName(c));
    const int64_t batch = 5;
    Tensor out = Outputs(c, batch, 1);
    const std::vector<int32_t> labels = Labels(c, batch, 2);
    const float scale = 0.2f;
    Tensor grad;
    ops::Loss(c.kind, c.from_logits, out, labels, scale, &grad);
    ASSERT_EQ(grad.shape(), out.shape());
    const float h = 1e-3f;
    for (int64_t i = 0; i < out.size(); ++i) {
      const float saved = out[i];
      out[i] = saved + h;
      const double xp = out[i];
      const double plus = ops::Loss(c.kind, c.from_logits, out, labels, 0, nullptr).loss_sum;
      out[i] = saved - h;
      const double xm = out[i];
      const double minus = ops::Loss(c.kind, c.from_logits, out, labels, 0, nullptr).loss_sum;
      out[i] = saved;
      const double fd = scale * (plus - minus) / (xp - xm);
      EXPECT_NEAR(grad[i], fd, 1e-2 * std::abs(fd) + 1e-4) << "element " << i;
    }
  }
}

TEST(OpsLossTest, KerasValuesOnProbabilities) {
  const std::vector<int32_t> one = {1};
  // Sparse: clip, then renormalise through log-softmax: log(sum c) - log c_y.
  {
    const Tensor p({1, 3}, std::vector<float>{0.2f, 0.3f, 0.1f});  // sums to 0.6
    const double want = std::log(0.6) - std::log(0.3);
    EXPECT_NEAR(ops::Loss(LossKind::kSparseCategoricalCrossentropy, false, p, one, 1, nullptr)
                    .loss_sum,
                want, 1e-6);
    // Categorical normalises first: -log(0.3 / 0.6), the same here.
    EXPECT_NEAR(
        ops::Loss(LossKind::kCategoricalCrossentropy, false, p, one, 1, nullptr).loss_sum, want,
        1e-6);
  }
  // A zero probability is clipped to 1e-7: -log(1e-7) ~= 16.118.
  {
    const Tensor p({1, 2}, std::vector<float>{1, 0});
    Tensor grad;
    const double loss =
        ops::Loss(LossKind::kSparseCategoricalCrossentropy, false, p, one, 1, &grad).loss_sum;
    EXPECT_NEAR(loss, std::log(1.0 + 1e-7) - std::log(1e-7), 1e-4);
    // Both entries sit outside the clipping interval: no gradient.
    EXPECT_EQ(grad[0], 0.0f);
    EXPECT_EQ(grad[1], 0.0f);
  }
  // Binary on probabilities and on logits.
  {
    const Tensor p({2, 1}, std::vector<float>{0.8f, 0.25f});
    const std::vector<int32_t> labels = {1, 0};
    EXPECT_NEAR(ops::Loss(LossKind::kBinaryCrossentropy, false, p, labels, 1, nullptr).loss_sum,
                -std::log(0.8) - std::log(0.75), 1e-6);
    const Tensor z({2, 1}, std::vector<float>{2, -1});
    EXPECT_NEAR(ops::Loss(LossKind::kBinaryCrossentropy, true, z, labels, 1, nullptr).loss_sum,
                std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-1.0)), 1e-6);
    // Huge logits stay finite.
    const Tensor big({2, 1}, std::vector<float>{1000, -1000});
    EXPECT_NEAR(
        ops::Loss(LossKind::kBinaryCrossentropy, true, big, labels, 1, nullptr).loss_sum, 0, 1e-6);
  }
  // MSE: the row mean of squared differences against one-hot or the label.
  {
    const Tensor out({1, 4}, std::vector<float>{0.5f, 1, 0, -1});
    EXPECT_NEAR(ops::Loss(LossKind::kMeanSquaredError, false, out, std::vector<int32_t>{1}, 1,
                          nullptr)
                    .loss_sum,
                (0.25 + 0 + 0 + 1) / 4, 1e-7);
    const Tensor w1({2, 1}, std::vector<float>{0.5f, 3});
    EXPECT_NEAR(ops::Loss(LossKind::kMeanSquaredError, false, w1, std::vector<int32_t>{1, 1}, 1,
                          nullptr)
                    .loss_sum,
                0.25 + 4, 1e-6);
  }
}

TEST(OpsLossTest, AccuracyIsKerasMetricForTheLoss) {
  // Categorical kinds: the first argmax equals the label.
  const Tensor p({3, 3}, std::vector<float>{0.5f, 0.1f, 0.5f, 0.1f, 0.7f, 0.2f, 0.6f, 0.3f, 0.1f});
  const std::vector<int32_t> labels = {0, 1, 2};
  for (LossKind kind : {LossKind::kSparseCategoricalCrossentropy,
                        LossKind::kCategoricalCrossentropy, LossKind::kMeanSquaredError}) {
    for (bool logits : {true, false}) {
      EXPECT_EQ(ops::Loss(kind, logits, p, labels, 1, nullptr).correct, 2)
          << LossKindName(kind) << " " << logits;
    }
  }
  // Binary: output > 0.5, even for logits (Keras' binary_accuracy does not
  // know the loss reads logits), and MSE on one output the same.
  const Tensor z({4, 1}, std::vector<float>{0.3f, 0.7f, -0.2f, 0.5f});
  const std::vector<int32_t> bl = {1, 1, 0, 0};
  EXPECT_EQ(ops::Loss(LossKind::kBinaryCrossentropy, true, z, bl, 1, nullptr).correct, 3);
  EXPECT_EQ(ops::Loss(LossKind::kBinaryCrossentropy, false, z, bl, 1, nullptr).correct, 3);
  EXPECT_EQ(ops::Loss(LossKind::kMeanSquaredError, false, z, bl, 1, nullptr).correct, 3);
}

TEST(OpsLossTest, SparseFromLogitsIsTheFusedKernelBitForBit) {
  const LossCase c{LossKind::kSparseCategoricalCrossentropy, true, 10};
  const Tensor out = Outputs(c, 32, 3);
  const std::vector<int32_t> labels = Labels(c, 32, 4);
  Tensor g1, g2;
  const LossResult r = SoftmaxCrossEntropy(out, labels, &g1);
  const ops::LossSums s = ops::Loss(c.kind, true, out, labels, 1.0f / 32, &g2);
  EXPECT_EQ(r.loss, s.loss_sum / 32);
  EXPECT_EQ(r.correct, s.correct);
  EXPECT_EQ(std::vector<float>(g1.span().begin(), g1.span().end()),
            std::vector<float>(g2.span().begin(), g2.span().end()));
}

}  // namespace
}  // namespace distrain

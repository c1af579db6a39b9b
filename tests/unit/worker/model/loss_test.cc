#include "worker/model/loss.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace distrain

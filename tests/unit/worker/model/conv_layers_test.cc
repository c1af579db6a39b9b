// Conv2D, pooling and GlobalAveragePooling2D: Keras' output geometry,
// gradients against central differences for padding x stride on odd sizes,
// and Keras' initialiser statistics.

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/conv_layers.h"

namespace distrain {
namespace {

using ::distrain::testing::DistinctTensor;
using ::distrain::testing::ExpectLayerGradients;
using ::distrain::testing::Training;
using ::distrain::testing::RandomTensor;
using ::testing::ElementsAre;

std::string Name(PaddingKind p, int64_t stride) {
  return std::string(p == PaddingKind::kSame ? "same" : "valid") + " stride " +
         std::to_string(stride);
}

TEST(Conv2DTest, OutputShapesAreKeras) {
  Conv2D valid("conv2d", 1, 32, {3, 3}, {1, 1}, PaddingKind::kValid, ActivationKind::kRelu,
               true, 1);
  EXPECT_THAT(valid.OutputShape({8, 28, 28, 1}), ElementsAre(8, 26, 26, 32));
  Conv2D same2("conv2d", 3, 4, {3, 3}, {2, 2}, PaddingKind::kSame, ActivationKind::kLinear, true,
               1);
  EXPECT_THAT(same2.OutputShape({2, 7, 5, 3}), ElementsAre(2, 4, 3, 4));  // ceil(7/2), ceil(5/2)
  Conv2D valid2("conv2d", 3, 4, {3, 2}, {2, 2}, PaddingKind::kValid, ActivationKind::kLinear,
                true, 1);
  EXPECT_THAT(valid2.OutputShape({2, 7, 5, 3}), ElementsAre(2, 3, 2, 4));
}

TEST(Conv2DTest, KnownValuesForAOneByOneAndACrossCorrelation) {
  // 3x3 single-channel image, 2x2 kernel, valid: cross-correlation (no flip).
  Conv2D conv("conv2d", 1, 1, {2, 2}, {1, 1}, PaddingKind::kValid, ActivationKind::kLinear, true,
              1);
  conv.parameters()[0]->value = Tensor({2, 2, 1, 1}, std::vector<float>{1, 2, 3, 4});
  conv.parameters()[1]->value = Tensor({1}, std::vector<float>{0.5f});
  const Tensor x({1, 3, 3, 1}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor y;
  conv.Forward(x, &y);
  ASSERT_THAT(y.shape(), ElementsAre(1, 2, 2, 1));
  // [1 2; 4 5] . [1 2; 3 4] = 1 + 4 + 12 + 20 = 37, etc.
  EXPECT_THAT(y.span(), ElementsAre(37.5f, 47.5f, 67.5f, 77.5f));
}

TEST(Conv2DTest, GradientsMatchFiniteDifferencesForEveryPaddingAndStride) {
  for (PaddingKind padding : {PaddingKind::kValid, PaddingKind::kSame}) {
    for (int64_t stride : {1, 2}) {
      for (std::array<int64_t, 2> kernel : {std::array<int64_t, 2>{3, 3}, {2, 3}}) {
        SCOPED_TRACE(Name(padding, stride) + " kernel " + std::to_string(kernel[0]) + "x" +
                     std::to_string(kernel[1]));
        Conv2D conv("conv2d", 2, 3, kernel, {stride, stride}, padding, ActivationKind::kTanh,
                    true, 11);
        conv.parameters()[1]->value = RandomTensor({3}, 4, 0.3f);
        ExpectLayerGradients(conv, RandomTensor({2, 7, 5, 2}, 3), Training(), 9,
                             {.h = 1e-2f, .rtol = 1e-2, .atol = 2e-3});
      }
    }
  }
}

TEST(Conv2DTest, NoBiasAndReluActivation) {
  Conv2D conv("conv2d", 3, 2, {3, 3}, {2, 1}, PaddingKind::kSame, ActivationKind::kRelu, false, 5);
  ASSERT_EQ(conv.parameters().size(), 1u);
  EXPECT_EQ(conv.parameters()[0]->name, "conv2d/kernel");
  ExpectLayerGradients(conv, RandomTensor({1, 5, 5, 3}, 8), Training(), 2,
                       {.h = 1e-3f, .rtol = 2e-2, .atol = 3e-3});
}

TEST(Conv2DTest, GlorotUniformWithKerasConvolutionFans) {
  // Keras: fan_in = kh * kw * in, fan_out = kh * kw * out.
  const int64_t kh = 3, kw = 3, in = 32, out = 64;
  Conv2D conv("conv2d_1", in, out, {kh, kw}, {1, 1}, PaddingKind::kValid, ActivationKind::kRelu,
              true, 42);
  const Tensor& kernel = conv.parameters()[0]->value;
  ASSERT_THAT(kernel.shape(), ElementsAre(kh, kw, in, out));
  EXPECT_EQ(conv.parameters()[0]->name, "conv2d_1/kernel");
  EXPECT_EQ(conv.parameters()[1]->name, "conv2d_1/bias");
  const double limit = std::sqrt(6.0 / (kh * kw * in + kh * kw * out));
  double sum = 0, sum_sq = 0, max_abs = 0;
  for (int64_t i = 0; i < kernel.size(); ++i) {
    sum += kernel[i];
    sum_sq += double{kernel[i]} * kernel[i];
    max_abs = std::max(max_abs, std::abs(double{kernel[i]}));
  }
  const double n = static_cast<double>(kernel.size());
  EXPECT_LE(max_abs, limit);
  EXPECT_GT(max_abs, 0.99 * limit);
  EXPECT_NEAR(sum / n, 0.0, 0.02 * limit);
  EXPECT_NEAR(sum_sq / n, limit * limit / 3, 0.05 * limit * limit / 3);
  for (float b : conv.parameters()[1]->value.span()) EXPECT_EQ(b, 0.0f);
}

TEST(PoolingTest, OutputShapesAndKnownValues) {
  Pooling2D max("max_pooling2d", ops::PoolKind::kMax, {2, 2}, {2, 2}, PaddingKind::kValid);
  EXPECT_THAT(max.OutputShape({4, 26, 26, 32}), ElementsAre(4, 13, 13, 32));
  EXPECT_THAT(max.OutputShape({4, 7, 7, 1}), ElementsAre(4, 3, 3, 1));
  Pooling2D avg_same("average_pooling2d", ops::PoolKind::kAverage, {2, 2}, {2, 2},
                     PaddingKind::kSame);
  EXPECT_THAT(avg_same.OutputShape({4, 7, 7, 1}), ElementsAre(4, 4, 4, 1));

  const Tensor x({1, 3, 3, 1}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor y;
  max.Forward(x, &y);
  EXPECT_THAT(y.span(), ElementsAre(5.0f));
  // Same padding: the bottom/right windows hold fewer real inputs, and the
  // average divides by those only (TensorFlow).
  avg_same.Forward(x, &y);
  ASSERT_THAT(y.shape(), ElementsAre(1, 2, 2, 1));
  EXPECT_THAT(y.span(), ElementsAre(3.0f, 4.5f, 7.5f, 9.0f));
}

TEST(PoolingTest, GradientsMatchFiniteDifferencesForEveryPaddingAndStride) {
  for (ops::PoolKind kind : {ops::PoolKind::kMax, ops::PoolKind::kAverage}) {
    for (PaddingKind padding : {PaddingKind::kValid, PaddingKind::kSame}) {
      for (int64_t stride : {1, 2}) {
        for (std::array<int64_t, 2> pool : {std::array<int64_t, 2>{2, 2}, {3, 2}}) {
          SCOPED_TRACE(std::string(kind == ops::PoolKind::kMax ? "max " : "avg ") +
                       Name(padding, stride) + " pool " + std::to_string(pool[0]) + "x" +
                       std::to_string(pool[1]));
          Pooling2D layer("pool", kind, pool, {stride, stride}, padding);
          // Distinct inputs 2/70 apart: no tie and no argmax change within h.
          ExpectLayerGradients(layer, DistinctTensor({1, 7, 5, 2}, 5), Training(), 6,
                               {.h = 1e-3f, .rtol = 1e-2, .atol = 1e-3});
        }
      }
    }
  }
}

TEST(GlobalAveragePooling2DTest, MeanOverRowsAndColumns) {
  GlobalAveragePooling2D gap("global_average_pooling2d");
  EXPECT_THAT(gap.OutputShape({3, 5, 7, 4}), ElementsAre(3, 4));
  const Tensor x({1, 2, 2, 2}, std::vector<float>{1, 10, 2, 20, 3, 30, 4, 40});
  Tensor y;
  gap.Forward(x, &y);
  EXPECT_THAT(y.span(), ElementsAre(2.5f, 25.0f));
  ExpectLayerGradients(gap, RandomTensor({2, 5, 3, 4}, 2), Training(), 3);
}

}  // namespace
}  // namespace distrain

// BatchNormalization: Keras' initial values and names, batch statistics
// while training with the moving-average update, moving statistics at
// evaluation, and gradients against central differences.
// LayerNormalization and RMSNormalization: Keras' variables for each
// center/scale choice, per-example statistics (the batch never mixes), the
// same output in training and evaluation, and gradients against central
// differences. Values against Keras itself: tests/golden/layers.json.

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/normalization.h"

namespace distrain {
namespace {

using ::distrain::testing::ExpectLayerGradients;
using ::distrain::testing::Training;
using ::distrain::testing::RandomTensor;
using ::testing::ElementsAre;

std::vector<float> Values(const Tensor& t) { return {t.span().begin(), t.span().end()}; }

TEST(BatchNormalizationTest, KerasVariablesAndInitialValues) {
  BatchNormalization bn("batch_normalization", 3, 0.99, 1e-3);
  std::vector<std::string> names;
  for (Parameter* p : bn.parameters()) names.push_back(p->name);
  EXPECT_THAT(names, ElementsAre("batch_normalization/gamma", "batch_normalization/beta"));
  names.clear();
  for (Parameter* p : bn.state_variables()) names.push_back(p->name);
  EXPECT_THAT(names, ElementsAre("batch_normalization/moving_mean",
                                 "batch_normalization/moving_variance"));
  EXPECT_THAT(Values(bn.parameters()[0]->value), ElementsAre(1, 1, 1));
  EXPECT_THAT(Values(bn.parameters()[1]->value), ElementsAre(0, 0, 0));
  EXPECT_THAT(Values(bn.state_variables()[0]->value), ElementsAre(0, 0, 0));
  EXPECT_THAT(Values(bn.state_variables()[1]->value), ElementsAre(1, 1, 1));
}

TEST(BatchNormalizationTest, TrainingUsesBatchStatisticsAndUpdatesMovingOnes) {
  const double momentum = 0.9, eps = 1e-3;
  BatchNormalization bn("bn", 2, momentum, eps);
  // Channel 0: 1, 3, 5, 7 (mean 4, biased variance 5); channel 1: all 2.
  const Tensor x({2, 2, 1, 2}, std::vector<float>{1, 2, 3, 2, 5, 2, 7, 2});
  Tensor y;
  bn.Forward(x, &y, Training());
  const double inv = 1 / std::sqrt(5.0 + eps);
  EXPECT_NEAR(y[0], (1 - 4) * inv, 1e-6);
  EXPECT_NEAR(y[6], (7 - 4) * inv, 1e-6);
  EXPECT_NEAR(y[1], 0.0, 1e-6);
  const Tensor& mean = bn.state_variables()[0]->value;
  const Tensor& var = bn.state_variables()[1]->value;
  // moving = moving * momentum + batch * (1 - momentum), biased variance.
  EXPECT_NEAR(mean[0], 0 * 0.9 + 4 * 0.1, 1e-6);
  EXPECT_NEAR(mean[1], 2 * 0.1, 1e-6);
  EXPECT_NEAR(var[0], 1 * 0.9 + 5 * 0.1, 1e-6);
  EXPECT_NEAR(var[1], 1 * 0.9 + 0 * 0.1, 1e-6);
  // A second training step moves them again.
  bn.Forward(x, &y, Training());
  EXPECT_NEAR(mean[0], 0.4 * 0.9 + 4 * 0.1, 1e-6);
}

TEST(BatchNormalizationTest, EvaluationUsesMovingStatisticsAndChangesNothing) {
  BatchNormalization bn("bn", 2, 0.99, 1e-3);
  bn.parameters()[0]->value = Tensor({2}, std::vector<float>{2, 0.5f});
  bn.parameters()[1]->value = Tensor({2}, std::vector<float>{1, -1});
  bn.state_variables()[0]->value = Tensor({2}, std::vector<float>{0.5f, -1});
  bn.state_variables()[1]->value = Tensor({2}, std::vector<float>{4, 0.25f});
  const Tensor x({3, 2}, std::vector<float>{1, 0, 2, -1, -3, 5});
  Tensor y;
  bn.Forward(x, &y, ForwardContext{});
  for (int r = 0; r < 3; ++r) {
    EXPECT_NEAR(y[r * 2], 2 * (x[r * 2] - 0.5) / std::sqrt(4 + 1e-3) + 1, 1e-5);
    EXPECT_NEAR(y[r * 2 + 1], 0.5 * (x[r * 2 + 1] + 1) / std::sqrt(0.25 + 1e-3) - 1, 1e-5);
  }
  EXPECT_THAT(Values(bn.state_variables()[0]->value), ElementsAre(0.5f, -1));
  EXPECT_THAT(Values(bn.state_variables()[1]->value), ElementsAre(4, 0.25f));
}

TEST(BatchNormalizationTest, TrainingGradientsMatchFiniteDifferences) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{6, 4}, {2, 3, 3, 3}}) {
    SCOPED_TRACE(Tensor(shape).ShapeString());
    const int64_t c = shape.back();
    BatchNormalization bn("bn", c, 0.99, 1e-3);
    bn.parameters()[0]->value = RandomTensor({c}, 1, 1.0f);
    bn.parameters()[1]->value = RandomTensor({c}, 2, 1.0f);
    ExpectLayerGradients(bn, RandomTensor(shape, 3, 2.0f), Training(), 4,
                         {.h = 1e-2f, .rtol = 2e-2, .atol = 2e-3});
  }
}

TEST(LayerNormalizationTest, KerasVariablesForEachChoice) {
  struct Case {
    bool center, scale, rms;
    std::vector<std::string> names;
  };
  for (const Case& c : std::vector<Case>{
           {true, true, false, {"ln/gamma", "ln/beta"}},
           {false, true, false, {"ln/gamma"}},
           {true, false, false, {"ln/beta"}},
           {false, false, false, {}},
           {true, true, true, {"ln/scale"}},  // RMSNormalization has no beta
       }) {
    LayerNormalization ln("ln", 3, 1e-3, c.center, c.scale, c.rms);
    std::vector<std::string> names;
    for (Parameter* p : ln.parameters()) {
      names.push_back(p->name);
      EXPECT_EQ(p->value.shape(), std::vector<int64_t>{3});
    }
    EXPECT_EQ(names, c.names);
    EXPECT_TRUE(ln.state_variables().empty());
  }
}

TEST(LayerNormalizationTest, EachExampleIsNormalisedOnItsOwn) {
  const double eps = 1e-3;
  LayerNormalization ln("ln", 4, eps, true, true, false);
  ln.parameters()[0]->value = Tensor({4}, std::vector<float>{1, 2, 0.5f, -1});
  ln.parameters()[1]->value = Tensor({4}, std::vector<float>{0, 1, -1, 0.25f});
  // Row 0: 1, 3, 5, 7 (mean 4, biased variance 5); row 1 is row 0 times 100
  // plus 9: the same normalised values, so no statistic crosses rows.
  const Tensor x({2, 4}, std::vector<float>{1, 3, 5, 7, 109, 309, 509, 709});
  Tensor train_y, eval_y;
  ln.Forward(x, &train_y, Training());
  ln.Forward(x, &eval_y, ForwardContext{});
  EXPECT_EQ(Values(train_y), Values(eval_y)) << "no batch statistics: training == evaluation";
  const float gamma[] = {1, 2, 0.5f, -1}, beta[] = {0, 1, -1, 0.25f};
  for (int r = 0; r < 2; ++r) {
    const double var = r == 0 ? 5.0 : 50000.0;
    for (int k = 0; k < 4; ++k) {
      const double xhat = (x[r * 4 + k] - (r == 0 ? 4.0 : 409.0)) / std::sqrt(var + eps);
      EXPECT_NEAR(train_y[r * 4 + k], gamma[k] * xhat + beta[k], 2e-5) << r << "," << k;
    }
  }
}

TEST(LayerNormalizationTest, RmsNormalisationDividesByTheRootMeanSquare) {
  const double eps = 1e-6;
  LayerNormalization rms("rms", 3, eps, true, true, /*rms=*/true);
  rms.parameters()[0]->value = Tensor({3}, std::vector<float>{1, 2, -0.5f});
  const Tensor x({2, 3}, std::vector<float>{1, 2, 2, -3, 0, 4});
  Tensor y;
  rms.Forward(x, &y, ForwardContext{});
  const float scale[] = {1, 2, -0.5f};
  for (int r = 0; r < 2; ++r) {
    const double ms = r == 0 ? 3.0 : 25.0 / 3.0;  // (1 + 4 + 4) / 3, (9 + 0 + 16) / 3
    for (int k = 0; k < 3; ++k) {
      EXPECT_NEAR(y[r * 3 + k], scale[k] * x[r * 3 + k] / std::sqrt(ms + eps), 1e-6);
    }
  }
}

TEST(LayerNormalizationTest, GradientsMatchFiniteDifferences) {
  struct Case {
    bool center, scale, rms;
  };
  for (const Case& c : std::vector<Case>{{true, true, false},
                                         {false, false, false},
                                         {true, false, false},
                                         {false, true, true}}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{5, 6}, {2, 3, 2, 4}}) {
      SCOPED_TRACE(::testing::Message() << Tensor(shape).ShapeString() << " center " << c.center
                                        << " scale " << c.scale << " rms " << c.rms);
      const int64_t features = shape.back();
      LayerNormalization ln("ln", features, 1e-3, c.center, c.scale, c.rms);
      uint32_t seed = 10;
      for (Parameter* p : ln.parameters()) p->value = RandomTensor({features}, ++seed, 1.0f);
      ExpectLayerGradients(ln, RandomTensor(shape, 3, 2.0f), Training(), 4,
                           {.h = 1e-2f, .rtol = 2e-2, .atol = 2e-3});
    }
  }
}

}  // namespace
}  // namespace distrain

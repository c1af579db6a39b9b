// Dense (activations, use_bias), Activation, Flatten, Reshape and Dropout:
// values, gradients against central differences, and Dropout's streams.

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/worker/model/device_test_util.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/activation_layer.h"
#include "worker/model/dropout.h"
#include "worker/model/layer.h"
#include "worker/model/rescaling.h"
#include "worker/model/reshape_layers.h"

namespace distrain {
namespace {

using ::distrain::testing::ExpectLayerGradients;
using ::distrain::testing::GradCheckOptions;
using ::distrain::testing::RandomTensor;
using ::testing::ElementsAre;

using ::distrain::testing::AllActivationFunctions;

ForwardContext Training(uint64_t stream = 0) {
  ForwardContext ctx;
  ctx.training = true;
  ctx.rng_stream = stream;
  return ctx;
}

// Moves every element at least `gap` away from 0 (ReLU's kink).
void AwayFromZero(Tensor* t, float gap) {
  for (int64_t i = 0; i < t->size(); ++i) {
    if (std::abs((*t)[i]) < gap) (*t)[i] = (*t)[i] < 0 ? -2 * gap : 2 * gap;
  }
}

TEST(ActivationTest, ValuesMatchTheirDefinitions) {
  const Tensor x({2, 3}, std::vector<float>{-2, 0, 1.5f, 30, -30, 0.25f});
  auto run = [&](ActivationKind kind) {
    Activation layer("activation", kind);
    Tensor y;
    layer.Forward(x, &y);
    EXPECT_EQ(y.shape(), x.shape());
    return y;
  };
  const Tensor relu = run(ActivationKind::kRelu);
  const Tensor sigmoid = run(ActivationKind::kSigmoid);
  const Tensor tanh = run(ActivationKind::kTanh);
  const Tensor gelu = run(ActivationKind::kGelu);
  const Tensor softmax = run(ActivationKind::kSoftmax);
  const Tensor linear = run(ActivationKind::kLinear);
  for (int64_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_EQ(relu[i], v > 0 ? x[i] : 0.0f);
    EXPECT_NEAR(sigmoid[i], 1 / (1 + std::exp(-v)), 1e-7);
    EXPECT_NEAR(tanh[i], std::tanh(v), 1e-7);
    EXPECT_NEAR(gelu[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6 * (1 + std::abs(v)));
    EXPECT_EQ(linear[i], x[i]);
  }
  // Softmax per row, stable for +-30.
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(static_cast<double>(x[r * 3 + c]));
    double sum = 0;
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(softmax[r * 3 + c], std::exp(static_cast<double>(x[r * 3 + c])) / z, 1e-7);
      sum += softmax[r * 3 + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  // Huge logits stay finite.
  Activation sm("activation", ActivationKind::kSoftmax);
  Tensor y;
  sm.Forward(Tensor({1, 3}, std::vector<float>{1e30f, -1e30f, 0}), &y);
  EXPECT_THAT(y.span(), ElementsAre(1.0f, 0.0f, 0.0f));
  Activation sig("activation", ActivationKind::kSigmoid);
  sig.Forward(Tensor({1, 2}, std::vector<float>{-200, 200}), &y);
  EXPECT_THAT(y.span(), ElementsAre(0.0f, 1.0f));
}

TEST(ActivationTest, GradientsMatchFiniteDifferences) {
  for (ActivationFunction f : AllActivationFunctions()) {
    SCOPED_TRACE(absl::StrCat(ActivationName(f.kind), " alpha ", f.alpha));
    Activation layer("activation", f);
    Tensor input = RandomTensor({3, 2, 5}, 3, 3.0f);
    AwayFromZero(&input, 0.05f);
    ExpectLayerGradients(layer, input, Training(), 4, {.h = 1e-2f, .rtol = 1e-2, .atol = 2e-3});
  }
}

// Dense and Conv2D apply their activation in place (y overwrites x): the
// backward pass must still see what it needs — GELU its input, which the
// in-place forward destroys, the others their output.
TEST(ActivationTest, InPlaceForwardGivesTheSameGradientAsOutOfPlace) {
  for (ActivationFunction f : AllActivationFunctions()) {
    const ActivationKind kind = f.kind;
    Activation a("activation", f), b("activation", f);
    const Tensor x = RandomTensor({2, 4}, 1);
    const Tensor dy = RandomTensor({2, 4}, 2);
    Tensor y, g1, g2;
    a.Forward(x, &y);
    a.Backward(dy, &g1);
    Tensor z = x;
    b.Forward(z, &z);
    EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
              std::vector<float>(z.span().begin(), z.span().end()))
        << ActivationName(kind);
    b.Backward(dy, &g2);
    EXPECT_EQ(std::vector<float>(g1.span().begin(), g1.span().end()),
              std::vector<float>(g2.span().begin(), g2.span().end()))
        << ActivationName(kind);
  }
}

TEST(DenseTest, EveryActivationAndNoBiasMatchFiniteDifferences) {
  for (ActivationFunction f : AllActivationFunctions()) {
    for (bool use_bias : {true, false}) {
      SCOPED_TRACE(absl::StrCat(ActivationName(f.kind), " alpha ", f.alpha,
                                use_bias ? " bias" : " no bias"));
      Dense dense("dense", 4, 3, 7, f, use_bias);
      ASSERT_EQ(dense.parameters().size(), use_bias ? 2u : 1u);
      if (use_bias) dense.parameters()[1]->value = RandomTensor({3}, 5);
      // Inputs and a kernel that keep the pre-activations off ReLU's kink.
      Tensor input = RandomTensor({5, 4}, 6);
      ExpectLayerGradients(dense, input, Training(), 8, {.h = 1e-3f, .rtol = 2e-2, .atol = 2e-3});
    }
  }
}

TEST(DenseTest, ActivationIsAppliedAfterTheBias) {
  Dense dense("dense", 2, 2, 1, ActivationKind::kRelu);
  dense.parameters()[0]->value = Tensor({2, 2}, std::vector<float>{1, 0, 0, 1});
  dense.parameters()[1]->value = Tensor({2}, std::vector<float>{-1, 1});
  Tensor y;
  dense.Forward(Tensor({1, 2}, std::vector<float>{0.5f, -0.5f}), &y);
  EXPECT_THAT(y.span(), ElementsAre(0.0f, 0.5f));  // relu(0.5 - 1), relu(-0.5 + 1)
}

// The parameter server's factors, for a batch of rows and for a batch of
// sequences (each position a row of the matrices the push carries).
TEST(DenseTest, FactorsAreTheInputAndThePreActivationGradient) {
  for (const std::vector<int64_t>& lead : {std::vector<int64_t>{4}, {2, 3}}) {
    SCOPED_TRACE(lead.size());
    Dense dense("dense", 3, 2, 1, ActivationKind::kTanh);
    ASSERT_TRUE(dense.SetFactoredKernelGrad(true));
    Dense plain("dense", 3, 2, 1, ActivationKind::kTanh);
    std::vector<int64_t> x_shape = lead, dy_shape = lead;
    x_shape.push_back(3);
    dy_shape.push_back(2);
    const Tensor x = RandomTensor(x_shape, 1);
    const Tensor dy = RandomTensor(dy_shape, 2);
    Tensor y, dx;
    plain.Forward(x, &y);
    plain.Backward(dy, &dx);
    dense.Forward(x, &y);
    dense.Backward(dy, &dx);
    const std::optional<GradFactors> f = dense.KernelGradFactors();
    ASSERT_TRUE(f.has_value());
    const int64_t rows = x.size() / 3;
    ASSERT_EQ(f->left->shape(), (std::vector<int64_t>{rows, 3}));
    ASSERT_EQ(f->right->shape(), (std::vector<int64_t>{rows, 2}));
    const Tensor& want = plain.parameters()[0]->grad;
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        double g = 0;
        for (int64_t b = 0; b < rows; ++b) g += double{f->left->at(b, i)} * f->right->at(b, j);
        EXPECT_NEAR(g, want.at(i, j), 1e-6);
      }
    }
  }
}

// Keras' Dense on a sequence: each step through the same kernel, gradients
// against central differences.
TEST(DenseTest, OnASequenceEachStepIsARowAndGradientsMatchFiniteDifferences) {
  Dense dense("dense", 4, 3, 7, ActivationKind::kTanh);
  dense.parameters()[1]->value = RandomTensor({3}, 5);
  const Tensor x = RandomTensor({2, 5, 4}, 6);
  Tensor y;
  dense.Forward(x, &y);
  EXPECT_THAT(y.shape(), ElementsAre(2, 5, 3));
  Dense rows("dense", 4, 3, 7, ActivationKind::kTanh);
  rows.parameters()[1]->value = dense.parameters()[1]->value;
  Tensor flat_y;
  rows.Forward(Tensor({10, 4}, std::vector<float>(x.span().begin(), x.span().end())), &flat_y);
  EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
            std::vector<float>(flat_y.span().begin(), flat_y.span().end()));
  ExpectLayerGradients(dense, x, Training(), 8, {.h = 1e-3f, .rtol = 2e-2, .atol = 2e-3});
}

TEST(ReshapeLayersTest, FlattenAndReshapeKeepRowMajorOrder) {
  const Tensor x = RandomTensor({2, 3, 2, 2}, 1);
  Flatten flatten("flatten");
  Tensor y, dx;
  flatten.Forward(x, &y);
  EXPECT_THAT(y.shape(), ElementsAre(2, 12));
  EXPECT_EQ(y.data(), x.data()) << "Flatten passes its input on without a copy";
  EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
            std::vector<float>(x.span().begin(), x.span().end()));
  flatten.Backward(y, &dx);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dx.data(), y.data()) << "and its output gradient back the same way";

  Reshape reshape("reshape", {3, -1});
  EXPECT_THAT(reshape.OutputShape({2, 12}), ElementsAre(2, 3, 4));
  reshape.Forward(y, &dx);
  EXPECT_THAT(dx.shape(), ElementsAre(2, 3, 4));
  Reshape image("reshape", {28, 28, 1});
  EXPECT_THAT(image.OutputShape({5, 784}), ElementsAre(5, 28, 28, 1));
  ExpectLayerGradients(reshape, y, Training(), 3);
  ExpectLayerGradients(flatten, x, Training(), 3);
}

TEST(DropoutTest, IdentityAtEvaluation) {
  Dropout dropout("dropout", 0.5);
  const Tensor x = RandomTensor({4, 8}, 1);
  Tensor y, dx;
  ForwardContext eval;
  eval.rng_stream = 99;
  dropout.Forward(x, &y, eval);
  EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
            std::vector<float>(x.span().begin(), x.span().end()));
  dropout.Backward(x, &dx);
  EXPECT_EQ(std::vector<float>(dx.span().begin(), dx.span().end()),
            std::vector<float>(x.span().begin(), x.span().end()));
  // Rate 0 is the identity while training too.
  Dropout none("dropout", 0.0);
  none.Forward(x, &y, Training(5));
  EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
            std::vector<float>(x.span().begin(), x.span().end()));
}

TEST(DropoutTest, MaskIsReproduciblePerStreamAndScalesSurvivors) {
  const double rate = 0.3;
  const Tensor x({100, 100}, 1.0f);
  auto run = [&](const std::string& name, uint64_t stream) {
    Dropout d(name, rate);
    Tensor y;
    d.Forward(x, &y, Training(stream));
    return std::vector<float>(y.span().begin(), y.span().end());
  };
  const std::vector<float> a = run("dropout", 7);
  EXPECT_EQ(a, run("dropout", 7));
  EXPECT_NE(a, run("dropout", 8));
  EXPECT_NE(a, run("dropout_1", 7)) << "layers of one model draw different masks";
  int64_t kept = 0;
  const float scale = static_cast<float>(1.0 / (1.0 - rate));
  for (float v : a) {
    ASSERT_TRUE(v == 0.0f || v == scale) << v;
    kept += v != 0.0f;
  }
  // 10000 Bernoulli(0.7) draws: mean 7000, sd ~46.
  EXPECT_NEAR(static_cast<double>(kept), 7000.0, 250.0);
}

TEST(DropoutTest, GradientMatchesFiniteDifferencesWithAFixedStream) {
  Dropout dropout("dropout", 0.4);
  ExpectLayerGradients(dropout, RandomTensor({3, 7}, 2), Training(1234), 5);
  // And the gradient is the mask: zero exactly where the output was dropped.
  Tensor y, dx;
  const Tensor x({1, 64}, 1.0f);
  dropout.Forward(x, &y, Training(77));
  dropout.Backward(Tensor({1, 64}, 1.0f), &dx);
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(dx[i], y[i]);
}

// Rescaling is x * scale + offset both ways of the step; under a 16-bit
// policy it multiplies by scale as Keras casts it (1/255 in bfloat16 is
// 0.0039368), so a mixed model's first activations equal Keras'.
TEST(RescalingTest, ScalesAndShiftsWithTheScaleCastToTheComputeType) {
  Rescaling layer("rescaling", 1.0 / 255, -0.5);
  const Tensor x({1, 3}, std::vector<float>{0, 128, 255});
  Tensor y;
  layer.Forward(x, &y);
  EXPECT_THAT(y.span(), ElementsAre(-0.5f, 128 * (1.0f / 255) - 0.5f, 255 * (1.0f / 255) - 0.5f));
  Tensor dx;
  layer.Backward(Tensor({1, 3}, std::vector<float>{1, 2, -4}), &dx);
  EXPECT_THAT(dx.span(), ElementsAre(1.0f / 255, 2.0f / 255, -4.0f / 255));

  layer.set_compute_type(ComputeType::kBfloat16);
  layer.Forward(x, &y);
  const float bf16_scale = 0.003936767578125f;  // 1/255 rounded to bfloat16
  EXPECT_FLOAT_EQ(y[2], 255 * bf16_scale - 0.5f);
  EXPECT_NE(y[2], 255 * (1.0f / 255) - 0.5f);
}

}  // namespace
}  // namespace distrain

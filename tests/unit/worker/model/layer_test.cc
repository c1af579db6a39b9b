#include "worker/model/layer.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/activation_layer.h"

namespace distrain {
namespace {

Tensor RandomTensor(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.size(); ++i) t[i] = uniform(gen);
  return t;
}

// L = sum(output * weights): a scalar whose dL/d(output) is `weights`.
double WeightedSum(const Tensor& output, const Tensor& weights) {
  double s = 0;
  for (int64_t i = 0; i < output.size(); ++i) s += static_cast<double>(output[i]) * weights[i];
  return s;
}

// Central differences of L(layer.Forward(input)) w.r.t. every element of
// *target (a parameter value or the input), compared with `analytic`.
void ExpectMatchesFiniteDifferences(Layer& layer, Tensor& input, Tensor* target,
                                    const Tensor& weights, const Tensor& analytic, float h,
                                    const std::string& what) {
  ASSERT_EQ(analytic.size(), target->size()) << what;
  Tensor out;
  for (int64_t i = 0; i < target->size(); ++i) {
    const float saved = (*target)[i];
    (*target)[i] = saved + h;
    const double x_plus = (*target)[i];
    layer.Forward(input, &out);
    const double plus = WeightedSum(out, weights);
    (*target)[i] = saved - h;
    const double x_minus = (*target)[i];
    layer.Forward(input, &out);
    const double minus = WeightedSum(out, weights);
    (*target)[i] = saved;
    const double fd = (plus - minus) / (x_plus - x_minus);
    EXPECT_NEAR(analytic[i], fd, 1e-2 * std::abs(fd) + 1e-4) << what << " element " << i;
  }
}

TEST(DenseTest, ForwardIsInputTimesKernelPlusBias) {
  Dense dense("dense_0", 3, 2, 1);
  auto params = dense.parameters();
  params[0]->value = Tensor({3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  params[1]->value = Tensor({2}, std::vector<float>{0.5f, -1});
  const Tensor input({2, 3}, std::vector<float>{1, 0, -1, 2, 1, 0});
  Tensor out;
  dense.Forward(input, &out);
  ASSERT_EQ(out.shape(), (std::vector<int64_t>{2, 2}));
  // [1 0 -1] W = [1-5, 2-6] = [-4, -4]; [2 1 0] W = [2+3, 4+4] = [5, 8]
  EXPECT_EQ(out.span(), (absl::Span<const float>(std::vector<float>{-3.5f, -5, 5.5f, 7})));
  EXPECT_EQ(dense.OutputShape({17, 3}), (std::vector<int64_t>{17, 2}));
}

TEST(DenseTest, GradientsMatchFiniteDifferences) {
  Dense dense("dense_0", 4, 3, 11);
  Tensor input = RandomTensor({5, 4}, 1);
  const Tensor weights = RandomTensor({5, 3}, 2);
  // Non-zero bias so a bias bug in Forward would show up too.
  Parameter* kernel = dense.parameters()[0];
  Parameter* bias = dense.parameters()[1];
  bias->value = RandomTensor({3}, 3);

  Tensor out, grad_input;
  dense.Forward(input, &out);
  dense.Backward(weights, &grad_input);
  const Tensor kernel_grad = kernel->grad, bias_grad = bias->grad;
  ASSERT_EQ(grad_input.shape(), input.shape());

  ExpectMatchesFiniteDifferences(dense, input, &kernel->value, weights, kernel_grad, 1e-2f,
                                 "kernel");
  ExpectMatchesFiniteDifferences(dense, input, &bias->value, weights, bias_grad, 1e-2f, "bias");
  ExpectMatchesFiniteDifferences(dense, input, &input, weights, grad_input, 1e-2f, "input");
}

TEST(DenseTest, BackwardWithoutGradInputStillWritesParameterGrads) {
  Dense with("d", 4, 3, 5), without("d", 4, 3, 5);
  const Tensor input = RandomTensor({2, 4}, 1);
  const Tensor grad_out = RandomTensor({2, 3}, 2);
  Tensor out, grad_input;
  with.Forward(input, &out);
  with.Backward(grad_out, &grad_input);
  without.Forward(input, &out);
  without.parameters()[0]->grad.Fill(NAN);
  without.parameters()[1]->grad.Fill(NAN);
  without.Backward(grad_out, nullptr);
  for (int p = 0; p < 2; ++p) {
    const Tensor& a = with.parameters()[p]->grad;
    const Tensor& b = without.parameters()[p]->grad;
    for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]);
  }
}

TEST(DenseTest, GlorotUniformInitAndZeroBias) {
  const int64_t in = 200, out = 100;
  Dense dense("dense_3", in, out, 42);
  const Tensor& kernel = dense.parameters()[0]->value;
  const Tensor& bias = dense.parameters()[1]->value;
  EXPECT_EQ(dense.parameters()[0]->name, "dense_3/kernel");
  EXPECT_EQ(dense.parameters()[1]->name, "dense_3/bias");
  ASSERT_EQ(kernel.shape(), (std::vector<int64_t>{in, out}));
  const double limit = std::sqrt(6.0 / (in + out));
  double sum = 0, sum_sq = 0, max_abs = 0;
  for (int64_t i = 0; i < kernel.size(); ++i) {
    sum += kernel[i];
    sum_sq += static_cast<double>(kernel[i]) * kernel[i];
    max_abs = std::max(max_abs, std::abs(static_cast<double>(kernel[i])));
  }
  const double n = static_cast<double>(kernel.size());
  EXPECT_LE(max_abs, limit);
  EXPECT_GT(max_abs, 0.99 * limit);  // spans the whole range
  EXPECT_NEAR(sum / n, 0.0, 0.02 * limit);
  EXPECT_NEAR(sum_sq / n, limit * limit / 3, 0.05 * limit * limit / 3);  // Var of U(-a, a)
  for (int64_t i = 0; i < bias.size(); ++i) EXPECT_EQ(bias[i], 0.0f);
}

TEST(DenseTest, InitDependsOnlyOnSeedAndName) {
  auto kernel = [](const std::string& name, uint64_t seed) {
    Dense d(name, 6, 5, seed);
    return std::vector<float>(d.parameters()[0]->value.span().begin(),
                              d.parameters()[0]->value.span().end());
  };
  EXPECT_EQ(kernel("dense_0", 1), kernel("dense_0", 1));
  EXPECT_NE(kernel("dense_0", 1), kernel("dense_0", 2));
  EXPECT_NE(kernel("dense_0", 1), kernel("dense_1", 1));
}

TEST(ReLUTest, ForwardAndBackward) {
  Activation relu("relu_0", ActivationKind::kRelu);
  const Tensor input({2, 3}, std::vector<float>{-1, 2, 0, 3, -4, 5});
  Tensor out, grad_input;
  relu.Forward(input, &out);
  EXPECT_EQ(out.span(), (absl::Span<const float>(std::vector<float>{0, 2, 0, 3, 0, 5})));
  // Backward reads the forward output the caller keeps (Model keeps every
  // layer's output until the step's backward pass): no copy per step.
  relu.Backward(Tensor({2, 3}, std::vector<float>{1, 1, 1, 1, 1, 1}), &grad_input);
  EXPECT_EQ(grad_input.span(), (absl::Span<const float>(std::vector<float>{0, 1, 0, 1, 0, 1})));
}

TEST(ReLUTest, GradientMatchesFiniteDifferencesAwayFromZero) {
  Activation relu("relu_0", ActivationKind::kRelu);
  Tensor input = RandomTensor({4, 6}, 9);
  for (int64_t i = 0; i < input.size(); ++i) {
    if (std::abs(input[i]) < 0.1f) input[i] = input[i] < 0 ? -0.5f : 0.5f;  // off the kink
  }
  const Tensor weights = RandomTensor({4, 6}, 10);
  Tensor out, grad_input;
  relu.Forward(input, &out);
  relu.Backward(weights, &grad_input);
  const Tensor analytic = grad_input;
  ExpectMatchesFiniteDifferences(relu, input, &input, weights, analytic, 1e-3f, "input");
}

}  // namespace
}  // namespace distrain

#ifndef DISTRAIN_TESTS_UNIT_WORKER_MODEL_GRADIENT_CHECK_H_
#define DISTRAIN_TESTS_UNIT_WORKER_MODEL_GRADIENT_CHECK_H_

// Central-difference checks of a layer's Backward, shared by the layer tests.
// The scalar is L = sum(Forward(input) * upstream) for a fixed random
// `upstream`, so dL/d(output) = upstream. ExpectModelGradients does the same
// for a whole model's TrainStep against its Evaluate loss.

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "absl/types/span.h"
#include "worker/model/layer.h"
#include "worker/model/model.h"

namespace distrain::testing {

inline ForwardContext Training() {
  ForwardContext ctx;
  ctx.training = true;
  return ctx;
}

// Every parameter's TrainStep gradient against central differences of the
// batch's Evaluate loss (so the model must have no Dropout and no batch
// statistics in it), within rtol * |fd| + atol.
inline void ExpectModelGradients(Model& model, const Tensor& features,
                                 absl::Span<const int32_t> labels, float h, double rtol,
                                 double atol) {
  model.TrainStep(features, labels);
  std::vector<Tensor> analytic;
  for (Parameter* p : model.parameters()) analytic.push_back(p->grad);
  auto params = model.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor& value = params[k]->value;
    for (int64_t i = 0; i < value.size(); ++i) {
      const float saved = value[i];
      value[i] = saved + h;
      const double x_plus = value[i];
      const double plus = model.Evaluate(features, labels).loss;
      value[i] = saved - h;
      const double x_minus = value[i];
      const double minus = model.Evaluate(features, labels).loss;
      value[i] = saved;
      const double fd = (plus - minus) / (x_plus - x_minus);
      EXPECT_NEAR(analytic[k][i], fd, rtol * std::abs(fd) + atol)
          << params[k]->name << " element " << i;
    }
  }
}

inline Tensor RandomTensor(std::vector<int64_t> shape, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.size(); ++i) t[i] = uniform(gen);
  return t;
}

// Distinct values spaced 2 / size apart in [-1, 1), shuffled: no ties for
// max pooling and no element near another (no kink inside the difference).
inline Tensor DistinctTensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  std::vector<int64_t> order(t.size());
  for (int64_t i = 0; i < t.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<float>(2.0 * static_cast<double>(order[i]) / t.size() - 1.0);
  }
  return t;
}

inline double WeightedSum(const Tensor& output, const Tensor& weights) {
  double s = 0;
  for (int64_t i = 0; i < output.size(); ++i) s += static_cast<double>(output[i]) * weights[i];
  return s;
}

struct GradCheckOptions {
  float h = 1e-2f;
  double rtol = 1e-2;
  double atol = 1e-3;
  bool check_input = true;
};

// Runs Forward(input, ctx) and Backward(upstream) once, then compares every
// parameter's grad and dL/d(input) with central differences of L. ctx is
// reused for every forward pass (so a Dropout mask or a BatchNormalization
// mode is the same throughout).
inline void ExpectLayerGradients(Layer& layer, Tensor input, const ForwardContext& ctx,
                                 uint32_t seed, const GradCheckOptions& opt = {}) {
  Tensor out;
  layer.Forward(input, &out, ctx);
  const Tensor upstream = RandomTensor(out.shape(), seed);
  Tensor grad_input;
  layer.Backward(upstream, opt.check_input ? &grad_input : nullptr);
  std::vector<Tensor> analytic;
  for (Parameter* p : layer.parameters()) analytic.push_back(p->grad);

  auto check = [&](Tensor* target, const Tensor& want, const std::string& what) {
    ASSERT_EQ(want.size(), target->size()) << what;
    Tensor y;
    for (int64_t i = 0; i < target->size(); ++i) {
      const float saved = (*target)[i];
      (*target)[i] = saved + opt.h;
      const double x_plus = (*target)[i];
      layer.Forward(input, &y, ctx);
      const double plus = WeightedSum(y, upstream);
      (*target)[i] = saved - opt.h;
      const double x_minus = (*target)[i];
      layer.Forward(input, &y, ctx);
      const double minus = WeightedSum(y, upstream);
      (*target)[i] = saved;
      const double fd = (plus - minus) / (x_plus - x_minus);
      ASSERT_NEAR(want[i], fd, opt.rtol * std::abs(fd) + opt.atol)
          << layer.name() << " " << what << " element " << i;
    }
  };
  auto params = layer.parameters();
  for (size_t k = 0; k < params.size(); ++k) check(&params[k]->value, analytic[k], params[k]->name);
  if (opt.check_input) {
    ASSERT_EQ(grad_input.shape(), input.shape()) << layer.name();
    check(&input, grad_input, "input");
  }
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_MODEL_GRADIENT_CHECK_H_

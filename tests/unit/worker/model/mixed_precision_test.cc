// Mixed precision (spec.training.precision, docs/architecture.md §6a): the
// rounding functors against the compiler's own conversions, the ops that
// carry them, a model whose activations and gradients hold 16-bit values
// while its variables stay float32, and mixed_float16's dynamic loss scaling
// — the underflow it exists to prevent, the overflow it skips, its growth
// and its checkpointed state. All on the CPU; the GPU runs the same
// functors (model_device_test.cc compares the devices).

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/model/device_test_util.h"
#include "worker/model/loss_scale.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/tensor/elementwise.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

using testing::GuideCnn;
using testing::ImageBatches;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- The rounding functors -----------------------------------------------------

// The nearest bfloat16 by definition: of the two bfloat16 values around x
// (x's bits truncated, and the next one up in magnitude), the closer; on a
// tie the one with an even last mantissa bit. Computed in double, where
// both distances are exact; past the largest bfloat16 the next value up is
// 2^128, which IEEE rounding then turns into infinity.
float ReferenceBfloat16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float down = std::bit_cast<float>(bits & 0xffff0000u);
  const float up = std::bit_cast<float>((bits & 0xffff0000u) + 0x10000u);
  const double up_value = std::isinf(up) ? std::copysign(0x1p128, x) : up;
  const double dd = std::abs(static_cast<double>(x) - down);
  const double du = std::abs(up_value - x);
  if (dd < du) return down;
  if (du < dd) return up;
  return ((bits >> 16) & 1u) == 0 ? down : up;
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(MixedPrecisionRoundingTest, Bfloat16IsTheNearestValueTiesToEvenOnAMillionRandomFloats) {
  std::mt19937 gen(7);
  const elementwise::RoundToBfloat16 round;
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(gen()));
    if (!std::isfinite(x)) continue;
    const float want = ReferenceBfloat16(x);
    ASSERT_TRUE(SameFloat(round(x), want)) << std::hexfloat << x << " -> " << round(x)
                                           << ", want " << want;
  }
}

TEST(MixedPrecisionRoundingTest, Bfloat16EdgeCases) {
  const elementwise::RoundToBfloat16 round;
  EXPECT_EQ(round(1.0f), 1.0f);
  EXPECT_EQ(round(1.0f + 0x1p-8f), 1.0f);                     // tie, 1.0 is even
  EXPECT_EQ(round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);       // tie, rounds to even
  EXPECT_EQ(round(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie
  EXPECT_EQ(round(std::numeric_limits<float>::max()), kInf);  // beyond bfloat16's range
  EXPECT_EQ(round(-kInf), -kInf);
  EXPECT_TRUE(std::signbit(round(-0.0f)));
  EXPECT_TRUE(std::isnan(round(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(round(std::bit_cast<float>(0x7f800001u))));
  // Every bfloat16 value is a fixed point.
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = std::bit_cast<float>(b << 16);
    ASSERT_TRUE(SameFloat(round(v), v)) << std::hexfloat << v;
  }
}

TEST(MixedPrecisionRoundingTest, Float16MatchesTheCompilersConversionOnAMillionRandomFloats) {
  std::mt19937 gen(11);
  const elementwise::RoundToFloat16 round;
  auto check = [&](float x) {
    const float want = static_cast<float>(static_cast<_Float16>(x));
    ASSERT_TRUE(SameFloat(round(x), want)) << std::hexfloat << x << " -> " << round(x)
                                           << ", want " << want;
  };
  for (int i = 0; i < 1'000'000; ++i) check(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  // Floats near float16's range, where random bit patterns seldom land.
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 200'000; ++i) {
    check(near(gen));
    check(tiny(gen));
  }
}

TEST(MixedPrecisionRoundingTest, Float16EdgeCases) {
  const elementwise::RoundToFloat16 round;
  EXPECT_EQ(round(65504.0f), 65504.0f);        // the largest float16
  EXPECT_EQ(round(65519.99f), 65504.0f);
  EXPECT_EQ(round(65520.0f), kInf);            // the tie with 65536 rounds to even: overflow
  EXPECT_EQ(round(-1e6f), -kInf);
  EXPECT_EQ(round(0x1p-24f), 0x1p-24f);        // the smallest subnormal
  EXPECT_EQ(round(0x1p-25f), 0.0f);            // tie with 0, which is even
  EXPECT_EQ(round(3 * 0x1p-25f), 0x1p-23f);    // tie, rounds to even
  EXPECT_EQ(round(1e-9f), 0.0f);               // underflow: what loss scaling prevents
  EXPECT_EQ(round(1.0f + 0x1p-11f), 1.0f);     // tie below 10 mantissa bits
  EXPECT_TRUE(std::isnan(round(std::numeric_limits<float>::quiet_NaN())));
}

// ---- The ops --------------------------------------------------------------------

TEST(MixedPrecisionOpsTest, RoundToIsIdempotentAndMayRunInPlace) {
  Tensor x({3, 5});
  for (int64_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) + 1e-3f;
  for (ComputeType type : {ComputeType::kBfloat16, ComputeType::kFloat16}) {
    Tensor y;
    ops::RoundTo(type, x, &y);
    EXPECT_EQ(y.shape(), x.shape());
    Tensor again = y;
    ops::RoundTo(type, again, &again);
    for (int64_t i = 0; i < y.size(); ++i) {
      EXPECT_EQ(again[i], y[i]);
      EXPECT_NEAR(y[i], x[i], std::abs(x[i]) * (type == ComputeType::kBfloat16 ? 0x1p-8 : 0x1p-11));
    }
  }
  Tensor copy;
  ops::RoundTo(ComputeType::kFloat32, x, &copy);
  for (int64_t i = 0; i < x.size(); ++i) EXPECT_EQ(copy[i], x[i]);
}

// The CPU loops run vectorised clones of the functors (AVX-512, AVX2,
// SSE2, whichever the CPU has): every bit pattern still rounds as the
// scalar functor does.
TEST(MixedPrecisionOpsTest, RoundToOverATensorIsTheFunctorOnEveryElement) {
  std::mt19937 gen(13);
  Tensor x({1 << 18});
  for (int64_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(static_cast<uint32_t>(gen()));
  Tensor bf, half;
  ops::RoundTo(ComputeType::kBfloat16, x, &bf);
  ops::RoundTo(ComputeType::kFloat16, x, &half);
  for (int64_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(SameFloat(bf[i], elementwise::RoundToBfloat16()(x[i]))) << std::hexfloat << x[i];
    ASSERT_TRUE(SameFloat(half[i], elementwise::RoundToFloat16()(x[i]))) << std::hexfloat << x[i];
  }
}

TEST(MixedPrecisionOpsTest, AllFiniteFindsOneBadElementInAnyTensor) {
  Tensor a({100}, 1.0f), b({7}, -2.0f);
  EXPECT_TRUE(ops::AllFinite({&a, &b}));
  for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    Tensor c = b;
    c[6] = bad;
    EXPECT_FALSE(ops::AllFinite({&a, &c})) << bad;
  }
  Tensor huge({2}, std::numeric_limits<float>::max());
  EXPECT_TRUE(ops::AllFinite({&huge}));
}

// ---- A model under a mixed policy -------------------------------------------------

std::unique_ptr<Model> MakeCnn(Precision precision) {
  ModelConfig config = GuideCnn();
  config.precision = precision;
  auto model = Model::Create(config, std::vector<int64_t>{28, 28, 1}, 10, /*seed=*/5);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

bool IsBfloat16(float v) { return (std::bit_cast<uint32_t>(v) & 0xffffu) == 0; }

TEST(MixedPrecisionModelTest, Bfloat16GradientsHold16BitValuesWhileVariablesStayFloat32) {
  std::unique_ptr<Model> model = MakeCnn(Precision::kMixedBfloat16);
  EXPECT_EQ(model->compute_type(), ComputeType::kBfloat16);
  auto optimizer = Optimizer::Create(OptimizerConfig{}, model->precision());
  ASSERT_TRUE(optimizer.ok());
  EXPECT_EQ((*optimizer)->dynamic_loss_scale(), nullptr);  // bfloat16 needs none
  int64_t float32_only = 0;
  for (const auto& batch : ImageBatches(3, 16, 1)) {
    model->TrainStep(batch.features, batch.labels);
    for (Parameter* p : model->parameters()) {
      for (int64_t i = 0; i < p->grad.size(); ++i) {
        ASSERT_TRUE(IsBfloat16(p->grad[i])) << p->name << "[" << i << "] = " << p->grad[i];
      }
    }
    (*optimizer)->Apply(model->parameters());
  }
  // The update lands in float32: small steps are kept, not rounded away.
  for (Parameter* p : model->parameters()) {
    for (int64_t i = 0; i < p->value.size(); ++i) float32_only += !IsBfloat16(p->value[i]);
  }
  EXPECT_GT(float32_only, 1000);
}

// Keras' normalisation layers compute in float32 under a mixed policy: their
// output is rounded like every layer's, their gamma/beta (scale) gradients
// are not.
TEST(MixedPrecisionModelTest, NormalizationLayersKeepFloat32Gradients) {
  for (LayerKind kind : {LayerKind::kBatchNormalization, LayerKind::kLayerNormalization,
                         LayerKind::kRMSNormalization}) {
    SCOPED_TRACE(LayerKindName(kind));
    ModelConfig config;
    config.type = "sequential";
    LayerConfig norm;
    norm.kind = kind;
    norm.epsilon = DefaultEpsilon(kind);
    LayerConfig flatten;
    flatten.kind = LayerKind::kFlatten;
    config.layers = {testing::ConvLayer(4, 3, ActivationKind::kRelu, PaddingKind::kValid), norm,
                     flatten, testing::DenseLayer(10, ActivationKind::kLinear)};
    config.loss.kind = LossKind::kSparseCategoricalCrossentropy;
    config.loss.from_logits = true;
    config.precision = Precision::kMixedBfloat16;
    auto model = Model::Create(config, std::vector<int64_t>{28, 28, 1}, 10, /*seed=*/2);
    ASSERT_TRUE(model.ok()) << model.status();
    const auto batch = ImageBatches(1, 8, 5)[0];
    (*model)->TrainStep(batch.features, batch.labels);
    const std::string prefix = LayerKindSnakeName(kind);
    int64_t norm_float32_only = 0;
    for (Parameter* p : (*model)->parameters()) {
      const bool is_norm = p->name.rfind(prefix, 0) == 0;
      for (int64_t i = 0; i < p->grad.size(); ++i) {
        if (is_norm) {
          norm_float32_only += !IsBfloat16(p->grad[i]);
        } else {
          ASSERT_TRUE(IsBfloat16(p->grad[i])) << p->name;
        }
      }
    }
    EXPECT_GT(norm_float32_only, 0);
  }
}

// Mixed precision trains the same function: the CNN's loss after 30 SGD steps
// under each mixed policy is within a few percent of float32's, but not
// identical to it (the rounding does happen).
TEST(MixedPrecisionModelTest, MixedPoliciesTrackFloat32Training) {
  const auto batches = ImageBatches(30, 32, 3);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.learning_rate = 0.05f;
  std::map<Precision, double> final_loss;
  for (Precision precision :
       {Precision::kFloat32, Precision::kMixedBfloat16, Precision::kMixedFloat16}) {
    std::unique_ptr<Model> model = MakeCnn(precision);
    auto optimizer = Optimizer::Create(sgd, precision);
    ASSERT_TRUE(optimizer.ok());
    double loss = 0;
    for (const auto& b : batches) {
      model->set_loss_scale((*optimizer)->loss_scale());
      loss = model->TrainStep(b.features, b.labels).loss;
      (*optimizer)->Apply(model->parameters());
    }
    final_loss[precision] = model->Evaluate(batches[0].features, batches[0].labels).loss;
    ASSERT_TRUE(std::isfinite(loss)) << PrecisionName(precision);
  }
  const double f32 = final_loss[Precision::kFloat32];
  for (Precision p : {Precision::kMixedBfloat16, Precision::kMixedFloat16}) {
    EXPECT_NEAR(final_loss[p], f32, 0.05 * f32) << PrecisionName(p);
    EXPECT_NE(final_loss[p], f32) << PrecisionName(p);
  }
}

// ---- Dynamic loss scaling ---------------------------------------------------------

ModelConfig SmallMlp(Precision precision) {
  ModelConfig c;
  c.type = "mlp";
  c.hidden_units = {32};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.precision = precision;
  return c;
}

// The first layer's kernel gradient of one step with the output kernel
// shrunk by 1e-6, so dL/d(hidden) is ~1e-9: below float16's smallest
// subnormal (6e-8) unless the loss is scaled.
std::vector<float> FirstKernelGrad(Precision precision, float loss_scale) {
  auto model = Model::Create(SmallMlp(precision), 784, 10, /*seed=*/9);
  EXPECT_TRUE(model.ok());
  std::vector<Parameter*> params = (*model)->parameters();
  ops::Scale(1e-6f, &params[2]->value);  // dense_1/kernel
  const auto batch = ImageBatches(1, 64, 4)[0];
  (*model)->set_loss_scale(loss_scale);
  (*model)->TrainStep(batch.features, batch.labels);
  std::vector<float> g(params[0]->grad.data(), params[0]->grad.data() + params[0]->grad.size());
  for (float& v : g) v /= loss_scale;
  return g;
}

TEST(DynamicLossScaleTest, ScalingKeepsFloat16GradientsThatWouldUnderflow) {
  const std::vector<float> want = FirstKernelGrad(Precision::kFloat32, 1.0f);
  const std::vector<float> unscaled = FirstKernelGrad(Precision::kMixedFloat16, 1.0f);
  const std::vector<float> scaled =
      FirstKernelGrad(Precision::kMixedFloat16, DynamicLossScale::kInitialScale);
  double norm_want = 0, norm_unscaled = 0, dot = 0, norm_scaled = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    norm_want += double{want[i]} * want[i];
    norm_unscaled += double{unscaled[i]} * unscaled[i];
    norm_scaled += double{scaled[i]} * scaled[i];
    dot += double{want[i]} * scaled[i];
  }
  ASSERT_GT(norm_want, 0.0);
  EXPECT_EQ(norm_unscaled, 0.0) << "float16 should have flushed these gradients to zero";
  // Scaled, they survive: float32's direction and size, up to float16's
  // rounding of the inputs, kernels and (partly subnormal) gradients.
  EXPECT_GT(dot / std::sqrt(norm_want * norm_scaled), 0.99);
  EXPECT_NEAR(std::sqrt(norm_scaled / norm_want), 1.0, 0.03);
}

std::vector<Parameter> OneParameter(float value, float grad) {
  std::vector<Parameter> p(1);
  p[0].name = "w";
  p[0].value = Tensor({4}, value);
  p[0].grad = Tensor({4}, grad);
  return p;
}

TEST(DynamicLossScaleTest, OverflowSkipsTheStepAndHalvesTheScaleFiniteStepsGrowIt) {
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.learning_rate = 0.5f;
  auto created = Optimizer::Create(sgd, Precision::kMixedFloat16);
  ASSERT_TRUE(created.ok());
  Optimizer& opt = **created;
  ASSERT_NE(opt.dynamic_loss_scale(), nullptr);
  EXPECT_EQ(opt.loss_scale(), 32768.0f);  // Keras' initial scale, 2^15
  opt.EnableDynamicLossScale(/*growth_steps=*/3);

  std::vector<Parameter> params = OneParameter(1.0f, 0.0f);
  params[0].grad[2] = kInf;
  std::vector<Parameter*> ptrs = {&params[0]};
  EXPECT_FALSE(opt.Apply(ptrs));
  EXPECT_EQ(params[0].value[0], 1.0f);  // nothing applied
  EXPECT_EQ(opt.iterations(), 0);
  EXPECT_EQ(opt.loss_scale(), 16384.0f);
  EXPECT_EQ(opt.dynamic_loss_scale()->skipped_steps(), 1);

  // Finite gradients are unscaled before the update: w -= lr * g / scale.
  for (int step = 1; step <= 3; ++step) {
    const float scale = opt.loss_scale();
    params[0].grad = Tensor({4}, 2.0f * scale);  // the true gradient is 2
    const float before = params[0].value[0];
    EXPECT_TRUE(opt.Apply(ptrs));
    EXPECT_FLOAT_EQ(params[0].value[0], before - 0.5f * 2.0f);
  }
  EXPECT_EQ(opt.iterations(), 3);
  EXPECT_EQ(opt.loss_scale(), 32768.0f);  // grew after 3 finite steps in a row
  EXPECT_EQ(opt.dynamic_loss_scale()->step_counter(), 0);
}

// A model whose gradients overflow float16 at 2^15 (its variables x8: the
// output kernel's gradient reaches ~2e5 scaled) while its forward pass
// stays in range: the first steps are skipped until the scale fits, then
// training proceeds.
TEST(DynamicLossScaleTest, TrainingFindsAScaleThatFitsAndThenApplies) {
  auto model = Model::Create(SmallMlp(Precision::kMixedFloat16), 784, 10, /*seed=*/3);
  ASSERT_TRUE(model.ok());
  for (Parameter* p : (*model)->parameters()) ops::Scale(8.0f, &p->value);
  auto opt = Optimizer::Create(OptimizerConfig{}, Precision::kMixedFloat16);
  ASSERT_TRUE(opt.ok());
  const auto batches = ImageBatches(12, 32, 6);
  int applied = 0;
  for (const auto& b : batches) {
    (*model)->set_loss_scale((*opt)->loss_scale());
    (*model)->TrainStep(b.features, b.labels);
    applied += (*opt)->Apply((*model)->parameters());
  }
  const int64_t skipped = (*opt)->dynamic_loss_scale()->skipped_steps();
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(applied + skipped, 12);
  EXPECT_GT(applied, 0);
  EXPECT_EQ((*opt)->loss_scale(), 32768.0f / static_cast<float>(1 << skipped));
  EXPECT_EQ((*opt)->iterations(), applied);
  for (Parameter* p : (*model)->parameters()) {
    for (int64_t i = 0; i < p->value.size(); ++i) ASSERT_TRUE(std::isfinite(p->value[i]));
  }
}

TEST(DynamicLossScaleTest, StateRoundTripsThroughTheOptimizersSlots) {
  auto a = Optimizer::Create(OptimizerConfig{}, Precision::kMixedFloat16);
  ASSERT_TRUE(a.ok());
  std::vector<Parameter> params = OneParameter(1.0f, kInf);
  std::vector<Parameter*> ptrs = {&params[0]};
  (*a)->Apply(ptrs);  // skipped: scale 16384
  params[0].grad = Tensor({4}, 1.0f);
  (*a)->Apply(ptrs);  // applied: counter 1
  const std::map<std::string, Tensor> slots = (*a)->SlotState();
  ASSERT_EQ(slots.count(DynamicLossScale::kScaleKey), 1u);

  auto b = Optimizer::Create(OptimizerConfig{}, Precision::kMixedFloat16);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->RestoreState(slots, (*a)->iterations()).ok());
  EXPECT_EQ((*b)->loss_scale(), 16384.0f);
  EXPECT_EQ((*b)->dynamic_loss_scale()->step_counter(), 1);

  // A float32 job resuming from it ignores the loss scale; a mixed_float16
  // job resuming from a float32 checkpoint starts at the initial scale.
  auto f32 = Optimizer::Create(OptimizerConfig{}, Precision::kFloat32);
  ASSERT_TRUE(f32.ok());
  EXPECT_TRUE((*f32)->RestoreState(slots, 1).ok());
  EXPECT_EQ((*f32)->SlotState().count(DynamicLossScale::kScaleKey), 0u);
  auto c = Optimizer::Create(OptimizerConfig{}, Precision::kMixedFloat16);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->RestoreState({}, 0).ok());
  EXPECT_EQ((*c)->loss_scale(), DynamicLossScale::kInitialScale);

  // A damaged state is refused by name.
  std::map<std::string, Tensor> damaged = slots;
  damaged[DynamicLossScale::kScaleKey] = Tensor({1}, -1.0f);
  absl::Status s = (*c)->RestoreState(damaged, 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("loss scale"), std::string::npos) << s;
}

}  // namespace
}  // namespace distrain

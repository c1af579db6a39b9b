#include "worker/model/optimizer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config) {
  auto opt = Optimizer::Create(config);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

OptimizerConfig Config(OptimizerType type, float lr) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  return c;
}

// One parameter w = [w0, w1] stepped with the gradients grads[step].
std::vector<std::vector<float>> Trajectory(Optimizer& opt, std::vector<float> w,
                                    const std::vector<std::vector<float>>& grads) {
  Parameter p{"dense_0/kernel", Tensor({2}, w), Tensor({2})};
  std::vector<std::vector<float>> trajectory;
  for (const auto& g : grads) {
    p.grad = Tensor({2}, g);
    Parameter* params[] = {&p};
    opt.Apply(params);
    trajectory.emplace_back(p.value.span().begin(), p.value.span().end());
  }
  return trajectory;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

const std::vector<std::vector<float>> kGrads = {{0.5f, -1.0f}, {-0.25f, 2.0f}, {1.0f, 0.0f}};

TEST(OptimizerTest, SgdFollowsKerasRule) {
  auto opt = MakeOptimizer(Config(OptimizerType::kSgd, 0.1f));
  const auto t = Trajectory(*opt, {1.0f, -2.0f}, kGrads);
  ExpectNear(t[0], {1.0 - 0.1 * 0.5, -2.0 - 0.1 * -1.0}, "step 1");
  ExpectNear(t[1], {1.0 - 0.1 * 0.5 - 0.1 * -0.25, -2.0 + 0.1 - 0.1 * 2.0}, "step 2");
  ExpectNear(t[2], {1.0 - 0.05 + 0.025 - 0.1, -2.0 + 0.1 - 0.2 - 0.0}, "step 3");
  EXPECT_EQ(opt->iterations(), 3);
  EXPECT_TRUE(opt->SlotState().empty());
}

TEST(OptimizerTest, MomentumFollowsKerasRule) {
  OptimizerConfig c = Config(OptimizerType::kMomentum, 0.1f);
  c.momentum = 0.9f;
  auto opt = MakeOptimizer(c);
  const auto t = Trajectory(*opt, {1.0f, -2.0f}, kGrads);
  // element 0: v1 = -0.05; v2 = 0.9*-0.05 + 0.025 = -0.02; v3 = 0.9*-0.02 - 0.1 = -0.118
  // element 1: v1 = 0.1;   v2 = 0.09 - 0.2 = -0.11;        v3 = 0.9*-0.11 - 0 = -0.099
  ExpectNear(t[0], {1.0 - 0.05, -2.0 + 0.1}, "step 1");
  ExpectNear(t[1], {1.0 - 0.05 - 0.02, -2.0 + 0.1 - 0.11}, "step 2");
  ExpectNear(t[2], {1.0 - 0.05 - 0.02 - 0.118, -2.0 + 0.1 - 0.11 - 0.099}, "step 3");
  const auto slots = opt->SlotState();
  ASSERT_EQ(slots.size(), 1u);
  ASSERT_TRUE(slots.count("dense_0/kernel/momentum"));
  EXPECT_NEAR(slots.at("dense_0/kernel/momentum")[0], -0.118, 1e-6);
  EXPECT_NEAR(slots.at("dense_0/kernel/momentum")[1], -0.099, 1e-6);
}

TEST(OptimizerTest, NesterovMomentumFollowsKerasRule) {
  OptimizerConfig c = Config(OptimizerType::kMomentum, 0.1f);
  c.momentum = 0.9f;
  c.nesterov = true;
  auto opt = MakeOptimizer(c);
  const auto t = Trajectory(*opt, {1.0f, -2.0f}, kGrads);
  // w += 0.9 * v_new - 0.1 * g, with the same v sequence as plain momentum.
  const double d1[] = {0.9 * -0.05 - 0.05, 0.9 * 0.1 + 0.1};
  const double d2[] = {0.9 * -0.02 + 0.025, 0.9 * -0.11 - 0.2};
  const double d3[] = {0.9 * -0.118 - 0.1, 0.9 * -0.099 - 0.0};
  ExpectNear(t[0], {1.0 + d1[0], -2.0 + d1[1]}, "step 1");
  ExpectNear(t[1], {1.0 + d1[0] + d2[0], -2.0 + d1[1] + d2[1]}, "step 2");
  ExpectNear(t[2], {1.0 + d1[0] + d2[0] + d3[0], -2.0 + d1[1] + d2[1] + d3[1]}, "step 3");
}

TEST(OptimizerTest, AdamFollowsKerasRule) {
  OptimizerConfig c = Config(OptimizerType::kAdam, 0.1f);
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.epsilon = 1e-7f;
  auto opt = MakeOptimizer(c);
  const auto t = Trajectory(*opt, {1.0f, -2.0f}, kGrads);
  const double b1 = 0.9f, b2 = 0.999f, eps = 1e-7f;  // as the float config holds them
  // element 0, g = 0.5, -0.25, 1.0
  const double m1 = (1 - b1) * 0.5, v1 = (1 - b2) * 0.25;
  const double m2 = b1 * m1 + (1 - b1) * -0.25, v2 = b2 * v1 + (1 - b2) * 0.0625;
  const double m3 = b1 * m2 + (1 - b1) * 1.0, v3 = b2 * v2 + (1 - b2) * 1.0;
  // element 1, g = -1, 2, 0
  const double n1 = (1 - b1) * -1.0, u1 = (1 - b2) * 1.0;
  const double n2 = b1 * n1 + (1 - b1) * 2.0, u2 = b2 * u1 + (1 - b2) * 4.0;
  const double n3 = b1 * n2, u3 = b2 * u2;
  const double lr1 = 0.1 * std::sqrt(1 - b2) / (1 - b1);
  const double lr2 = 0.1 * std::sqrt(1 - b2 * b2) / (1 - b1 * b1);
  const double lr3 = 0.1 * std::sqrt(1 - b2 * b2 * b2) / (1 - b1 * b1 * b1);
  const double w1[] = {1.0 - lr1 * m1 / (std::sqrt(v1) + eps),
                       -2.0 - lr1 * n1 / (std::sqrt(u1) + eps)};
  const double w2[] = {w1[0] - lr2 * m2 / (std::sqrt(v2) + eps),
                       w1[1] - lr2 * n2 / (std::sqrt(u2) + eps)};
  const double w3[] = {w2[0] - lr3 * m3 / (std::sqrt(v3) + eps),
                       w2[1] - lr3 * n3 / (std::sqrt(u3) + eps)};
  // Adam's first step is ~lr * sign(g).
  EXPECT_NEAR(w1[0], 0.9, 1e-5);
  ExpectNear(t[0], {w1[0], w1[1]}, "step 1");
  ExpectNear(t[1], {w2[0], w2[1]}, "step 2");
  ExpectNear(t[2], {w3[0], w3[1]}, "step 3");
  const auto slots = opt->SlotState();
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_NEAR(slots.at("dense_0/kernel/m")[0], m3, 1e-7);
  EXPECT_NEAR(slots.at("dense_0/kernel/v")[1], u3, 1e-7);
}

TEST(OptimizerTest, ApplyDenseUsesTheGivenIteration) {
  // A parameter server passes its own step count; bias correction must use it.
  OptimizerConfig c = Config(OptimizerType::kAdam, 0.1f);
  auto opt = MakeOptimizer(c);
  std::vector<float> w = {0.0f};
  const std::vector<float> g = {1.0f};
  opt->ApplyDense("v", absl::MakeSpan(w), g, 5);
  const double b1 = 0.9f, b2 = 0.999f;
  const double lr5 = 0.1 * std::sqrt(1 - std::pow(b2, 5)) / (1 - std::pow(b1, 5));
  const double m = 1 - b1, v = 1 - b2;
  EXPECT_NEAR(w[0], -lr5 * m / (std::sqrt(v) + 1e-7), 1e-6);
  EXPECT_EQ(opt->iterations(), 0);  // only Apply counts steps
}

// The ps forms a factored gradient a block of rows at a time and applies each
// block on its own: every rule must give exactly what one whole update gives,
// slots included, over several steps and with ranges that split SIMD widths.
TEST(OptimizerTest, UpdatingRangeByRangeEqualsOneWholeUpdateBitForBit) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                            OptimizerType::kAdamW, OptimizerType::kRmsprop}) {
    SCOPED_TRACE(static_cast<int>(type));
    OptimizerConfig c = Config(type, 0.01f);
    c.centered = true;        // rmsprop's second slot too
    c.weight_decay = 0.05f;   // and the decay before every rule
    auto whole = MakeOptimizer(c);
    auto ranged = MakeOptimizer(c);
    const int64_t n = 1000;
    std::vector<float> w1(n), w2(n), g(n);
    for (int64_t i = 0; i < n; ++i) w1[i] = w2[i] = std::sin(0.37f * static_cast<float>(i));
    for (int step = 1; step <= 3; ++step) {
      for (int64_t i = 0; i < n; ++i) g[i] = std::cos(0.11f * static_cast<float>(i * step));
      whole->ApplyDense("v", absl::MakeSpan(w1), g, step);
      for (int64_t begin = 0, len = 1; begin < n; begin += len, len = len * 3 + 2) {
        const int64_t count = std::min(len, n - begin);
        ranged->ApplyDenseRange("v", n, begin, absl::MakeSpan(w2.data() + begin, count),
                                absl::MakeConstSpan(g.data() + begin, count), step);
      }
    }
    EXPECT_EQ(std::memcmp(w1.data(), w2.data(), n * sizeof(float)), 0);
    const auto s1 = whole->SlotState();
    const auto s2 = ranged->SlotState();
    ASSERT_EQ(s1.size(), s2.size());
    for (const auto& [name, t] : s1) {
      ASSERT_EQ(s2.count(name), 1u) << name;
      EXPECT_EQ(std::memcmp(t.data(), s2.at(name).data(), t.size() * sizeof(float)), 0) << name;
    }
  }
}

TEST(OptimizerTest, SlotsAreKeptPerVariableName) {
  OptimizerConfig c = Config(OptimizerType::kMomentum, 0.1f);
  auto opt = MakeOptimizer(c);
  Parameter a{"dense_0/kernel", Tensor({1}, 0.0f), Tensor({1}, 1.0f)};
  Parameter b{"dense_0/bias", Tensor({3}, 0.0f), Tensor({3}, -1.0f)};
  Parameter* params[] = {&a, &b};
  opt->Apply(params);
  opt->Apply(params);
  const auto slots = opt->SlotState();
  std::vector<std::string> names;
  for (const auto& [name, t] : slots) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("dense_0/bias/momentum", "dense_0/kernel/momentum"));
  EXPECT_EQ(slots.at("dense_0/bias/momentum").size(), 3);
  EXPECT_NEAR(slots.at("dense_0/kernel/momentum")[0], 0.9 * -0.1 - 0.1, 1e-6);
  EXPECT_NEAR(slots.at("dense_0/bias/momentum")[2], 0.9 * 0.1 + 0.1, 1e-6);
}

// Apply 3 steps, checkpoint, restore into a fresh optimizer: step 4 must be
// bit-identical to the uninterrupted run.
void ExpectExactResume(const OptimizerConfig& config) {
  std::vector<Parameter> params = {
      {"dense_0/kernel", Tensor({2, 3}, std::vector<float>{0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f}),
       Tensor({2, 3})},
      {"dense_0/bias", Tensor({3}, std::vector<float>{0.01f, 0.02f, -0.03f}), Tensor({3})}};
  auto set_grads = [&](std::vector<Parameter>& ps, int step) {
    for (auto& p : ps) {
      for (int64_t i = 0; i < p.grad.size(); ++i) {
        p.grad[i] = std::sin(1.7f * static_cast<float>(i + 1) * static_cast<float>(step + 1));
      }
    }
  };
  auto apply = [](Optimizer& opt, std::vector<Parameter>& ps) {
    std::vector<Parameter*> ptrs;
    for (auto& p : ps) ptrs.push_back(&p);
    opt.Apply(ptrs);
  };
  auto original = MakeOptimizer(config);
  for (int step = 0; step < 3; ++step) {
    set_grads(params, step);
    apply(*original, params);
  }
  std::vector<Parameter> resumed_params = params;
  auto resumed = MakeOptimizer(config);
  ASSERT_TRUE(resumed->RestoreState(original->SlotState(), original->iterations()).ok());
  EXPECT_EQ(resumed->iterations(), 3);

  set_grads(params, 3);
  set_grads(resumed_params, 3);
  apply(*original, params);
  apply(*resumed, resumed_params);
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_EQ(std::memcmp(params[p].value.data(), resumed_params[p].value.data(),
                          params[p].value.bytes()),
              0)
        << params[p].name;
  }
  const auto a = original->SlotState(), b = resumed->SlotState();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(std::memcmp(t.data(), b.at(name).data(), t.bytes()), 0) << name;
  }
}

TEST(OptimizerStateTest, AdamResumesBitIdentically) {
  ExpectExactResume(Config(OptimizerType::kAdam, 0.01f));
}

TEST(OptimizerStateTest, MomentumResumesBitIdentically) {
  OptimizerConfig c = Config(OptimizerType::kMomentum, 0.05f);
  c.nesterov = true;
  ExpectExactResume(c);
}

TEST(OptimizerStateTest, CenteredRmspropWithWeightDecayResumesBitIdentically) {
  OptimizerConfig c = Config(OptimizerType::kRmsprop, 0.01f);
  c.centered = true;
  c.weight_decay = 0.01f;
  ExpectExactResume(c);
}

TEST(OptimizerStateTest, AdamWResumesBitIdentically) {
  ExpectExactResume(Config(OptimizerType::kAdamW, 0.01f));
}

// A checkpoint of plain RMSprop lacks the centered variant's average
// gradients: refused by name, not read as zeros.
TEST(OptimizerStateTest, RmspropStateDoesNotRestoreIntoCenteredRmsprop) {
  auto plain = MakeOptimizer(Config(OptimizerType::kRmsprop, 0.01f));
  Parameter p{"w", Tensor({2}, 1.0f), Tensor({2}, 0.5f)};
  Parameter* params[] = {&p};
  plain->Apply(params);
  OptimizerConfig c = Config(OptimizerType::kRmsprop, 0.01f);
  c.centered = true;
  auto centered = MakeOptimizer(c);
  const absl::Status s = centered->RestoreState(plain->SlotState(), plain->iterations());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("w/average_gradient"));
}

TEST(OptimizerStateTest, SgdResumesWithIterations) {
  ExpectExactResume(Config(OptimizerType::kSgd, 0.05f));
}

TEST(OptimizerStateTest, RestoreRejectsBadStateAndKeepsTheOld) {
  auto adam = MakeOptimizer(Config(OptimizerType::kAdam, 0.01f));
  Parameter p{"w", Tensor({2}, 1.0f), Tensor({2}, 0.5f)};
  Parameter* params[] = {&p};
  adam->Apply(params);
  const auto before = adam->SlotState();

  struct Case {
    std::map<std::string, Tensor> slots;
    int64_t iterations;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"w/momentum", Tensor({2})}}, 1, "\"w/momentum\" is not a slot of the adam optimizer"},
      {{{"w/m", Tensor({2})}}, 1, "has no \"w/v\" slot"},
      {{{"w/m", Tensor({2})}, {"w/v", Tensor({3})}}, 1, "differ in size"},
      {{{"w/m", Tensor({3})}, {"w/v", Tensor({3})}}, 1, "belongs to a different model"},
      {{{"w/m", Tensor({1, 2})}, {"w/v", Tensor({2})}}, 1, "want a 1-D tensor"},
      {{{"m", Tensor({2})}}, 1, "is not a slot of the adam optimizer"},
      {before, -1, "iterations must be >= 0"},
  };
  for (const Case& c : cases) {
    const absl::Status s = adam->RestoreState(c.slots, c.iterations);
    EXPECT_FALSE(s.ok()) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  EXPECT_EQ(adam->iterations(), 1);
  const auto after = adam->SlotState();
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : before) {
    EXPECT_EQ(std::memcmp(t.data(), after.at(name).data(), t.bytes()), 0) << name;
  }

  auto sgd = MakeOptimizer(Config(OptimizerType::kSgd, 0.01f));
  const absl::Status s = sgd->RestoreState(before, 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not a slot of the sgd optimizer"));
}

TEST(OptimizerCreateTest, RejectsOutOfRangeFieldsNamingThem) {
  const std::string prefix = "spec.training.optimizer.";
  struct Case {
    OptimizerType type;
    float lr, momentum, beta1, beta2, epsilon;
    std::string field;  // empty: valid
  };
  const std::vector<Case> cases = {
      {OptimizerType::kSgd, 0.1f, 0.9f, 0.9f, 0.999f, 1e-7f, ""},
      {OptimizerType::kSgd, 0.0f, 0.9f, 0.9f, 0.999f, 1e-7f, prefix + "learningRate"},
      {OptimizerType::kAdam, -1.0f, 0.9f, 0.9f, 0.999f, 1e-7f, prefix + "learningRate"},
      {OptimizerType::kAdam, NAN, 0.9f, 0.9f, 0.999f, 1e-7f, prefix + "learningRate"},
      {OptimizerType::kMomentum, 0.1f, 0.0f, 0.9f, 0.999f, 1e-7f, ""},
      {OptimizerType::kMomentum, 0.1f, 1.0f, 0.9f, 0.999f, 1e-7f, prefix + "momentum"},
      {OptimizerType::kMomentum, 0.1f, -0.1f, 0.9f, 0.999f, 1e-7f, prefix + "momentum"},
      {OptimizerType::kAdam, 0.1f, 0.9f, 1.0f, 0.999f, 1e-7f, prefix + "beta1"},
      {OptimizerType::kAdam, 0.1f, 0.9f, 0.0f, 0.999f, 1e-7f, ""},
      {OptimizerType::kAdam, 0.1f, 0.9f, 0.9f, -0.5f, 1e-7f, prefix + "beta2"},
      {OptimizerType::kAdam, 0.1f, 0.9f, 0.9f, 0.999f, 0.0f, prefix + "epsilon"},
  };
  for (const Case& c : cases) {
    OptimizerConfig config;
    config.type = c.type;
    config.learning_rate = c.lr;
    config.momentum = c.momentum;
    config.beta1 = c.beta1;
    config.beta2 = c.beta2;
    config.epsilon = c.epsilon;
    auto opt = Optimizer::Create(config);
    if (c.field.empty()) {
      EXPECT_TRUE(opt.ok()) << opt.status();
    } else {
      ASSERT_FALSE(opt.ok()) << c.field;
      EXPECT_THAT(std::string(opt.status().message()), HasSubstr(c.field + ":"));
    }
  }
}

}  // namespace
}  // namespace distrain

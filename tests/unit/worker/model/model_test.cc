#include "worker/model/model.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/optimizer.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Model> MakeModel(std::vector<int> hidden, int input_dim, int classes,
                                 uint64_t seed) {
  ModelConfig config;
  config.hidden_units = std::move(hidden);
  auto model = Model::Create(config, input_dim, classes, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

TEST(ModelTest, BuildsNamedLayersAndParameters) {
  auto model = MakeModel({5, 4}, 3, 2, 1);
  EXPECT_EQ(model->num_layers(), 5);  // dense_0 relu_0 dense_1 relu_1 dense_2
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (Parameter* p : model->parameters()) {
    names.push_back(p->name);
    shapes.push_back(p->value.shape());
  }
  EXPECT_THAT(names, ElementsAre("dense_0/kernel", "dense_0/bias", "dense_1/kernel",
                                 "dense_1/bias", "dense_2/kernel", "dense_2/bias"));
  EXPECT_THAT(shapes, ElementsAre(ElementsAre(3, 5), ElementsAre(5), ElementsAre(5, 4),
                                  ElementsAre(4), ElementsAre(4, 2), ElementsAre(2)));
  const auto by_layer = model->parameters_by_layer();
  ASSERT_EQ(by_layer.size(), 5u);
  EXPECT_EQ(by_layer[0].size(), 2u);
  EXPECT_TRUE(by_layer[1].empty());
  EXPECT_EQ(by_layer[4][0]->name, "dense_2/kernel");
  EXPECT_EQ(model->num_parameters(), 3 * 5 + 5 + 5 * 4 + 4 + 4 * 2 + 2);
  EXPECT_EQ(MakeModel({128}, 784, 10, 1)->Summary(), "mlp 784-128-10 (101770 params)");
}

TEST(ModelTest, CreateRejectsBadConfigNamingTheField) {
  struct Case {
    std::string type, activation;
    std::vector<int> hidden;
    int input_dim, classes;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"cnn", "relu", {8}, 4, 3, "spec.training.model.type:"},
      {"mlp", "tanh", {8}, 4, 3, "spec.training.model.activation:"},
      {"mlp", "relu", {8, 0}, 4, 3, "spec.training.model.hiddenUnits[1]:"},
      {"mlp", "relu", {-3}, 4, 3, "spec.training.model.hiddenUnits[0]:"},
      {"mlp", "relu", {8}, 0, 3, "spec.training.dataset.numFeatures:"},
      {"mlp", "relu", {8}, 4, 1, "spec.training.dataset.numClasses:"},
  };
  for (const Case& c : cases) {
    ModelConfig config;
    config.type = c.type;
    config.activation = c.activation;
    config.hidden_units = c.hidden;
    auto model = Model::Create(config, c.input_dim, c.classes, 1);
    ASSERT_FALSE(model.ok()) << c.field;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(c.field));
  }
  // No hidden layers is plain softmax regression, which is valid.
  EXPECT_EQ(MakeModel({}, 4, 3, 1)->Summary(), "mlp 4-3 (15 params)");
}

std::vector<std::vector<float>> Values(Model& model) {
  std::vector<std::vector<float>> out;
  for (Parameter* p : model.parameters()) {
    out.emplace_back(p->value.span().begin(), p->value.span().end());
  }
  return out;
}

TEST(ModelTest, SameSeedGivesIdenticalParametersOtherSeedsDiffer) {
  auto a = MakeModel({16, 8}, 10, 4, 42);
  auto b = MakeModel({16, 8}, 10, 4, 42);
  auto c = MakeModel({16, 8}, 10, 4, 43);
  const auto va = Values(*a), vb = Values(*b), vc = Values(*c);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_EQ(std::memcmp(va[i].data(), vb[i].data(), va[i].size() * sizeof(float)), 0) << i;
  }
  for (size_t i = 0; i < va.size(); i += 2) EXPECT_NE(va[i], vc[i]) << "kernel " << i / 2;
  // Layers of one model are not copies of each other either.
  auto square = MakeModel({8, 8}, 8, 8, 42);
  const auto vs = Values(*square);
  EXPECT_NE(vs[0], vs[2]);
  EXPECT_NE(vs[2], vs[4]);
}

struct Batch {
  Tensor features;
  std::vector<int32_t> labels;
};

Batch RandomBatch(int64_t n, int dim, int classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Batch b{Tensor({n, dim}), std::vector<int32_t>(n)};
  for (int64_t i = 0; i < b.features.size(); ++i) b.features[i] = normal(gen);
  for (auto& l : b.labels) l = static_cast<int32_t>(gen() % classes);
  return b;
}

TEST(ModelTest, GradientsOfEveryParameterMatchFiniteDifferences) {
  auto model = MakeModel({6, 5}, 4, 3, 7);
  const Batch batch = RandomBatch(5, 4, 3, 3);
  testing::ExpectModelGradients(*model, batch.features, batch.labels, 1e-3f, 1e-2, 2e-4);
}

TEST(ModelTest, EvaluateMatchesTrainStepLossAndCountsCorrect) {
  auto model = MakeModel({8}, 4, 3, 1);
  const Batch batch = RandomBatch(32, 4, 3, 5);
  const LossResult eval = model->Evaluate(batch.features, batch.labels);
  const LossResult train = model->TrainStep(batch.features, batch.labels);
  EXPECT_DOUBLE_EQ(eval.loss, train.loss);
  EXPECT_EQ(eval.correct, train.correct);
  EXPECT_GT(eval.loss, 0.0);
  EXPECT_GE(eval.correct, 0);
  EXPECT_LE(eval.correct, 32);
}

TEST(ModelTest, ReportsEachLayersGradsLastLayerFirstAsSoonAsTheyAreFinal) {
  auto model = MakeModel({6, 5}, 4, 3, 7);
  const Batch batch = RandomBatch(5, 4, 3, 3);
  model->TrainStep(batch.features, batch.labels);
  std::vector<std::vector<float>> final_grads;
  for (Parameter* p : model->parameters()) {
    final_grads.emplace_back(p->grad.span().begin(), p->grad.span().end());
  }

  // Poison the grads; at each callback the reported layer's grads must be
  // final and the earlier layers' still untouched (backward continues).
  for (Parameter* p : model->parameters()) p->grad.Fill(NAN);
  const auto by_layer = model->parameters_by_layer();
  std::vector<int> order;
  model->TrainStep(batch.features, batch.labels, [&](int layer) {
    order.push_back(layer);
    for (int l = 0; l < static_cast<int>(by_layer.size()); ++l) {
      for (Parameter* p : by_layer[l]) {
        EXPECT_EQ(std::isnan(p->grad[0]), l < layer) << "at callback " << layer << ": " << p->name;
      }
    }
  });
  EXPECT_THAT(order, ElementsAre(4, 2, 0));
  auto params = model->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_EQ(std::vector<float>(params[k]->grad.span().begin(), params[k]->grad.span().end()),
              final_grads[k])
        << params[k]->name;
  }
}

// What a parameter server forms from the factors is the kernel gradient the
// model would have formed, and the rest of backward is unchanged.
TEST(ModelTest, FactoredKernelGradsMultiplyOutToTheDenseOnes) {
  auto dense = MakeModel({6, 5}, 4, 3, 7);
  auto factored = MakeModel({6, 5}, 4, 3, 7);
  factored->set_factored_kernel_grads(true);
  const Batch batch = RandomBatch(9, 4, 3, 3);
  dense->TrainStep(batch.features, batch.labels);
  for (Parameter* p : factored->parameters()) p->grad.Fill(NAN);
  std::vector<int> seen;
  const auto by_layer = factored->parameters_by_layer();
  const LossResult r = factored->TrainStep(batch.features, batch.labels, [&](int layer) {
    seen.push_back(layer);
    const std::optional<GradFactors> f = factored->kernel_grad_factors(layer);
    ASSERT_TRUE(f.has_value()) << "layer " << layer;
    EXPECT_EQ(f->kernel, by_layer[layer][0]);
    // The kernel's own grad is not formed.
    EXPECT_TRUE(std::isnan(f->kernel->grad[0])) << f->kernel->name;
    const Tensor& want = dense->parameters_by_layer()[layer][0]->grad;
    ASSERT_EQ(f->left->dim(0), 9);
    ASSERT_EQ(f->left->dim(1), want.dim(0));
    ASSERT_EQ(f->right->dim(1), want.dim(1));
    for (int64_t i = 0; i < want.dim(0); ++i) {
      for (int64_t j = 0; j < want.dim(1); ++j) {
        double g = 0;
        for (int64_t b = 0; b < 9; ++b) g += double{f->left->at(b, i)} * f->right->at(b, j);
        EXPECT_NEAR(g, want.at(i, j), 1e-6) << f->kernel->name << "[" << i << "," << j << "]";
      }
    }
  });
  EXPECT_THAT(seen, ElementsAre(4, 2, 0));
  EXPECT_DOUBLE_EQ(r.loss, dense->Evaluate(batch.features, batch.labels).loss);
  // Biases are formed as before.
  for (int layer : {0, 2, 4}) {
    EXPECT_EQ(std::memcmp(factored->parameters_by_layer()[layer][1]->grad.data(),
                          dense->parameters_by_layer()[layer][1]->grad.data(),
                          dense->parameters_by_layer()[layer][1]->grad.bytes()),
              0);
  }
  EXPECT_FALSE(factored->kernel_grad_factors(1).has_value()) << "a ReLU has no kernel";
  EXPECT_FALSE(dense->kernel_grad_factors(0).has_value()) << "not in factored mode";
  // Switched back, the kernel grads are formed again.
  factored->set_factored_kernel_grads(false);
  factored->TrainStep(batch.features, batch.labels);
  EXPECT_FALSE(std::isnan(factored->parameters()[0]->grad[0]));
}

// Four Gaussian blobs at (+-1, +-1) labelled by XOR of the signs: not linearly
// separable, so the hidden layer has to work.
Batch XorBlobs(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> noise(0.0f, 0.25f);
  Batch b{Tensor({n, 2}), std::vector<int32_t>(n)};
  for (int64_t i = 0; i < n; ++i) {
    const int qx = static_cast<int>(gen() % 2), qy = static_cast<int>(gen() % 2);
    b.features.at(i, 0) = (qx ? 1.0f : -1.0f) + noise(gen);
    b.features.at(i, 1) = (qy ? 1.0f : -1.0f) + noise(gen);
    b.labels[i] = qx ^ qy;
  }
  return b;
}

TEST(ModelTest, LearnsXorBlobsWithEveryOptimizer) {
  struct Case {
    std::string name;
    OptimizerType type;
    float lr;
    bool nesterov;
  };
  const std::vector<Case> cases = {
      {"sgd", OptimizerType::kSgd, 0.5f, false},
      {"momentum", OptimizerType::kMomentum, 0.1f, false},
      {"nesterov", OptimizerType::kMomentum, 0.1f, true},
      {"adam", OptimizerType::kAdam, 0.02f, false},
      {"adamw", OptimizerType::kAdamW, 0.02f, false},
      {"rmsprop", OptimizerType::kRmsprop, 0.01f, false},
  };
  const Batch test = XorBlobs(1000, 99);
  for (const Case& c : cases) {
    auto model = MakeModel({16}, 2, 2, 3);
    OptimizerConfig config;
    config.type = c.type;
    config.learning_rate = c.lr;
    config.nesterov = c.nesterov;
    auto opt = Optimizer::Create(config);
    ASSERT_TRUE(opt.ok()) << opt.status();
    const double initial = model->Evaluate(test.features, test.labels).correct / 1000.0;
    for (int step = 0; step < 300; ++step) {
      const Batch batch = XorBlobs(64, 1000 + step);
      model->TrainStep(batch.features, batch.labels);
      (*opt)->Apply(model->parameters());
    }
    const LossResult r = model->Evaluate(test.features, test.labels);
    EXPECT_GT(r.correct / 1000.0, 0.95) << c.name << " (started at " << initial << ")";
    EXPECT_LT(r.loss, 0.2) << c.name;
  }
}

}  // namespace
}  // namespace distrain

// Model built from spec.training.model.layers: the guide's CNN, Keras' loss
// semantics for a softmax output, BatchNormalization's state variables,
// Dropout's per-step streams, gradients end to end, and config errors.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LayerConfig L(LayerKind kind) {
  LayerConfig l;
  l.kind = kind;
  return l;
}
LayerConfig Conv(int64_t filters, int64_t k, ActivationKind act = ActivationKind::kRelu,
                 PaddingKind padding = PaddingKind::kValid, int64_t stride = 1) {
  LayerConfig l = L(LayerKind::kConv2D);
  l.filters = filters;
  l.kernel_size = {k, k};
  l.activation = act;
  l.padding = padding;
  l.strides = std::array<int64_t, 2>{stride, stride};
  return l;
}
LayerConfig DenseL(int64_t units, ActivationKind act = ActivationKind::kLinear) {
  LayerConfig l = L(LayerKind::kDense);
  l.units = units;
  l.activation = act;
  return l;
}
LayerConfig Pool(LayerKind kind = LayerKind::kMaxPooling2D) {
  LayerConfig l = L(kind);
  l.pool_size = {2, 2};
  return l;
}
LayerConfig Act(ActivationKind act) {
  LayerConfig l = L(LayerKind::kActivation);
  l.activation = act;
  return l;
}

ModelConfig Sequential(std::vector<LayerConfig> layers,
                       LossKind loss = LossKind::kSparseCategoricalCrossentropy,
                       std::optional<bool> from_logits = std::nullopt) {
  ModelConfig c;
  c.type = "sequential";
  c.layers = std::move(layers);
  c.loss.kind = loss;
  c.loss.from_logits = from_logits;
  return c;
}

// The distributed-training guide's CNN.
ModelConfig GuideCnn() {
  return Sequential({Conv(32, 3), Pool(), Conv(64, 3), L(LayerKind::kFlatten),
                     DenseL(64, ActivationKind::kRelu), DenseL(10, ActivationKind::kSoftmax)},
                    LossKind::kSparseCategoricalCrossentropy, true);
}

std::unique_ptr<Model> Build(const ModelConfig& config, std::vector<int64_t> example_shape,
                             int classes, uint64_t seed = 1) {
  auto model = Model::Create(config, example_shape, classes, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

struct Batch {
  Tensor features;
  std::vector<int32_t> labels;
};

Batch RandomBatch(int64_t n, int64_t features, int classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Batch b{Tensor({n, features}), std::vector<int32_t>(n)};
  for (int64_t i = 0; i < b.features.size(); ++i) b.features[i] = u(gen);
  for (auto& l : b.labels) l = static_cast<int32_t>(gen() % classes);
  return b;
}

TEST(SequentialModelTest, GuideCnnHasKerasNamesShapesAndParameterCount) {
  auto model = Build(GuideCnn(), {28, 28, 1}, 10);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->num_layers(), 6);
  std::vector<std::string> names;
  for (Parameter* p : model->parameters()) names.push_back(p->name);
  EXPECT_THAT(names, ElementsAre("conv2d/kernel", "conv2d/bias", "conv2d_1/kernel",
                                 "conv2d_1/bias", "dense/kernel", "dense/bias", "dense_1/kernel",
                                 "dense_1/bias"));
  EXPECT_THAT(model->parameters()[0]->value.shape(), ElementsAre(3, 3, 1, 32));
  EXPECT_THAT(model->parameters()[2]->value.shape(), ElementsAre(3, 3, 32, 64));
  EXPECT_THAT(model->parameters()[4]->value.shape(), ElementsAre(11 * 11 * 64, 64));
  // Keras' model.summary(): 320 + 18496 + 495680 + 650.
  EXPECT_EQ(model->num_parameters(), 515146);
  EXPECT_EQ(model->Summary(),
            "sequential conv2d[26,26,32] max_pooling2d[13,13,32] conv2d_1[11,11,64] "
            "flatten[7744] dense[64] dense_1[10] (515146 params)");
  EXPECT_TRUE(model->state_variables().empty());
  const auto by_layer = model->parameters_by_layer();
  EXPECT_TRUE(by_layer[1].empty());
  EXPECT_EQ(by_layer[5][0]->name, "dense_1/kernel");
}

// Keras hands the cross-entropy the logits behind the softmax whether
// fromLogits is true (the guide: it warns) or false: all three spellings of
// the model compute one loss and one gradient.
TEST(SequentialModelTest, SoftmaxOutputLossReadsTheLogitsLikeKeras) {
  const std::vector<int64_t> shape = {6};
  auto logits_model = Build(Sequential({DenseL(8, ActivationKind::kTanh), DenseL(4)},
                                       LossKind::kSparseCategoricalCrossentropy, true),
                            shape, 4);
  auto softmax_true = Build(Sequential({DenseL(8, ActivationKind::kTanh),
                                        DenseL(4, ActivationKind::kSoftmax)},
                                       LossKind::kSparseCategoricalCrossentropy, true),
                            shape, 4);
  auto softmax_false = Build(Sequential({DenseL(8, ActivationKind::kTanh),
                                         DenseL(4, ActivationKind::kSoftmax)}),
                             shape, 4);
  auto activation_layer = Build(Sequential({DenseL(8, ActivationKind::kTanh), DenseL(4),
                                            Act(ActivationKind::kSoftmax)}),
                                shape, 4);
  Batch b = RandomBatch(16, 6, 4, 3);
  for (int64_t i = 0; i < b.features.size(); ++i) b.features[i] *= 20;  // saturate the softmax
  const LossResult want = logits_model->TrainStep(b.features, b.labels);
  for (Model* m : {softmax_true.get(), softmax_false.get(), activation_layer.get()}) {
    const LossResult r = m->TrainStep(b.features, b.labels);
    EXPECT_NEAR(r.loss, want.loss, 1e-6 * want.loss);
    EXPECT_EQ(r.correct, want.correct);
    for (size_t k = 0; k < m->parameters().size(); ++k) {
      const Tensor& g = m->parameters()[k]->grad;
      const Tensor& w = logits_model->parameters()[k]->grad;
      for (int64_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-6) << k << " " << i;
    }
  }
  // Without the softmax, fromLogits: false on the raw outputs clips them as
  // probabilities: a different (much larger) loss.
  auto linear_probs = Build(Sequential({DenseL(8, ActivationKind::kTanh), DenseL(4)},
                                       LossKind::kSparseCategoricalCrossentropy, false),
                            shape, 4);
  EXPECT_GT(linear_probs->Evaluate(b.features, b.labels).loss, want.loss + 1);
}

TEST(SequentialModelTest, GradientsOfEveryParameterMatchFiniteDifferences) {
  // Images through Conv2D (same, stride 2), average pooling, Flatten, Dense
  // with a softmax output; a sigmoid Conv2D in between.
  auto model = Build(Sequential({Conv(3, 3, ActivationKind::kTanh, PaddingKind::kSame, 2),
                                 Conv(2, 2, ActivationKind::kSigmoid),
                                 Pool(LayerKind::kAveragePooling2D), L(LayerKind::kFlatten),
                                 DenseL(3, ActivationKind::kSoftmax)}),
                     {7, 9, 2}, 3, 5);
  ASSERT_NE(model, nullptr);
  const Batch batch = RandomBatch(4, 7 * 9 * 2, 3, 3);
  testing::ExpectModelGradients(*model, batch.features, batch.labels, 1e-2f, 2e-2, 2e-4);
}

TEST(SequentialModelTest, BatchNormalizationStateVariablesTrainAndEvaluate) {
  LayerConfig bn = L(LayerKind::kBatchNormalization);
  bn.momentum = 0.5;
  auto model = Build(Sequential({Conv(4, 3, ActivationKind::kLinear), bn,
                                 Act(ActivationKind::kRelu), L(LayerKind::kGlobalAveragePooling2D),
                                 DenseL(3, ActivationKind::kSoftmax)}),
                     {6, 6, 1}, 3);
  ASSERT_NE(model, nullptr);
  std::vector<std::string> names;
  for (Parameter* p : model->state_variables()) names.push_back(p->name);
  EXPECT_THAT(names, ElementsAre("batch_normalization/moving_mean",
                                 "batch_normalization/moving_variance"));
  names.clear();
  for (Parameter* p : model->parameters()) names.push_back(p->name);
  EXPECT_THAT(names, ElementsAre("conv2d/kernel", "conv2d/bias", "batch_normalization/gamma",
                                 "batch_normalization/beta", "dense/kernel", "dense/bias"));
  // Keras counts the moving statistics too: 40 + 4*4 + 15.
  EXPECT_EQ(model->num_parameters(), 40 + 16 + 15);
  const Batch b = RandomBatch(8, 36, 3, 1);
  const std::vector<float> before(model->state_variables()[0]->value.span().begin(),
                                  model->state_variables()[0]->value.span().end());
  model->Evaluate(b.features, b.labels);
  EXPECT_EQ(std::vector<float>(model->state_variables()[0]->value.span().begin(),
                               model->state_variables()[0]->value.span().end()),
            before);
  std::vector<int> order;
  model->TrainStep(b.features, b.labels, [&](int layer) { order.push_back(layer); });
  EXPECT_THAT(order, ElementsAre(4, 1, 0)) << "BatchNormalization reports gamma/beta";
  EXPECT_NE(std::vector<float>(model->state_variables()[0]->value.span().begin(),
                               model->state_variables()[0]->value.span().end()),
            before);
  // Training statistics differ from the (barely moved) moving ones.
  EXPECT_NE(model->Evaluate(b.features, b.labels).loss,
            model->TrainStep(b.features, b.labels).loss);
}

TEST(SequentialModelTest, DropoutDrawsPerStepAndReplicaAndIsOffAtEvaluation) {
  LayerConfig dropout = L(LayerKind::kDropout);
  dropout.rate = 0.5;
  auto make = [&] {
    return Build(Sequential({DenseL(16, ActivationKind::kRelu), dropout, DenseL(3)},
                            LossKind::kSparseCategoricalCrossentropy, true),
                 {5}, 3, 9);
  };
  auto a = make(), b = make();
  const Batch batch = RandomBatch(8, 5, 3, 2);
  auto grads = [&](Model& m, int64_t step, int replica) {
    m.TrainStep(batch.features, batch.labels, {}, {}, StepContext{step, replica});
    return std::vector<float>(m.parameters()[0]->grad.span().begin(),
                              m.parameters()[0]->grad.span().end());
  };
  EXPECT_EQ(grads(*a, 3, 0), grads(*b, 3, 0)) << "same seed, step and replica";
  EXPECT_NE(grads(*a, 3, 0), grads(*a, 4, 0));
  EXPECT_NE(grads(*a, 3, 0), grads(*a, 3, 1));
  EXPECT_EQ(a->Evaluate(batch.features, batch.labels).loss,
            a->Evaluate(batch.features, batch.labels).loss);
}

TEST(SequentialModelTest, FirstLayersWithoutParametersGetNoBackward) {
  // Reshape first: the Conv2D after it is the first layer with parameters
  // and computes no input gradient; hooks still fire for it.
  LayerConfig reshape = L(LayerKind::kReshape);
  reshape.shape = {4, 4, 1};
  auto model = Build(Sequential({reshape, Conv(2, 3), L(LayerKind::kFlatten), DenseL(2)},
                                LossKind::kSparseCategoricalCrossentropy, true),
                     {16}, 2);
  ASSERT_NE(model, nullptr);
  const Batch b = RandomBatch(3, 16, 2, 4);
  std::vector<int> order;
  model->TrainStep(b.features, b.labels, [&](int layer) { order.push_back(layer); });
  EXPECT_THAT(order, ElementsAre(3, 1));
}

// A ReLU followed by max pooling leaves its gradient to the pooling, which
// masks its smaller gradient by (pooled output > 0) before routing it
// (Layer::ApplyPrecedingReluGradient). Against the same model with an
// identity Reshape between the two, which keeps them apart, every gradient
// must be bit-identical: windows that overlap (3x3, stride 2), 'same'
// padding, windows whose inputs are all zero after the ReLU (a negative
// bias makes most of them), a ReLU of its own (Activation) as well as
// Conv2D's, and both policies.
TEST(SequentialModelTest, ReluGradientAppliedByMaxPoolingIsBitIdentical) {
  LayerConfig overlapping = Pool();
  overlapping.pool_size = {3, 3};
  overlapping.strides = std::array<int64_t, 2>{2, 2};
  overlapping.padding = PaddingKind::kSame;
  LayerConfig identity = L(LayerKind::kReshape);
  identity.shape = {9, 9, 3};
  struct Case {
    const char* name;
    std::vector<LayerConfig> fused;
    int relu_layer;  // the index of the layer whose output is ReLU's
    Precision precision;
  };
  const std::vector<Case> cases = {
      {"Conv2D(relu), overlapping 'same' windows",
       {Conv(3, 3), overlapping, L(LayerKind::kFlatten), DenseL(4)}, 0, Precision::kFloat32},
      {"Conv2D(relu), 2x2 windows, mixed_bfloat16",
       {Conv(3, 3), Pool(), L(LayerKind::kFlatten), DenseL(4)}, 0, Precision::kMixedBfloat16},
      {"Activation(relu)",
       {Conv(3, 3, ActivationKind::kLinear), Act(ActivationKind::kRelu), overlapping,
        L(LayerKind::kFlatten), DenseL(4)},
       1, Precision::kFloat32},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ModelConfig fused_config = Sequential(c.fused, LossKind::kSparseCategoricalCrossentropy, true);
    ModelConfig apart_config = fused_config;
    apart_config.layers.insert(apart_config.layers.begin() + c.relu_layer + 1, identity);
    fused_config.precision = apart_config.precision = c.precision;
    auto fused = Build(fused_config, {11, 11, 1}, 4, 7);
    auto apart = Build(apart_config, {11, 11, 1}, 4, 7);
    ASSERT_NE(fused, nullptr);
    ASSERT_NE(apart, nullptr);
    const std::vector<Parameter*> fp = fused->parameters(), ap = apart->parameters();
    ASSERT_EQ(fp.size(), ap.size());
    for (size_t i = 0; i < fp.size(); ++i) {
      ASSERT_EQ(fp[i]->name, ap[i]->name);
      ASSERT_EQ(fp[i]->value.size(), ap[i]->value.size());
      std::memcpy(ap[i]->value.data(), fp[i]->value.data(), fp[i]->value.size() * sizeof(float));
    }
    // Most pre-activations negative: many windows are all zeros after ReLU.
    for (Model* m : {fused.get(), apart.get()}) {
      for (int64_t f = 0; f < 3; ++f) m->parameters()[1]->value[f] = -0.3f;
    }
    const Batch b = RandomBatch(5, 121, 4, 11);
    const LossResult lf = fused->TrainStep(b.features, b.labels);
    const LossResult la = apart->TrainStep(b.features, b.labels);
    EXPECT_EQ(lf.loss, la.loss);
    int64_t zero_grads = 0, grads = 0;
    for (size_t i = 0; i < fp.size(); ++i) {
      SCOPED_TRACE(fp[i]->name);
      ASSERT_EQ(fp[i]->grad.size(), ap[i]->grad.size());
      EXPECT_EQ(0, std::memcmp(fp[i]->grad.data(), ap[i]->grad.data(),
                               fp[i]->grad.size() * sizeof(float)));
      for (int64_t k = 0; k < fp[i]->grad.size(); ++k) zero_grads += fp[i]->grad[k] == 0.0f;
      grads += fp[i]->grad.size();
    }
    EXPECT_LT(zero_grads, grads) << "a test whose gradients are all zero compares nothing";
  }
}

TEST(SequentialModelTest, LearnsToSeparateBrightFromDarkImages) {
  // 8x8 images: class 0 dark noise, class 1 a bright square somewhere.
  auto model = Build(Sequential({Conv(4, 3), Pool(), L(LayerKind::kFlatten),
                                 DenseL(2, ActivationKind::kSoftmax)}),
                     {8, 8, 1}, 2, 3);
  ASSERT_NE(model, nullptr);
  OptimizerConfig oc;
  oc.type = OptimizerType::kAdam;
  oc.learning_rate = 0.01f;
  auto opt = Optimizer::Create(oc);
  ASSERT_TRUE(opt.ok());
  auto make = [](int64_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> noise(0.0f, 0.3f);
    Batch b{Tensor({n, 64}), std::vector<int32_t>(n)};
    for (int64_t i = 0; i < n; ++i) {
      b.labels[i] = static_cast<int32_t>(gen() % 2);
      for (int p = 0; p < 64; ++p) b.features.at(i, p) = noise(gen);
      if (b.labels[i] == 1) {
        const int r0 = static_cast<int>(gen() % 5), c0 = static_cast<int>(gen() % 5);
        for (int r = r0; r < r0 + 3; ++r) {
          for (int c = c0; c < c0 + 3; ++c) b.features.at(i, r * 8 + c) = 1.0f;
        }
      }
    }
    return b;
  };
  const Batch test = make(200, 99);
  for (int step = 0; step < 60; ++step) {
    const Batch b = make(32, 1000 + step);
    model->TrainStep(b.features, b.labels, {}, {}, StepContext{step, 0});
    (*opt)->Apply(model->parameters());
  }
  const LossResult r = model->Evaluate(test.features, test.labels);
  EXPECT_GT(r.correct / 200.0, 0.95);
}

TEST(SequentialModelTest, MlpShorthandFlattensImageExamples) {
  ModelConfig mlp;
  mlp.hidden_units = {16};
  auto model = Build(mlp, {28, 28, 1}, 10);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->Summary(), "mlp 784-16-10 (12730 params)");
  EXPECT_THAT(model->example_shape(), ElementsAre(28, 28, 1));
}

TEST(SequentialModelTest, CreateRejectsInvalidModelsNamingTheLayer) {
  // Dense on images without Flatten.
  auto bad = Model::Create(Sequential({Conv(2, 3), DenseL(10)}), {8, 8, 1}, 10, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("layers[1] (Dense)"));
  // Output width against the classes.
  auto wrong = Model::Create(Sequential({DenseL(3)}), {4}, 10, 1);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("needs one value per class"));
  auto empty = Model::Create(Sequential({}), {4}, 10, 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("spec.training.model.layers"));
}

TEST(SequentialModelTest, BinaryAndMeanSquaredErrorOutputs) {
  auto binary = Build(Sequential({DenseL(4, ActivationKind::kRelu),
                                  DenseL(1, ActivationKind::kSigmoid)},
                                 LossKind::kBinaryCrossentropy),
                      {3}, 2);
  auto mse = Build(Sequential({DenseL(2)}, LossKind::kMeanSquaredError), {3}, 2);
  auto mse1 = Build(Sequential({DenseL(1)}, LossKind::kMeanSquaredError), {3}, 2);
  const Batch b = RandomBatch(10, 3, 2, 5);
  for (Model* m : {binary.get(), mse.get(), mse1.get()}) {
    ASSERT_NE(m, nullptr);
    const LossResult r = m->TrainStep(b.features, b.labels);
    EXPECT_GT(r.loss, 0);
    EXPECT_LE(r.correct, 10);
  }
}

}  // namespace
}  // namespace distrain

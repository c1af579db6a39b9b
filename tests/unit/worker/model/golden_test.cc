// distrain's layers, losses and models against Keras 3 on TensorFlow: the
// reference numbers in tests/golden/layers.json come from
// tests/golden/make_layer_goldens.py (see there for what each case records).
// Every value must agree within 1e-5 (relative to magnitudes above 1).

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "nlohmann/json.hpp"
#include "worker/model/layer_factory.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

constexpr double kTolerance = 1e-5;

const Json& Goldens() {
  static const Json* goldens = [] {
    std::ifstream in(std::string(DISTRAIN_SOURCE_DIR) + "/tests/golden/layers.json");
    EXPECT_TRUE(in.good()) << "tests/golden/layers.json missing";
    auto* j = new Json(Json::parse(in));
    return j;
  }();
  return *goldens;
}

std::vector<int64_t> Shape(const Json& j) { return j.get<std::vector<int64_t>>(); }

Tensor ToTensor(const Json& shape, const Json& values) {
  return Tensor(Shape(shape), values.get<std::vector<float>>());
}

void ExpectClose(const Tensor& got, const Json& want, const std::string& what) {
  const std::vector<float> w = want.get<std::vector<float>>();
  ASSERT_EQ(got.size(), static_cast<int64_t>(w.size())) << what;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_LE(std::abs(double{got[i]} - w[i]), kTolerance * std::max(1.0, std::abs(double{w[i]})))
        << what << " element " << i << ": distrain " << got[i] << ", Keras " << w[i];
  }
}

std::array<int64_t, 2> Pair(const Json& j) {
  if (j.is_number()) return {j.get<int64_t>(), j.get<int64_t>()};
  return {j[0].get<int64_t>(), j[1].get<int64_t>()};
}

// A layer's config in distrain's terms from the golden file's Keras
// spelling (the same camelCase arguments as spec.training.model.layers).
LayerConfig ToLayerConfig(const Json& j, const std::string& default_name) {
  LayerConfig c;
  const std::optional<LayerKind> kind = ParseLayerKind(j.at("class").get<std::string>());
  EXPECT_TRUE(kind.has_value()) << j.dump();
  c.kind = kind.value_or(LayerKind::kDense);
  c.name = j.value("name", default_name);
  // A 1-D layer's sizes are one length, {length, 1}.
  const bool one_d = IsOneDimensional(c.kind);
  auto size = [&](const Json& v) -> std::array<int64_t, 2> {
    if (one_d) return {v.is_array() ? v[0].get<int64_t>() : v.get<int64_t>(), 1};
    return Pair(v);
  };
  if (one_d) c.pool_size = {2, 1};
  if (j.contains("units")) c.units = j["units"];
  if (j.contains("inputDim")) c.input_dim = j["inputDim"];
  if (j.contains("outputDim")) c.output_dim = j["outputDim"];
  if (j.contains("filters")) c.filters = j["filters"];
  if (j.contains("kernelSize")) c.kernel_size = size(j["kernelSize"]);
  if (j.contains("poolSize")) c.pool_size = size(j["poolSize"]);
  if (j.contains("strides")) c.strides = size(j["strides"]);
  if (j.contains("padding")) {
    c.padding = j["padding"] == "same"     ? PaddingKind::kSame
                : j["padding"] == "causal" ? PaddingKind::kCausal
                                           : PaddingKind::kValid;
  }
  if (j.contains("activation")) {
    const std::optional<ActivationKind> a = ParseActivationName(j["activation"]);
    EXPECT_TRUE(a.has_value()) << j.dump();
    c.activation = a.value_or(ActivationKind::kLinear);
  }
  if (j.contains("useBias")) c.use_bias = j["useBias"];
  if (j.contains("targetShape")) c.shape = Shape(j["targetShape"]);
  if (j.contains("rate")) c.rate = j["rate"];
  if (j.contains("momentum")) c.momentum = j["momentum"];
  c.epsilon = j.value("epsilon", DefaultEpsilon(c.kind));
  if (j.contains("negativeSlope")) c.negative_slope = j["negativeSlope"].get<double>();
  if (j.contains("maxValue")) c.max_value = j["maxValue"].get<double>();
  if (j.contains("alpha")) c.alpha = j["alpha"];
  if (j.contains("axis")) c.axis = j["axis"];
  // LayerNormalization's `scale` is a switch, Rescaling's a number.
  if (j.contains("scale") && j["scale"].is_boolean()) {
    c.scale_output = j["scale"];
  } else if (j.contains("scale")) {
    c.scale = j["scale"];
  }
  if (j.contains("center")) c.center = j["center"];
  if (j.contains("offset")) c.offset = j["offset"];
  return c;
}

std::string Suffix(const std::string& name) { return name.substr(name.rfind('/') + 1); }

void RunLayerCase(const Json& c) {
  const LayerConfig config = ToLayerConfig(c["layer"], "layer");
  const std::vector<int64_t> input_shape = Shape(c["input_shape"]);
  const std::vector<int64_t> example(input_shape.begin() + 1, input_shape.end());
  std::unique_ptr<Layer> layer = MakeLayer(config, example, 1);
  ASSERT_NE(layer, nullptr);
  std::map<std::string, Parameter*> vars;
  for (Parameter* p : layer->parameters()) vars[Suffix(p->name)] = p;
  for (Parameter* p : layer->state_variables()) vars[Suffix(p->name)] = p;
  ASSERT_EQ(vars.size(), c["variables"].size());
  for (const auto& [name, v] : c["variables"].items()) {
    ASSERT_TRUE(vars.count(name)) << "no variable " << name;
    ASSERT_EQ(vars[name]->value.shape(), Shape(v["shape"])) << name;
    vars[name]->value = ToTensor(v["shape"], v["value"]);
  }
  const Tensor input = ToTensor(c["input_shape"], c["input"]);
  ForwardContext ctx;
  ctx.training = c["training"];
  Tensor output;
  layer->Forward(input, &output, ctx);
  ASSERT_EQ(output.shape(), Shape(c["output_shape"]));
  ExpectClose(output, c["output"], "output");
  if (c.contains("variables_after")) {
    for (const auto& [name, v] : c["variables_after"].items()) {
      ExpectClose(vars[name]->value, v, name + " after the training call");
    }
  }
  // Backward of L = sum(output * upstream); BatchNormalization at inference
  // is never differentiated by the model (its training pass is).
  if (config.kind == LayerKind::kBatchNormalization && !ctx.training) return;
  const Tensor upstream = ToTensor(c["output_shape"], c["upstream"]);
  // Token ids (Embedding) have no gradient: the case records none.
  Tensor grad_input;
  layer->Backward(upstream, c.contains("grad_input") ? &grad_input : nullptr);
  if (c.contains("grad_input")) ExpectClose(grad_input, c["grad_input"], "grad_input");
  for (const auto& [name, g] : c["grad_variables"].items()) {
    ExpectClose(vars[name]->grad, g, "grad " + name);
  }
}

void RunModelCase(const Json& c) {
  ModelConfig config;
  config.type = "sequential";
  for (const Json& l : c["layers"]) config.layers.push_back(ToLayerConfig(l, ""));
  const std::optional<LossKind> loss = ParseLossKindName(c["loss"]["type"]);
  ASSERT_TRUE(loss.has_value());
  config.loss.kind = *loss;
  config.loss.from_logits = c["loss"]["fromLogits"].get<bool>();
  // distrain warns where Keras did (from_logits on a softmax or sigmoid output).
  EXPECT_EQ(!ModelWarnings(config.layers, config.loss).empty(), c["keras_warned"].get<bool>());
  auto created = Model::Create(config, Shape(c["example_shape"]), c["num_classes"], 1);
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  std::map<std::string, Parameter*> vars;
  for (Parameter* p : model.parameters()) vars[p->name] = p;
  for (Parameter* p : model.state_variables()) vars[p->name] = p;
  ASSERT_EQ(vars.size(), c["variables"].size());
  for (const auto& [name, v] : c["variables"].items()) {
    ASSERT_TRUE(vars.count(name)) << "no variable " << name;
    ASSERT_EQ(vars[name]->value.shape(), Shape(v["shape"])) << name;
    vars[name]->value = ToTensor(v["shape"], v["value"]);
  }
  const std::vector<int64_t> input_shape = Shape(c["input_shape"]);
  const int64_t batch = input_shape[0];
  // Batches arrive flat, as the datasets yield them.
  const Tensor features({batch, Tensor::NumElements(input_shape) / batch},
                        c["input"].get<std::vector<float>>());
  const std::vector<int32_t> labels = c["labels"].get<std::vector<int32_t>>();

  const LossResult eval = model.Evaluate(features, labels);
  const double want_loss = c["loss_value"];
  EXPECT_LE(std::abs(eval.loss - want_loss), kTolerance * std::max(1.0, want_loss))
      << "evaluate loss: distrain " << eval.loss << ", Keras " << want_loss;
  EXPECT_NEAR(static_cast<double>(eval.correct) / batch, c["accuracy"].get<double>(), 1e-6)
      << "accuracy";

  const LossResult train = model.TrainStep(features, labels);
  const double tape_loss = c["tape_loss"];
  EXPECT_LE(std::abs(train.loss - tape_loss), kTolerance * std::max(1.0, tape_loss))
      << "training loss: distrain " << train.loss << ", Keras " << tape_loss;
  for (const auto& [name, g] : c["grads"].items()) {
    ASSERT_TRUE(vars.count(name)) << name;
    ExpectClose(vars[name]->grad, g, "grad " + name);
  }
  for (const auto& [name, v] : c["state_after_training_call"].items()) {
    ExpectClose(vars[name]->value, v, name + " after the training step");
  }
}

// Three steps of an optimizer, its config read by the job parser as a user
// writes it (spec.training.optimizer), against Keras' optimizer.apply.
absl::StatusOr<JobConfig> ParseOptimizerBlock(const Json& optimizer) {
  absl::StatusOr<JobConfig> job = ParseJobYaml(absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: t}\n"
      "spec:\n  strategy: OneDevice\n  replicaSpecs: {Worker: {replicas: 1}}\n"
      "  training: {optimizer: ",
      optimizer.dump(), "}\n"));
  if (job.ok()) {
    if (absl::Status s = ValidateJobConfig(*job); !s.ok()) return s;
  }
  return job;
}

void RunOptimizerCase(const Json& c) {
  absl::StatusOr<JobConfig> job = ParseOptimizerBlock(c["optimizer"]);
  ASSERT_TRUE(job.ok()) << job.status();
  auto optimizer = Optimizer::Create(job->training.optimizer);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::map<std::string, Tensor> values;
  for (const auto& [name, v] : c["variables"].items()) {
    values[name] = ToTensor(v["shape"], v["value"]);
  }
  int64_t iteration = 0;
  for (const Json& step : c["steps"]) {
    ++iteration;
    for (auto& [name, value] : values) {
      const std::vector<float> grad = step.at(name).get<std::vector<float>>();
      (*optimizer)->ApplyDense(name, value.span(), grad, iteration);
    }
  }
  for (const auto& [name, value] : values) ExpectClose(value, c["after"][name], name);
}

// A learning-rate schedule at steps around its corners, against Keras'
// schedule object: relative to the rate, however small it gets.
void RunScheduleCase(const Json& c) {
  absl::StatusOr<JobConfig> job = ParseOptimizerBlock(c["optimizer"]);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<int64_t> steps = c["steps"].get<std::vector<int64_t>>();
  const std::vector<double> rates = c["rates"].get<std::vector<double>>();
  for (size_t i = 0; i < steps.size(); ++i) {
    const double got = job->training.optimizer.LearningRate(steps[i]);
    EXPECT_LE(std::abs(got - rates[i]), 2e-6 * std::abs(rates[i]) + 1e-30)
        << "step " << steps[i] << ": distrain " << got << ", Keras " << rates[i];
  }
}

TEST(KerasGoldenTest, EveryCaseMatchesKeras) {
  const Json& cases = Goldens()["cases"];
  ASSERT_GT(cases.size(), 50u);
  int layers = 0, models = 0, optimizers = 0, schedules = 0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    if (c["kind"] == "layer") {
      RunLayerCase(c);
      ++layers;
    } else if (c["kind"] == "optimizer") {
      RunOptimizerCase(c);
      ++optimizers;
    } else if (c["kind"] == "schedule") {
      RunScheduleCase(c);
      ++schedules;
    } else {
      RunModelCase(c);
      ++models;
    }
  }
  EXPECT_GT(layers, 40);
  EXPECT_GT(models, 40);
  EXPECT_GE(optimizers, 9);
  EXPECT_GE(schedules, 9);
}

// Every activation name distrain accepts, aliases included, has a golden case
// of its own (an Activation layer on wide inputs).
TEST(KerasGoldenTest, EveryActivationNameHasACase) {
  std::set<std::string> covered;
  for (const Json& c : Goldens()["cases"]) {
    if (c["kind"] == "layer" && c["layer"]["class"] == "Activation") {
      covered.insert(c["layer"]["activation"].get<std::string>());
    }
  }
  for (const std::string& name : ActivationNames(/*with_aliases=*/true)) {
    EXPECT_TRUE(covered.count(name)) << name << " has no Activation case in tests/golden";
  }
}

// The guide's model and the quirk it documents: fromLogits: true on a
// softmax output makes Keras warn and read the logits.
TEST(KerasGoldenTest, GuideCnnWarnsInKerasAndMatches) {
  for (const Json& c : Goldens()["cases"]) {
    if (c["name"] != "guide_cnn_small") continue;
    EXPECT_TRUE(c["keras_warned"].get<bool>());
    RunModelCase(c);
    return;
  }
  FAIL() << "no guide_cnn_small case";
}

}  // namespace
}  // namespace distrain

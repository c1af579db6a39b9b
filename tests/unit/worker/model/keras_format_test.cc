#include "worker/model/keras_format.h"

#include <hdf5.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <functional>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/keras_archive.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/strategy/variable_state.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// A Keras 3 model.to_json() of the guide's CNN (keys as Keras 3.15 writes
// them, trimmed of the ones the importer ignores).
Json GuideCnnJson() {
  return Json::parse(R"({
    "module": "keras", "class_name": "Sequential", "registered_name": null,
    "config": {"name": "sequential", "trainable": true, "layers": [
      {"module": "keras.layers", "class_name": "InputLayer",
       "config": {"batch_shape": [null, 28, 28, 1], "dtype": "float32", "sparse": false,
                  "ragged": false, "name": "input_layer", "optional": false}},
      {"module": "keras.layers", "class_name": "Conv2D",
       "config": {"name": "conv2d", "filters": 32, "kernel_size": [3, 3], "strides": [1, 1],
                  "padding": "valid", "data_format": "channels_last", "dilation_rate": [1, 1],
                  "groups": 1, "activation": "relu", "use_bias": true,
                  "kernel_initializer": {"module": "keras.initializers", "class_name": "GlorotUniform", "config": {"seed": null}},
                  "bias_initializer": {"module": "keras.initializers", "class_name": "Zeros", "config": {}},
                  "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
                  "kernel_constraint": null, "bias_constraint": null}},
      {"module": "keras.layers", "class_name": "MaxPooling2D",
       "config": {"name": "max_pooling2d", "pool_size": [2, 2], "padding": "valid",
                  "strides": [2, 2], "data_format": "channels_last"}},
      {"module": "keras.layers", "class_name": "Flatten",
       "config": {"name": "flatten", "data_format": "channels_last"}},
      {"module": "keras.layers", "class_name": "Dense",
       "config": {"name": "dense", "units": 10, "activation": "softmax", "use_bias": true}}
    ]}})");
}

// `distrain import-keras`'s block pasted under spec.training of a job, as a
// user does, and parsed.
absl::StatusOr<JobConfig> ParsePastedBlock(const std::string& block) {
  std::string indented;
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) indented += "    " + line + "\n";
  return ParseJobYaml(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: t}\n"
      "spec:\n  strategy: OneDevice\n  replicaSpecs: {Worker: {replicas: 1}}\n  training:\n" +
      indented);
}

TEST(KerasImportTest, GuideCnnBecomesTheSameLayersWithKerasParameterCount) {
  auto imported = ImportKerasModelJson(GuideCnnJson().dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const auto& layers = imported->model.layers;
  ASSERT_EQ(layers.size(), 5u);
  EXPECT_EQ(layers[0].kind, LayerKind::kInput);
  EXPECT_EQ(layers[0].shape, (std::vector<int64_t>{28, 28, 1}));
  EXPECT_EQ(layers[1].kind, LayerKind::kConv2D);
  EXPECT_EQ(layers[1].filters, 32);
  EXPECT_EQ(layers[1].activation, ActivationKind::kRelu);
  EXPECT_FALSE(layers[2].strides.has_value()) << "strides equal to pool_size are Keras' default";
  EXPECT_EQ(layers[4].activation, ActivationKind::kSoftmax);
  // 3*3*32+32 + 13*13*32*10+10 = 320 + 54,090.
  EXPECT_EQ(imported->num_parameters, 54410);
  EXPECT_TRUE(imported->warnings.empty());
}

TEST(KerasImportTest, YamlBlockParsesBackIntoTheSameModel) {
  auto imported = ImportKerasModelJson(GuideCnnJson().dump());
  ASSERT_TRUE(imported.ok());
  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("54410 parameters"));
  auto parsed = ParsePastedBlock(block);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << block;
  EXPECT_EQ(parsed->training.model.layers, imported->model.layers) << block;
}

// Keras 3.15's to_json() of activation layers and Rescaling (trimmed as
// above), and the configs distrain reads from it.
TEST(KerasImportTest, ActivationLayersAndRescalingImportExportAndParseBack) {
  const Json json = Json::parse(R"({
    "module": "keras", "class_name": "Sequential", "registered_name": null,
    "config": {"name": "sequential", "trainable": true, "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 8], "sparse": false, "ragged": false, "name": "input_layer", "optional": false}},
      {"class_name": "Rescaling", "config": {"name": "rescaling", "scale": 0.00392156862745098, "offset": 0.5}},
      {"class_name": "Dense", "config": {"name": "dense", "units": 4, "activation": "silu", "use_bias": true}},
      {"class_name": "LeakyReLU", "config": {"name": "leaky_re_lu", "negative_slope": 0.3}},
      {"class_name": "ReLU", "config": {"name": "re_lu", "max_value": 6.0, "negative_slope": 0.0, "threshold": 0.0}},
      {"class_name": "ReLU", "config": {"name": "re_lu_1", "max_value": null, "negative_slope": 0.1, "threshold": 0.0}},
      {"class_name": "ELU", "config": {"name": "elu", "alpha": 0.5}},
      {"class_name": "Dense", "config": {"name": "dense_1", "units": 3, "activation": "hard_silu", "use_bias": true}},
      {"class_name": "Softmax", "config": {"name": "softmax", "axis": -1}}
    ]}})");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::vector<LayerConfig>& layers = imported->model.layers;
  ASSERT_EQ(layers.size(), 9u);
  EXPECT_EQ(layers[1].kind, LayerKind::kRescaling);
  EXPECT_DOUBLE_EQ(layers[1].scale, 1.0 / 255);
  EXPECT_DOUBLE_EQ(layers[1].offset, 0.5);
  EXPECT_EQ(layers[2].Activation(), ActivationFunction(ActivationKind::kSilu));
  EXPECT_EQ(layers[3].Activation(), ActivationFunction(ActivationKind::kLeakyRelu, 0.3f));
  EXPECT_FALSE(layers[3].negative_slope.has_value()) << "0.3 is LeakyReLU's default";
  EXPECT_EQ(layers[4].Activation(), ActivationFunction(ActivationKind::kRelu6));
  EXPECT_EQ(layers[5].Activation(), ActivationFunction(ActivationKind::kLeakyRelu, 0.1f));
  EXPECT_EQ(layers[6].Activation(), ActivationFunction(ActivationKind::kElu, 0.5f));
  EXPECT_EQ(layers[7].Activation(), ActivationFunction(ActivationKind::kHardSilu));
  EXPECT_EQ(layers[8].Activation(), ActivationFunction(ActivationKind::kSoftmax));
  EXPECT_EQ(imported->num_parameters, 8 * 4 + 4 + 4 * 3 + 3);
  EXPECT_TRUE(imported->warnings.empty());

  // distrain's own config.json of the model imports as the same layers.
  KerasModelSpec spec;
  spec.model = imported->model;
  spec.example_shape = {8};
  spec.num_classes = 3;
  auto written = KerasConfigJson(spec);
  ASSERT_TRUE(written.ok()) << written.status();
  auto again = ImportKerasModelJson(*written);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << *written;
  EXPECT_EQ(again->model.layers, layers) << *written;

  // And the YAML block `distrain import-keras` prints parses back into them.
  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("set dataset.scale: 1 to scale them once"));
  auto parsed = ParsePastedBlock(block);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << block;
  EXPECT_EQ(parsed->training.model.layers, layers) << block;

  // What distrain cannot compute is refused by name.
  Json per_channel = json;
  per_channel["config"]["layers"][1]["config"]["scale"] = {0.5, 0.25, 0.125};
  auto refused = ImportKerasModelJson(per_channel.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("Rescaling 'rescaling': scale is a list"),
                    HasSubstr("one scale for every channel")));
  Json threshold = json;
  threshold["config"]["layers"][4]["config"]["threshold"] = 1.0;
  refused = ImportKerasModelJson(threshold.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("threshold 1 is not supported"));
}

// Keras' RMSprop, AdamW and any optimizer's weight_decay come over; what
// distrain lacks (RMSprop's momentum, EMA) is refused by name.
TEST(KerasImportTest, RmspropAdamWAndWeightDecayImportAndWhatIsMissingIsRefused) {
  auto import_with = [](const std::string& optimizer) {
    Json json = GuideCnnJson();
    json["compile_config"] = {{"optimizer", Json::parse(optimizer)}};
    return ImportKerasModelJson(json.dump());
  };
  auto rmsprop = import_with(R"({"class_name": "RMSprop", "config": {"name": "rmsprop",
      "learning_rate": 0.002, "weight_decay": null, "rho": 0.8, "momentum": 0.0,
      "epsilon": 1e-06, "centered": true, "use_ema": false}})");
  ASSERT_TRUE(rmsprop.ok()) << rmsprop.status();
  EXPECT_EQ(rmsprop->optimizer->type, OptimizerType::kRmsprop);
  EXPECT_FLOAT_EQ(rmsprop->optimizer->rho, 0.8f);
  EXPECT_FLOAT_EQ(rmsprop->optimizer->epsilon, 1e-6f);
  EXPECT_TRUE(rmsprop->optimizer->centered);
  EXPECT_FALSE(rmsprop->optimizer->weight_decay.has_value());
  const std::string block = KerasImportYaml(*rmsprop, "config.json");
  EXPECT_THAT(block, AllOf(HasSubstr("type: rmsprop"), HasSubstr("rho: 0.8"),
                           HasSubstr("centered: true")));
  EXPECT_THAT(block, ::testing::Not(HasSubstr("beta1")));

  auto adamw = import_with(R"({"class_name": "AdamW", "config": {"name": "adamw",
      "learning_rate": 0.001, "weight_decay": 0.004, "beta_1": 0.9, "beta_2": 0.999,
      "epsilon": 1e-07, "amsgrad": false}})");
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ(adamw->optimizer->type, OptimizerType::kAdamW);
  EXPECT_FALSE(adamw->optimizer->weight_decay.has_value()) << "0.004 is AdamW's default";
  EXPECT_FLOAT_EQ(adamw->optimizer->EffectiveWeightDecay(), 0.004f);

  auto sgd = import_with(R"({"class_name": "SGD", "config": {"name": "SGD",
      "learning_rate": 0.1, "weight_decay": 0.0005, "momentum": 0.9, "nesterov": true}})");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->optimizer->type, OptimizerType::kMomentum);
  EXPECT_EQ(sgd->optimizer->weight_decay, std::optional<float>(0.0005f));
  EXPECT_THAT(KerasImportYaml(*sgd, "config.json"), HasSubstr("weightDecay: 0.0005"));

  auto momentum = import_with(R"({"class_name": "RMSprop", "config": {"momentum": 0.9}})");
  ASSERT_FALSE(momentum.ok());
  EXPECT_THAT(momentum.status().message(),
              HasSubstr("RMSprop with momentum 0.9 is not supported"));
  auto ema = import_with(R"({"class_name": "Adam", "config": {"use_ema": true}})");
  ASSERT_FALSE(ema.ok());
  EXPECT_THAT(ema.status().message(), HasSubstr("use_ema is true"));
}

// Keras 3.15's to_json() of the 1-D layers (trimmed as above): imported as
// {length, 1} sizes, written back the way Keras writes them, and the YAML
// block says one length.
TEST(KerasImportTest, OneDimensionalLayersImportExportAndParseBack) {
  const Json json = Json::parse(R"({
    "module": "keras", "class_name": "Sequential", "registered_name": null,
    "config": {"name": "sequential", "trainable": true, "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 50, 3], "sparse": false, "ragged": false, "name": "input_layer", "optional": false}},
      {"class_name": "Conv1D", "config": {"name": "conv1d", "filters": 8, "kernel_size": [5], "strides": [1], "padding": "same", "data_format": "channels_last", "dilation_rate": [1], "groups": 1, "activation": "relu", "use_bias": true}},
      {"class_name": "MaxPooling1D", "config": {"name": "max_pooling1d", "pool_size": [2], "padding": "valid", "strides": [2], "data_format": "channels_last"}},
      {"class_name": "AveragePooling1D", "config": {"name": "average_pooling1d", "pool_size": [3], "padding": "same", "strides": [1], "data_format": "channels_last"}},
      {"class_name": "GlobalAveragePooling1D", "config": {"name": "global_average_pooling1d", "data_format": "channels_last", "keepdims": false}},
      {"class_name": "Dense", "config": {"name": "dense", "units": 4, "activation": "linear", "use_bias": true}}
    ]}})");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::vector<LayerConfig>& layers = imported->model.layers;
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers[1].kind, LayerKind::kConv1D);
  EXPECT_EQ(layers[1].kernel_size, (std::array<int64_t, 2>{5, 1}));
  EXPECT_FALSE(layers[1].strides.has_value());
  EXPECT_EQ(layers[1].Activation(), ActivationFunction(ActivationKind::kRelu));
  EXPECT_EQ(layers[2].pool_size, (std::array<int64_t, 2>{2, 1}));
  EXPECT_FALSE(layers[2].strides.has_value()) << "strides equal to pool_size are Keras' default";
  EXPECT_EQ(layers[3].strides, (std::optional<std::array<int64_t, 2>>{{1, 1}}));
  EXPECT_EQ(layers[4].kind, LayerKind::kGlobalAveragePooling1D);
  EXPECT_EQ(imported->num_parameters, 5 * 3 * 8 + 8 + 8 * 4 + 4);

  KerasModelSpec spec;
  spec.model = imported->model;
  spec.example_shape = {50, 3};
  spec.num_classes = 4;
  auto written = KerasConfigJson(spec);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, HasSubstr("\"kernel_size\":[5]"));
  auto again = ImportKerasModelJson(*written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model.layers, layers) << *written;

  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("- Conv1D: {filters: 8, kernelSize: 5, padding: same"));
  auto parsed = ParsePastedBlock(block);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << block;
  EXPECT_EQ(parsed->training.model.layers, layers) << block;

  // Causal padding: Conv1D's, both ways; a pooling layer has none in Keras.
  Json causal = json;
  causal["config"]["layers"][1]["config"]["padding"] = "causal";
  auto causal_import = ImportKerasModelJson(causal.dump());
  ASSERT_TRUE(causal_import.ok()) << causal_import.status();
  EXPECT_EQ(causal_import->model.layers[1].padding, PaddingKind::kCausal);
  spec.model = causal_import->model;
  auto causal_written = KerasConfigJson(spec);
  ASSERT_TRUE(causal_written.ok()) << causal_written.status();
  EXPECT_THAT(*causal_written, HasSubstr("\"padding\":\"causal\""));
  EXPECT_THAT(KerasImportYaml(*causal_import, "model.json"),
              HasSubstr("- Conv1D: {filters: 8, kernelSize: 5, padding: causal"));
  causal["config"]["layers"][2]["config"]["padding"] = "causal";
  auto refused = ImportKerasModelJson(causal.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("MaxPooling1D 'max_pooling1d': padding 'causal' is not supported; use "
                        "valid or same"));
}

// LayerNormalization and RMSNormalization as Keras 3.15 writes them once
// built (axis as a list of one), with every center/scale choice; the axis
// of BatchNormalization and LayerNormalization is checked against the input.
TEST(KerasImportTest, LayerAndRmsNormalizationImportExportAndParseBack) {
  const Json json = Json::parse(R"({
    "module": "keras", "class_name": "Sequential", "registered_name": null,
    "config": {"name": "sequential", "trainable": true, "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 6, 4], "sparse": false, "ragged": false, "name": "input_layer", "optional": false}},
      {"class_name": "LayerNormalization", "config": {"name": "layer_normalization", "trainable": true, "axis": [-1], "epsilon": 0.001, "center": true, "scale": true, "rms_scaling": false, "beta_initializer": {"module": "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": null}, "gamma_initializer": {"module": "keras.initializers", "class_name": "Ones", "config": {}, "registered_name": null}, "beta_regularizer": null, "gamma_regularizer": null, "beta_constraint": null, "gamma_constraint": null}},
      {"class_name": "LayerNormalization", "config": {"name": "layer_normalization_1", "axis": [2], "epsilon": 1e-05, "center": false, "scale": true, "rms_scaling": false}},
      {"class_name": "RMSNormalization", "config": {"name": "rms_normalization", "trainable": true, "axis": [-1], "epsilon": 1e-06}},
      {"class_name": "BatchNormalization", "config": {"name": "batch_normalization", "axis": 2, "momentum": 0.99, "epsilon": 0.001, "center": true, "scale": true}},
      {"class_name": "Flatten", "config": {"name": "flatten", "data_format": "channels_last"}},
      {"class_name": "Dense", "config": {"name": "dense", "units": 3, "activation": "linear", "use_bias": true}},
      {"class_name": "LayerNormalization", "config": {"name": "layer_normalization_2", "axis": -1, "center": true, "scale": false}}
    ]}})");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::vector<LayerConfig>& layers = imported->model.layers;
  ASSERT_EQ(layers.size(), 8u);
  EXPECT_EQ(layers[1].kind, LayerKind::kLayerNormalization);
  EXPECT_TRUE(layers[1].center && layers[1].scale_output);
  EXPECT_EQ(layers[2].axis, 2);
  EXPECT_EQ(layers[2].epsilon, 1e-5);
  EXPECT_FALSE(layers[2].center);
  EXPECT_EQ(layers[3].kind, LayerKind::kRMSNormalization);
  EXPECT_EQ(layers[3].epsilon, 1e-6);
  EXPECT_FALSE(layers[7].scale_output);
  // gamma and beta; gamma; scale; BN's gamma, beta and moving statistics;
  // the Dense layer; beta.
  EXPECT_EQ(imported->num_parameters, 8 + 4 + 4 + 4 * 4 + 24 * 3 + 3 + 3);

  KerasModelSpec spec;
  spec.model = imported->model;
  spec.example_shape = {6, 4};
  spec.num_classes = 3;
  auto written = KerasConfigJson(spec);
  ASSERT_TRUE(written.ok()) << written.status();
  auto again = ImportKerasModelJson(*written);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerConfig want = layers[i];
    want.axis = -1;  // written as Keras' [-1]: the same axis
    EXPECT_EQ(again->model.layers[i], want) << i << "\n" << *written;
  }

  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("- LayerNormalization: {axis: 2, epsilon: 1e-05, center: false}"));
  EXPECT_THAT(block, HasSubstr("- RMSNormalization: {}"));
  auto parsed = ParsePastedBlock(block);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << block;
  EXPECT_EQ(parsed->training.model.layers, layers) << block;

  for (const auto& [index, key, value, message] :
       std::vector<std::tuple<int, std::string, Json, std::string>>{
           {1, "rms_scaling", true, "LayerNormalization 'layer_normalization': rms_scaling is "
                                    "true (deprecated in Keras"},
           {1, "axis", Json::array({1, 2}), "axis is [1,2]; distrain normalises one axis"},
           {2, "axis", Json::array({1}), "(LayerNormalization): axis 1 is not supported"},
           {4, "axis", 1, "(BatchNormalization): axis 1 is not supported"},
           {1, "gamma_regularizer", Json::object({{"class_name", "L2"}}),
            "gamma_regularizer is set"},
       }) {
    Json bad = json;
    bad["config"]["layers"][index]["config"][key] = value;
    auto refused = ImportKerasModelJson(bad.dump());
    ASSERT_FALSE(refused.ok()) << key;
    EXPECT_THAT(refused.status().message(), HasSubstr(message));
  }
}

// Keras' Embedding as Keras 3.15 writes it, both ways; what distrain cannot
// honour (masks, Keras 2's input_length, regularizers) is refused by name.
TEST(KerasImportTest, EmbeddingImportsExportsAndRefusesMasks) {
  const Json json = Json::parse(R"({
    "module": "keras", "class_name": "Sequential", "registered_name": null,
    "config": {"name": "sequential", "trainable": true, "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 5], "sparse": false, "ragged": false, "name": "input_layer", "optional": false}},
      {"module": "keras.layers", "class_name": "Embedding", "config": {"name": "embedding", "trainable": true, "input_dim": 20, "output_dim": 4, "embeddings_initializer": {"module": "keras.initializers", "class_name": "RandomUniform", "config": {"seed": null, "minval": -0.05, "maxval": 0.05}, "registered_name": null}, "embeddings_regularizer": null, "activity_regularizer": null, "embeddings_constraint": null, "mask_zero": false, "quantization_config": null}},
      {"class_name": "GlobalAveragePooling1D", "config": {"name": "global_average_pooling1d", "data_format": "channels_last", "keepdims": false}},
      {"class_name": "Dense", "config": {"name": "dense", "units": 2, "activation": "linear", "use_bias": true}}
    ]}})");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_TRUE(imported->warnings.empty()) << absl::StrJoin(imported->warnings, "\n");
  const std::vector<LayerConfig>& layers = imported->model.layers;
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[1].kind, LayerKind::kEmbedding);
  EXPECT_EQ(layers[1].input_dim, 20);
  EXPECT_EQ(layers[1].output_dim, 4);
  EXPECT_EQ(imported->num_parameters, 20 * 4 + 4 * 2 + 2);

  KerasModelSpec spec;
  spec.model = imported->model;
  spec.example_shape = {5};
  spec.num_classes = 2;
  auto written = KerasConfigJson(spec);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, HasSubstr("\"mask_zero\":false"));
  auto again = ImportKerasModelJson(*written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model.layers, layers) << *written;
  EXPECT_TRUE(again->warnings.empty()) << absl::StrJoin(again->warnings, "\n");

  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("- Embedding: {inputDim: 20, outputDim: 4}"));
  Json string_initializer = json;  // Keras 2 writes the initialiser as "uniform"
  string_initializer["config"]["layers"][1]["config"]["embeddings_initializer"] = "uniform";
  auto from_string = ImportKerasModelJson(string_initializer.dump());
  ASSERT_TRUE(from_string.ok()) << from_string.status();
  EXPECT_TRUE(from_string->warnings.empty()) << absl::StrJoin(from_string->warnings, "\n");

  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, Json, std::string>>{
           {"mask_zero", true, "Embedding 'embedding': mask_zero is true; distrain has no masks"},
           {"input_length", 5, "input_length is set (a Keras 2 argument)"},
           {"embeddings_regularizer", Json::object({{"class_name", "L2"}}),
            "embeddings_regularizer is set"},
       }) {
    Json bad = json;
    bad["config"]["layers"][1]["config"][key] = value;
    auto refused = ImportKerasModelJson(bad.dump());
    ASSERT_FALSE(refused.ok()) << key;
    EXPECT_THAT(refused.status().message(), HasSubstr(message));
  }
}

// Keras' schedules come over as spec.training.optimizer.schedule, with only
// the fields their type reads in the YAML block; others are refused by name.
TEST(KerasImportTest, LearningRateSchedulesImportAsTheScheduleBlock) {
  Json json = GuideCnnJson();
  json["compile_config"] = {{"optimizer", Json::parse(R"({"class_name": "Adam", "config": {
      "learning_rate": {"module": "keras.optimizers.schedules", "class_name": "CosineDecay",
                        "config": {"initial_learning_rate": 0.0001, "decay_steps": 1000,
                                   "alpha": 0.05, "name": "CosineDecay",
                                   "warmup_target": 0.001, "warmup_steps": 100},
                        "registered_name": null}}})")}};
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const OptimizerConfig& o = *imported->optimizer;
  EXPECT_FLOAT_EQ(o.learning_rate, 1e-4f);
  EXPECT_EQ(o.schedule.type, LearningRateScheduleType::kCosineDecay);
  EXPECT_EQ(o.schedule.decay_steps, 1000);
  EXPECT_FLOAT_EQ(o.schedule.alpha, 0.05f);
  EXPECT_EQ(o.schedule.warmup_steps, 100);
  EXPECT_EQ(o.schedule.warmup_target, std::optional<float>(1e-3f));
  EXPECT_TRUE(imported->warnings.empty());
  const std::string block = KerasImportYaml(*imported, "config.json");
  EXPECT_THAT(block, AllOf(HasSubstr("schedule: {type: CosineDecay, decaySteps: 1000"),
                           HasSubstr("warmupTarget: 0.001")));
  EXPECT_THAT(block, ::testing::Not(HasSubstr("boundaries")));

  json["compile_config"]["optimizer"]["config"]["learning_rate"] = {
      {"class_name", "CosineDecayRestarts"}, {"config", {{"initial_learning_rate", 0.1}}}};
  auto refused = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the schedule 'CosineDecayRestarts' is not supported"));
}

// distrain's own compile_config of every optimizer type reads back as the
// same spec.training.optimizer.
TEST(KerasImportTest, EveryOptimizerTypeRoundTripsThroughCompileConfig) {
  auto imported = ImportKerasModelJson(GuideCnnJson().dump());
  ASSERT_TRUE(imported.ok());
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdamW, OptimizerType::kRmsprop}) {
    SCOPED_TRACE(static_cast<int>(type));
    KerasModelSpec spec;
    spec.model = imported->model;
    spec.example_shape = {28, 28, 1};
    spec.num_classes = 10;
    spec.optimizer.type = type;
    spec.optimizer.learning_rate = 0.005f;
    spec.optimizer.centered = type == OptimizerType::kRmsprop;
    if (type != OptimizerType::kAdamW) spec.optimizer.weight_decay = 0.02f;
    // And a schedule of each kind along the way.
    LearningRateScheduleConfig& schedule = spec.optimizer.schedule;
    schedule.type = static_cast<LearningRateScheduleType>(static_cast<int>(type) + 1);
    schedule.decay_steps = 500;
    schedule.decay_rate = 0.9f;
    schedule.warmup_steps = 10;
    schedule.warmup_target = 0.01f;
    if (schedule.type == LearningRateScheduleType::kPiecewiseConstantDecay) {
      schedule.boundaries = {100, 200};
      schedule.values = {0.005f, 0.001f, 0.0001f};
    }
    auto written = KerasConfigJson(spec);
    ASSERT_TRUE(written.ok()) << written.status();
    auto back = ImportKerasModelJson(*written);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(back->optimizer.has_value());
    OptimizerConfig want = spec.optimizer;
    OptimizerConfig got = *back->optimizer;
    // Fields the type does not read are not in Keras' config.
    if (type != OptimizerType::kMomentum) {
      got.momentum = want.momentum;
      got.nesterov = want.nesterov;
    }
    // Nor are the fields the schedule's type does not read.
    const LearningRateScheduleConfig& w = want.schedule;
    LearningRateScheduleConfig& g = got.schedule;
    using T = LearningRateScheduleType;
    if (w.type != T::kExponentialDecay && w.type != T::kInverseTimeDecay) g.decay_rate = w.decay_rate;
    if (w.type != T::kCosineDecay) {
      g.warmup_steps = w.warmup_steps;
      g.warmup_target = w.warmup_target;
    }
    if (w.type == T::kPiecewiseConstantDecay) g.decay_steps = w.decay_steps;
    EXPECT_EQ(got, want) << *written;
  }
}

TEST(KerasImportTest, UnsupportedLayerIsNamedWithTheSupportedList) {
  Json json = GuideCnnJson();
  json["config"]["layers"].push_back(
      {{"class_name", "LSTM"}, {"config", {{"name", "lstm"}, {"units", 8}}}});
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(),
              AllOf(HasSubstr("layers[5] LSTM 'lstm'"), HasSubstr("Conv2D"),
                    HasSubstr("BatchNormalization"), HasSubstr("InputLayer")));
}

TEST(KerasImportTest, ArgumentsThatChangeTheModelAreErrorsInitialisersAreNotes) {
  Json json = GuideCnnJson();
  auto& conv = json["config"]["layers"][1]["config"];
  conv["dilation_rate"] = {2, 2};
  conv["kernel_regularizer"] = {{"class_name", "L2"}, {"config", {{"l2", 0.01}}}};
  conv["kernel_initializer"] = {{"class_name", "HeNormal"}, {"config", {{"seed", nullptr}}}};
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(),
              AllOf(HasSubstr("layers[1] Conv2D 'conv2d': dilation_rate"),
                    HasSubstr("kernel_regularizer")));

  conv.erase("dilation_rate");
  conv["kernel_regularizer"] = nullptr;
  imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_EQ(imported->warnings.size(), 1u);
  EXPECT_THAT(imported->warnings[0], AllOf(HasSubstr("HeNormal"), HasSubstr("GlorotUniform")));
}

// The guide CNN as Keras 3.15 writes it with the Functional API (inputs =
// keras.Input(...); x = layer(x); ...; keras.Model(inputs, outputs)).
Json FunctionalGuideCnnJson() {
  Json json = GuideCnnJson();
  json["class_name"] = "Functional";
  Json& config = json["config"];
  config["name"] = "functional";
  config["input_layers"] = Json::array({"input_layer", 0, 0});
  config["output_layers"] = Json::array({"dense", 0, 0});
  Json& layers = config["layers"];
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]["name"] = layers[i]["config"]["name"];
    layers[i]["inbound_nodes"] = Json::array();
    if (i == 0) continue;
    layers[i]["inbound_nodes"].push_back(
        {{"args", Json::array({{{"class_name", "__keras_tensor__"},
                                {"config", {{"shape", Json::array({nullptr, 1})},
                                            {"dtype", "float32"},
                                            {"keras_history", Json::array({layers[i - 1]["name"], 0,
                                                                           0})}}}}})},
         {"kwargs", Json::object()}});
  }
  return json;
}

// A Functional chain is the Sequential it equals; a graph that is not a
// chain is refused naming the layer that breaks it.
TEST(KerasImportTest, FunctionalChainsImportAsTheSequentialTheyEqual) {
  auto sequential = ImportKerasModelJson(GuideCnnJson().dump());
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  const Json functional = FunctionalGuideCnnJson();
  auto imported = ImportKerasModelJson(functional.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->model.layers, sequential->model.layers);
  EXPECT_EQ(imported->num_parameters, sequential->num_parameters);
  EXPECT_EQ(imported->input_shape, sequential->input_shape);
  // Keras records unset call arguments as null ({"mask": null}): no effect.
  Json with_null = functional;
  with_null["config"]["layers"][2]["inbound_nodes"][0]["kwargs"] = {{"mask", nullptr}};
  EXPECT_TRUE(ImportKerasModelJson(with_null.dump()).ok());
  // Several outputs as Keras lists them: one is fine.
  Json listed = functional;
  listed["config"]["output_layers"] = Json::array({Json::array({"dense", 0, 0})});
  EXPECT_TRUE(ImportKerasModelJson(listed.dump()).ok());

  struct Bad {
    std::function<void(Json&)> edit;
    std::string message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {[](Json& j) {  // a skip connection: the Dense reads the pooling's output
              j["config"]["layers"][4]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] =
                  "max_pooling2d";
            },
            "layers[4] Dense 'dense' takes the output of 'max_pooling2d', not of the layer listed "
            "before it, 'flatten'"},
           {[](Json& j) {  // a merge: two inputs
              Json& args = j["config"]["layers"][3]["inbound_nodes"][0]["args"];
              args.push_back(args[0]);
            },
            "layers[3] Flatten 'flatten' takes 2 inputs"},
           {[](Json& j) {  // a shared layer: called twice
              Json& nodes = j["config"]["layers"][2]["inbound_nodes"];
              nodes.push_back(nodes[0]);
            },
            "layers[2] MaxPooling2D 'max_pooling2d' is called 2 times"},
           {[](Json& j) { j["config"]["output_layers"] = Json::array({"flatten", 0, 0}); },
            "the Functional model's one output is not its last layer 'dense'"},
           {[](Json& j) {
              j["config"]["layers"][1]["inbound_nodes"][0]["kwargs"] = {{"mask", nullptr},
                                                                         {"training", true}};
            },
            "layers[1] Conv2D 'conv2d' is called with the keyword argument training=true"},
       }) {
    Json j = functional;
    bad.edit(j);
    auto refused = ImportKerasModelJson(j.dump());
    ASSERT_FALSE(refused.ok()) << bad.message;
    EXPECT_THAT(refused.status().message(),
                AllOf(HasSubstr(bad.message), HasSubstr("form one chain")));
  }
}

TEST(KerasImportTest, FunctionalModelsAndGarbageAreRefusedClearly) {
  auto functional = ImportKerasModelJson(R"({"class_name": "Functional", "config": {}})");
  ASSERT_FALSE(functional.ok());
  EXPECT_THAT(functional.status().message(), AllOf(HasSubstr("Functional"), HasSubstr("layers")));
  auto subclassed = ImportKerasModelJson(R"({"class_name": "MyModel", "config": {}})");
  ASSERT_FALSE(subclassed.ok());
  EXPECT_THAT(subclassed.status().message(),
              AllOf(HasSubstr("MyModel"), HasSubstr("Sequential")));
  auto garbage = ImportKerasModelJson("not json");
  ASSERT_FALSE(garbage.ok());
  EXPECT_THAT(garbage.status().message(), HasSubstr("to_json"));
  auto channels_first = GuideCnnJson();
  channels_first["config"]["layers"][1]["config"]["data_format"] = "channels_first";
  auto cf = ImportKerasModelJson(channels_first.dump());
  ASSERT_FALSE(cf.ok());
  EXPECT_THAT(cf.status().message(), HasSubstr("channels_last"));
}

TEST(KerasImportTest, CompileConfigBringsLossAndOptimizer) {
  Json json = GuideCnnJson();
  json["compile_config"] = Json::parse(R"({
    "optimizer": {"module": "keras.optimizers", "class_name": "Adam",
                  "config": {"name": "adam", "learning_rate": 0.0005, "beta_1": 0.8,
                             "beta_2": 0.99, "epsilon": 1e-07, "amsgrad": false}},
    "loss": {"module": "keras.losses", "class_name": "SparseCategoricalCrossentropy",
             "config": {"from_logits": true}},
    "metrics": ["accuracy"]})");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_TRUE(imported->optimizer.has_value());
  EXPECT_EQ(imported->optimizer->type, OptimizerType::kAdam);
  EXPECT_FLOAT_EQ(imported->optimizer->learning_rate, 0.0005f);
  EXPECT_FLOAT_EQ(imported->optimizer->beta1, 0.8f);
  EXPECT_TRUE(imported->has_loss);
  EXPECT_EQ(imported->model.loss.from_logits, std::optional<bool>(true));
  const std::string block = KerasImportYaml(*imported, "config.json");
  EXPECT_THAT(block, AllOf(HasSubstr("optimizer: {"), HasSubstr("learningRate: 0.0005"),
                           HasSubstr("fromLogits: true")));
  EXPECT_THAT(block, ::testing::Not(HasSubstr("momentum")));
}

// Reads a stored zip's entries back (local headers, checking each CRC-32),
// as a zip reader would.
std::map<std::string, std::string> ReadStoredZip(const std::string& zip) {
  std::map<std::string, std::string> entries;
  auto le = [&](size_t at, int bytes) {
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(zip[at + i]);
    return v;
  };
  size_t at = 0;
  while (at + 30 <= zip.size() && le(at, 4) == 0x04034b50) {
    EXPECT_EQ(le(at + 8, 2), 0u) << "stored";
    const uint32_t crc = le(at + 14, 4);
    const uint32_t size = le(at + 18, 4);
    const uint32_t name_len = le(at + 26, 2);
    const std::string name = zip.substr(at + 30, name_len);
    const std::string data = zip.substr(at + 30 + name_len, size);
    EXPECT_EQ(crc32(0, reinterpret_cast<const Bytef*>(data.data()), data.size()), crc) << name;
    entries[name] = data;
    at += 30 + name_len + size;
  }
  // The end-of-central-directory record counts them.
  const size_t eocd = zip.size() - 22;
  EXPECT_EQ(le(eocd, 4), 0x06054b50u);
  EXPECT_EQ(le(eocd + 10, 2), entries.size());
  return entries;
}

class KerasExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/keras_export_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A small BN model and its state after one Adam step.
  static KerasModelSpec Spec() {
    KerasModelSpec spec;
    spec.model.type = "sequential";
    LayerConfig conv;
    conv.kind = LayerKind::kConv2D;
    conv.filters = 4;
    conv.kernel_size = {3, 3};
    LayerConfig bn;
    bn.kind = LayerKind::kBatchNormalization;
    LayerConfig flatten;
    flatten.kind = LayerKind::kFlatten;
    LayerConfig dense;
    dense.kind = LayerKind::kDense;
    dense.units = 3;
    dense.activation = ActivationKind::kSoftmax;
    spec.model.layers = {conv, bn, flatten, dense};
    spec.example_shape = {6, 6, 1};
    spec.num_classes = 3;
    return spec;
  }
  static CheckpointState TrainedState(const KerasModelSpec& spec) {
    auto model = Model::Create(spec.model, spec.example_shape, spec.num_classes, 1);
    EXPECT_TRUE(model.ok());
    auto optimizer = Optimizer::Create(spec.optimizer);
    Tensor x({2, 36}, 0.5f);
    std::vector<int32_t> labels = {0, 2};
    (*model)->TrainStep(x, labels);
    (*optimizer)->Apply((*model)->parameters());
    return CaptureVariableState(**model, **optimizer, 1);
  }
  std::string dir_;
};

TEST_F(KerasExportTest, ArchiveHoldsKerasLayoutWeightsAndAdamSlots) {
  const KerasModelSpec spec = Spec();
  const CheckpointState state = TrainedState(spec);
  const std::string path = dir_ + "/m.keras";
  ASSERT_TRUE(ExportKerasModel(spec, state, path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string zip((std::istreambuf_iterator<char>(in)), {});
  auto entries = ReadStoredZip(zip);
  ASSERT_EQ(entries.size(), 3u);
  const Json config = Json::parse(entries["config.json"]);
  EXPECT_EQ(config["class_name"], "Sequential");
  EXPECT_EQ(config["config"]["layers"][0]["class_name"], "InputLayer");
  EXPECT_EQ(config["config"]["layers"][4]["config"]["activation"], "softmax");
  EXPECT_EQ(config["compile_config"]["optimizer"]["class_name"], "Adam");
  EXPECT_EQ(Json::parse(entries["metadata.json"])["keras_version"], kKerasFormatVersion);

  // The weights file, opened by HDF5 from the archive's bytes.
  const std::string h5_path = dir_ + "/w.h5";
  std::ofstream(h5_path, std::ios::binary) << entries["model.weights.h5"];
  const hid_t file = H5Fopen(h5_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  auto read = [&](const std::string& name) {
    const hid_t set = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(set, 0) << name;
    const hid_t space = H5Dget_space(set);
    std::vector<float> values(H5Sget_simple_extent_npoints(space));
    H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Sclose(space);
    H5Dclose(set);
    return values;
  };
  auto expect_equal = [&](const std::string& h5_name, const std::string& checkpoint_name) {
    const Tensor& t = state.tensors.at(checkpoint_name);
    EXPECT_EQ(read(h5_name), std::vector<float>(t.data(), t.data() + t.size())) << h5_name;
  };
  expect_equal("/layers/conv2d/vars/0", "variables/conv2d/kernel");
  // gamma, beta, moving_mean, moving_variance: Keras' order.
  expect_equal("/layers/batch_normalization/vars/1", "variables/batch_normalization/beta");
  expect_equal("/layers/batch_normalization/vars/3", "variables/batch_normalization/moving_variance");
  expect_equal("/layers/dense/vars/1", "variables/dense/bias");
  // iterations, learning rate, then (momentum, velocity) per trainable variable.
  expect_equal("/optimizer/vars/2", "optimizer/conv2d/kernel/m");
  expect_equal("/optimizer/vars/3", "optimizer/conv2d/kernel/v");
  expect_equal("/optimizer/vars/8", "optimizer/batch_normalization/beta/m");
  expect_equal("/optimizer/vars/11", "optimizer/dense/kernel/v");
  EXPECT_GT(H5Lexists(file, "/optimizer/vars/13", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Lexists(file, "/optimizer/vars/14", H5P_DEFAULT), 0) << "2 + 2 x 6 variables";
  H5Fclose(file);
}

TEST_F(KerasExportTest, CheckpointOfAnotherModelNamesTheMissingVariable) {
  const KerasModelSpec spec = Spec();
  CheckpointState state = TrainedState(spec);
  state.tensors.erase("variables/dense/kernel");
  auto s = ExportKerasModel(spec, state, dir_ + "/m.keras");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("dense/kernel"), HasSubstr("another model")));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/m.keras")) << "no half-written model";
  auto bad_name = ExportKerasModel(spec, TrainedState(spec), dir_ + "/m.h5");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_THAT(bad_name.message(), HasSubstr(".keras"));
}

TEST_F(KerasExportTest, CheckpointMetadataIsEnoughToExport) {
  CheckpointState state;
  auto missing = KerasModelSpecFromCheckpoint(state);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--job"));
}

// A one-entry zip whose entry is deflated, as `zip` or Python's zipfile with
// ZIP_DEFLATED write it (Keras itself stores).
std::string DeflatedZip(const std::string& name, const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string packed(deflateBound(&zs, data.size()) + 16, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = data.size();
  zs.next_out = reinterpret_cast<Bytef*>(packed.data());
  zs.avail_out = packed.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  packed.resize(zs.total_out);
  deflateEnd(&zs);
  auto put = [](std::string* out, uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(data.data()), data.size());
  std::string zip, central;
  for (std::string* out : {&zip, &central}) {
    const bool local = out == &zip;
    put(out, local ? 0x04034b50 : 0x02014b50, 4);
    if (!local) put(out, 20, 2);
    put(out, 20, 2);
    put(out, 0, 2);
    put(out, 8, 2);  // deflated
    put(out, 0, 4);  // time, date
    put(out, crc, 4);
    put(out, packed.size(), 4);
    put(out, data.size(), 4);
    put(out, name.size(), 2);
    put(out, 0, 2);
    if (!local) {
      put(out, 0, 2 + 2 + 2);
      put(out, 0, 4);
      put(out, 0, 4);  // the local header's offset
    }
    *out += name;
    if (local) *out += packed;
  }
  const uint32_t central_at = zip.size();
  zip += central;
  put(&zip, 0x06054b50, 4);
  put(&zip, 0, 4);
  put(&zip, 1, 2);
  put(&zip, 1, 2);
  put(&zip, central.size(), 4);
  put(&zip, central_at, 4);
  put(&zip, 0, 2);
  return zip;
}

TEST(KerasArchiveTest, ZipReaderReadsStoredAndDeflatedAndRejectsDamage) {
  const std::string big(100000, 'k');
  auto stored = StoredZip({{"config.json", "{}"}, {"model.weights.h5", big}});
  ASSERT_TRUE(stored.ok());
  auto entries = ReadZip(*stored, "m.keras");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ((*entries)["config.json"], "{}");
  EXPECT_EQ((*entries)["model.weights.h5"], big);

  auto deflated = ReadZip(DeflatedZip("config.json", big), "d.keras");
  ASSERT_TRUE(deflated.ok()) << deflated.status();
  EXPECT_EQ((*deflated)["config.json"], big);

  std::string flipped = *stored;
  flipped[100] ^= 0x20;  // inside config.json's or the weights' bytes
  auto bad_crc = ReadZip(flipped, "m.keras");
  ASSERT_FALSE(bad_crc.ok());
  EXPECT_THAT(bad_crc.status().message(), AllOf(HasSubstr("m.keras"), HasSubstr("CRC")));
  for (size_t cut : {size_t{0}, size_t{10}, stored->size() / 2, stored->size() - 1}) {
    auto truncated = ReadZip(stored->substr(0, cut), "m.keras");
    ASSERT_FALSE(truncated.ok()) << cut;
    EXPECT_THAT(truncated.status().message(), HasSubstr("not a readable zip"));
  }
}

// ---------------------------------------------------------------------------
// spec.training.precision <-> each layer's Keras dtype policy.

Json Keras3Policy(const std::string& name) {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", name}}},
          {"registered_name", nullptr}};
}

// The guide's CNN with every layer but the InputLayer under `policy`.
Json GuideCnnWithPolicy(const Json& policy) {
  Json json = GuideCnnJson();
  for (size_t i = 1; i < json["config"]["layers"].size(); ++i) {
    json["config"]["layers"][i]["config"]["dtype"] = policy;
  }
  return json;
}

TEST_F(KerasExportTest, MixedModelWritesItsPolicyOnEveryLayerButTheInput) {
  KerasModelSpec spec = Spec();
  spec.model.precision = Precision::kMixedBfloat16;
  auto config = KerasConfigJson(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  const Json json = Json::parse(*config);
  const Json& layers = json["config"]["layers"];
  ASSERT_EQ(layers.size(), 5u);
  EXPECT_EQ(layers[0]["class_name"], "InputLayer");
  EXPECT_EQ(layers[0]["config"]["dtype"], "float32") << "the input tensor's type, as in Keras";
  for (size_t i = 1; i < layers.size(); ++i) {
    EXPECT_EQ(layers[i]["config"]["dtype"], Keras3Policy("mixed_bfloat16")) << layers[i].dump();
  }
  EXPECT_EQ(json["config"]["dtype"], Keras3Policy("mixed_bfloat16"));

  // float32 stays as before.
  auto plain = KerasConfigJson(Spec());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Json::parse(*plain)["config"]["layers"][1]["config"]["dtype"], Keras3Policy("float32"));

  // The exported file imports back under the same policy.
  const std::string path = dir_ + "/mixed.keras";
  ASSERT_TRUE(ExportKerasModel(spec, TrainedState(spec), path).ok());
  auto file = ImportKerasFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->imported.model.precision, Precision::kMixedBfloat16);
  EXPECT_THAT(KerasImportYaml(file->imported, path), HasSubstr("\nprecision: mixed_bfloat16"));

  // `distrain export CHECKPOINT_DIR` reads the policy from the recorded job.
  JobConfig job;
  job.training.model = spec.model;
  CheckpointState state;
  state.metadata[kCheckpointJobConfigKey] = JobConfigToJson(job);
  state.metadata[kCheckpointExampleShapeKey] = "6,6,1";
  state.metadata[kCheckpointNumClassesKey] = "3";
  auto recorded = KerasModelSpecFromCheckpoint(state);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->model.precision, Precision::kMixedBfloat16);
}

TEST(KerasImportTest, EveryKerasSpellingOfAPolicyIsRead) {
  struct Case {
    Json policy;
    Precision want;
  };
  const Case cases[] = {
      {Keras3Policy("mixed_bfloat16"), Precision::kMixedBfloat16},
      {Keras3Policy("mixed_float16"), Precision::kMixedFloat16},
      {Keras3Policy("float32"), Precision::kFloat32},
      // Keras 2: a bare name for float policies, a Policy object for mixed ones.
      {"float32", Precision::kFloat32},
      {"mixed_bfloat16", Precision::kMixedBfloat16},
      {{{"class_name", "Policy"}, {"config", {{"name", "mixed_float16"}}}},
       Precision::kMixedFloat16},
      // Early Keras 3 releases.
      {{{"class_name", "FloatDTypePolicy"}, {"config", {{"name", "mixed_bfloat16"}}}},
       Precision::kMixedBfloat16},
  };
  for (const Case& c : cases) {
    auto imported = ImportKerasModelJson(GuideCnnWithPolicy(c.policy).dump());
    ASSERT_TRUE(imported.ok()) << c.policy.dump() << ": " << imported.status();
    EXPECT_EQ(imported->model.precision, c.want) << c.policy.dump();
  }
}

TEST(KerasImportTest, MixedPolicyBecomesPrecisionInTheBlockAndParsesBack) {
  auto imported = ImportKerasModelJson(GuideCnnWithPolicy(Keras3Policy("mixed_bfloat16")).dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::string block = KerasImportYaml(*imported, "model.json");
  EXPECT_THAT(block, HasSubstr("\nprecision: mixed_bfloat16"));
  auto parsed = ParsePastedBlock(block);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << block;
  EXPECT_EQ(parsed->training.model.precision, Precision::kMixedBfloat16);
  EXPECT_EQ(parsed->training.model.layers, imported->model.layers);
  // A float32 model's block says nothing about precision.
  auto plain = ImportKerasModelJson(GuideCnnJson().dump());
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(KerasImportYaml(*plain, "model.json"), ::testing::Not(HasSubstr("precision")));
}

// Keras' mixed-precision guide ends the model with
// Activation("softmax", dtype="float32"): accepted, under the mixed policy.
TEST(KerasImportTest, GuideFloat32OutputActivationIsAcceptedUnderTheMixedPolicy) {
  Json json = GuideCnnWithPolicy(Keras3Policy("mixed_float16"));
  json["config"]["layers"][4]["config"]["activation"] = "linear";
  json["config"]["layers"].push_back(
      {{"class_name", "Activation"},
       {"config",
        {{"name", "predictions"}, {"activation", "softmax"}, {"dtype", Keras3Policy("float32")}}}});
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->model.precision, Precision::kMixedFloat16);
  EXPECT_EQ(imported->model.layers.back().kind, LayerKind::kActivation);
}

TEST(KerasImportTest, DisagreeingMiddleLayerIsRefusedNamingTheField) {
  Json json = GuideCnnWithPolicy(Keras3Policy("mixed_bfloat16"));
  json["config"]["layers"][3]["config"]["dtype"] = Keras3Policy("float32");
  auto imported = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(),
              AllOf(HasSubstr("layers[3].dtype (Flatten 'flatten') is float32"),
                    HasSubstr("layers[1].dtype"), HasSubstr("mixed_bfloat16"),
                    HasSubstr("spec.training.precision"),
                    HasSubstr("dtype=\"mixed_bfloat16\"")));
  // Two mixed policies disagree too.
  json["config"]["layers"][3]["config"]["dtype"] = Keras3Policy("mixed_float16");
  imported = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("layers[3].dtype"));
  // A float32 Dense at the end is not an output Activation.
  json = GuideCnnWithPolicy(Keras3Policy("mixed_bfloat16"));
  json["config"]["layers"][4]["config"]["dtype"] = "float32";
  imported = ImportKerasModelJson(json.dump());
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("layers[4].dtype (Dense 'dense')"));
}

TEST(KerasImportTest, PlainSixteenBitAndUnknownPoliciesAreRefused) {
  for (const char* name : {"bfloat16", "float16"}) {
    auto imported = ImportKerasModelJson(GuideCnnWithPolicy(Keras3Policy(name)).dump());
    ASSERT_FALSE(imported.ok()) << name;
    EXPECT_THAT(imported.status().message(),
                AllOf(HasSubstr(absl::StrCat("layers[1].dtype (Conv2D 'conv2d') is ", name)),
                      HasSubstr("float32 variables"),
                      HasSubstr(absl::StrCat("dtype=\"mixed_", name, "\""))));
  }
  auto int8 = ImportKerasModelJson(GuideCnnWithPolicy("int8").dump());
  ASSERT_FALSE(int8.ok());
  EXPECT_THAT(int8.status().message(),
              AllOf(HasSubstr("layers[1].dtype (Conv2D 'conv2d') is int8"),
                    HasSubstr("float32, mixed_bfloat16 or mixed_float16")));
  auto quantized = ImportKerasModelJson(
      GuideCnnWithPolicy({{"class_name", "QuantizedDTypePolicy"},
                          {"config", {{"mode", "int8"}, {"source_name", "float32"}}}})
          .dump());
  ASSERT_FALSE(quantized.ok());
  EXPECT_THAT(quantized.status().message(), HasSubstr("quantized"));
}

// Found by tests/fuzz/keras_json_fuzz (corpus regression-null-layer-name): a
// field of another JSON type than expected threw nlohmann's type_error out of
// the importer, which aborted `distrain import-keras`.
TEST(KerasImportTest, AFieldOfTheWrongJsonTypeIsAnErrorNotACrash) {
  for (const char* json : {
           R"({"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense", "config": {"name": null, "units": 3}}]}})",
           R"({"class_name": "Sequential", "config": {"layers": [{"class_name": 7}]}})",
           R"({"class_name": ["Sequential"], "config": {"layers": []}})"}) {
    absl::StatusOr<KerasImport> imported = ImportKerasModelJson(json);
    EXPECT_FALSE(imported.ok()) << json;
  }
}

}  // namespace
}  // namespace distrain

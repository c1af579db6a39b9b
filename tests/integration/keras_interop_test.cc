// Keras interop, with TensorFlow itself on the other side:
//   * a job's exported .keras file opens with keras.saving.load_model, and
//     model.predict equals distrain's predictions on the same real MNIST
//     digits (<= 1e-5), for the guide's CNN and for a model with Dropout and
//     BatchNormalization trained by two MultiWorkerMirrored processes;
//   * so does a model of Keras' other activations and activation layers,
//     with Rescaling and a Softmax layer;
//   * a mixed_bfloat16 model loads under Keras' mixed_bfloat16 policy;
//   * Keras' own model.to_json() -> `distrain import-keras` -> train ->
//     export -> load in Keras closes the loop with the same architecture and
//     parameter count.

#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/integration/mnist_data.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"
#include "tests/integration/tensorflow_peer.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/model/keras_format.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/strategy/variable_state.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FreshTempDir;
using testing::MnistDir;
using testing::SourceDir;
using testing::Subprocess;
using testing::WriteTextFile;

constexpr int kPredictExamples = 64;

// pixel_scale: spec.training.dataset.scale (Keras-style 1/255 unless given).
std::string JobYaml(const std::string& strategy, const std::string& replica_specs,
                    const std::string& model_block, const std::string& export_path,
                    float pixel_scale = 1.0f / 255) {
  const std::string& d = MnistDir();
  return absl::StrCat("apiVersion: distrain.io/v1alpha1\n", "kind: DistributedTrainingJob\n",
                      "metadata: {name: keras-interop}\n", "spec:\n", "  strategy: ", strategy,
                      "\n", "  replicaSpecs:\n", replica_specs, "  training:\n", model_block,
                      "    dataset:\n", "      type: idx\n", "      trainFiles: [", d,
                      "/train-images-idx3-ubyte]\n", "      trainLabelFiles: [", d,
                      "/train-labels-idx1-ubyte]\n", "      numClasses: 10\n",
                      pixel_scale == 1.0f / 255 ? ""
                                                : absl::StrCat("      scale: ", pixel_scale, "\n"),
                      "    optimizer: {type: adam, learningRate: 0.001}\n",
                      "    globalBatchSize: 64\n", "    steps: 30\n", "    logEverySteps: 10\n",
                      "    export: {path: ", export_path, "}\n");
}

std::string RunJob(const std::string& job, const std::string& dir) {
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--work-dir", dir + "/work",
                  "--checkpoint-dir", dir + "/ckpt"});
  auto rc = run.Wait(600);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << run.output();
  return run.output();
}

// The first kPredictExamples test digits, as float32 [n, 28, 28, 1] in
// `path`, and distrain's predictions for them from the newest checkpoint in
// `checkpoint_dir` (built from what the checkpoint records, as export does)
// in `predictions_path`. Returns the model's parameter count (Keras'
// count_params: every model variable), -1 on failure.
int64_t PredictWithDistrain(const std::string& checkpoint_dir, const std::string& inputs_path,
                            const std::string& predictions_path, float pixel_scale = 1.0f / 255) {
  auto data = LoadIdxDataset(MnistDir() + "/t10k-images-idx3-ubyte",
                             MnistDir() + "/t10k-labels-idx1-ubyte", pixel_scale);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return -1;
  const int features = (*data)->num_features();
  Tensor batch({kPredictExamples, features});
  for (int i = 0; i < kPredictExamples; ++i) {
    int32_t label;
    (*data)->Get(i, batch.data() + static_cast<int64_t>(i) * features, &label);
  }
  CheckpointManager checkpoints(checkpoint_dir, 100);
  auto state = checkpoints.RestoreLatest();
  EXPECT_TRUE(state.ok() && state->has_value()) << checkpoint_dir;
  if (!state.ok() || !state->has_value()) return -1;
  auto spec = KerasModelSpecFromCheckpoint(**state);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return -1;
  auto model = Model::Create(spec->model, spec->example_shape, spec->num_classes, 0);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return -1;
  auto optimizer = Optimizer::Create(spec->optimizer);
  EXPECT_TRUE(optimizer.ok());
  if (!optimizer.ok()) return -1;
  absl::Status restored = RestoreVariableState(**state, **model, **optimizer);
  EXPECT_TRUE(restored.ok()) << restored;
  if (!restored.ok()) return -1;
  const Tensor& predictions = (*model)->Predict(batch);
  std::ofstream(inputs_path, std::ios::binary)
      .write(reinterpret_cast<const char*>(batch.data()), batch.size() * sizeof(float));
  std::ofstream(predictions_path, std::ios::binary)
      .write(reinterpret_cast<const char*>(predictions.data()), predictions.size() * sizeof(float));
  return (*model)->num_parameters();
}

// Loads `keras_file` in Keras and compares its predictions with distrain's;
// returns what the script prints (JSON).
nlohmann::json CompareInKeras(const std::string& python, const std::string& dir,
                              const std::string& keras_file) {
  const std::string script = WriteTextFile(dir + "/compare.py", R"PY(
import json, sys
import numpy as np
import keras
model = keras.saving.load_model(sys.argv[1])
x = np.fromfile(sys.argv[2], dtype=np.float32).reshape((-1,) + tuple(model.input_shape[1:]))
ours = np.fromfile(sys.argv[3], dtype=np.float32).reshape((x.shape[0], -1))
theirs = model.predict(x, verbose=0).reshape((x.shape[0], -1))
print("RESULT " + json.dumps({
    "max_abs_diff": float(np.max(np.abs(ours - theirs))),
    "params": int(model.count_params()),
    "layers": [type(l).__name__ for l in model.layers],
    "output_shapes": [list(l.output.shape[1:]) for l in model.layers],
    "optimizer": type(model.optimizer).__name__,
    "iterations": int(model.optimizer.iterations.numpy()),
    "loss": type(model.loss).__name__,
}))
)PY");
  Subprocess py({python, script, keras_file, dir + "/x.f32", dir + "/p.f32"},
                {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  auto rc = py.Wait(300);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << py.output();
  const std::string out = py.output();
  const size_t at = out.rfind("RESULT ");
  if (at == std::string::npos) {
    ADD_FAILURE() << out;
    return nlohmann::json::object();
  }
  nlohmann::json result = nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
  std::cout << keras_file << ": max |keras - distrain| = " << result.value("max_abs_diff", -1.0)
            << "\n";
  return result;
}

// Trains `model_block` on MNIST as a `strategy` job that exports
// <dir>/model.keras (its optimizer replaced by `optimizer` when given), then
// returns CompareInKeras of that file with distrain's predictions from the
// job's last checkpoint, distrain's parameter count added as
// "distrain_params".
nlohmann::json TrainExportAndCompare(const std::string& python, const std::string& dir,
                                     const std::string& strategy,
                                     const std::string& replica_specs,
                                     const std::string& model_block,
                                     const std::string& optimizer = "",
                                     float pixel_scale = 1.0f / 255) {
  const std::string exported = dir + "/model.keras";
  std::string job = JobYaml(strategy, replica_specs, model_block, exported, pixel_scale);
  if (!optimizer.empty()) {
    const std::string adam = "optimizer: {type: adam, learningRate: 0.001}";
    job.replace(job.find(adam), adam.size(), "optimizer: " + optimizer);
  }
  RunJob(WriteTextFile(dir + "/job.yaml", job), dir);
  EXPECT_TRUE(std::filesystem::exists(exported)) << exported;
  const int64_t params =
      PredictWithDistrain(dir + "/ckpt", dir + "/x.f32", dir + "/p.f32", pixel_scale);
  nlohmann::json result = CompareInKeras(python, dir, exported);
  result["distrain_params"] = params;
  return result;
}

// What TrainExportAndCompare found, for a model whose every layer Keras
// must rebuild: its predictions within 1e-5 of distrain's, the same parameter
// count, and Keras' layer classes in order.
void ExpectKerasRebuildsTheModel(const nlohmann::json& r, const std::vector<std::string>& layers) {
  EXPECT_LE(r.value("max_abs_diff", 1.0), 1e-5) << r.dump();
  EXPECT_EQ(r.value("params", int64_t{0}), r.value("distrain_params", int64_t{-1})) << r.dump();
  EXPECT_EQ(r.value("layers", nlohmann::json::array()), nlohmann::json(layers)) << r.dump();
}

const char kGuideCnnModel[] =
    "    model:\n"
    "      layers:\n"
    "        - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}\n"
    "        - MaxPooling2D: {poolSize: [2, 2]}\n"
    "        - Conv2D: {filters: 64, kernelSize: [3, 3], activation: relu}\n"
    "        - Flatten: {}\n"
    "        - Dense: {units: 64, activation: relu}\n"
    "        - Dense: {units: 10, activation: softmax}\n"
    "      loss: {type: SparseCategoricalCrossentropy, fromLogits: true}\n";

TEST(KerasInteropTest, GuideCnnExportPredictsInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_guide_cnn");
  const std::string exported = dir + "/guide.keras";
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      JobYaml("OneDevice", "    Worker: {replicas: 1}\n", kGuideCnnModel, exported));
  const std::string out = RunJob(job, dir);
  EXPECT_NE(out.find("guide.keras"), std::string::npos) << out;
  ASSERT_TRUE(std::filesystem::exists(exported)) << out;
  // The command does the same from the checkpoint directory alone.
  const std::string from_cli = dir + "/from-cli.keras";
  Subprocess export_cmd({DistrainBinary(), "export", dir + "/ckpt", "-o", from_cli});
  auto rc = export_cmd.Wait(60);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << export_cmd.output();

  const int64_t params = PredictWithDistrain(dir + "/ckpt", dir + "/x.f32", dir + "/p.f32");
  for (const std::string& file : {exported, from_cli}) {
    nlohmann::json r = CompareInKeras(python, dir, file);
    EXPECT_LE(r.value("max_abs_diff", 1.0), 1e-5) << r.dump();
    EXPECT_EQ(r.value("params", int64_t{0}), params) << r.dump();
    EXPECT_EQ(r.value("optimizer", ""), "Adam");
    EXPECT_EQ(r.value("iterations", -1), 30) << "the optimizer's state travels with the model";
    EXPECT_EQ(r.value("loss", ""), "SparseCategoricalCrossentropy");
  }
  std::filesystem::remove_all(dir);
}

TEST(KerasInteropTest, BatchNormAndDropoutModelFromTwoWorkersPredictsInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_bn_dropout");
  nlohmann::json r = TrainExportAndCompare(
      python, dir, "MultiWorkerMirrored", "    Chief: {replicas: 1}\n    Worker: {replicas: 1}\n",
      "    model:\n"
      "      layers:\n"
      "        - Conv2D: {filters: 16, kernelSize: [3, 3], padding: same, useBias: false}\n"
      "        - BatchNormalization: {momentum: 0.9}\n"
      "        - Activation: {activation: relu}\n"
      "        - MaxPooling2D: {poolSize: [2, 2]}\n"
      "        - Dropout: {rate: 0.25}\n"
      "        - Conv2D: {filters: 32, kernelSize: [3, 3], strides: [2, 2]}\n"
      "        - BatchNormalization: {}\n"
      "        - Activation: {activation: gelu}\n"
      "        - GlobalAveragePooling2D: {}\n"
      "        - Dense: {units: 10, activation: softmax}\n");
  // Inference uses the moving statistics, which must have arrived too.
  ExpectKerasRebuildsTheModel(r, {"Conv2D", "BatchNormalization", "Activation", "MaxPooling2D",
                                  "Dropout", "Conv2D", "BatchNormalization", "Activation",
                                  "GlobalAveragePooling2D", "Dense"});
  std::filesystem::remove_all(dir);
}

// Keras' other activations, by name and as layers, with Rescaling in front
// and a Softmax layer at the end: the file Keras loads computes what distrain
// computed (each function's formula is Keras', tests/golden).
TEST(KerasInteropTest, ActivationLayersAndRescalingPredictInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_activations");
  nlohmann::json r = TrainExportAndCompare(python, dir, "OneDevice", "    Worker: {replicas: 1}\n",
                                           "    model:\n"
                                           "      layers:\n"
                                           "        - Rescaling: {scale: 2.0, offset: -1.0}\n"
                                           "        - Conv2D: {filters: 8, kernelSize: 3, "
                                           "activation: swish}\n"
                                           "        - MaxPooling2D: {}\n"
                                           "        - Conv2D: {filters: 8, kernelSize: 3}\n"
                                           "        - LeakyReLU: {}\n"
                                           "        - Flatten: {}\n"
                                           "        - Dense: {units: 32, activation: selu}\n"
                                           "        - ELU: {alpha: 0.5}\n"
                                           "        - Dense: {units: 32, activation: mish}\n"
                                           "        - ReLU: {maxValue: 6}\n"
                                           "        - Dense: {units: 10, activation: hard_silu}\n"
                                           "        - Softmax: {}\n");
  ExpectKerasRebuildsTheModel(r, {"Rescaling", "Conv2D", "MaxPooling2D", "Conv2D", "LeakyReLU",
                                  "Flatten", "Dense", "ELU", "Dense", "ReLU", "Dense", "Softmax"});
  std::filesystem::remove_all(dir);
}

// Keras' 1-D layers, over each digit's rows as a sequence of 28 steps of 28
// channels: what Keras loads computes what distrain computed.
TEST(KerasInteropTest, Conv1DSequenceModelPredictsInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_conv1d");
  nlohmann::json r = TrainExportAndCompare(
      python, dir, "OneDevice", "    Worker: {replicas: 1}\n",
      "    model:\n"
      "      layers:\n"
      "        - Reshape: {targetShape: [28, 28]}\n"
      "        - Conv1D: {filters: 16, kernelSize: 3, activation: relu}\n"
      "        - MaxPooling1D: {}\n"
      "        - Conv1D: {filters: 16, kernelSize: 3, strides: 2, padding: same}\n"
      "        - AveragePooling1D: {poolSize: 3, strides: 1, padding: same}\n"
      "        - GlobalAveragePooling1D: {}\n"
      "        - Dense: {units: 10}\n"
      "      loss: {fromLogits: true}\n");
  ExpectKerasRebuildsTheModel(r, {"Reshape", "Conv1D", "MaxPooling1D", "Conv1D",
                                  "AveragePooling1D", "GlobalAveragePooling1D", "Dense"});
  std::filesystem::remove_all(dir);
}

// LayerNormalization (each center/scale choice that changes the variables)
// and RMSNormalization, on images and on rows, trained by two workers in
// sync: Keras loads what distrain computed, with Keras' variable layout.
TEST(KerasInteropTest, LayerAndRmsNormalizationPredictInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_layer_norm");
  nlohmann::json r = TrainExportAndCompare(
      python, dir, "MultiWorkerMirrored", "    Worker: {replicas: 2}\n",
      "    model:\n"
      "      layers:\n"
      "        - Conv2D: {filters: 8, kernelSize: 3}\n"
      "        - LayerNormalization: {}\n"
      "        - Activation: {activation: relu}\n"
      "        - MaxPooling2D: {}\n"
      "        - Flatten: {}\n"
      "        - Dense: {units: 32}\n"
      "        - LayerNormalization: {center: false, epsilon: 0.00001}\n"
      "        - Activation: {activation: gelu}\n"
      "        - Dense: {units: 32}\n"
      "        - RMSNormalization: {}\n"
      "        - Dense: {units: 10}\n"
      "        - LayerNormalization: {scale: false}\n"
      "      loss: {fromLogits: true}\n");
  ExpectKerasRebuildsTheModel(
      r, {"Conv2D", "LayerNormalization", "Activation", "MaxPooling2D", "Flatten", "Dense",
          "LayerNormalization", "Activation", "Dense", "RMSNormalization", "Dense",
          "LayerNormalization"});
  std::filesystem::remove_all(dir);
}

// Embedding over each digit's raw pixels as token ids (0-255, dataset.scale:
// 1), the table gradient summed per id, trained as a Mirrored job of two
// replicas: Keras' Embedding, fed the same ids, predicts what distrain does.
TEST(KerasInteropTest, EmbeddingOfPixelTokensPredictsInKerasAsInDistrain) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_embedding");
  nlohmann::json r = TrainExportAndCompare(
      python, dir, "Mirrored", "    Worker: {replicas: 1}\n",
      "    localReplicas: 2\n"
      "    model:\n"
      "      layers:\n"
      "        - Embedding: {inputDim: 256, outputDim: 4}\n"
      "        - Reshape: {targetShape: [784, 4]}\n"
      "        - Conv1D: {filters: 8, kernelSize: 28, strides: 28, activation: relu}\n"
      "        - Flatten: {}\n"
      "        - Dense: {units: 10}\n"
      "      loss: {fromLogits: true}\n",
      "", /*pixel_scale=*/1.0f);
  ExpectKerasRebuildsTheModel(r, {"Embedding", "Reshape", "Conv1D", "Flatten", "Dense"});
  std::filesystem::remove_all(dir);
}

// A model trained with centered RMSprop, weight decay and a cosine schedule
// opens in Keras with that optimizer and schedule, its iterations and its
// slots in Keras' order (no learning-rate variable under a schedule): every
// velocity (a mean of squares, never negative) where Keras expects one,
// every average gradient after them.
TEST(KerasInteropTest, RmspropWithAScheduleExportsItsConfigAndSlotsInKerasOrder) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_rmsprop");
  const std::string exported = dir + "/model.keras";
  nlohmann::json r = TrainExportAndCompare(
      python, dir, "OneDevice", "    Worker: {replicas: 1}\n", kGuideCnnModel,
      "{type: rmsprop, learningRate: 0.001, centered: true, weightDecay: 0.01, "
      "schedule: {type: CosineDecay, decaySteps: 30, alpha: 0.1}}");
  EXPECT_LE(r.value("max_abs_diff", 1.0), 1e-5) << r.dump();
  EXPECT_EQ(r.value("optimizer", ""), "RMSprop");
  EXPECT_EQ(r.value("iterations", -1), 30);

  const std::string script = WriteTextFile(dir + "/slots.py", R"PY(
import json, sys
import numpy as np
import keras
model = keras.saving.load_model(sys.argv[1])
opt = model.optimizer
shapes = {v.path: tuple(v.shape) for v in model.trainable_variables}
slots = []
for v in opt.variables[1:]:  # after iterations; a schedule has no rate variable
    value = np.asarray(v)
    slots.append({"path": v.path, "shape": list(value.shape),
                  "min": float(value.min()), "nonzero": bool(np.any(value != 0))})
print("RESULT " + json.dumps({
    "config": {k: opt.get_config()[k] for k in ("rho", "centered", "weight_decay", "momentum")},
    "schedule": type(opt._learning_rate).__name__,
    "rate_now": float(opt.learning_rate),
    "trainable": len(shapes), "slots": slots}))
)PY");
  Subprocess py({python, script, exported},
                {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  auto rc = py.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << py.output();
  const std::string out = py.output();
  const size_t at = out.rfind("RESULT ");
  ASSERT_NE(at, std::string::npos) << out;
  const nlohmann::json slots =
      nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
  EXPECT_EQ(slots["config"]["centered"], true) << slots.dump();
  EXPECT_NEAR(slots["config"]["weight_decay"].get<double>(), 0.01, 1e-7);
  EXPECT_NEAR(slots["config"]["rho"].get<double>(), 0.9, 1e-7);
  // The schedule travels as Keras' own object; after its 30 decay steps the
  // rate is alpha * 0.001.
  EXPECT_EQ(slots["schedule"], "CosineDecay");
  EXPECT_NEAR(slots["rate_now"].get<double>(), 1e-4, 1e-9);
  const int trainable = slots["trainable"];
  ASSERT_EQ(slots["slots"].size(), 2u * trainable) << slots.dump();
  for (int i = 0; i < 2 * trainable; ++i) {
    const nlohmann::json& slot = slots["slots"][i];
    SCOPED_TRACE(slot.dump());
    const std::string path = slot["path"];
    EXPECT_NE(path.find(i < trainable ? "velocity" : "average_gradient"), std::string::npos);
    EXPECT_TRUE(slot["nonzero"].get<bool>()) << "trained slots were exported";
    if (i < trainable) {
      EXPECT_GE(slot["min"].get<double>(), 0.0);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(KerasInteropTest, KerasJsonImportsTrainsAndReturnsToKeras) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_round_trip");
  // 1. Keras writes the guide's CNN (with BatchNormalization and Dropout
  //    added) as JSON, and says how many parameters it has.
  const std::string script = WriteTextFile(dir + "/write.py", R"PY(
import sys, keras
model = keras.Sequential([
    keras.Input(shape=(28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.BatchNormalization(),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dropout(0.2),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
open(sys.argv[1], "w").write(model.to_json())
print("PARAMS", model.count_params())
print("SHAPES", [list(l.output.shape[1:]) for l in model.layers])
)PY");
  Subprocess writer({python, script, dir + "/model.json"}, {{"TF_CPP_MIN_LOG_LEVEL", "3"}});
  auto rc = writer.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << writer.output();
  const std::string written = writer.output();
  const size_t p = written.find("PARAMS ");
  ASSERT_NE(p, std::string::npos) << written;
  const int64_t keras_params = std::stoll(written.substr(p + 7));

  // 2. distrain turns it into the job's model block.
  Subprocess import({DistrainBinary(), "import-keras", dir + "/model.json"});
  rc = import.Wait(60);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << import.output();
  const std::string block = import.output();
  EXPECT_NE(block.find(absl::StrCat(keras_params, " parameters")), std::string::npos) << block;
  // Indent the block under spec.training; the comment lines go too.
  std::string model_block;
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("distrain: note", 0) == 0) continue;
    model_block += "    " + line + "\n";
  }
  model_block += "      loss: {type: SparseCategoricalCrossentropy, fromLogits: true}\n";

  // 3. Train it, export it, and load it back in Keras.
  const std::string exported = dir + "/round-trip.keras";
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      JobYaml("OneDevice", "    Worker: {replicas: 1}\n", model_block, exported));
  RunJob(job, dir);
  EXPECT_EQ(PredictWithDistrain(dir + "/ckpt", dir + "/x.f32", dir + "/p.f32"), keras_params);
  nlohmann::json r = CompareInKeras(python, dir, exported);
  EXPECT_EQ(r.value("params", int64_t{0}), keras_params) << r.dump();
  EXPECT_LE(r.value("max_abs_diff", 1.0), 1e-5) << r.dump();
  const size_t s = written.find("SHAPES ");
  ASSERT_NE(s, std::string::npos);
  EXPECT_EQ(r["output_shapes"].dump(),
            nlohmann::json::parse(written.substr(s + 7, written.find('\n', s) - s - 7)).dump());
  std::filesystem::remove_all(dir);
}

// A model trained in Keras comes in with its weights: distrain predicts what
// Keras predicts, and a job fine-tunes it from there.
// Builds the model of an imported .keras file with its weights, predicts the
// 64 digits <dir>/x.f32 holds and returns the largest difference from Keras'
// predictions in <dir>/keras-predictions.f32 (-1 on failure); `largest`
// receives the largest |Keras prediction|.
float ImportedPredictionGap(const KerasFileImport& file, const std::string& dir,
                            float* largest = nullptr) {
  auto model = Model::Create(file.imported.model, file.imported.input_shape, 10, 0);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return -1;
  auto optimizer = Optimizer::Create(OptimizerConfig{});
  EXPECT_TRUE(optimizer.ok());
  if (!optimizer.ok()) return -1;
  absl::Status restored = RestoreVariableState(file.weights, **model, **optimizer);
  EXPECT_TRUE(restored.ok()) << restored;
  if (!restored.ok()) return -1;
  std::ifstream xs(dir + "/x.f32", std::ios::binary);
  std::vector<float> x(64 * 784);
  xs.read(reinterpret_cast<char*>(x.data()), x.size() * sizeof(float));
  const Tensor& ours = (*model)->Predict(Tensor({64, 784}, x));
  std::ifstream ps(dir + "/keras-predictions.f32", std::ios::binary);
  std::vector<float> theirs(64 * 10);
  ps.read(reinterpret_cast<char*>(theirs.data()), theirs.size() * sizeof(float));
  float max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < theirs.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(ours.data()[i] - theirs[i]));
    max_abs = std::max(max_abs, std::abs(theirs[i]));
  }
  if (largest != nullptr) *largest = max_abs;
  return max_diff;
}

// A model written with Keras' Functional API that is a chain (the common
// tutorial form: inputs = keras.Input(...); x = layer(x); ...) imports as the
// Sequential it equals, its weights included: distrain's predictions from
// the imported file equal Keras'.
TEST(KerasInteropTest, AFunctionalChainImportsWithItsWeights) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_functional");
  const std::string script = WriteTextFile(dir + "/build.py", R"PY(
import sys
import numpy as np
import keras
d, out = sys.argv[1], sys.argv[2]
keras.utils.set_random_seed(3)
inputs = keras.Input(shape=(28, 28, 1), name="pixels")
x = keras.layers.Rescaling(2.0, offset=-1.0)(inputs)
x = keras.layers.Conv2D(8, 3, activation="relu", name="features")(x)
x = keras.layers.Conv2D(8, 3, padding="same")(x)
x = keras.layers.LayerNormalization()(x)
x = keras.layers.MaxPooling2D()(x)
x = keras.layers.Flatten()(x)
x = keras.layers.Dense(32, activation="gelu")(x)
x = keras.layers.BatchNormalization()(x)
outputs = keras.layers.Dense(10, name="head")(x)
model = keras.Model(inputs, outputs)
# Weights away from their initial values, BatchNormalization's statistics too.
rng = np.random.default_rng(3)
for w in model.weights:
    v = rng.uniform(-0.1, 0.1, w.shape)
    if w.path.endswith(("gamma", "moving_variance")):
        v += 1.0
    w.assign(v.astype("float32"))
model.save(out + "/functional.keras")
t = (np.fromfile(f"{d}/t10k-images-idx3-ubyte", dtype=np.uint8)[16:]
     .reshape(-1, 28, 28, 1)[:64].astype("float32") / 255)
model.predict(t, verbose=0).astype("float32").tofile(out + "/keras-predictions.f32")
t.tofile(out + "/x.f32")
)PY");
  Subprocess build({python, script, MnistDir(), dir},
                   {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  auto rc = build.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << build.output();

  auto file = ImportKerasFile(dir + "/functional.keras");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> classes;
  for (const LayerConfig& l : file->imported.model.layers) classes.push_back(LayerKindName(l.kind));
  EXPECT_EQ(classes, (std::vector<std::string>{"Input", "Rescaling", "Conv2D", "Conv2D",
                                               "LayerNormalization", "MaxPooling2D", "Flatten",
                                               "Dense", "BatchNormalization", "Dense"}));
  float largest = 0;
  const float max_diff = ImportedPredictionGap(*file, dir, &largest);
  std::cout << "functional import: max |keras - distrain| = " << max_diff << " (outputs up to "
            << largest << ")\n";
  EXPECT_GE(max_diff, 0);
  EXPECT_LE(max_diff, 1e-5 * std::max(1.0f, largest));
  std::filesystem::remove_all(dir);
}

TEST(KerasInteropTest, KerasFileImportsWithItsWeightsAndFineTunes) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_file_import");
  const std::string& d = MnistDir();
  // 1. Keras trains a CNN with BatchNormalization for one epoch and saves it.
  const std::string script = WriteTextFile(dir + "/train.py", R"PY(
import sys
import numpy as np
import keras
d, out = sys.argv[1], sys.argv[2]
def idx(name, offset, shape):
    return np.fromfile(f"{d}/{name}", dtype=np.uint8)[offset:].reshape(shape)
x = idx("train-images-idx3-ubyte", 16, (-1, 28, 28, 1)).astype("float32") / 255
y = idx("train-labels-idx1-ubyte", 8, (-1,))
keras.utils.set_random_seed(1)
model = keras.Sequential([
    keras.Input(shape=(28, 28, 1)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.BatchNormalization(),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
model.save(out + "/keras-trained.keras")
t = idx("t10k-images-idx3-ubyte", 16, (-1, 28, 28, 1))[:64].astype("float32") / 255
model.predict(t, verbose=0).astype("float32").tofile(out + "/keras-predictions.f32")
t.tofile(out + "/x.f32")
)PY");
  Subprocess train({python, script, d, dir}, {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  auto rc = train.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << train.output();

  // 2. The weights as distrain reads them predict what Keras predicted.
  auto file = ImportKerasFile(dir + "/keras-trained.keras");
  ASSERT_TRUE(file.ok()) << file.status();
  const float max_diff = ImportedPredictionGap(*file, dir);
  std::cout << "imported weights: max |keras - distrain| = " << max_diff << "\n";
  EXPECT_GE(max_diff, 0);
  EXPECT_LE(max_diff, 1e-5);

  // 3. The command writes them as a checkpoint; a job resumes from it.
  Subprocess import({DistrainBinary(), "import-keras", dir + "/keras-trained.keras",
                     "--checkpoint-dir", dir + "/ckpt", "-o", dir + "/block.yaml"});
  rc = import.Wait(60);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << import.output();
  std::ifstream block_in(dir + "/block.yaml");
  std::string block;
  for (std::string line; std::getline(block_in, line);) {
    if (line.rfind("optimizer:", 0) == 0) continue;  // JobYaml sets its own
    block += "    " + line + "\n";
  }
  // The example job with the imported block and the test digits to evaluate on.
  std::string job_text = JobYaml("OneDevice", "    Worker: {replicas: 1}\n", block,
                                 dir + "/tuned.keras");
  const size_t classes_at = job_text.find("      numClasses: 10\n");
  job_text.insert(classes_at, absl::StrCat("      evalFiles: [", d, "/t10k-images-idx3-ubyte]\n",
                                           "      evalLabelFiles: [", d,
                                           "/t10k-labels-idx1-ubyte]\n"));
  const std::string out = RunJob(WriteTextFile(dir + "/job.yaml", job_text), dir);
  EXPECT_NE(out.find("resumed from checkpoint step 0"), std::string::npos) << out;
  // Training starts from Keras' weights: after 10 steps the loss is that of a
  // trained model (from scratch this model is still above 1.0 there).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("step 10/30 loss ([0-9.]+)"))) << out;
  EXPECT_LT(std::stod(m[1]), 0.6) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("eval_accuracy ([0-9.]+)"))) << out;
  EXPECT_GT(std::stod(m[1]), 0.8) << out;
  std::filesystem::remove_all(dir);
}

// spec.training.precision travels as Keras' own dtype policy: TensorFlow
// loads a mixed_bfloat16 export with every layer under mixed_bfloat16 and
// float32 variables, and predicts what distrain predicts to bfloat16's
// precision. No job needed: one training step makes the variables.
TEST(KerasInteropTest, MixedBfloat16ExportLoadsUnderKerasMixedPolicy) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("keras_mixed_bfloat16");
  KerasModelSpec spec;
  spec.model.type = "sequential";
  LayerConfig conv;
  conv.kind = LayerKind::kConv2D;
  conv.filters = 8;
  conv.kernel_size = {3, 3};
  conv.activation = ActivationKind::kRelu;
  LayerConfig pool;
  pool.kind = LayerKind::kMaxPooling2D;
  LayerConfig flatten;
  flatten.kind = LayerKind::kFlatten;
  LayerConfig hidden;
  hidden.kind = LayerKind::kDense;
  hidden.units = 32;
  hidden.activation = ActivationKind::kRelu;
  LayerConfig output = hidden;
  output.units = 10;
  output.activation = ActivationKind::kSoftmax;
  spec.model.layers = {conv, pool, flatten, hidden, output};
  spec.model.precision = Precision::kMixedBfloat16;
  spec.example_shape = {28, 28, 1};
  spec.num_classes = 10;

  auto data = LoadIdxDataset(MnistDir() + "/t10k-images-idx3-ubyte",
                             MnistDir() + "/t10k-labels-idx1-ubyte", 1.0f / 255);
  ASSERT_TRUE(data.ok()) << data.status();
  Tensor batch({kPredictExamples, 784});
  std::vector<int32_t> labels(kPredictExamples);
  for (int i = 0; i < kPredictExamples; ++i) {
    (*data)->Get(i, batch.data() + static_cast<int64_t>(i) * 784, &labels[i]);
  }
  auto model = Model::Create(spec.model, spec.example_shape, spec.num_classes, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto optimizer = Optimizer::Create(spec.optimizer);
  ASSERT_TRUE(optimizer.ok());
  (*model)->TrainStep(batch, labels);
  (*optimizer)->Apply((*model)->parameters());
  const std::string exported = dir + "/mixed.keras";
  ASSERT_TRUE(ExportKerasModel(spec, CaptureVariableState(**model, **optimizer, 1), exported).ok());
  const Tensor& predictions = (*model)->Predict(batch);
  std::ofstream(dir + "/x.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(batch.data()), batch.size() * sizeof(float));
  std::ofstream(dir + "/p.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(predictions.data()), predictions.size() * sizeof(float));

  const std::string script = WriteTextFile(dir + "/policies.py", R"PY(
import json, sys
import numpy as np
import keras
model = keras.saving.load_model(sys.argv[1])
x = np.fromfile(sys.argv[2], dtype=np.float32).reshape((-1, 28, 28, 1))
ours = np.fromfile(sys.argv[3], dtype=np.float32).reshape((x.shape[0], -1))
theirs = np.asarray(model.predict(x, verbose=0), dtype=np.float32)
print("RESULT " + json.dumps({
    "policies": [l.dtype_policy.name for l in model.layers],
    "variable_dtypes": sorted({str(v.dtype) for v in model.weights}),
    "max_abs_diff": float(np.max(np.abs(ours - theirs))),
}))
# The mixed-precision guide's model, for the import direction: the global
# policy, and a float32 softmax at the end.
keras.config.set_dtype_policy("mixed_bfloat16")
guide = keras.Sequential([
    keras.Input(shape=(784,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
    keras.layers.Activation("softmax", dtype="float32"),
])
open(sys.argv[4], "w").write(guide.to_json())
)PY");
  Subprocess py({python, script, exported, dir + "/x.f32", dir + "/p.f32", dir + "/guide.json"},
                {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  auto rc = py.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << py.output();
  const std::string out = py.output();
  const size_t at = out.rfind("RESULT ");
  ASSERT_NE(at, std::string::npos) << out;
  const nlohmann::json r =
      nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
  std::cout << "mixed_bfloat16: " << r.dump() << "\n";
  EXPECT_EQ(r["policies"], nlohmann::json(std::vector<std::string>(5, "mixed_bfloat16")));
  EXPECT_EQ(r["variable_dtypes"], nlohmann::json({"float32"}));
  // Probabilities from bfloat16 logits (8 significant bits) on both sides.
  EXPECT_LE(r.value("max_abs_diff", 1.0), 1e-2) << r.dump();

  std::ifstream guide_in(dir + "/guide.json");
  const std::string guide((std::istreambuf_iterator<char>(guide_in)), {});
  auto imported = ImportKerasModelJson(guide);
  ASSERT_TRUE(imported.ok()) << imported.status() << "\n" << guide;
  EXPECT_EQ(imported->model.precision, Precision::kMixedBfloat16) << guide;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distrain

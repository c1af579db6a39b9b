// A TensorFlow user's loop end to end, exactly as examples/keras-workflow.yaml
// tells it (shortened), with TensorFlow checking every hand-over:
//   1. Keras' model.to_json() (examples/keras/guide_cnn.json) -> `distrain
//      import-keras` -> the example's model block (the example cannot drift);
//   2. TFRecord shards TensorFlow wrote (scripts/mnist_tfrecord.sh) train a
//      MultiWorkerMirrored job (chief + worker, FILE-sharded);
//   3. TensorBoard's event multiplexer reads the chief's train/ and
//      validation/ runs: the logged loss at the logged steps;
//   4. keras.saving.load_model opens the exported model, and Keras' own
//      model.evaluate on the TFRecord test shard, read with tf.data, gives
//      distrain's final eval loss and accuracy.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/integration/mnist_data.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"
#include "tests/integration/tensorflow_peer.h"
#include "yaml-cpp/yaml.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FreshTempDir;
using testing::MnistTfRecordDir;
using testing::SourceDir;
using testing::Subprocess;
using testing::WriteTextFile;

constexpr int kSteps = 60;

constexpr char kCheckScript[] = R"PY(
import json, sys
import tensorflow as tf
import keras
from tensorboard.backend.event_processing import event_multiplexer

logdir, model_path, test_files = sys.argv[1], sys.argv[2], sys.argv[3:]
mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(logdir)
mux.Reload()
curves = {}
for run, tags in mux.Runs().items():
    for tag in tags.get("tensors", []):
        curves.setdefault(run, {})[tag] = [
            [e.step, float(tf.make_ndarray(e.tensor_proto))] for e in mux.Tensors(run, tag)]
    for tag in tags.get("scalars", []):
        curves.setdefault(run, {})[tag] = [[e.step, e.value] for e in mux.Scalars(run, tag)]

def parse(record):
    f = tf.io.parse_single_example(record, {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [28, 28, 1])
    return tf.cast(image, tf.float32) / 255.0, f["label"]

test = tf.data.TFRecordDataset(test_files, compression_type="GZIP").map(parse).batch(500)
model = keras.saving.load_model(model_path)
loss, accuracy = model.evaluate(test, verbose=0)
print("RESULT " + json.dumps({"curves": curves, "keras_eval_loss": loss,
                              "keras_eval_accuracy": accuracy,
                              "examples": int(sum(1 for _ in test.unbatch()))}))
)PY";

TEST(TensorFlowWorkflowTest, KerasJsonToTfRecordTrainingToTensorBoardToKeras) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("tf_workflow");
  const std::string data = MnistTfRecordDir();

  // 1. The example's model block is what import-keras prints for the JSON.
  Subprocess import({DistrainBinary(), "import-keras", SourceDir() + "/examples/keras/guide_cnn.json"});
  auto rc = import.Wait(60);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << import.output();
  std::ifstream example_in(SourceDir() + "/examples/keras-workflow.yaml");
  const std::string example((std::istreambuf_iterator<char>(example_in)), {});
  std::istringstream block(import.output());
  for (std::string line; std::getline(block, line);) {
    if (line.rfind("# spec.training blocks", 0) == 0) continue;  // names the path it read
    EXPECT_NE(example.find("    " + line + "\n"), std::string::npos)
        << "examples/keras-workflow.yaml lacks the imported line:\n" << line;
  }

  // 2. The example, shortened, with the data at absolute paths.
  YAML::Node job = YAML::LoadFile(SourceDir() + "/examples/keras-workflow.yaml");
  YAML::Node training = job["spec"]["training"];
  training["steps"] = kSteps;
  training["logEverySteps"] = 10;
  training["evalEverySteps"] = 30;
  training["checkpoint"]["everySteps"] = 30;
  training["export"]["path"] = dir + "/guide-cnn.keras";
  YAML::Node dataset = training["dataset"];
  for (const char* key : {"trainFiles", "evalFiles"}) {
    const std::string relative = dataset[key][0].as<std::string>();
    ASSERT_EQ(relative.rfind("data/mnist-tfrecord/", 0), 0u) << relative;
    dataset[key][0] = data + relative.substr(std::string("data/mnist-tfrecord").size());
  }
  YAML::Emitter emitter;
  emitter << job;
  const std::string job_path = WriteTextFile(dir + "/job.yaml", emitter.c_str());
  Subprocess run({DistrainBinary(), "run", job_path, "--no-progress", "--work-dir",
                  dir + "/work", "--checkpoint-dir", dir + "/ckpt"});
  rc = run.Wait(600);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << run.output();
  const std::string out = run.output();
  // The chief's summary: "training complete: steps 60 loss L eval_loss E
  // eval_accuracy A".
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex(absl::StrCat(R"(\[chief-0\][^\n]*training complete: steps )", kSteps,
                              R"( loss ([0-9.]+) eval_loss ([0-9.]+) eval_accuracy ([0-9.]+))"))))
      << out;
  const double last_loss = std::stod(m[1]);
  const double eval_loss = std::stod(m[2]);
  const double eval_accuracy = std::stod(m[3]);

  // 3 and 4, in one TensorFlow process.
  const std::string script = WriteTextFile(dir + "/check.py", kCheckScript);
  Subprocess check({python, script, dir + "/ckpt", dir + "/guide-cnn.keras",
                    data + "/test-00000-of-00001.tfrecord.gz"},
                   {{"TF_CPP_MIN_LOG_LEVEL", "3"}, {"CUDA_VISIBLE_DEVICES", ""}});
  rc = check.Wait(300);
  ASSERT_TRUE(rc.has_value() && *rc == 0) << check.output();
  const std::string checked = check.output();
  const size_t at = checked.rfind("RESULT ");
  ASSERT_NE(at, std::string::npos) << checked;
  const nlohmann::json r = nlohmann::json::parse(checked.substr(at + 7));

  const nlohmann::json& train = r["curves"]["train"];
  for (const char* tag :
       {"loss", "accuracy", "examples_per_second", "step_time_seconds", "learning_rate"}) {
    ASSERT_TRUE(train.contains(tag)) << tag << " missing: " << r["curves"].dump();
    std::vector<int64_t> steps;
    for (const auto& point : train[tag]) steps.push_back(point[0].get<int64_t>());
    EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 30, 40, 50, 60})) << tag;
  }
  EXPECT_NEAR(train["loss"].back()[1].get<double>(), last_loss, 5e-5) << "the logged loss";
  const nlohmann::json& validation = r["curves"]["validation"];
  ASSERT_TRUE(validation.contains("accuracy")) << r["curves"].dump();
  EXPECT_EQ(validation["accuracy"].back()[0].get<int64_t>(), kSteps);
  EXPECT_NEAR(validation["accuracy"].back()[1].get<double>(), eval_accuracy, 5e-5);

  // Keras evaluates the exported model on the same 2,000 digits: the same
  // loss and accuracy (distrain logs 4 decimals; one digit is 5e-4).
  EXPECT_EQ(r["examples"].get<int>(), 2000);
  EXPECT_NEAR(r["keras_eval_accuracy"].get<double>(), eval_accuracy, 5e-4 + 5e-5) << r.dump();
  EXPECT_NEAR(r["keras_eval_loss"].get<double>(), eval_loss, 1e-4) << r.dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distrain

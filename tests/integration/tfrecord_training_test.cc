// dataset type tfrecord on files TensorFlow itself writes (tf.io.TFRecordWriter
// + tf.train.Example, through scripts/mnist_tfrecord.py in the TensorFlow venv):
//   * a subset of real MNIST as plain and as GZIP TFRecord shards trains to
//     bit-identical variables and the same final line as the same examples in
//     IDX files (the shards hold the IDX order, read in sorted order, so the
//     batches are the same examples in the same order);
//   * truncated and corrupted TensorFlow-written files make `distrain run`
//     exit with the data error code (4), naming the file and the byte offset;
//   * examples/cnn-mnist-tfrecord.yaml trains exactly as examples/cnn-mnist.yaml
//     under OneDevice, and learns under MultiWorkerMirrored (AUTO -> FILE
//     sharding of its 4 shards over 2 workers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "tests/integration/mnist_data.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"
#include "tests/integration/tensorflow_peer.h"
#include "yaml-cpp/yaml.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::ExpectSameVariables;
using testing::FinalVariables;
using testing::FreshTempDir;
using testing::MnistDir;
using testing::MnistTfRecordDir;
using testing::SourceDir;
using testing::Subprocess;
using testing::WriteTextFile;
namespace fs = std::filesystem;

constexpr int kTrain = 640;  // the first examples of scripts/mnist.sh's split
constexpr int kTest = 160;
constexpr int kSteps = 30;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The first `n` examples of an IDX images/labels pair, as a new pair.
void WriteIdxPrefix(const std::string& from_images, const std::string& from_labels, int n,
                    const std::string& to_images, const std::string& to_labels) {
  // The count is the first dimension, bytes 4..7 of both headers (big-endian).
  auto header = [](std::string bytes, int n) {
    bytes[4] = static_cast<char>(n >> 24);
    bytes[5] = static_cast<char>(n >> 16);
    bytes[6] = static_cast<char>(n >> 8);
    bytes[7] = static_cast<char>(n);
    return bytes;
  };
  const std::string images = ReadBytes(from_images);
  const std::string labels = ReadBytes(from_labels);
  ASSERT_GE(images.size(), 16u + 784u * n);
  WriteBytes(to_images, header(images.substr(0, 16 + 784 * n), n));
  WriteBytes(to_labels, header(labels.substr(0, 8 + n), n));
}

// The data every test here shares, written once per test binary: IDX
// prefixes, and TensorFlow's TFRecord shards of the same examples.
struct Data {
  std::string dir;
  std::string skip;  // why the data is missing (no TensorFlow venv)
};

const Data& SharedData() {
  static const Data* data = [] {
    auto* d = new Data;
    const std::string python = testing_peer::TensorFlowPython();
    if (python.empty()) {
      d->skip = "TensorFlow peer venv missing: run scripts/setup.sh (without --no-peers)";
      return d;
    }
    const std::string mnist = MnistDir();
    d->dir = FreshTempDir("tfrecord_data");
    WriteIdxPrefix(mnist + "/train-images-idx3-ubyte", mnist + "/train-labels-idx1-ubyte", kTrain,
                   d->dir + "/train-images", d->dir + "/train-labels");
    WriteIdxPrefix(mnist + "/t10k-images-idx3-ubyte", mnist + "/t10k-labels-idx1-ubyte", kTest,
                   d->dir + "/test-images", d->dir + "/test-labels");
    // One TensorFlow process writes both layouts (its import costs seconds).
    const std::string program = absl::StrCat(
        "import os, sys\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'\n"
        "sys.path.insert(0, '", SourceDir(), "/scripts')\n",
        "import mnist_tfrecord as m\n"
        "import tensorflow as tf\n"
        "src = '", mnist, "'\n",
        "for comp, shards, out in (('NONE', 3, 'plain'), ('GZIP', 4, 'gzip')):\n"
        "  os.makedirs(os.path.join('", d->dir, "', out))\n",
        "  for name, idx, n in (('train', 'train', ", kTrain, "),\n",
        "                       ('test', 't10k', ", kTest, ")):\n",
        "    images = m.read_idx(os.path.join(src, idx + '-images-idx3-ubyte'), 2051, 3)[:n]\n"
        "    labels = m.read_idx(os.path.join(src, idx + '-labels-idx1-ubyte'), 2049, 1)[:n]\n"
        "    m.write_split(tf, images, labels, os.path.join('", d->dir, "', out), name,\n",
        "                  shards if name == 'train' else 1, comp)\n");
    Subprocess tf({python, "-c", program});
    auto rc = tf.Wait(300);
    EXPECT_TRUE(rc.has_value() && *rc == 0) << tf.output();
    return d;
  }();
  return *data;
}

#define REQUIRE_SHARED_DATA(var)                 \
  const Data& var = SharedData();                \
  if (!var.skip.empty()) GTEST_SKIP() << var.skip;

const char kGuideCnn[] =
    "      - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}\n"
    "      - MaxPooling2D: {poolSize: [2, 2]}\n"
    "      - Conv2D: {filters: 64, kernelSize: [3, 3], activation: relu}\n"
    "      - Flatten: {}\n"
    "      - Dense: {units: 64, activation: relu}\n"
    "      - Dense: {units: 10, activation: softmax}\n";

std::string Job(const std::string& dataset) {
  return absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\n"
      "kind: DistributedTrainingJob\n"
      "metadata: {name: tfrecord}\n"
      "spec:\n"
      "  strategy: OneDevice\n"
      "  replicaSpecs: {Worker: {replicas: 1}}\n"
      "  training:\n"
      "    model:\n"
      "      layers:\n",
      kGuideCnn,
      "      loss: {type: SparseCategoricalCrossentropy, fromLogits: true}\n"
      "    dataset:\n",
      dataset,
      "      numClasses: 10\n"
      "    optimizer: {type: adam, learningRate: 0.001}\n"
      "    globalBatchSize: 32\n"
      "    steps: ",
      kSteps,
      "\n"
      "    logEverySteps: 10\n"
      "    seed: 11\n");
}

std::string TfRecordDataset(const std::string& dir, const std::string& compression,
                            const std::string& suffix) {
  return absl::StrCat("      type: tfrecord\n", "      trainFiles: [", dir, "/train-*", suffix,
                      "]\n", "      evalFiles: [", dir, "/test-*", suffix, "]\n",
                      "      compression: ", compression, "\n",
                      "      featureShape: [28, 28, 1]\n");
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult DistrainRun(const std::string& job_path, const std::string& checkpoint_dir) {
  Subprocess run({DistrainBinary(), "run", job_path, "--no-progress", "--checkpoint-dir",
                  checkpoint_dir},
                 {{"OPENBLAS_NUM_THREADS", "1"}});
  auto rc = run.Wait(300);
  EXPECT_TRUE(rc.has_value()) << "distrain run did not finish in 300 s:\n" << run.output();
  return {rc.value_or(-1), run.output()};
}

// "training complete: steps 30 loss ... eval_accuracy ..." without the wall time.
std::string FinalLine(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("training complete: (steps [^\n]*) wall"))) {
    ADD_FAILURE() << "no final line in:\n" << out;
    return "";
  }
  return m[1];
}

TEST(TfRecordTrainingTest, TensorFlowWrittenShardsTrainExactlyAsTheSameIdxData) {
  REQUIRE_SHARED_DATA(data);
  const std::string dir = FreshTempDir("tfrecord_vs_idx");
  const std::string idx_job = WriteTextFile(
      dir + "/idx.yaml",
      Job(absl::StrCat("      type: idx\n", "      trainFiles: [", data.dir, "/train-images]\n",
                       "      trainLabelFiles: [", data.dir, "/train-labels]\n",
                       "      evalFiles: [", data.dir, "/test-images]\n",
                       "      evalLabelFiles: [", data.dir, "/test-labels]\n")));
  const RunResult idx = DistrainRun(idx_job, dir + "/idx");
  ASSERT_EQ(idx.exit_code, 0) << idx.output;
  const auto want = FinalVariables(dir + "/idx", kSteps);
  const std::string want_line = FinalLine(idx.output);
  ASSERT_NE(want_line.find("eval_accuracy"), std::string::npos) << idx.output;

  for (const auto& [layout, compression, suffix] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"plain", "NONE", ".tfrecord"}, {"gzip", "GZIP", ".tfrecord.gz"}}) {
    SCOPED_TRACE(layout);
    const std::string job = WriteTextFile(
        dir + "/" + layout + ".yaml",
        Job(TfRecordDataset(data.dir + "/" + layout, compression, suffix)));
    const RunResult run = DistrainRun(job, dir + "/" + layout);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    // Same examples, same order, same seed: the same arithmetic, bit for bit.
    ExpectSameVariables(FinalVariables(dir + "/" + layout, kSteps), want, 0.0f);
    EXPECT_EQ(FinalLine(run.output), want_line);
  }
  fs::remove_all(dir);
}

// Walks the framing of a plain TFRecord file: the byte offset of each record.
std::vector<size_t> RecordOffsets(const std::string& bytes) {
  std::vector<size_t> offsets;
  for (size_t pos = 0; pos + 12 <= bytes.size();) {
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[pos + i]);
    offsets.push_back(pos);
    pos += 16 + length;
  }
  return offsets;
}

TEST(TfRecordTrainingTest, TruncatedAndCorruptTensorFlowFilesFailNamingFileAndOffset) {
  REQUIRE_SHARED_DATA(data);
  const std::string dir = FreshTempDir("tfrecord_corrupt");
  const std::string original = data.dir + "/plain/train-00001-of-00003.tfrecord";
  const std::string bytes = ReadBytes(original);
  const std::vector<size_t> offsets = RecordOffsets(bytes);
  ASSERT_GT(offsets.size(), 100u);

  struct Case {
    std::string sub;  // directory of the case
    std::string name;
    std::string bytes;
    std::string compression;
    std::vector<std::string> expect;
  };
  // Cut inside record 57; a bit flipped in record 91's pixels.
  const size_t cut = offsets[57] + 300;
  std::string flipped = bytes;
  flipped[offsets[91] + 12 + 400] ^= 0x10;
  const std::string gz = ReadBytes(data.dir + "/gzip/train-00002-of-00004.tfrecord.gz");
  const std::vector<Case> cases = {
      {"cut", "truncated.tfrecord", bytes.substr(0, cut), "NONE",
       {absl::StrCat("record 57: file '", dir, "/cut/truncated.tfrecord' at byte offset ",
                     offsets[57]),
        "truncated record"}},
      {"flip", "flipped.tfrecord", flipped, "NONE",
       {absl::StrCat("record 91: file '", dir, "/flip/flipped.tfrecord' at byte offset ",
                     offsets[91]),
        "corrupt record (data CRC mismatch"}},
      {"cut_gz", "truncated.tfrecord.gz", gz.substr(0, gz.size() * 2 / 3), "GZIP",
       {absl::StrCat("file '", dir, "/cut_gz/truncated.tfrecord.gz' ends inside its GZIP "
                     "stream"),
        "truncated"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string sub = dir + "/" + c.sub;
    fs::create_directories(sub);
    // The broken file between two good ones, so the error must say which.
    fs::copy_file(data.dir + "/plain/train-00000-of-00003.tfrecord", sub + "/a.tfrecord");
    WriteBytes(sub + "/" + c.name, c.bytes);
    const std::string train =
        c.compression == "GZIP" ? absl::StrCat("[", sub, "/", c.name, "]")
                                : absl::StrCat("[", sub, "/a.tfrecord, ", sub, "/", c.name, "]");
    const std::string job = WriteTextFile(
        sub + "/job.yaml", Job(absl::StrCat("      type: tfrecord\n      trainFiles: ", train,
                                            "\n      compression: ", c.compression,
                                            "\n      featureShape: [28, 28, 1]\n")));
    const RunResult run = DistrainRun(job, sub + "/ckpt");
    EXPECT_EQ(run.exit_code, kExitInvalidData) << run.output;
    for (const std::string& e : c.expect) {
      EXPECT_NE(run.output.find(e), std::string::npos) << e << "\n" << run.output;
    }
    EXPECT_EQ(run.output.find("Aborted"), std::string::npos) << run.output;
  }
  fs::remove_all(dir);
}

// examples/<stem>.yaml with fewer steps, the given strategy, and its
// data/... paths made absolute (`mnist` is the directory they point into).
std::string ShortenedExample(const std::string& stem, const std::string& mnist_dir,
                             const std::string& link, const std::string& strategy,
                             const std::string& replica_specs) {
  YAML::Node job = YAML::LoadFile(SourceDir() + "/examples/" + stem + ".yaml");
  job["spec"]["strategy"] = strategy;
  job["spec"]["replicaSpecs"] = YAML::Load(replica_specs);
  YAML::Node training = job["spec"]["training"];
  training["steps"] = 40;
  training["evalEverySteps"] = 0;
  training["checkpoint"]["everySteps"] = 0;
  YAML::Node dataset = training["dataset"];
  for (const char* key : {"trainFiles", "trainLabelFiles", "evalFiles", "evalLabelFiles"}) {
    if (!dataset[key]) continue;
    const std::string relative = dataset[key][0].as<std::string>();
    EXPECT_EQ(relative.rfind(link + "/", 0), 0u) << key << ": " << relative;
    dataset[key][0] = mnist_dir + relative.substr(link.size());
  }
  YAML::Emitter emitter;
  emitter << job;
  return emitter.c_str();
}

double EvalAccuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("eval_accuracy ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

TEST(TfRecordTrainingTest, ExampleTrainsAsTheIdxExampleAndShardsOverWorkers) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string tfrecord_dir = MnistTfRecordDir();
  const std::string idx_dir = MnistDir();
  const std::string dir = FreshTempDir("tfrecord_example");
  const std::string one = "{Worker: {replicas: 1}}";
  const RunResult idx = DistrainRun(
      WriteTextFile(dir + "/idx.yaml",
                    ShortenedExample("cnn-mnist", idx_dir, "data/mnist", "OneDevice", one)),
      dir + "/idx");
  ASSERT_EQ(idx.exit_code, 0) << idx.output;
  const RunResult tfrecord =
      DistrainRun(WriteTextFile(dir + "/tfrecord.yaml",
                                ShortenedExample("cnn-mnist-tfrecord", tfrecord_dir,
                                                 "data/mnist-tfrecord", "OneDevice", one)),
                  dir + "/tfrecord");
  ASSERT_EQ(tfrecord.exit_code, 0) << tfrecord.output;
  ExpectSameVariables(FinalVariables(dir + "/tfrecord", 40), FinalVariables(dir + "/idx", 40),
                      0.0f);
  EXPECT_EQ(FinalLine(tfrecord.output), FinalLine(idx.output));
  EXPECT_GT(EvalAccuracy(tfrecord.output), 0.6) << tfrecord.output;

  // Two workers, AUTO: each reads 2 of the 4 shards (FILE), as tf.data would.
  const RunResult mwms = DistrainRun(
      WriteTextFile(dir + "/mwms.yaml",
                    ShortenedExample("cnn-mnist-tfrecord", tfrecord_dir, "data/mnist-tfrecord",
                                     "MultiWorkerMirrored",
                                     "{Chief: {replicas: 1}, Worker: {replicas: 1}}")),
      dir + "/mwms");
  ASSERT_EQ(mwms.exit_code, 0) << mwms.output;
  EXPECT_NE(mwms.output.find("shard 1/2"), std::string::npos) << mwms.output;
  EXPECT_GT(EvalAccuracy(mwms.output), 0.6) << mwms.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distrain

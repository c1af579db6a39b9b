// The CNN of TensorFlow's distributed-training guide on real MNIST digits
// (scripts/mnist.sh), as real processes under every strategy:
//   * synchronous placements (Mirrored with 4 replicas, MultiWorkerMirrored
//     with a chief and 3 workers, CentralStorage with 4 replicas) end within
//     1e-4 of OneDevice after 100 steps on the same global batch and seed,
//     with every replica holding identical variables after every step;
//   * a model with Dropout and BatchNormalization stays in sync under
//     MultiWorkerMirrored (moving statistics averaged over the replicas) and
//     its checkpoint carries the moving statistics;
//   * ParameterServer (with Dropout) and an Evaluator replica train and
//     evaluate it through `distrain run`;
//   * examples/cnn-mnist.yaml itself runs under every strategy, switched the
//     way its comments tell a user to switch it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"
#include "tests/integration/mnist_data.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::ExpectSameVariables;
using testing::FinalVariables;
using testing::FreshTempDir;
using testing::MnistDir;
using testing::ReadLines;
using testing::SourceDir;
using testing::Subprocess;
using testing::SyncCluster;
using testing::WorkerBinary;
using testing::WriteTextFile;
namespace fs = std::filesystem;

constexpr int kSteps = 100;

const char kGuideCnn[] =
    "      - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}\n"
    "      - MaxPooling2D: {poolSize: [2, 2]}\n"
    "      - Conv2D: {filters: 64, kernelSize: [3, 3], activation: relu}\n"
    "      - Flatten: {}\n"
    "      - Dense: {units: 64, activation: relu}\n"
    "      - Dense: {units: 10, activation: softmax}\n";

// The guide's CNN with the layers that keep state or draw random numbers.
const char kCnnWithDropoutAndBatchNorm[] =
    "      - Conv2D: {filters: 16, kernelSize: [3, 3], padding: same, useBias: false}\n"
    "      - BatchNormalization: {momentum: 0.9}\n"
    "      - Activation: {activation: relu}\n"
    "      - MaxPooling2D: {poolSize: [2, 2]}\n"
    "      - Conv2D: {filters: 32, kernelSize: [3, 3], strides: [2, 2], activation: relu}\n"
    "      - GlobalAveragePooling2D: {}\n"
    "      - Dropout: {rate: 0.25}\n"
    "      - Dense: {units: 10}\n";

std::string CnnJobYaml(const std::string& strategy, const std::string& replica_specs,
                       const char* layers, const std::string& loss, int64_t steps,
                       const std::string& extra_training = "", double learning_rate = 0.001) {
  const std::string& d = MnistDir();
  return absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\n",
      "kind: DistributedTrainingJob\n",
      "metadata: {name: cnn}\n",
      "spec:\n",
      "  strategy: ", strategy, "\n",
      "  replicaSpecs:\n", replica_specs,
      "  training:\n",
      "    model:\n",
      "      layers:\n", layers,
      "      loss: ", loss, "\n",
      "    dataset:\n",
      "      type: idx\n",
      "      trainFiles: [", d, "/train-images-idx3-ubyte]\n",
      "      trainLabelFiles: [", d, "/train-labels-idx1-ubyte]\n",
      "      evalFiles: [", d, "/t10k-images-idx3-ubyte]\n",
      "      evalLabelFiles: [", d, "/t10k-labels-idx1-ubyte]\n",
      "      autoShardPolicy: DATA\n",
      "    optimizer: {type: adam, learningRate: ", learning_rate, "}\n",
      "    globalBatchSize: 64\n",
      "    steps: ", steps, "\n",
      "    logEverySteps: 25\n",
      "    seed: 7\n", extra_training);
}

const char kGuideLoss[] = "{type: SparseCategoricalCrossentropy, fromLogits: true}";

// The sync-equivalence jobs train with Adam at 1e-4. Placements differ in
// summation order (a replica's 16 examples, then the all-reduce, against one
// sum over 64), and at Keras' default 1e-3 the CNN's training amplifies those
// last-bit differences: a ReLU or a max-pool window that flips on one side
// routes a whole gradient elsewhere, and Adam turns tiny gradients into
// full-size steps. Measured on this job, OneDevice against Mirrored(4):
// 3e-7 after 1 step, 4e-7 after 10, 8e-3 after 100 at lr 1e-3 (SGD at 0.05:
// 1e-3); at lr 1e-4, 4e-8 after 100 steps. TensorFlow's placements are no
// more equal than that. The replicas themselves stay bit-identical at any
// learning rate (the checksum hook), and that is tested at 1e-3 below.
constexpr double kSyncLearningRate = 1e-4;

std::string GuideJob(const std::string& strategy, const std::string& replica_specs,
                     const std::string& extra = "") {
  return CnnJobYaml(strategy, replica_specs, kGuideCnn, kGuideLoss, kSteps, extra,
                    kSyncLearningRate);
}

// `distrain run` on `job` with checkpoints in dir/ckpt (and, with
// `checksums`, the checksum hook's files in dir); returns its output, after
// failing the test unless it succeeded.
std::string RunToSuccess(const std::string& job, const std::string& dir, bool checksums = false) {
  std::map<std::string, std::string> env;
  if (checksums) env["DISTRAIN_PARAM_CHECKSUM_FILE"] = dir + "/checksums.{task}.txt";
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt"},
                 env);
  auto rc = run.Wait(300);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << run.output();
  return run.output();
}

// The eval accuracy of distrain run's final summary line; -1 when absent.
double FinalEvalAccuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("eval_accuracy ([0-9.]+)"))) {
    ADD_FAILURE() << "no eval_accuracy in:\n" << out;
    return -1;
  }
  return std::stod(m[1]);
}

// OneDevice on the guide CNN, trained once per test binary.
const std::map<std::string, Tensor>& CnnReference() {
  static const auto* reference = [] {
    const std::string dir = FreshTempDir("cnn_reference");
    const std::string job = WriteTextFile(dir + "/job.yaml",
                                          GuideJob("OneDevice", "    Worker: {replicas: 1}\n"));
    Subprocess worker({WorkerBinary(), "--config", job, "--checkpoint-dir", dir + "/ckpt"},
                      {{"OPENBLAS_NUM_THREADS", "1"}});
    auto rc = worker.Wait(300);
    EXPECT_TRUE(rc.has_value() && *rc == 0) << worker.output();
    // Keras warns about a softmax output compiled with from_logits=True, as
    // the guide does; so does distrain.
    EXPECT_NE(worker.output().find("Softmax activation"), std::string::npos) << worker.output();
    auto* vars = new std::map<std::string, Tensor>(FinalVariables(dir + "/ckpt", kSteps));
    std::filesystem::remove_all(dir);
    return vars;
  }();
  return *reference;
}

TEST(CnnMnistTest, OneDeviceLearnsRealDigits) {
  const std::string dir = FreshTempDir("cnn_onedevice");
  const std::string job = WriteTextFile(
      dir + "/job.yaml", CnnJobYaml("OneDevice", "    Worker: {replicas: 1}\n", kGuideCnn,
                                    kGuideLoss, kSteps));
  // 100 steps of 64 real digits: far above chance (0.1), as in Keras.
  EXPECT_GT(FinalEvalAccuracy(RunToSuccess(job, dir)), 0.8);
  const auto vars = FinalVariables(dir + "/ckpt", kSteps);
  for (const char* name : {"variables/conv2d/kernel", "variables/conv2d/bias",
                           "variables/conv2d_1/kernel", "variables/dense/kernel",
                           "variables/dense_1/bias"}) {
    EXPECT_TRUE(vars.count(name)) << name;
  }
  EXPECT_EQ(vars.at("variables/conv2d/kernel").shape(), (std::vector<int64_t>{3, 3, 1, 32}));
  EXPECT_EQ(vars.at("variables/dense/kernel").shape(), (std::vector<int64_t>{7744, 64}));
  fs::remove_all(dir);
}

// Mirrored and CentralStorage: 4 replicas as threads of one process.
class CnnLocalReplicasTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CnnLocalReplicasTest, FourReplicasMatchOneDevice) {
  const auto& reference = CnnReference();
  const std::string dir = FreshTempDir("cnn_" + GetParam());
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      GuideJob(GetParam(), "    Worker: {replicas: 1}\n",
               "    localReplicas: 4\n    communication: {bytesPerPack: 65536}\n"));
  RunToSuccess(job, dir, /*checksums=*/true);
  ExpectSameVariables(FinalVariables(dir + "/ckpt", kSteps), reference, 1e-4f);
  // The worker checks its 4 replicas against each other before every line.
  EXPECT_EQ(ReadLines(dir + "/checksums.worker-0.txt").size(), static_cast<size_t>(kSteps));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Strategies, CnnLocalReplicasTest,
                         ::testing::Values("Mirrored", "CentralStorage"));

TEST(CnnMnistTest, MultiWorkerMirroredChiefAnd3WorkersMatchesOneDevice) {
  const auto& reference = CnnReference();
  const std::string dir = FreshTempDir("cnn_mwms");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      GuideJob("MultiWorkerMirrored", "    Chief: {replicas: 1}\n    Worker: {replicas: 3}\n",
               "    communication: {implementation: Ring, timeoutSeconds: 30, "
               "bytesPerPack: 65536}\n"));
  SyncCluster cluster(job, dir, 3, kSteps);
  cluster.ExpectAllSucceed(300);
  ExpectSameVariables(FinalVariables(dir + "/ckpt", kSteps), reference, 1e-4f);
  cluster.ExpectIdenticalChecksums(dir);
  fs::remove_all(dir);
}

// BatchNormalization's moving statistics are per-replica state that the
// strategy averages; Dropout draws a different mask per replica. The
// replicas must still agree bit for bit after every step, and the
// checkpoint must carry the moving statistics.
TEST(CnnMnistTest, MultiWorkerMirroredKeepsBatchNormStatisticsInSync) {
  const std::string dir = FreshTempDir("cnn_bn");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      CnnJobYaml("MultiWorkerMirrored", "    Chief: {replicas: 1}\n    Worker: {replicas: 1}\n",
                 kCnnWithDropoutAndBatchNorm,
                 "{type: SparseCategoricalCrossentropy, fromLogits: true}", 60,
                 "    communication: {implementation: Ring, timeoutSeconds: 30}\n"));
  SyncCluster cluster(job, dir, 1, 60);
  cluster.ExpectAllSucceed(300);
  cluster.ExpectIdenticalChecksums(dir);
  auto state = CheckpointManager(dir + "/ckpt", 3).RestoreLatest();
  ASSERT_TRUE(state.ok() && state->has_value()) << state.status();
  const auto& tensors = (*state)->tensors;
  ASSERT_TRUE(tensors.count("variables/batch_normalization/moving_mean"));
  ASSERT_TRUE(tensors.count("variables/batch_normalization/moving_variance"));
  // Moved away from the initial (0, 1) by 60 steps of real data.
  const Tensor& mean = tensors.at("variables/batch_normalization/moving_mean");
  double moved = 0;
  for (int64_t i = 0; i < mean.size(); ++i) moved += std::fabs(mean[i]);
  EXPECT_GT(moved, 1e-3);
  fs::remove_all(dir);
}

// Mixed precision end to end: the guide CNN under each Keras policy learns
// real digits like float32 does (100 steps: far above chance), across
// processes (MultiWorkerMirrored, the replicas bit-identical step by step),
// and a mixed_float16 checkpoint carries the dynamic loss scale under Keras'
// names: the scale, and one finite step counted per applied step.
TEST(CnnMnistTest, MixedPrecisionJobsLearnInSyncAndCheckpointTheLossScale) {
  for (const char* precision : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(precision);
    const std::string dir = FreshTempDir(std::string("cnn_") + precision);
    const std::string job = WriteTextFile(
        dir + "/job.yaml",
        CnnJobYaml("MultiWorkerMirrored", "    Chief: {replicas: 1}\n    Worker: {replicas: 1}\n",
                   kGuideCnn, kGuideLoss, kSteps,
                   absl::StrCat("    precision: ", precision, "\n",
                                "    communication: {implementation: Ring, timeoutSeconds: 30}\n")));
    SyncCluster cluster(job, dir, 1, kSteps);
    cluster.ExpectAllSucceed(300);
    cluster.ExpectIdenticalChecksums(dir);
    EXPECT_NE(cluster.processes[0]->output().find(absl::StrCat("precision ", precision)),
              std::string::npos)
        << cluster.processes[0]->output();
    EXPECT_GT(FinalEvalAccuracy(cluster.processes[0]->output()), 0.8);
    auto state = CheckpointManager(dir + "/ckpt", 3).RestoreLatest();
    ASSERT_TRUE(state.ok() && state->has_value()) << state.status();
    const auto& tensors = (*state)->tensors;
    const bool scaled = std::string(precision) == "mixed_float16";
    ASSERT_EQ(tensors.count("optimizer/loss_scale_optimizer/dynamic_scale"), scaled ? 1u : 0u);
    if (scaled) {
      const float scale = tensors.at("optimizer/loss_scale_optimizer/dynamic_scale")[0];
      const float counter = tensors.at("optimizer/loss_scale_optimizer/step_counter")[0];
      const std::string iterations = (*state)->metadata.at("optimizer_iterations");
      // Every skipped step halved the scale from 2^15 (and restarted the
      // count of finite steps); every applied one counted.
      const int applied = std::stoi(iterations);
      const int skipped = kSteps - applied;
      EXPECT_EQ(scale, 32768.0f / static_cast<float>(1 << skipped));
      EXPECT_LE(counter, static_cast<float>(applied));
      if (skipped == 0) {
        EXPECT_EQ(counter, static_cast<float>(applied));
      }
    }
    fs::remove_all(dir);
  }
}

// A job stopped at step 30 and run again from its checkpoint ends exactly
// where an uninterrupted 60-step job ends: the checkpoint carries every
// variable (BatchNormalization's moving statistics included) and the
// optimizer's slots, and Dropout's masks depend only on (seed, step,
// replica), so the resumed steps draw the masks the uninterrupted ones drew.
TEST(CnnMnistTest, ResumeWithDropoutAndBatchNormIsExact) {
  const std::string dir = FreshTempDir("cnn_resume");
  const std::string loss = "{type: SparseCategoricalCrossentropy, fromLogits: true}";
  const std::string straight = WriteTextFile(
      dir + "/straight.yaml", CnnJobYaml("OneDevice", "    Worker: {replicas: 1}\n",
                                         kCnnWithDropoutAndBatchNorm, loss, 60));
  RunToSuccess(straight, dir + "/straight");
  const std::string first = WriteTextFile(
      dir + "/first.yaml", CnnJobYaml("OneDevice", "    Worker: {replicas: 1}\n",
                                      kCnnWithDropoutAndBatchNorm, loss, 30));
  RunToSuccess(first, dir + "/resumed");
  const std::string out = RunToSuccess(straight, dir + "/resumed");
  EXPECT_NE(out.find("resumed from checkpoint step 30"), std::string::npos) << out;
  const auto want = FinalVariables(dir + "/straight/ckpt", 60);
  const auto got = FinalVariables(dir + "/resumed/ckpt", 60);
  ASSERT_TRUE(want.count("variables/batch_normalization/moving_variance"));
  ExpectSameVariables(got, want, 0.0f);
  fs::remove_all(dir);
}

TEST(CnnMnistTest, ParameterServerAndEvaluatorTrainTheCnnWithDropout) {
  const std::string dir = FreshTempDir("cnn_ps");
  const char kCnnWithDropout[] =
      "      - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}\n"
      "      - MaxPooling2D: {poolSize: [2, 2]}\n"
      "      - Conv2D: {filters: 64, kernelSize: [3, 3], activation: relu}\n"
      "      - Flatten: {}\n"
      "      - Dropout: {rate: 0.2}\n"
      "      - Dense: {units: 64, activation: relu}\n"
      "      - Dense: {units: 10}\n";
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      CnnJobYaml("ParameterServer",
                 "    Chief: {replicas: 1}\n    Worker: {replicas: 2}\n    PS: {replicas: 2}\n"
                 "    Evaluator: {replicas: 1}\n",
                 kCnnWithDropout, "{type: SparseCategoricalCrossentropy, fromLogits: true}", 150,
                 "    checkpoint: {everySteps: 50}\n"));
  const std::string out = RunToSuccess(job, dir);
  EXPECT_GT(FinalEvalAccuracy(out), 0.8) << out;
  // The Evaluator read the chief's checkpoints of the conv model.
  EXPECT_NE(out.find("[evaluator-0]"), std::string::npos) << out;
  fs::remove_all(dir);
}

// examples/cnn-mnist.yaml with its strategy and replicaSpecs switched as its
// comments say, fewer steps, and the data at absolute paths (the example's
// are relative to the repository root).
struct ExampleCase {
  std::string strategy;
  std::string replica_specs;  // YAML flow map
  int local_replicas = 0;     // 0: leave unset
};

void PrintTo(const ExampleCase& c, std::ostream* os) { *os << c.strategy; }

class CnnExampleTest : public ::testing::TestWithParam<ExampleCase> {};

TEST_P(CnnExampleTest, RunsAndLearns) {
  const ExampleCase& c = GetParam();
  const std::string dir = FreshTempDir("cnn_example_" + c.strategy);
  YAML::Node job = YAML::LoadFile(SourceDir() + "/examples/cnn-mnist.yaml");
  job["spec"]["strategy"] = c.strategy;
  job["spec"]["replicaSpecs"] = YAML::Load(c.replica_specs);
  YAML::Node training = job["spec"]["training"];
  training["steps"] = 60;
  training["evalEverySteps"] = 0;
  training["checkpoint"]["everySteps"] = 30;
  if (c.local_replicas > 0) training["localReplicas"] = c.local_replicas;
  YAML::Node dataset = training["dataset"];
  for (const char* key : {"trainFiles", "trainLabelFiles", "evalFiles", "evalLabelFiles"}) {
    const std::string relative = dataset[key][0].as<std::string>();
    ASSERT_EQ(relative.rfind("data/mnist/", 0), 0u) << key << ": " << relative;
    dataset[key][0] = MnistDir() + relative.substr(std::string("data/mnist").size());
  }
  YAML::Emitter emitter;
  emitter << job;
  const std::string path = WriteTextFile(dir + "/job.yaml", emitter.c_str());
  // 60 steps of the example's batches; chance is 0.1.
  EXPECT_GT(FinalEvalAccuracy(RunToSuccess(path, dir)), 0.6);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    EveryStrategy, CnnExampleTest,
    ::testing::Values(
        ExampleCase{"OneDevice", "{Worker: {replicas: 1}}"},
        ExampleCase{"Mirrored", "{Worker: {replicas: 1}}", 2},
        ExampleCase{"CentralStorage", "{Worker: {replicas: 1}}", 2},
        ExampleCase{"MultiWorkerMirrored",
                    "{Chief: {replicas: 1}, Worker: {replicas: 1}, Evaluator: {replicas: 1}}"},
        ExampleCase{"ParameterServer",
                    "{Chief: {replicas: 1}, Worker: {replicas: 2}, PS: {replicas: 1}}"}),
    [](const ::testing::TestParamInfo<ExampleCase>& info) { return info.param.strategy; });

}  // namespace
}  // namespace distrain

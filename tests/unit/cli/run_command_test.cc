// `distrain run` refuses a job whose model does not fit its data before any
// replica starts (exit code 3), listing every layer problem.
#include "cli/run_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

class RunCommandModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "run-model-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Runs the job; returns the exit code, stderr in *err.
  int Run(const std::string& job_file, std::string* err) {
    RunOptions options;
    options.job_file = job_file;
    options.worker_binary = "/nonexistent/distrain-worker";
    options.work_dir = (dir_ / "work").string();
    options.progress = false;
    ::testing::internal::CaptureStderr();
    const int code = RunJob(options);
    *err = ::testing::internal::GetCapturedStderr();
    return code;
  }

  std::filesystem::path dir_;
};

// An IDX images header (magic 0x00000803, [n, rows, cols]); nothing after it.
std::string IdxHeader(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = {0, 0, 8, 3};
  for (uint32_t v : {n, rows, cols}) {
    for (int shift : {24, 16, 8, 0}) s.push_back(static_cast<char>((v >> shift) & 0xff));
  }
  return s;
}

TEST_F(RunCommandModelTest, ModelThatDoesNotFitTheImagesExitsThreeBeforeStarting) {
  const std::string images = Write("train-images.idx", IdxHeader(2, 28, 28));
  const std::string labels = Write("train-labels.idx", "");
  const std::string job = Write("cnn.yaml", absl::StrCat(R"(apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {name: cnn}
spec:
  strategy: OneDevice
  replicaSpecs: {Worker: {replicas: 1}}
  training:
    dataset: {type: idx, trainFiles: [")", images, R"("], trainLabelFiles: [")", labels, R"("]}
    model:
      layers:
        - Conv2D: {filters: 32, kernelSize: 3, activation: relu, name: features}
        - MaxPooling2D: {poolSize: 2, name: features}
        - Flatten: {}
        - Dense: {units: 64, activation: relu}
        - Conv2D: {filters: 8, kernelSize: 3}
        - Dense: {units: 10}
)"));
  std::string err;
  EXPECT_EQ(Run(job, &err), kExitInvalidConfig);
  EXPECT_THAT(err, HasSubstr("spec.training.model.layers[1] (MaxPooling2D): name \"features\" is "
                             "already used by layers[0]"));
  EXPECT_THAT(err, HasSubstr("spec.training.model.layers[4] (Conv2D): expects a 3-D input [rows, "
                             "cols, channels] but gets [64]"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "work")) << "nothing may start: " << err;
}

TEST_F(RunCommandModelTest, BadLayerArgumentsExitThree) {
  const std::string job = Write("bad.yaml", R"(apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {name: bad}
spec:
  strategy: OneDevice
  replicaSpecs: {Worker: {replicas: 1}}
  training:
    model:
      layers:
        - Dense: {units: 0}
        - Dropout: {rate: 1.5}
        - Dense: {unit: 10}
)");
  std::string err;
  EXPECT_EQ(Run(job, &err), kExitInvalidConfig);
  EXPECT_THAT(err,
              HasSubstr("spec.training.model.layers[0].Dense.units: must be a positive integer"));
  EXPECT_THAT(err,
              HasSubstr("spec.training.model.layers[1].Dropout.rate: must be a number in [0, 1)"));
  EXPECT_THAT(err, HasSubstr("spec.training.model.layers[2].Dense.unit: unknown argument of Dense; "
                             "did you mean \"units\"?"));
}

TEST_F(RunCommandModelTest, CsvRowsCheckedAgainstTheFirstLine) {
  const std::string csv = Write("rows.csv", "3,1,2,3,4,5,6,7,8,9\n");
  const std::string job = Write("csv.yaml", absl::StrCat(R"(apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {name: csv}
spec:
  strategy: OneDevice
  replicaSpecs: {Worker: {replicas: 1}}
  training:
    dataset: {type: csv, trainFiles: [")", csv, R"("]}
    model:
      layers:
        - Reshape: {targetShape: [4, 4, 1]}
        - Flatten: {}
        - Dense: {units: 4}
)"));
  std::string err;
  EXPECT_EQ(Run(job, &err), kExitInvalidConfig);
  EXPECT_THAT(err, HasSubstr("spec.training.model.layers[0] (Reshape): targetShape [4, 4, 1] has "
                             "16 elements but its input [9] has 9"));
}

}  // namespace
}  // namespace distrain

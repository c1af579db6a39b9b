// spec.training.dataset for file datasets: the tfrecord fields (parsed,
// defaulted, checked against the type, round-tripped through the worker's
// JSON), the model checked against featureShape before any file is read, and
// trainFiles patterns (ExpandDatasetFiles).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Job(const std::string& dataset, const std::string& extra_training = "") {
  return absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\n"
      "kind: DistributedTrainingJob\n"
      "metadata: {name: data}\n"
      "spec:\n"
      "  replicaSpecs: {Worker: {replicas: 1}}\n"
      "  training:\n"
      "    dataset: ",
      dataset, "\n", extra_training);
}

// Parse + ValidateJobConfig, as every reader of a job does.
absl::Status Check(const std::string& yaml) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(yaml);
  if (!config.ok()) return config.status();
  return ValidateJobConfig(*config);
}

TEST(TfRecordConfigTest, ParsesEveryFieldAndRoundTripsThroughJson) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(
      Job("{type: tfrecord, trainFiles: [data/train-*.tfrecord.gz], evalFiles: [e.tfrecord.gz], "
          "compression: GZIP, featureKey: image_raw, featureShape: [28, 28, 1], "
          "featureEncoding: floatList, labelKey: digit}"));
  ASSERT_TRUE(config.ok()) << config.status();
  const DatasetConfig& d = config->training.dataset;
  EXPECT_EQ(d.type, DatasetType::kTfRecord);
  EXPECT_EQ(d.compression, DataCompression::kGzip);
  EXPECT_EQ(d.feature_key, "image_raw");
  EXPECT_THAT(d.feature_shape, ElementsAre(28, 28, 1));
  EXPECT_EQ(d.feature_encoding, FeatureEncoding::kFloatList);
  EXPECT_EQ(d.label_key, "digit");
  EXPECT_TRUE(ValidateJobConfig(*config).ok()) << ValidateJobConfig(*config);
  absl::StatusOr<JobConfig> back = ParseJobConfigJson(JobConfigToJson(*config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->training.dataset, d);
}

TEST(TfRecordConfigTest, DefaultsAreMnistAsTensorFlowUsersWriteIt) {
  absl::StatusOr<JobConfig> config =
      ParseJobYaml(Job("{type: tfrecord, trainFiles: [t.tfrecord], featureShape: [784]}"));
  ASSERT_TRUE(config.ok()) << config.status();
  const DatasetConfig& d = config->training.dataset;
  EXPECT_EQ(d.compression, DataCompression::kNone);
  EXPECT_EQ(d.feature_key, "image");
  EXPECT_EQ(d.feature_encoding, FeatureEncoding::kUint8Bytes);
  EXPECT_EQ(d.label_key, "label");
  EXPECT_FLOAT_EQ(d.scale, 1.0f / 255);
}

TEST(TfRecordConfigTest, UnknownEnumValuesAreRejectedWithTheChoices) {
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [4], "
                                    "compression: BZIP2}"))
                              .message()),
              HasSubstr("spec.training.dataset.compression: must be one of \"NONE\", \"GZIP\", "
                        "\"ZLIB\", got \"BZIP2\""));
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [4], "
                                    "featureEncoding: png}"))
                              .message()),
              HasSubstr("spec.training.dataset.featureEncoding: must be one of \"uint8Bytes\", "
                        "\"floatList\", \"int64List\", got \"png\""));
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [28, 0]}"))
                              .message()),
              HasSubstr("spec.training.dataset.featureShape[1]"));
}

TEST(TfRecordConfigTest, FeatureShapeAndTrainFilesAreRequired) {
  const std::string message = std::string(Check(Job("{type: tfrecord}")).message());
  EXPECT_THAT(message, HasSubstr("spec.training.dataset.trainFiles: required for dataset type "
                                 "tfrecord"));
  EXPECT_THAT(message, AllOf(HasSubstr("spec.training.dataset.featureShape: required for dataset "
                                       "type tfrecord"),
                             HasSubstr("[28, 28, 1]")));
}

TEST(TfRecordConfigTest, LabelFilesKeysAndFeatureShapeElsewhereAreRejected) {
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], trainLabelFiles: [l], "
                                    "featureShape: [4]}"))
                              .message()),
              HasSubstr("spec.training.dataset.trainLabelFiles: tfrecord examples carry their "
                        "labels in the labelKey feature"));
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [4], "
                                    "labelKey: image}"))
                              .message()),
              HasSubstr("spec.training.dataset.labelKey: is the same feature as featureKey"));
  EXPECT_THAT(std::string(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [4], "
                                    "featureKey: \"\"}"))
                              .message()),
              HasSubstr("spec.training.dataset.featureKey: is empty"));
  EXPECT_THAT(std::string(Check(Job("{type: csv, trainFiles: [t.csv], featureShape: [4]}"))
                              .message()),
              HasSubstr("spec.training.dataset.featureShape: is for dataset type tfrecord only"));
}

// featureShape is the model's input, known without reading any file: the
// layers are checked against it by ValidateJobConfig (so also by the
// operator), and ExampleShapeOf gives it to `distrain run`.
TEST(TfRecordConfigTest, TheModelIsCheckedAgainstFeatureShapeBeforeReadingData) {
  const std::string model =
      "    model:\n"
      "      layers:\n"
      "        - Conv2D: {filters: 4, kernelSize: [3, 3]}\n"
      "        - Flatten: {}\n"
      "        - Dense: {units: 10}\n";
  EXPECT_TRUE(Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [28, 28, 1]}", model))
                  .ok());
  // A flat vector cannot go into a Conv2D: reported from the YAML alone.
  const absl::Status flat =
      Check(Job("{type: tfrecord, trainFiles: [t], featureShape: [784]}", model));
  EXPECT_THAT(std::string(flat.message()), HasSubstr("spec.training.model.layers[0]"));

  DatasetConfig d;
  d.type = DatasetType::kTfRecord;
  d.feature_shape = {28, 28, 1};
  d.train_files = {"/nonexistent/train.tfrecord"};
  EXPECT_EQ(ExampleShapeOf(d).status().code(), absl::StatusCode::kNotFound);
  char tmpl[] = "/tmp/dataset_config_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/train.tfrecord") << "";
  d.train_files = {dir + "/*.tfrecord"};
  absl::StatusOr<std::vector<int64_t>> shape = ExampleShapeOf(d);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (std::vector<int64_t>{28, 28, 1}));
  std::filesystem::remove_all(dir);
}

class ExpandDatasetFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/expand_files_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Created out of order: the expansion must not follow the directory's.
    for (const char* name : {"train-00002.tfrecord.gz", "train-00000.tfrecord.gz",
                             "train-00001.tfrecord.gz", "eval-00000.tfrecord.gz"}) {
      std::ofstream(dir_ + "/" + name) << "x";
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ExpandDatasetFilesTest, PatternsExpandSortedAndPlainPathsStayAsWritten) {
  absl::StatusOr<std::vector<std::string>> files = ExpandDatasetFiles(
      {dir_ + "/train-*.tfrecord.gz", dir_ + "/eval-0000[0-9].tfrecord.gz", "not/here.csv"},
      "spec.training.dataset.trainFiles");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/train-00000.tfrecord.gz",
                                  dir_ + "/train-00001.tfrecord.gz",
                                  dir_ + "/train-00002.tfrecord.gz",
                                  dir_ + "/eval-00000.tfrecord.gz", "not/here.csv"));
}

TEST_F(ExpandDatasetFilesTest, APatternThatMatchesNothingIsAnErrorNamingIt) {
  absl::StatusOr<std::vector<std::string>> files =
      ExpandDatasetFiles({dir_ + "/train-*.tfrecord.gz", dir_ + "/test-*.tfrecord"},
                         "spec.training.dataset.evalFiles");
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(files.status().message()),
              AllOf(HasSubstr("spec.training.dataset.evalFiles[1]"),
                    HasSubstr("'" + dir_ + "/test-*.tfrecord' matches no file")));
}

}  // namespace
}  // namespace distrain

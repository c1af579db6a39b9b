#include "worker/data/dataset.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Rows [first, first + n) with features {row, -row} and label row % classes.
std::unique_ptr<Dataset> Rows(const std::string& name, int first, int n, int classes,
                              int num_features = 2) {
  std::vector<float> features;
  std::vector<int32_t> labels;
  for (int i = first; i < first + n; ++i) {
    features.push_back(static_cast<float>(i));
    for (int j = 1; j < num_features; ++j) features.push_back(static_cast<float>(-i));
    labels.push_back(i % classes);
  }
  return std::make_unique<InMemoryDataset>(name, num_features, classes, std::move(features),
                                           std::move(labels));
}

// First feature of every example, in order.
std::vector<float> FirstFeatures(const Dataset& dataset) {
  std::vector<float> out;
  std::vector<float> row(dataset.num_features());
  for (int64_t i = 0; i < dataset.size(); ++i) {
    int32_t label;
    dataset.Get(i, row.data(), &label);
    out.push_back(row[0]);
  }
  return out;
}

TEST(ConcatDatasetsTest, LaysPartsEndToEnd) {
  std::vector<std::unique_ptr<Dataset>> parts;
  parts.push_back(Rows("a", 0, 3, 3));
  parts.push_back(Rows("b", 3, 1, 5));
  parts.push_back(Rows("c", 4, 2, 2));
  auto dataset = ConcatDatasets(std::move(parts));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 6);
  EXPECT_EQ((*dataset)->num_classes(), 5);
  EXPECT_THAT(FirstFeatures(**dataset), ElementsAre(0, 1, 2, 3, 4, 5));
  std::vector<float> row(2);
  int32_t label;
  (*dataset)->Get(3, row.data(), &label);
  EXPECT_EQ(label, 3 % 5);
  EXPECT_THAT(row, ElementsAre(3, -3));
}

TEST(ConcatDatasetsTest, FeatureCountMismatchNamesBothParts) {
  std::vector<std::unique_ptr<Dataset>> parts;
  parts.push_back(Rows("first.csv", 0, 3, 3, 2));
  parts.push_back(Rows("second.csv", 0, 3, 3, 4));
  auto dataset = ConcatDatasets(std::move(parts));
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(std::string(dataset.status().message()),
              AllOf(HasSubstr("second.csv has 4 features"), HasSubstr("first.csv has 2")));
}

TEST(ConcatDatasetsTest, KeepsThePartsExampleShape) {
  std::vector<std::unique_ptr<Dataset>> parts;
  for (int k = 0; k < 2; ++k) {
    parts.push_back(std::make_unique<InMemoryDataset>(
        absl::StrCat("img", k), 6, 3, std::vector<float>(12, 0.5f), std::vector<int32_t>{0, 2},
        std::vector<int64_t>{2, 3, 1}));
  }
  auto dataset = ConcatDatasets(std::move(parts));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 4);
  EXPECT_THAT((*dataset)->example_shape(), ElementsAre(2, 3, 1));
}

TEST(ConcatDatasetsTest, ShapeMismatchWithEqualFeatureCountNamesBothParts) {
  std::vector<std::unique_ptr<Dataset>> parts;
  parts.push_back(std::make_unique<InMemoryDataset>("wide.idx", 6, 3, std::vector<float>(6),
                                                    std::vector<int32_t>{1},
                                                    std::vector<int64_t>{2, 3, 1}));
  parts.push_back(std::make_unique<InMemoryDataset>("tall.idx", 6, 3, std::vector<float>(6),
                                                    std::vector<int32_t>{1},
                                                    std::vector<int64_t>{3, 2, 1}));
  auto dataset = ConcatDatasets(std::move(parts));
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(std::string(dataset.status().message()),
              AllOf(HasSubstr("tall.idx has examples of shape [3, 2, 1]"),
                    HasSubstr("wide.idx has [2, 3, 1]")));
}

TEST(InMemoryDatasetTest, DefaultExampleShapeIsFlat) {
  EXPECT_THAT(Rows("rows", 0, 3, 3, 4)->example_shape(), ElementsAre(4));
}

TEST(ConcatDatasetsTest, EmptyListIsAnError) { EXPECT_FALSE(ConcatDatasets({}).ok()); }

// A model that starts with Embedding accepts only whole-number ids below
// inputDim; the first bad one is named with the fix. Other models take any
// features.
TEST(CheckTokenIdsTest, EmbeddingModelsNeedWholeIdsBelowInputDim) {
  ModelConfig model;
  model.type = "sequential";
  LayerConfig input;
  input.kind = LayerKind::kInput;
  input.shape = {3};
  LayerConfig embedding;
  embedding.kind = LayerKind::kEmbedding;
  embedding.input_dim = 10;
  embedding.output_dim = 4;
  model.layers = {input, embedding};
  auto data = [](std::vector<float> features) {
    const size_t n = features.size() / 3;
    return InMemoryDataset("tokens.csv", 3, 2, std::move(features), std::vector<int32_t>(n, 0));
  };
  EXPECT_TRUE(CheckTokenIds(data({0, 9, 3, 1, 1, 1}), model).ok());
  for (const auto& [features, value] : std::vector<std::pair<std::vector<float>, std::string>>{
           {{0, 9, 3, 1, 10, 1}, "10"}, {{0, 9, 3, 1, 2.5f, 1}, "2.5"},
           {{0, 9, 3, 1, -1, 1}, "-1"}}) {
    const absl::Status s = CheckTokenIds(data(features), model);
    EXPECT_THAT(s.message(), AllOf(HasSubstr(absl::StrCat("tokens.csv: example 1, feature 1 is ",
                                                          value)),
                                   HasSubstr("spec.training.model.layers[1] (Embedding)"),
                                   HasSubstr("[0, 10) (inputDim: 10)")))
        << s;
  }
  model.layers = {input};  // no Embedding: real-valued features are fine
  EXPECT_TRUE(CheckTokenIds(data({0.5f, -3, 2.5f}), model).ok());
}

TEST(OpenTrainingInputTest, SyntheticResolvesPolicies) {
  DatasetConfig config;
  config.num_examples = 50;
  config.num_features = 3;
  struct Case {
    AutoShardPolicy policy;
    AutoShardPolicy effective;
  };
  for (Case c : {Case{AutoShardPolicy::kAuto, AutoShardPolicy::kData},
                 Case{AutoShardPolicy::kData, AutoShardPolicy::kData},
                 Case{AutoShardPolicy::kOff, AutoShardPolicy::kOff}}) {
    config.auto_shard_policy = c.policy;
    auto input = OpenTrainingInput(config, 1, 1, 3);
    ASSERT_TRUE(input.ok()) << input.status();
    EXPECT_EQ(input->effective_policy, c.effective);
    EXPECT_EQ(input->dataset->size(), 50);  // every pipeline holds all; the batcher strides
  }
}

TEST(OpenTrainingInputTest, FileShardingOfSyntheticDataExplainsWhy) {
  DatasetConfig config;
  config.auto_shard_policy = AutoShardPolicy::kFile;
  auto input = OpenTrainingInput(config, 1, 0, 2);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              AllOf(HasSubstr("spec.training.dataset.autoShardPolicy"), HasSubstr("trainFiles"),
                    HasSubstr("synthetic")));
}

TEST(OpenTrainingInputTest, RejectsBadShardIndex) {
  DatasetConfig config;
  config.num_examples = 10;
  config.num_features = 2;
  EXPECT_FALSE(OpenTrainingInput(config, 1, 2, 2).ok());
  EXPECT_FALSE(OpenTrainingInput(config, 1, 0, 0).ok());
}

class FileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/input_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // CSV file k holds rows with first feature 100*k + r and label r % 3.
  DatasetConfig CsvConfig(int num_files, int rows_per_file = 2) {
    DatasetConfig config;
    config.type = DatasetType::kCsv;
    config.num_classes = 3;
    config.label_column = 0;
    for (int k = 0; k < num_files; ++k) {
      const std::string path = absl::StrCat(dir_, "/part", k, ".csv");
      std::ofstream out(path);
      for (int r = 0; r < rows_per_file; ++r) out << r % 3 << "," << 100 * k + r << ",0\n";
      config.train_files.push_back(path);
    }
    return config;
  }

  std::string dir_;
};

TEST_F(FileInputTest, IdxShapeSurvivesShardingAndEval) {
  // Two IDX files of 4x5 images: the shape must reach the model through
  // every wrapper (FILE shards, DATA/OFF concatenations, the eval set).
  auto put = [](std::string* out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
  };
  DatasetConfig config;
  config.type = DatasetType::kIdx;
  config.num_classes = 10;
  config.scale = 1.0f / 255;
  for (int k = 0; k < 2; ++k) {
    std::string images, labels;
    put(&images, 0x803);
    put(&images, 3);
    put(&images, 4);
    put(&images, 5);
    images.append(3 * 4 * 5, static_cast<char>(k));
    put(&labels, 0x801);
    put(&labels, 3);
    labels.append({1, 2, 3});
    const std::string image_path = absl::StrCat(dir_, "/img", k, ".idx");
    const std::string label_path = absl::StrCat(dir_, "/lbl", k, ".idx");
    std::ofstream(image_path, std::ios::binary) << images;
    std::ofstream(label_path, std::ios::binary) << labels;
    config.train_files.push_back(image_path);
    config.train_label_files.push_back(label_path);
  }
  config.eval_files = config.train_files;
  config.eval_label_files = config.train_label_files;
  for (AutoShardPolicy policy :
       {AutoShardPolicy::kFile, AutoShardPolicy::kData, AutoShardPolicy::kOff}) {
    config.auto_shard_policy = policy;
    auto input = OpenTrainingInput(config, 1, 1, 2);
    ASSERT_TRUE(input.ok()) << input.status();
    EXPECT_EQ(input->dataset->num_features(), 20);
    EXPECT_THAT(input->dataset->example_shape(), ElementsAre(4, 5, 1));
  }
  auto eval = OpenEvalDataset(config, 1);
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_NE(*eval, nullptr);
  EXPECT_EQ((*eval)->size(), 6);
  EXPECT_THAT((*eval)->example_shape(), ElementsAre(4, 5, 1));
}

TEST_F(FileInputTest, FileShardingSplitsFilesRoundRobin) {
  DatasetConfig config = CsvConfig(5);
  config.auto_shard_policy = AutoShardPolicy::kFile;
  auto shard0 = OpenTrainingInput(config, 1, 0, 2);
  auto shard1 = OpenTrainingInput(config, 1, 1, 2);
  ASSERT_TRUE(shard0.ok()) << shard0.status();
  ASSERT_TRUE(shard1.ok()) << shard1.status();
  EXPECT_EQ(shard0->effective_policy, AutoShardPolicy::kFile);
  EXPECT_THAT(FirstFeatures(*shard0->dataset), ElementsAre(0, 1, 200, 201, 400, 401));
  EXPECT_THAT(FirstFeatures(*shard1->dataset), ElementsAre(100, 101, 300, 301));
}

TEST_F(FileInputTest, AutoPicksFileWhenEveryShardGetsAFileElseData) {
  DatasetConfig config = CsvConfig(3);
  config.auto_shard_policy = AutoShardPolicy::kAuto;
  auto three = OpenTrainingInput(config, 1, 2, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->effective_policy, AutoShardPolicy::kFile);
  EXPECT_THAT(FirstFeatures(*three->dataset), ElementsAre(200, 201));

  auto four = OpenTrainingInput(config, 1, 3, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->effective_policy, AutoShardPolicy::kData);
  EXPECT_THAT(FirstFeatures(*four->dataset), ElementsAre(0, 1, 100, 101, 200, 201));
}

TEST_F(FileInputTest, DataAndOffReadEveryFile) {
  DatasetConfig config = CsvConfig(3);
  for (AutoShardPolicy policy : {AutoShardPolicy::kData, AutoShardPolicy::kOff}) {
    config.auto_shard_policy = policy;
    auto input = OpenTrainingInput(config, 1, 1, 2);
    ASSERT_TRUE(input.ok()) << input.status();
    EXPECT_EQ(input->effective_policy, policy);
    EXPECT_THAT(FirstFeatures(*input->dataset), ElementsAre(0, 1, 100, 101, 200, 201));
  }
}

TEST_F(FileInputTest, FileShardingWithTooFewFilesNamesTheFields) {
  DatasetConfig config = CsvConfig(2);
  config.auto_shard_policy = AutoShardPolicy::kFile;
  auto input = OpenTrainingInput(config, 1, 0, 3);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              AllOf(HasSubstr("spec.training.dataset.autoShardPolicy"),
                    HasSubstr("spec.training.dataset.trainFiles has 2 for 3")));
}

TEST_F(FileInputTest, EveryShardReportsTheConfiguredClassCount) {
  // Labels only reach 2 in these files, but numClasses says 7: every shard
  // (and so every replica's model) must agree on 7.
  DatasetConfig config = CsvConfig(2);
  config.num_classes = 7;
  auto input = OpenTrainingInput(config, 1, 0, 2);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->dataset->num_classes(), 7);
}

TEST_F(FileInputTest, ErrorsNameTheConfigPath) {
  DatasetConfig no_files;
  no_files.type = DatasetType::kCsv;
  auto input = OpenTrainingInput(no_files, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()), HasSubstr("spec.training.dataset.trainFiles"));

  DatasetConfig too_few_classes = CsvConfig(1, 3);  // labels 0..2
  too_few_classes.num_classes = 2;
  input = OpenTrainingInput(too_few_classes, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              AllOf(HasSubstr("spec.training.dataset.trainFiles[0]"), HasSubstr("numClasses 2")));

  DatasetConfig idx;
  idx.type = DatasetType::kIdx;
  idx.train_files = {dir_ + "/a.idx", dir_ + "/b.idx"};
  idx.train_label_files = {dir_ + "/a-labels.idx"};
  input = OpenTrainingInput(idx, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              HasSubstr("spec.training.dataset.trainLabelFiles"));

  DatasetConfig missing = CsvConfig(2);
  missing.train_files.push_back(dir_ + "/missing.csv");
  input = OpenTrainingInput(missing, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              AllOf(HasSubstr("spec.training.dataset.trainFiles[2]"), HasSubstr("missing.csv")));
}

TEST_F(FileInputTest, EvalDatasetReadsEvalFilesOrIsAbsent) {
  DatasetConfig config = CsvConfig(2);
  auto none = OpenEvalDataset(config, 1);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  config.eval_files = config.train_files;
  config.train_files.clear();
  auto eval = OpenEvalDataset(config, 1);
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_NE(*eval, nullptr);
  EXPECT_THAT(FirstFeatures(**eval), ElementsAre(0, 1, 100, 101));
  EXPECT_EQ((*eval)->num_classes(), 3);
}

TEST(OpenEvalDatasetTest, SyntheticEvalUsesEvalSizeOrIsAbsent) {
  DatasetConfig config;
  config.num_examples = 40;
  config.num_eval_examples = 15;
  config.num_features = 4;
  auto eval = OpenEvalDataset(config, 3);
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_NE(*eval, nullptr);
  EXPECT_EQ((*eval)->size(), 15);
  config.num_eval_examples = 0;
  eval = OpenEvalDataset(config, 3);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(*eval, nullptr);
}

}  // namespace
}  // namespace distrain

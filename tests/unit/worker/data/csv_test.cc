#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CsvLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/csv_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::string dir_;
};

std::vector<float> Row(const Dataset& dataset, int64_t i, int32_t* label) {
  std::vector<float> features(dataset.num_features());
  dataset.Get(i, features.data(), label);
  return features;
}

TEST_F(CsvLoaderTest, ParsesFeaturesAroundTheLabelColumn) {
  const std::string path = Write("ok.csv",
                                 "a,label,b\r\n"
                                 "1.5, 2 ,-3\r\n"
                                 "\r\n"
                                 "+4e1,0,.25\n"
                                 "7,4.0,8");  // integral float label, no final newline
  auto dataset = LoadCsvDataset(path, /*label_column=*/1, /*header=*/true, /*num_classes=*/0);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 3);
  EXPECT_EQ((*dataset)->num_features(), 2);
  EXPECT_EQ((*dataset)->num_classes(), 5);
  EXPECT_EQ((*dataset)->description(), path);
  int32_t label;
  EXPECT_THAT(Row(**dataset, 0, &label), ElementsAre(1.5f, -3.0f));
  EXPECT_EQ(label, 2);
  EXPECT_THAT(Row(**dataset, 1, &label), ElementsAre(40.0f, 0.25f));
  EXPECT_EQ(label, 0);
  EXPECT_THAT(Row(**dataset, 2, &label), ElementsAre(7.0f, 8.0f));
  EXPECT_EQ(label, 4);
}

TEST_F(CsvLoaderTest, NumClassesParameterSetsTheClassCount) {
  auto dataset = LoadCsvDataset(Write("ok.csv", "0,1\n1,2\n"), 0, false, 10);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->num_classes(), 10);
}

TEST_F(CsvLoaderTest, BadInputNamesFileLineAndColumn) {
  struct Case {
    const char* name;
    const char* text;
    int label_column;
    bool header;
    int num_classes;
    std::vector<const char*> expected;
  };
  const Case cases[] = {
      {"value", "1,2,3\n1,x2,3\n", 0, false, 0, {":2: column 2: \"x2\" is not a finite number"}},
      {"empty_value",
       "h,h,h\n1,2,3\n1,,3\n",
       0,
       true,
       0,
       {":3: column 2: \"\" is not a finite number"}},
      {"nan_value", "1,2,nan\n", 0, false, 0, {":1: column 3"}},
      {"too_few_columns", "1,2,3\n1,2\n", 0, false, 0, {":2: found 2 columns, expected 3"}},
      {"too_many_vs_header",
       "a,b\n1,2\n1,2,3\n",
       0,
       true,
       0,
       {":3: found 3 columns, expected 2 like the header"}},
      {"negative_label",
       "1,2\n-1,2\n",
       0,
       false,
       0,
       {":2: column 1: label \"-1\" is not a non-negative integer"}},
      {"fractional_label", "1,2\n1,2.5\n", 1, false, 0, {":2: column 2: label \"2.5\""}},
      {"text_label", "cat,2\n", 0, false, 0, {":1: column 1: label \"cat\""}},
      {"label_too_big",
       "1,2\n9,2\n",
       0,
       false,
       5,
       {":2: column 1: label 9 is not below numClasses 5"}},
      {"label_column_out_of_range",
       "1,2\n",
       2,
       false,
       0,
       {":1: labelColumn 2 is out of range", "2 columns"}},
      {"negative_label_column",
       "1,2\n",
       -1,
       false,
       0,
       {": labelColumn must be a 0-based column index"}},
      {"one_column", "1\n2\n", 0, false, 0, {":1: found 1 column"}},
      {"no_rows", "a,b\n\n", 0, true, 0, {": has no data rows"}},
  };
  for (const Case& c : cases) {
    const std::string path = Write(std::string(c.name) + ".csv", c.text);
    auto dataset = LoadCsvDataset(path, c.label_column, c.header, c.num_classes);
    ASSERT_FALSE(dataset.ok()) << c.name;
    const std::string message(dataset.status().message());
    EXPECT_THAT(message, HasSubstr(path)) << c.name;
    // The first part follows the path directly ("<path>:<line>: ..."); the rest anywhere.
    for (size_t k = 0; k < c.expected.size(); ++k) {
      EXPECT_THAT(message, HasSubstr(k == 0 ? path + c.expected[k] : std::string(c.expected[k])))
          << c.name;
    }
  }
}

TEST_F(CsvLoaderTest, MissingFileIsNotFound) {
  auto dataset = LoadCsvDataset(dir_ + "/missing.csv", 0, false, 0);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(dataset.status().message()), HasSubstr("missing.csv"));
}

}  // namespace
}  // namespace distrain

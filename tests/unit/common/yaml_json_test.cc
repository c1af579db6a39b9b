#include "common/yaml_json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

struct ScalarCase {
  std::string yaml_value;
  std::string expected_json;  // the value as compact JSON
};

void PrintTo(const ScalarCase& c, std::ostream* os) { *os << c.yaml_value; }

class YamlScalarTest : public ::testing::TestWithParam<ScalarCase> {};

TEST_P(YamlScalarTest, ReadsScalarLikeKubernetes) {
  const ScalarCase& c = GetParam();
  absl::StatusOr<YamlJson> result = YamlToJson("v: " + c.yaml_value + "\n");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->value["v"].dump(), c.expected_json) << "YAML: " << c.yaml_value;
}

INSTANTIATE_TEST_SUITE_P(
    CoreSchema, YamlScalarTest,
    ::testing::Values(ScalarCase{"256", "256"}, ScalarCase{"-3", "-3"}, ScalarCase{"+7", "7"},
                      ScalarCase{"0x1F", "31"}, ScalarCase{"0o17", "15"}, ScalarCase{"1.5", "1.5"},
                      ScalarCase{"1e-7", "1e-07"}, ScalarCase{".5", "0.5"},
                      ScalarCase{"true", "true"}, ScalarCase{"False", "false"},
                      ScalarCase{"~", "null"}, ScalarCase{"null", "null"}, ScalarCase{"", "null"},
                      // Quoted scalars stay strings: "256" is not a number.
                      ScalarCase{"\"256\"", "\"256\""}, ScalarCase{"'true'", "\"true\""},
                      ScalarCase{"'null'", "\"null\""},
                      // YAML 1.1 booleans are strings in the 1.2 core schema.
                      ScalarCase{"yes", "\"yes\""}, ScalarCase{"off", "\"off\""},
                      ScalarCase{"abc", "\"abc\""}, ScalarCase{"1.2.3", "\"1.2.3\""},
                      ScalarCase{".inf", "\".inf\""},
                      // Explicit tags win.
                      ScalarCase{"!!str 5", "\"5\""}, ScalarCase{"!!float 5", "5.0"},
                      ScalarCase{"!!int \"12\"", "12"},
                      // Beyond 64 bits: kept as a float, like JSON.
                      ScalarCase{"123456789012345678901234567890", "1.2345678901234568e+29"}));

TEST(YamlJsonTest, BlockScalarIsAString) {
  auto result = YamlToJson("v: |\n  42\n");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->value["v"], "42\n");
}

TEST(YamlJsonTest, KeepsDocumentOrderAndNesting) {
  auto result = YamlToJson("b: 1\na:\n  z: [1, \"x\", {k: v}]\n  y: null\n");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->value.dump(), R"({"b":1,"a":{"z":[1,"x",{"k":"v"}],"y":null}})");
}

TEST(YamlJsonTest, RecordsOneBasedLocationsByPath) {
  auto result = YamlToJson("spec:\n  training:\n    hiddenUnits:\n      - 1\n      - 2\n");
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->locations.count("spec.training.hiddenUnits"));
  EXPECT_EQ(result->locations.at("spec.training").line, 2);
  EXPECT_EQ(result->locations.at("spec.training").column, 3);
  EXPECT_EQ(result->locations.at("spec.training.hiddenUnits").line, 3);
  EXPECT_EQ(result->locations.at("spec.training.hiddenUnits[1]").line, 5);
}

TEST(YamlJsonTest, SyntaxErrorNamesLineAndColumn) {
  auto result = YamlToJson("a: 1\nb: [1, 2\nc: 3\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("YAML syntax error at line 3, column"));
}

TEST(YamlJsonTest, DuplicateKeyIsAnError) {
  auto result = YamlToJson("a: 1\nb: 2\na: 3\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("line 3, column 1: duplicate key \"a\""));
}

TEST(YamlJsonTest, ComplexKeyIsAnError) {
  auto result = YamlToJson("? [a, b]\n: 1\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("mapping keys must be plain strings"));
}

TEST(YamlJsonTest, SeveralDocumentsAreAnError) {
  auto result = YamlToJson("a: 1\n---\nb: 2\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("the file has 2 YAML documents"));
}

TEST(YamlJsonTest, LeadingSeparatorAndEmptyInputAreFine) {
  auto one = YamlToJson("---\na: 1\n");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->value["a"], 1);
  auto empty = YamlToJson("");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->value.is_null());
}

TEST(YamlJsonTest, BadExplicitTagIsAnError) {
  auto result = YamlToJson("v: !!int abc\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("line 1, column 4: \"abc\" is not a valid int"));
}

// Found by tests/fuzz/job_yaml_fuzz (corpus regression-stray-comma):
// yaml-cpp's LoadAll never returned on a stray ',' at block level.
TEST(YamlJsonTest, AStrayCommaIsASyntaxErrorNotAHang) {
  for (const char* yaml : {",", ", a", ", dataset shaped like MNIST (784 features, 10 classes)"}) {
    absl::StatusOr<YamlJson> result = YamlToJson(yaml);
    ASSERT_FALSE(result.ok()) << yaml;
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("','")) << yaml;
  }
  EXPECT_FALSE(YamlToJson("spec:\n  strategy: OneDevice\n, dataset (784, 10)\n").ok());
  // Commas inside flow lists and in scalars are still fine; so are several "---".
  EXPECT_TRUE(YamlToJson("a: [1, 2]\nb: x, y\n").ok());
  EXPECT_TRUE(YamlToJson("---\na: 1\n---\n").ok());
}

}  // namespace
}  // namespace distrain

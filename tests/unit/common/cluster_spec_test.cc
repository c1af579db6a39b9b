#include "common/cluster_spec.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace distrain {
namespace {

using ::testing::HasSubstr;

struct ValidCase {
  std::string name;
  std::string tf_config;
  int chiefs, workers, ps, evaluators;
  TaskId chief_task;
  std::optional<int> my_rank;
  bool is_chief;
  int training_tasks;
};

void PrintTo(const ValidCase& c, std::ostream* os) { *os << c.name; }

class ClusterSpecValidTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ClusterSpecValidTest, ParsesShapeRanksAndChief) {
  const ValidCase& c = GetParam();
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(c.tf_config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_tasks("chief"), c.chiefs);
  EXPECT_EQ(spec->num_tasks("worker"), c.workers);
  EXPECT_EQ(spec->num_tasks("ps"), c.ps);
  EXPECT_EQ(spec->num_tasks("evaluator"), c.evaluators);
  EXPECT_EQ(spec->chief_task(), c.chief_task);
  EXPECT_EQ(spec->my_training_rank(), c.my_rank);
  EXPECT_EQ(spec->is_chief(), c.is_chief);
  EXPECT_EQ(spec->num_training_tasks(), c.training_tasks);
  EXPECT_EQ(spec->has_chief(), c.chiefs > 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ClusterSpecValidTest,
    ::testing::Values(
        ValidCase{
            "WorkerOnly",
            R"({"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 1}})",
            0,
            2,
            0,
            0,
            {"worker", 0},
            1,
            false,
            2},
        ValidCase{
            "WorkerZeroIsChiefWithoutChief",
            R"({"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 0}})",
            0,
            2,
            0,
            0,
            {"worker", 0},
            0,
            true,
            2},
        ValidCase{"ChiefAndWorkers",
                  R"({"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222", "w2:2222"]},
                      "task": {"type": "worker", "index": 2}, "environment": "cloud"})",
                  1,
                  3,
                  0,
                  0,
                  {"chief", 0},
                  3,
                  false,
                  4},
        ValidCase{
            "ChiefIsRankZero",
            R"({"cluster": {"chief": ["c:2222"], "worker": ["w0:2222"]}, "task": {"type": "chief", "index": 0}})",
            1,
            1,
            0,
            0,
            {"chief", 0},
            0,
            true,
            2},
        ValidCase{
            "ChiefWorkersPs",
            R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"]},
                      "task": {"type": "ps", "index": 1}})",
            1,
            2,
            2,
            0,
            {"chief", 0},
            std::nullopt,
            false,
            3},
        ValidCase{
            "WithEvaluator",
            R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"],
                                  "evaluator": ["e:1"]},
                      "task": {"type": "evaluator", "index": 0}})",
            1,
            2,
            2,
            1,
            {"chief", 0},
            std::nullopt,
            false,
            3},
        ValidCase{
            "ParameterServerWorker",
            R"({"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
                      "task": {"type": "worker", "index": 0}})",
            1,
            2,
            1,
            0,
            {"chief", 0},
            1,
            false,
            3},
        ValidCase{
            "IPv6AndEmptyEnvironment",
            R"({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]}, "task": {"type": "worker", "index": 0},
                      "environment": ""})",
            0,
            2,
            0,
            0,
            {"worker", 0},
            0,
            true,
            2},
        ValidCase{
            "EmptyJobIsDropped",
            R"({"cluster": {"worker": ["w0:2222"], "ps": []}, "task": {"type": "worker", "index": 0},
                      "rpc_layer": "grpc"})",
            0,
            1,
            0,
            0,
            {"worker", 0},
            0,
            true,
            1}),
    [](const ::testing::TestParamInfo<ValidCase>& info) { return info.param.name; });

TEST(ClusterSpecTest, EnvironmentDefaultsToCloudAndEmptyIsKept) {
  auto spec = ClusterSpec::Parse(
      R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->environment(), "cloud");
  auto empty = ClusterSpec::Parse(
      R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "environment": ""})");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->environment(), "");
}

TEST(ClusterSpecTest, TrainingRanksWithChief) {
  auto spec = ClusterSpec::Create(
      {{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1", "w2:1"}}, {"ps", {"p:1"}}}, {"worker", 0});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->TrainingRank({"chief", 0}), 0);
  EXPECT_EQ(spec->TrainingRank({"worker", 0}), 1);
  EXPECT_EQ(spec->TrainingRank({"worker", 2}), 3);
  EXPECT_EQ(spec->TrainingRank({"worker", 3}), std::nullopt);
  EXPECT_EQ(spec->TrainingRank({"ps", 0}), std::nullopt);
  for (int rank = 0; rank < spec->num_training_tasks(); ++rank) {
    EXPECT_EQ(spec->TrainingRank(spec->TaskForTrainingRank(rank)), rank);
  }
  EXPECT_EQ(spec->TaskForTrainingRank(0), (TaskId{"chief", 0}));
  EXPECT_EQ(spec->TaskForTrainingRank(3), (TaskId{"worker", 2}));
}

TEST(ClusterSpecTest, TrainingRanksWithoutChief) {
  auto spec = ClusterSpec::Create({{"worker", {"w0:1", "w1:1"}}}, {"worker", 1});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->TrainingRank({"worker", 0}), 0);
  EXPECT_EQ(spec->TrainingRank({"worker", 1}), 1);
  EXPECT_EQ(spec->TaskForTrainingRank(1), (TaskId{"worker", 1}));
  EXPECT_EQ(spec->my_training_rank(), 1);
  EXPECT_FALSE(spec->is_chief());
}

TEST(ClusterSpecDeathTest, TaskForTrainingRankOutOfRangeAborts) {
  auto spec = ClusterSpec::Create({{"worker", {"w0:1"}}}, {"worker", 0});
  ASSERT_TRUE(spec.ok());
  EXPECT_DEATH(spec->TaskForTrainingRank(1), "rank 1 of 1");
}

TEST(ClusterSpecTest, AddressLookup) {
  auto spec =
      ClusterSpec::Create({{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:2"}}}, {"worker", 1});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->address({"worker", 1}), "w1:2");
  EXPECT_EQ(spec->my_address(), "w1:2");
  EXPECT_EQ(spec->address({"worker", 2}), std::nullopt);
  EXPECT_EQ(spec->address({"ps", 0}), std::nullopt);
  EXPECT_TRUE(spec->addresses("ps").empty());
  EXPECT_EQ(spec->addresses("worker"), (std::vector<std::string>{"w0:1", "w1:2"}));
}

TEST(ClusterSpecTest, TrainingClusterDropsEvaluatorOnly) {
  auto spec = ClusterSpec::Create(
      {{"chief", {"c:1"}}, {"worker", {"w:1"}}, {"ps", {"p:1"}}, {"evaluator", {"e:1"}}},
      {"worker", 0});
  ASSERT_TRUE(spec.ok()) << spec.status();
  ClusterSpec training = spec->TrainingCluster();
  EXPECT_EQ(training.num_tasks("evaluator"), 0);
  EXPECT_EQ(training.num_tasks("chief"), 1);
  EXPECT_EQ(training.num_tasks("worker"), 1);
  EXPECT_EQ(training.num_tasks("ps"), 1);
  EXPECT_EQ(training.task(), (TaskId{"worker", 0}));
  EXPECT_EQ(spec->num_tasks("evaluator"), 1);  // the original is untouched
}

TEST(ClusterSpecTest, ToJsonHasTensorFlowKeyOrder) {
  auto spec = ClusterSpec::Create({{"worker", {"w0:2222", "w1:2222"}},
                                   {"evaluator", {"e:2222"}},
                                   {"ps", {"p:2222"}},
                                   {"chief", {"c:2222"}}},
                                  {"ps", 0});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ToJson(),
            R"({"cluster":{"chief":["c:2222"],"worker":["w0:2222","w1:2222"],"ps":["p:2222"],)"
            R"("evaluator":["e:2222"]},"task":{"type":"ps","index":0},"environment":"cloud"})");
}

TEST(ClusterSpecTest, ToJsonParseRoundTrip) {
  auto spec = ClusterSpec::Create(
      {{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1"}}, {"ps", {"p0:3", "p1:3"}}}, {"worker", 1},
      "google");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto again = ClusterSpec::Parse(spec->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->jobs(), spec->jobs());
  EXPECT_EQ(again->task(), spec->task());
  EXPECT_EQ(again->environment(), "google");
  EXPECT_EQ(again->ToJson(), spec->ToJson());
}

TEST(ClusterSpecTest, ToJsonIsWhatTensorFlowReads) {
  // The shape TF's TFConfigClusterResolver reads: plain lists and a task object.
  auto spec = ClusterSpec::Create({{"worker", {"job-worker-0.job:2222"}}}, {"worker", 0});
  ASSERT_TRUE(spec.ok());
  nlohmann::json j = nlohmann::json::parse(spec->ToJson());
  EXPECT_EQ(j["cluster"]["worker"][0], "job-worker-0.job:2222");
  EXPECT_EQ(j["task"]["type"], "worker");
  EXPECT_TRUE(j["task"]["index"].is_number_integer());
  EXPECT_EQ(j["environment"], "cloud");
}

struct InvalidCase {
  std::string name;
  std::string tf_config;
  std::string expected;  // substring of the error
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class ClusterSpecInvalidTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(ClusterSpecInvalidTest, ErrorNamesThePath) {
  const InvalidCase& c = GetParam();
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(c.tf_config);
  ASSERT_FALSE(spec.ok()) << c.tf_config;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.expected));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ClusterSpecInvalidTest,
    ::testing::Values(
        InvalidCase{"InvalidJson", R"({"cluster": {"worker": ["a:1"]}, )",
                    "TF_CONFIG: invalid JSON at byte "},
        InvalidCase{"NotAnObject", R"(["a:1"])", "TF_CONFIG: must be a JSON object"},
        InvalidCase{
            "UnknownTopLevelField",
            R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "tsk": 1})",
            "TF_CONFIG.tsk: unknown field"},
        InvalidCase{"MissingCluster", R"({"task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster: required"},
        InvalidCase{"UnknownTaskTypeInCluster",
                    R"({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}})",
                    "TF_CONFIG.cluster.master: unknown task type \"master\"; expected one of "
                    "chief, worker, ps, "
                    "evaluator"},
        InvalidCase{"JobNotAList",
                    R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.worker: must be a list"},
        InvalidCase{
            "AddressNotAString",
            R"({"cluster": {"worker": ["a:1", 7]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.worker[1]: must be a \"host:port\" string, got 7"},
        InvalidCase{
            "NoPort",
            R"({"cluster": {"worker": ["a:1", "host"]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.worker[1]: \"host\" has no port; expected host:port"},
        InvalidCase{"EmptyPort",
                    R"({"cluster": {"worker": ["a:"]}, "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.worker[0]: \"a:\" has no port"},
        InvalidCase{
            "NonNumericPort",
            R"({"cluster": {"worker": ["a:http"]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.worker[0]: \"a:http\" has a non-numeric port"},
        InvalidCase{"PortZero",
                    R"({"cluster": {"worker": ["a:0"]}, "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.worker[0]: port \"0\" in \"a:0\" is out of range; expected "
                    "1..65535"},
        InvalidCase{
            "PortTooLarge",
            R"({"cluster": {"worker": ["a:65536"]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.worker[0]: port \"65536\""},
        InvalidCase{"EmptyHost",
                    R"({"cluster": {"worker": [":2222"]}, "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.worker[0]: \":2222\" has an empty host"},
        InvalidCase{
            "UnbracketedIPv6",
            R"({"cluster": {"worker": ["::1:2222"]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.worker[0]: \"::1:2222\" has more than one ':'"},
        InvalidCase{"TwoChiefs",
                    R"({"cluster": {"chief": ["c0:1", "c1:1"], "worker": ["w:1"]},
                        "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.chief: has 2 tasks; TensorFlow allows at most one chief"},
        InvalidCase{
            "TwoEvaluators",
            R"({"cluster": {"worker": ["w:1"], "evaluator": ["e0:1", "e1:1"]},
                        "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG.cluster.evaluator: has 2 tasks; TensorFlow allows at most one evaluator"},
        InvalidCase{"DuplicateAddress",
                    R"({"cluster": {"chief": ["a:1"], "worker": ["b:1", "a:1"]},
                        "task": {"type": "worker", "index": 0}})",
                    "TF_CONFIG.cluster.worker[1]: \"a:1\" is also cluster.chief[0]"},
        InvalidCase{"NoTrainingTask",
                    R"({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}})",
                    "TF_CONFIG.cluster: has no chief and no worker"},
        InvalidCase{"MissingTask", R"({"cluster": {"worker": ["a:1"]}})",
                    "TF_CONFIG.task: required"},
        InvalidCase{"TaskNotAnObject", R"({"cluster": {"worker": ["a:1"]}, "task": "worker:0"})",
                    "TF_CONFIG.task: must be an object"},
        InvalidCase{"UnknownTaskType",
                    R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}})",
                    "TF_CONFIG.task.type: unknown task type \"master\"; expected one of chief, "
                    "worker, ps, evaluator"},
        InvalidCase{"TaskTypeNotInCluster",
                    R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})",
                    "TF_CONFIG.task.type: \"ps\" is not a job in TF_CONFIG.cluster (jobs: worker)"},
        InvalidCase{"MissingTaskType", R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})",
                    "TF_CONFIG.task.type: required"},
        InvalidCase{"MissingTaskIndex",
                    R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})",
                    "TF_CONFIG.task.index: required"},
        InvalidCase{
            "IndexOutOfRange",
            R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 3}})",
            "TF_CONFIG.task.index: 3 is out of range, cluster.worker has 2 tasks (0..1)"},
        InvalidCase{"NegativeIndex",
                    R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})",
                    "TF_CONFIG.task.index: must be a non-negative integer, got -1"},
        InvalidCase{"StringIndex",
                    R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})",
                    "TF_CONFIG.task.index: must be a non-negative integer, got \"0\""},
        InvalidCase{
            "EnvironmentNotAString",
            R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "environment": 1})",
            "TF_CONFIG.environment: must be a string"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(ClusterSpecTest, CreateAppliesTheSameRules) {
  EXPECT_THAT(
      std::string(
          ClusterSpec::Create({{"worker", {"a:1", "a:1"}}}, {"worker", 0}).status().message()),
      HasSubstr("TF_CONFIG.cluster.worker[1]: \"a:1\" is also cluster.worker[0]"));
  EXPECT_THAT(
      std::string(ClusterSpec::Create({{"worker", {"a:1"}}}, {"worker", 1}).status().message()),
      HasSubstr("TF_CONFIG.task.index: 1 is out of range, cluster.worker has 1 task (0..0)"));
  EXPECT_THAT(
      std::string(ClusterSpec::Create({{"Worker", {"a:1"}}}, {"worker", 0}).status().message()),
      HasSubstr("TF_CONFIG.cluster.Worker: unknown task type"));
}

// Found by tests/fuzz/tf_config_fuzz (corpus regression-number-overflow*): a
// number beyond a double is nlohmann's out_of_range, not a parse_error, and
// escaped Parse, so the worker aborted instead of naming TF_CONFIG.
TEST(ClusterSpecTest, ANumberTooLargeForADoubleIsAnErrorNotACrash) {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(
      R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1e400}})");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("TF_CONFIG: invalid JSON"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("number overflow"));
}

}  // namespace
}  // namespace distrain

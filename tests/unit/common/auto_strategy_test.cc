// spec.strategy: Auto (common/auto_strategy.h): every row of the table, with
// injected facts, and the reason each choice gives.
#include "common/auto_strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

JobConfig Job(const std::string& replicas, const std::string& training = "") {
  auto config = ParseJobYaml(absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: auto}\n"
      "spec:\n  strategy: Auto\n  replicaSpecs:\n",
      replicas, "  training: {globalBatchSize: 96", training, "}\n"));
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig{};
}

DeviceFacts Gpus(int n, std::optional<double> host_device = {},
                 std::optional<double> device_device = {}) {
  DeviceFacts facts;
  facts.gpus = n;
  facts.host_device_gbps = host_device;
  facts.device_device_gbps = device_device;
  return facts;
}

TEST(AutoStrategyTest, EveryRowOfTheTable) {
  const std::string one = "    Worker: {replicas: 1}\n";
  struct Row {
    std::string what;
    JobConfig config;
    DeviceFacts facts;
    StrategyKind want;
    std::string reason;
  };
  const std::vector<Row> rows = {
      {"ps replicas", Job("    Chief: {replicas: 1}\n    Worker: {replicas: 2}\n    PS: {replicas: 2}\n"),
       Gpus(8, 50, 400), StrategyKind::kParameterServer, "2 PS replicas"},
      {"several machines", Job("    Chief: {replicas: 1}\n    Worker: {replicas: 3}\n"), Gpus(8, 50, 400),
       StrategyKind::kMultiWorkerMirrored, "4 training tasks"},
      {"CPU<->GPU faster", Job(one), Gpus(4, 50, 20), StrategyKind::kCentralStorage,
       "CPU<->GPU 50.0 GB/s is faster than GPU<->GPU 20.0 GB/s"},
      {"GPU<->GPU faster", Job(one), Gpus(4, 50, 400), StrategyKind::kMirrored,
       "GPU<->GPU 400.0 GB/s is at least CPU<->GPU 50.0 GB/s"},
      {"GPU<->GPU equal", Job(one), Gpus(2, 30, 30), StrategyKind::kMirrored, "at least"},
      {"GPUs, nothing measured", Job(one), Gpus(2), StrategyKind::kMirrored, "not measured"},
      {"one GPU", Job(one), Gpus(1, 50, 20), StrategyKind::kMirrored, "1 GPU: a replica per GPU"},
      {"CPU replicas", Job(one, ", localReplicas: 4"), Gpus(0), StrategyKind::kMirrored,
       "4 replicas on CPU threads"},
      {"one CPU replica", Job(one), Gpus(0), StrategyKind::kOneDevice, "no GPU"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    const StrategyChoice choice = ChooseAutoStrategy(row.config, row.facts);
    EXPECT_EQ(StrategyName(choice.strategy), std::string(StrategyName(row.want)));
    EXPECT_THAT(choice.reason, HasSubstr(row.reason));
  }
}

TEST(AutoStrategyTest, ResolvingReplacesAutoAndNamesTheChoice) {
  auto resolved = ResolveAutoStrategy(Job("    Chief: {replicas: 1}\n    Worker: {replicas: 2}\n"), {});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->first.strategy, StrategyKind::kMultiWorkerMirrored);
  EXPECT_THAT(resolved->second, HasSubstr("Auto chose MultiWorkerMirrored: 3 training tasks"));
  // Not Auto: unchanged, no reason.
  JobConfig explicit_config = Job("    Worker: {replicas: 1}\n");
  explicit_config.strategy = StrategyKind::kOneDevice;
  auto same = ResolveAutoStrategy(explicit_config, Gpus(4));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->first.strategy, StrategyKind::kOneDevice);
  EXPECT_TRUE(same->second.empty());
}

TEST(AutoStrategyTest, AChoiceWhoseRulesTheSpecBreaksIsRefusedNamingTheChoice) {
  // 3 tasks cannot split a global batch of 96 + 1: MultiWorkerMirrored's rule.
  JobConfig config = Job("    Chief: {replicas: 1}\n    Worker: {replicas: 2}\n");
  config.training.global_batch_size = 97;
  auto resolved = ResolveAutoStrategy(config, {});
  ASSERT_FALSE(resolved.ok());
  EXPECT_THAT(std::string(resolved.status().message()),
              HasSubstr("Auto chose MultiWorkerMirrored"));
  EXPECT_THAT(std::string(resolved.status().message()), HasSubstr("globalBatchSize"));
}

}  // namespace
}  // namespace distrain

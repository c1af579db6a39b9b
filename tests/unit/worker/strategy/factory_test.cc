#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "worker/strategy/strategy.h"

namespace distrain {
namespace {

struct SupportCase {
  std::string name;
  StrategyKind strategy;
  CollectiveImplementation implementation;
  absl::StatusCode want;
  std::string message_part;  // must appear in the message when not OK
};

class CheckStrategySupportedTest : public ::testing::TestWithParam<SupportCase> {};

TEST_P(CheckStrategySupportedTest, AcceptsImplementedStrategiesAndExplainsTheRest) {
  const SupportCase& c = GetParam();
  JobConfig config;
  config.strategy = c.strategy;
  config.training.communication.implementation = c.implementation;
  absl::Status s = CheckStrategySupported(config);
  EXPECT_EQ(s.code(), c.want) << s;
  if (!s.ok()) {
    EXPECT_NE(s.message().find(c.message_part), std::string::npos) << s;
  }
  auto created = CreateStrategy(config);
  EXPECT_EQ(created.status().code(), c.want);
  if (created.ok()) {
    EXPECT_STREQ((*created)->name(), StrategyName(c.strategy));
  }
}

// NCCL on this machine: every strategy without GPU replicas here refuses it,
// naming the field, with the reason this process has (a CPU-only build, no
// visible GPU, or a strategy that trains on CPU threads) — never a ring that
// quietly stands in for it. On a GPU machine the GPU strategies accept it.
TEST(CheckStrategySupportedNcclTest, EveryStrategyRefusesNcclWithTheFieldAndNoStrategyIsMade) {
  for (StrategyKind strategy : {StrategyKind::kOneDevice, StrategyKind::kMirrored,
                                StrategyKind::kMultiWorkerMirrored, StrategyKind::kCentralStorage,
                                StrategyKind::kParameterServer}) {
    JobConfig config;
    config.strategy = strategy;
    config.training.communication.implementation = CollectiveImplementation::kNccl;
    const absl::Status s = CheckStrategySupported(config);
    const DeviceUseFacts facts = ThisProcessDeviceFacts();
    if (facts.cuda_build && facts.visible_gpus > 0 && StrategyTrainsOnGpus(strategy)) {
      EXPECT_TRUE(s.ok()) << StrategyName(strategy) << " trains on this machine's GPUs: " << s;
      continue;
    }
    const absl::StatusCode want = facts.cuda_build && facts.visible_gpus == 0
                                      ? absl::StatusCode::kFailedPrecondition
                                      : absl::StatusCode::kUnimplemented;
    EXPECT_EQ(s.code(), want) << StrategyName(strategy) << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), "spec.training.communication.implementation: NCCL"))
        << s;
    EXPECT_EQ(CreateStrategy(config).status().code(), want) << StrategyName(strategy);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, CheckStrategySupportedTest,
    ::testing::Values(
        SupportCase{"OneDevice", StrategyKind::kOneDevice, CollectiveImplementation::kAuto,
                    absl::StatusCode::kOk, ""},
        SupportCase{"Mirrored", StrategyKind::kMirrored, CollectiveImplementation::kAuto,
                    absl::StatusCode::kOk, ""},
        SupportCase{"MultiWorkerMirroredAuto", StrategyKind::kMultiWorkerMirrored,
                    CollectiveImplementation::kAuto, absl::StatusCode::kOk, ""},
        SupportCase{"MultiWorkerMirroredRing", StrategyKind::kMultiWorkerMirrored,
                    CollectiveImplementation::kRing, absl::StatusCode::kOk, ""},
        SupportCase{"CentralStorage", StrategyKind::kCentralStorage,
                    CollectiveImplementation::kAuto, absl::StatusCode::kOk, ""},
        SupportCase{"TpuRunsTheUsersImage", StrategyKind::kTPU, CollectiveImplementation::kAuto,
                    absl::StatusCode::kFailedPrecondition, "TPU"}),
    [](const ::testing::TestParamInfo<SupportCase>& info) { return info.param.name; });

}  // namespace
}  // namespace distrain

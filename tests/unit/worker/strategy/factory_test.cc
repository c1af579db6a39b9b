#include <gtest/gtest.h>

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
#ifndef DISTRAIN_HAVE_CUDA
        // A CPU-only build: a configuration error naming the field and the fix.
        SupportCase{"MultiWorkerMirroredNcclOnCpuBuild", StrategyKind::kMultiWorkerMirrored,
                    CollectiveImplementation::kNccl, absl::StatusCode::kInvalidArgument,
                    "spec.training.communication.implementation: NCCL needs GPUs and a CUDA build"},
#endif
        SupportCase{"CentralStorage", StrategyKind::kCentralStorage,
                    CollectiveImplementation::kAuto, absl::StatusCode::kOk, ""},
        SupportCase{"TpuRunsTheUsersImage", StrategyKind::kTPU, CollectiveImplementation::kAuto,
                    absl::StatusCode::kFailedPrecondition, "TPU"}),
    [](const ::testing::TestParamInfo<SupportCase>& info) { return info.param.name; });

}  // namespace
}  // namespace distrain

// The device rule (common/device_use.h): a job never trains on CPU threads
// while its pod holds GPUs, and never asks for NCCL where NCCL cannot run;
// each refusal names the field to change.
#include "common/device_use.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace distrain {
namespace {

JobConfig Job(StrategyKind strategy, CollectiveImplementation implementation) {
  JobConfig config;
  config.strategy = strategy;
  config.training.communication.implementation = implementation;
  return config;
}

TEST(DeviceUseTest, CpuJobsWithoutGpusRunOnAnyBuild) {
  for (bool cuda_build : {false, true}) {
    for (int visible : {0, 8}) {
      const DeviceUseFacts facts{cuda_build, cuda_build ? visible : 0, 0, false};
      for (CollectiveImplementation impl : {CollectiveImplementation::kAuto,
                                            CollectiveImplementation::kRing}) {
        EXPECT_TRUE(CheckDeviceUse(Job(StrategyKind::kMirrored, impl), facts).ok())
            << "a GPU host that lends this process nothing still trains on CPU";
      }
    }
  }
}

TEST(DeviceUseTest, NcclOnACpuOnlyBuildNamesTheFieldAndTheImageToUse) {
  const absl::Status s = CheckDeviceUse(
      Job(StrategyKind::kMultiWorkerMirrored, CollectiveImplementation::kNccl), DeviceUseFacts{});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StartsWith(s.message(), "spec.training.communication.implementation: NCCL"));
  EXPECT_TRUE(absl::StrContains(s.message(), "CPU-only build")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "implementation: Ring")) << s;
}

TEST(DeviceUseTest, NcclWithoutAVisibleGpuIsAFailedPrecondition) {
  const absl::Status s =
      CheckDeviceUse(Job(StrategyKind::kMirrored, CollectiveImplementation::kNccl),
                     DeviceUseFacts{/*cuda_build=*/true, /*visible_gpus=*/0, 0, true});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "sees none")) << s;
}

TEST(DeviceUseTest, NcclNeedsGpuReplicasInTheBuild) {
  const JobConfig job = Job(StrategyKind::kMirrored, CollectiveImplementation::kNccl);
  const absl::Status without = CheckDeviceUse(job, DeviceUseFacts{true, 2, 2, false});
  EXPECT_EQ(without.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(without.message(), "Mirrored on CPU threads only")) << without;
  EXPECT_TRUE(CheckDeviceUse(job, DeviceUseFacts{true, 2, 2, true}).ok());
}

TEST(DeviceUseTest, APodHoldingGpusItWouldNotUseIsRefusedNamingTheRequest) {
  const absl::Status s =
      CheckDeviceUse(Job(StrategyKind::kOneDevice, CollectiveImplementation::kAuto),
                     DeviceUseFacts{/*cuda_build=*/false, 0, /*held_gpus=*/2, false});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StartsWith(s.message(), "spec.replicaSpecs: this pod holds 2 GPU(s)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "remove the nvidia.com/gpu request")) << s;
  // Once the build's strategies use GPUs, holding them is the point.
  EXPECT_TRUE(CheckDeviceUse(Job(StrategyKind::kOneDevice, CollectiveImplementation::kAuto),
                             DeviceUseFacts{true, 2, 2, true})
                  .ok());
}

}  // namespace
}  // namespace distrain

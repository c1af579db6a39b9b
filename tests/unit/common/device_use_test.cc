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
                             DeviceUseFacts{true, 1, 1, true})
                  .ok());
}

TEST(DeviceUseTest, EverySynchronousStrategyTrainsOnGpusButNotTheParameterServer) {
  EXPECT_TRUE(StrategyTrainsOnGpus(StrategyKind::kOneDevice));
  EXPECT_TRUE(StrategyTrainsOnGpus(StrategyKind::kMirrored));
  EXPECT_TRUE(StrategyTrainsOnGpus(StrategyKind::kCentralStorage));
  EXPECT_TRUE(StrategyTrainsOnGpus(StrategyKind::kMultiWorkerMirrored));
  EXPECT_FALSE(StrategyTrainsOnGpus(StrategyKind::kParameterServer));
}

// Every row of the rule on a CUDA build whose single-process strategies
// train on GPUs (ThisProcessDeviceFacts of a CUDA build), one case each.
struct RuleCase {
  const char* name;
  StrategyKind strategy;
  CollectiveImplementation implementation;
  int local_replicas;
  DeviceUseFacts facts;
  absl::StatusCode want;
  const char* prefix;   // the refusal starts with the field it names
  const char* message;  // and says why
};

class DeviceRuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(DeviceRuleTest, Row) {
  const RuleCase& c = GetParam();
  JobConfig job = Job(c.strategy, c.implementation);
  job.training.local_replicas = c.local_replicas;
  const absl::Status s = CheckDeviceUse(job, c.facts);
  EXPECT_EQ(s.code(), c.want) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), c.prefix)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), c.message)) << s;
}

constexpr auto kOk = absl::StatusCode::kOk;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;
constexpr auto kPrecondition = absl::StatusCode::kFailedPrecondition;
constexpr auto kAuto = CollectiveImplementation::kAuto;
constexpr auto kNccl = CollectiveImplementation::kNccl;
constexpr char kNcclField[] = "spec.training.communication.implementation: NCCL";
constexpr char kHolds[] = "spec.replicaSpecs: this pod holds ";
constexpr char kReplicasField[] = "spec.training.localReplicas: ";
// {cuda_build, visible, held, gpu_strategies}
constexpr DeviceUseFacts kGpuPod{true, 2, 2, true};
constexpr DeviceUseFacts kOneGpuPod{true, 1, 1, true};
constexpr DeviceUseFacts kGpuHostNoPod{true, 2, 0, true};
constexpr DeviceUseFacts kBlindGpuPod{true, 0, 2, true};

INSTANTIATE_TEST_SUITE_P(
    Rows, DeviceRuleTest,
    ::testing::Values(
        // GPU strategies on the GPUs the pod holds, NCCL or not.
        RuleCase{"MirroredNcclOnGpus", StrategyKind::kMirrored, kNccl, 0, kGpuPod, kOk, "", ""},
        RuleCase{"MirroredOnGpus", StrategyKind::kMirrored, kAuto, 0, kGpuPod, kOk, "", ""},
        RuleCase{"MirroredOnePerGpuExplicitly", StrategyKind::kMirrored, kAuto, 2, kGpuPod, kOk,
                 "", ""},
        RuleCase{"CentralStorageOnGpus", StrategyKind::kCentralStorage, kAuto, 0, kGpuPod, kOk, "",
                 ""},
        RuleCase{"OneDeviceOnOneGpu", StrategyKind::kOneDevice, kNccl, 0, kOneGpuPod, kOk, "", ""},
        // A process outside a pod that sees GPUs: the GPU strategies use
        // them, the others train on CPU as they always did.
        RuleCase{"MirroredOnALocalGpuHost", StrategyKind::kMirrored, kAuto, 0, kGpuHostNoPod, kOk,
                 "", ""},
        RuleCase{"MwmsOnALocalGpuHost", StrategyKind::kMultiWorkerMirrored, kAuto, 0,
                 kGpuHostNoPod, kOk, "", ""},
        RuleCase{"MwmsOnGpus", StrategyKind::kMultiWorkerMirrored, kAuto, 0, kGpuPod, kOk, "", ""},
        // MultiWorkerMirrored on GPUs: NCCL across workers, one rank per GPU.
        RuleCase{"MwmsNccl", StrategyKind::kMultiWorkerMirrored, kNccl, 0, kGpuPod, kOk, "", ""},
        // NCCL with a strategy that does not train on GPUs.
        RuleCase{"PsNccl", StrategyKind::kParameterServer, kNccl, 0, kGpuHostNoPod, kUnimplemented,
                 kNcclField, "trains ParameterServer on CPU threads only"},
        // A pod holding GPUs a CPU strategy would leave idle.
        RuleCase{"PsHoldingGpus", StrategyKind::kParameterServer, kAuto, 0, kOneGpuPod,
                 kUnimplemented, kHolds, "remove the nvidia.com/gpu request"},
        // A pod holding GPUs it cannot see would train on CPU threads.
        RuleCase{"HeldButInvisible", StrategyKind::kMirrored, kAuto, 0, kBlindGpuPod,
                 kPrecondition, kHolds, "sees none of them"},
        RuleCase{"NcclHeldButInvisible", StrategyKind::kMirrored, kNccl, 0, kBlindGpuPod,
                 kPrecondition, kNcclField, "sees none"},
        // Fewer replicas than held GPUs.
        RuleCase{"OneDeviceHoldingTwo", StrategyKind::kOneDevice, kAuto, 0, kGpuPod, kPrecondition,
                 kHolds, "OneDevice trains on one GPU and would keep 1 idle"},
        RuleCase{"MirroredBelowTheGpus", StrategyKind::kMirrored, kAuto, 1, kGpuPod, kPrecondition,
                 kReplicasField, "1 would stay idle"},
        RuleCase{"MwmsBelowTheGpus", StrategyKind::kMultiWorkerMirrored, kAuto, 1, kGpuPod,
                 kPrecondition, kReplicasField, "1 would stay idle"},
        RuleCase{"CentralStorageBelowTheGpus", StrategyKind::kCentralStorage, kAuto, 1, kGpuPod,
                 kPrecondition, kReplicasField, "set localReplicas: 0 (one per GPU)"}),
    [](const ::testing::TestParamInfo<RuleCase>& info) { return info.param.name; });

}  // namespace
}  // namespace distrain

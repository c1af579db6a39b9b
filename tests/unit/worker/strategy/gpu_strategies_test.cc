// The single-process strategies on GPUs (docs/architecture.md §6a,
// "Placement"): OneDevice on GPU 0 trains like OneDevice on the CPU; Mirrored
// on every visible GPU and CentralStorage with one GPU train like OneDevice on
// a GPU; a checkpoint of Mirrored on GPUs restores into OneDevice on the CPU
// exactly as saved. The guide's CNN, 100 Adam steps, every variable and
// optimizer slot within 1e-4. These need a GPU and skip without one; the
// refusals of more replicas than GPUs take an injected GPU count and run
// everywhere.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/device_test_util.h"
#include "tests/unit/worker/strategy/local_step_util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/strategy/central_storage.h"
#include "worker/strategy/local_replicas.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/one_device.h"
#include "worker/strategy/param_checksum.h"

namespace distrain {
namespace {

constexpr int kSteps = 100;
constexpr int64_t kPerReplicaBatch = 32;

ClusterSpec LoneWorker() {
  auto spec = ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

JobConfig CnnJob(StrategyKind strategy, int local_replicas, int64_t global_batch) {
  JobConfig c;
  c.strategy = strategy;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.training.model = testing::GuideCnn();
  c.training.optimizer.type = OptimizerType::kAdam;
  c.training.optimizer.learning_rate = 1e-3f;
  c.training.global_batch_size = global_batch;
  c.training.local_replicas = local_replicas;
  c.training.seed = 7;
  // Several buckets per step: the overlap path reduces device spans.
  c.training.communication.bytes_per_pack = 64 << 10;
  return c;
}

// `gpus`: what the strategy may use (0: the CPU; kDetectGpus: every visible GPU).
std::unique_ptr<Strategy> Make(const JobConfig& config, int gpus) {
  std::unique_ptr<Strategy> s;
  switch (config.strategy) {
    case StrategyKind::kMirrored:
      s = std::make_unique<MirroredStrategy>(gpus);
      break;
    case StrategyKind::kCentralStorage:
      s = std::make_unique<CentralStorageStrategy>(gpus);
      break;
    default:
      s = std::make_unique<OneDeviceStrategy>(gpus);
  }
  const absl::Status init = s->Init(LoneWorker(), config);
  EXPECT_TRUE(init.ok()) << init;
  ModelFactory factory = [config] {
    return Model::Create(config.training.model, {28, 28, 1}, 10, config.training.seed);
  };
  const absl::Status created = s->CreateVariables(factory, config.training.optimizer);
  EXPECT_TRUE(created.ok()) << created;
  return s;
}

// Trains `steps` steps of the same batches (the Trainer's slicing: replica r
// takes rows [r b / n, (r + 1) b / n)); the checkpoint afterwards, whose
// tensors are host copies.
CheckpointState Train(Strategy& s, const std::vector<testing::ImageBatch>& batches) {
  for (size_t step = 0; step < batches.size(); ++step) {
    auto out = testing::LocalReplicaStep(s, batches[step].features, batches[step].labels);
    EXPECT_TRUE(out.ok()) << "step " << step << ": " << out.status();
    if (!out.ok()) break;
    // Synchronous replicas stay bit-identical on GPUs too.
    auto checksum = ReplicaChecksum(s.local_models());
    EXPECT_TRUE(checksum.ok()) << "step " << step << ": " << checksum.status();
  }
  auto state = s.SaveState(static_cast<int64_t>(batches.size()));
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? *std::move(state) : CheckpointState{};
}

// Every tensor of a checkpoint (variables and optimizer slots), in name order.
std::vector<Tensor> Tensors(const CheckpointState& state) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : state.tensors) {
    EXPECT_TRUE(t.on_host()) << name << ": checkpoints hold host tensors";
    out.push_back(t);
  }
  return out;
}

::testing::AssertionResult SameNames(const CheckpointState& a, const CheckpointState& b) {
  if (a.tensors.size() != b.tensors.size()) {
    return ::testing::AssertionFailure()
           << a.tensors.size() << " vs " << b.tensors.size() << " tensors";
  }
  for (auto i = a.tensors.begin(), j = b.tensors.begin(); i != a.tensors.end(); ++i, ++j) {
    if (i->first != j->first) return ::testing::AssertionFailure() << i->first << " vs " << j->first;
  }
  return ::testing::AssertionSuccess();
}

// Trains `want` and `got` on the same batches and compares every variable
// and optimizer slot within 1e-4; `what` names the case in a failure.
void ExpectTrainsAlike(Strategy& want_strategy, Strategy& got_strategy,
                       const std::vector<testing::ImageBatch>& batches,
                       const std::string& what = "") {
  const CheckpointState want = Train(want_strategy, batches);
  const CheckpointState got = Train(got_strategy, batches);
  ASSERT_TRUE(SameNames(want, got));
  EXPECT_TRUE(testing::AllClose(Tensors(want), Tensors(got), 1e-4)) << what;
}

// (a)
TEST(GpuStrategiesTest, OneDeviceOnGpuZeroTrainsLikeOneDeviceOnTheCpu) {
  if (VisibleGpus() == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const JobConfig job = CnnJob(StrategyKind::kOneDevice, 0, kPerReplicaBatch);
  const auto batches = testing::ImageBatches(kSteps, kPerReplicaBatch, 11);
  auto cpu = Make(job, /*gpus=*/0);
  auto gpu = Make(job, kDetectGpus);
  ASSERT_EQ(cpu->primary_model()->device(), DeviceId::Cpu());
  ASSERT_EQ(gpu->primary_model()->device(), DeviceId::Cuda(0));
  ExpectTrainsAlike(*cpu, *gpu, batches);
}

// (b) With one GPU this is one replica on an NCCL group of one: still the
// whole GPU path of Mirrored (device extras, ncclAvg, device state copies).
TEST(GpuStrategiesTest, MirroredOnEveryVisibleGpuTrainsLikeOneDeviceOnAGpu) {
  const int gpus = VisibleGpus();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const int64_t batch = kPerReplicaBatch * gpus;
  const auto batches = testing::ImageBatches(kSteps, batch, 13);
  auto one = Make(CnnJob(StrategyKind::kOneDevice, 0, batch), kDetectGpus);
  auto mirrored = Make(CnnJob(StrategyKind::kMirrored, 0, batch), kDetectGpus);
  ASSERT_EQ(mirrored->num_local_replicas(), gpus) << "localReplicas 0: one per visible GPU";
  const std::vector<Model*> models = mirrored->local_models();
  for (int r = 0; r < gpus; ++r) EXPECT_EQ(models[r]->device(), DeviceId::Cuda(r));
  ExpectTrainsAlike(*one, *mirrored, batches, absl::StrCat(gpus, " GPU(s)"));
}

// (c) TensorFlow's rule: with one device the variables live on it.
TEST(GpuStrategiesTest, CentralStorageWithOneGpuIsOneDeviceOnThatGpu) {
  if (VisibleGpus() == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const auto batches = testing::ImageBatches(kSteps, kPerReplicaBatch, 17);
  auto one = Make(CnnJob(StrategyKind::kOneDevice, 0, kPerReplicaBatch), kDetectGpus);
  auto central =
      Make(CnnJob(StrategyKind::kCentralStorage, 1, kPerReplicaBatch), kDetectGpus);
  ASSERT_EQ(central->num_local_replicas(), 1);
  EXPECT_EQ(central->primary_model()->device(), DeviceId::Cuda(0))
      << "one GPU: the variables live on it, not on the host";
  ExpectTrainsAlike(*one, *central, batches);
}

// On every visible GPU: with several, variables and optimizer on the host and
// one replica per GPU; with one (the lent machine may have one), the one-GPU
// rule again. Never skipped for want of a second GPU: scripts/gpu-check.sh
// treats a skip as "no GPU seen".
TEST(GpuStrategiesTest, CentralStorageOnEveryVisibleGpuTrainsLikeOneDeviceOnAGpu) {
  const int gpus = VisibleGpus();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const int64_t batch = kPerReplicaBatch * gpus;
  const auto batches = testing::ImageBatches(kSteps, batch, 19);
  auto one = Make(CnnJob(StrategyKind::kOneDevice, 0, batch), kDetectGpus);
  auto central = Make(CnnJob(StrategyKind::kCentralStorage, 0, batch), kDetectGpus);
  ASSERT_EQ(central->num_local_replicas(), gpus) << "localReplicas 0: one per visible GPU";
  const std::vector<Model*> models = central->local_models();  // the host copy first
  if (gpus == 1) {
    EXPECT_EQ(models[0]->device(), DeviceId::Cuda(0));
  } else {
    EXPECT_EQ(models[0]->device(), DeviceId::Cpu());
    for (int r = 0; r < gpus; ++r) EXPECT_EQ(models[r + 1]->device(), DeviceId::Cuda(r));
  }
  ExpectTrainsAlike(*one, *central, batches, absl::StrCat(gpus, " GPU(s)"));
}

// (c) Two replicas on a one-GPU host: refused, as TensorFlow puts one replica
// on each device and NCCL one rank on each GPU. Init refuses before touching
// a device, so an injected count tests it on any machine.
TEST(GpuStrategiesTest, MoreReplicasThanGpusIsRefusedNamingTheField) {
  for (StrategyKind kind : {StrategyKind::kCentralStorage, StrategyKind::kMirrored}) {
    std::unique_ptr<Strategy> s;
    if (kind == StrategyKind::kMirrored) {
      s = std::make_unique<MirroredStrategy>(/*gpus=*/1);
    } else {
      s = std::make_unique<CentralStorageStrategy>(/*gpus=*/1);
    }
    const absl::Status status = s->Init(LoneWorker(), CnnJob(kind, 2, 64));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), "spec.training.localReplicas: 2 replicas"))
        << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "sees 1 GPU(s)")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "localReplicas: 0 (one per GPU)")) << status;
  }
}

// (d) Through a checkpoint file: what Mirrored on GPUs saved is what
// OneDevice on the CPU holds after restoring it, bit for bit.
TEST(GpuStrategiesTest, AMirroredGpuCheckpointRestoresIntoOneDeviceOnTheCpuBitForBit) {
  const int gpus = VisibleGpus();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const int64_t batch = kPerReplicaBatch * gpus;
  auto mirrored = Make(CnnJob(StrategyKind::kMirrored, 0, batch), kDetectGpus);
  const CheckpointState saved = Train(*mirrored, testing::ImageBatches(20, batch, 23));
  const std::string path = ::testing::TempDir() + "/gpu_strategies_ckpt-20.dtc";
  ASSERT_TRUE(CheckpointManager::WriteFile(path, saved).ok());
  auto read = CheckpointManager::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();

  auto cpu = Make(CnnJob(StrategyKind::kOneDevice, 0, batch), /*gpus=*/0);
  ASSERT_TRUE(cpu->RestoreState(*read).ok());
  auto restored = cpu->SaveState(20);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(SameNames(saved, *restored));
  for (const auto& [name, want] : saved.tensors) {
    const Tensor& got = restored->tensors.at(name);
    ASSERT_TRUE(want.SameShape(got)) << name;
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.bytes()), 0) << name;
  }
  EXPECT_EQ(restored->metadata.at("optimizer_iterations"), "20");
}

}  // namespace
}  // namespace distrain

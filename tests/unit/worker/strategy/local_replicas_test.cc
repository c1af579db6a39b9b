#include "worker/strategy/local_replicas.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/collective/in_process.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/param_checksum.h"

namespace distrain {
namespace {

// Two LocalReplicas sets on one 2-rank group stand in for two processes of a
// MultiWorkerMirrored job (one replica each).
class TwoProcessesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    group_ = InProcessCollective::CreateGroup(2);
    ModelConfig mc;
    mc.hidden_units = {8};
    ModelFactory factory = [mc]() { return Model::Create(mc, 6, 3, 5); };
    for (int p = 0; p < 2; ++p) {
      LocalReplicas::Options options;
      options.first_replica_id = p;
      options.num_replicas_in_sync = 2;
      options.bytes_per_pack = 64;  // several buckets
      auto set = LocalReplicas::Create(factory, OptimizerConfig{}, {group_[p].get()}, options);
      ASSERT_TRUE(set.ok()) << set.status();
      sets_.push_back(std::move(*set));
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (int p = 0; p < 2; ++p) {
      features_[p] = Tensor({4, 6});
      for (int64_t i = 0; i < features_[p].size(); ++i) features_[p][i] = normal(rng);
      labels_[p] = {0, 1, 2, static_cast<int32_t>(p)};
    }
  }

  // One step in both "processes" at once.
  std::vector<StepOutput> Step() {
    std::vector<StepOutput> out(2);
    std::vector<std::thread> threads;
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([this, p, &out] {
        StepFn fn = [this, p](ReplicaContext& ctx) {
          return ctx.model->TrainStep(features_[p], labels_[p], ctx.on_layer_grads_ready);
        };
        auto result = sets_[p]->Run(fn, 4);
        ASSERT_TRUE(result.ok()) << result.status();
        out[p] = *result;
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  std::vector<std::unique_ptr<InProcessCollective>> group_;
  std::vector<std::unique_ptr<LocalReplicas>> sets_;
  Tensor features_[2];
  std::vector<int32_t> labels_[2];
};

TEST_F(TwoProcessesTest, DifferentDataSameParametersAfterEveryStep) {
  for (int s = 0; s < 5; ++s) {
    Step();
    EXPECT_EQ(ParameterChecksum(*sets_[0]->model(0)), ParameterChecksum(*sets_[1]->model(0)))
        << "step " << s;
  }
}

TEST_F(TwoProcessesTest, OneProcessStopVoteReachesEveryProcessInTheSameStep) {
  for (const StepOutput& o : Step()) EXPECT_FALSE(o.stop_requested);
  sets_[1]->VoteStop();
  for (const StepOutput& o : Step()) EXPECT_TRUE(o.stop_requested);
}

// Replica counts and devices with an injected GPU count (the rule of
// docs/architecture.md §6a, "Placement"): no GPU is the CPU rule of today;
// with GPUs one replica per GPU, never two on one, never fewer by default.
TrainingConfig Training(int local_replicas, int64_t global_batch) {
  TrainingConfig t;
  t.local_replicas = local_replicas;
  t.global_batch_size = global_batch;
  return t;
}

TEST(ResolveLocalReplicasTest, WithoutGpusTheCpuRuleIsUnchanged) {
  for (int threads : {1, 2, 6, 64}) {
    auto n = ResolveLocalReplicas(Training(0, 96), threads, /*visible_gpus=*/0);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, DefaultLocalReplicas(threads, 96));
    EXPECT_EQ(LocalReplicaDevice(0, 0), DeviceId::Cpu());
  }
  auto explicit_count = ResolveLocalReplicas(Training(3, 96), 2, 0);
  ASSERT_TRUE(explicit_count.ok());
  EXPECT_EQ(*explicit_count, 3) << "CPU replicas are threads: more than cores is allowed";
}

TEST(ResolveLocalReplicasTest, ZeroMeansOnePerVisibleGpuWhateverTheCores) {
  for (int gpus : {1, 2, 8}) {
    auto n = ResolveLocalReplicas(Training(0, 64), /*hardware_threads=*/2, gpus);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, gpus);
    for (int r = 0; r < *n; ++r) EXPECT_EQ(LocalReplicaDevice(r, gpus), DeviceId::Cuda(r));
  }
}

TEST(ResolveLocalReplicasTest, AnExplicitCountUpToTheGpusUsesTheFirstOnes) {
  auto n = ResolveLocalReplicas(Training(2, 64), 16, /*visible_gpus=*/4);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
}

TEST(ResolveLocalReplicasTest, MoreReplicasThanGpusNamesTheFieldAndTheStrategy) {
  for (const char* strategy : {"Mirrored", "CentralStorage"}) {
    auto n = ResolveLocalReplicas(Training(2, 64), 16, /*visible_gpus=*/1, strategy);
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(n.status().message());
    EXPECT_TRUE(absl::StartsWith(m, "spec.training.localReplicas: 2 replicas")) << m;
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat(strategy, " puts one replica on each GPU")))
        << m;
    EXPECT_TRUE(absl::StrContains(m, "NCCL cannot put two ranks on one GPU")) << m;
    EXPECT_TRUE(absl::StrContains(m, "at most 1")) << m;
  }
}

TEST(ResolveLocalReplicasTest, OnGpusTheCountIsNotLoweredToADivisorOfTheBatch) {
  auto n = ResolveLocalReplicas(Training(0, 30), 16, /*visible_gpus=*/4);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(n.status().message(), "spec.training.globalBatchSize: 30"))
      << n.status();
  EXPECT_TRUE(absl::StrContains(n.status().message(), "one per visible GPU")) << n.status();
}

TEST(LocalReplicasTest, DetectGpusMeansTheVisibleCount) {
  EXPECT_EQ(GpusOrDetect(kDetectGpus), VisibleGpus());
  EXPECT_EQ(GpusOrDetect(0), 0);
  EXPECT_EQ(GpusOrDetect(3), 3);
}

}  // namespace
}  // namespace distrain

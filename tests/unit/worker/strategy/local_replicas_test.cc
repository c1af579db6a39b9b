#include "worker/strategy/local_replicas.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "worker/collective/in_process.h"
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

}  // namespace
}  // namespace distrain

#include "tests/unit/worker/strategy/local_step_util.h"
#include "worker/strategy/mirrored.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "worker/strategy/one_device.h"
#include "worker/strategy/param_checksum.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

constexpr int kFeatures = testing::kLocalStepFeatures;
constexpr int kClasses = testing::kLocalStepClasses;

ClusterSpec LoneWorker() {
  auto spec = ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

JobConfig Job(StrategyKind strategy, int local_replicas,
              OptimizerType optimizer = OptimizerType::kAdam) {
  JobConfig c;
  c.strategy = strategy;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.training.global_batch_size = 32;
  c.training.local_replicas = local_replicas;
  c.training.model.hidden_units = {48, 24};
  c.training.optimizer.type = optimizer;
  c.training.optimizer.learning_rate = optimizer == OptimizerType::kAdam ? 0.01f : 0.05f;
  // Small packs: several buckets per step, so the overlap path is exercised.
  c.training.communication.bytes_per_pack = 2048;
  return c;
}

using testing::Batches;

// The job's model, as the Trainer builds it for every replica.
ModelFactory Factory(const JobConfig& config) {
  return [model = config.training.model, seed = config.training.seed]() {
    return Model::Create(model, kFeatures, kClasses, seed);
  };
}

std::unique_ptr<Strategy> Make(const JobConfig& config) {
  std::unique_ptr<Strategy> s;
  if (config.strategy == StrategyKind::kMirrored) {
    s = std::make_unique<MirroredStrategy>(/*gpus=*/0);
  } else {
    s = std::make_unique<OneDeviceStrategy>(/*gpus=*/0);
  }
  EXPECT_TRUE(s->Init(LoneWorker(), config).ok());
  EXPECT_TRUE(s->CreateVariables(Factory(config), config.training.optimizer).ok());
  return s;
}

absl::StatusOr<StepOutput> Step(Strategy& s, const Tensor& features,
                                const std::vector<int32_t>& labels) {
  return testing::LocalReplicaStep(s, features, labels);
}
float MaxAbsDiff(Model& a, Model& b) { return testing::MaxAbsParameterDiff(a, b); }

// Adam is nearly invariant to the gradients' scale, so momentum SGD is also
// run: it would expose a SUM where a MEAN belongs.
class MirroredMatchesOneDeviceTest : public ::testing::TestWithParam<OptimizerType> {};

TEST_P(MirroredMatchesOneDeviceTest, FourReplicasStayBitIdenticalAndMatchOneDevice) {
  constexpr int kSteps = 50;
  Batches data(32, kSteps);
  auto mirrored = Make(Job(StrategyKind::kMirrored, 4, GetParam()));
  auto one = Make(Job(StrategyKind::kOneDevice, 0, GetParam()));
  ASSERT_EQ(mirrored->num_local_replicas(), 4);
  ASSERT_EQ(mirrored->local_models().size(), 4u);
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < kSteps; ++s) {
    auto m = Step(*mirrored, data.features[s], data.labels[s]);
    auto o = Step(*one, data.features[s], data.labels[s]);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(m->examples, 32);
    EXPECT_NEAR(m->loss, o->loss, 1e-4) << "step " << s;
    auto checksum = ReplicaChecksum(mirrored->local_models());
    ASSERT_TRUE(checksum.ok()) << "after step " << s << ": " << checksum.status();
    ASSERT_LE(MaxAbsDiff(*mirrored->primary_model(), *one->primary_model()), 1e-5f) << "step " << s;
    if (s == 0) first_loss = m->loss;
    last_loss = m->loss;
  }
  EXPECT_LT(last_loss, first_loss * 0.8) << "the model did not train";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MirroredMatchesOneDeviceTest,
                         ::testing::Values(OptimizerType::kAdam, OptimizerType::kMomentum),
                         [](const ::testing::TestParamInfo<OptimizerType>& info) {
                           return std::string(info.param == OptimizerType::kAdam ? "Adam"
                                                                                 : "Momentum");
                         });

// Under mixed_float16 each replica keeps its own loss scale; they all see
// the all-reduced gradients, so they skip the same overflowing steps and
// stay bit-identical. Variables x8 make the first steps overflow float16 at
// the initial scale of 2^15. The job still trains, and tracks OneDevice
// under the same policy (not bit for bit: each replica rounds its own
// quarter of the batch's gradients to float16).
TEST(MirroredStrategyTest, MixedFloat16ReplicasSkipTheSameStepsAndStayIdentical) {
  constexpr int kSteps = 40;
  Batches data(32, kSteps);
  JobConfig mirrored_job = Job(StrategyKind::kMirrored, 4, OptimizerType::kMomentum);
  mirrored_job.training.model.precision = Precision::kMixedFloat16;
  JobConfig one_job = Job(StrategyKind::kOneDevice, 0, OptimizerType::kMomentum);
  one_job.training.model.precision = Precision::kMixedFloat16;
  auto mirrored = Make(mirrored_job);
  auto one = Make(one_job);
  for (Model* m : mirrored->local_models()) {
    for (Parameter* p : m->parameters()) ops::Scale(8.0f, &p->value);
  }
  for (Parameter* p : one->primary_model()->parameters()) ops::Scale(8.0f, &p->value);
  double first_loss = 0, last_loss = 0, one_last_loss = 0;
  int unchanged_steps = 0;
  for (int s = 0; s < kSteps; ++s) {
    const float before = mirrored->primary_model()->parameters()[0]->value[0];
    auto m = Step(*mirrored, data.features[s], data.labels[s]);
    auto o = Step(*one, data.features[s], data.labels[s]);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(o.ok()) << o.status();
    auto checksum = ReplicaChecksum(mirrored->local_models());
    ASSERT_TRUE(checksum.ok()) << "after step " << s << ": " << checksum.status();
    unchanged_steps += mirrored->primary_model()->parameters()[0]->value[0] == before;
    if (s == 0) first_loss = m->loss;
    last_loss = m->loss;
    one_last_loss = o->loss;
  }
  EXPECT_GT(unchanged_steps, 0) << "no step overflowed; the test lost its point";
  EXPECT_LT(unchanged_steps, 10);
  EXPECT_LT(last_loss, first_loss * 0.8) << "the model did not train";
  EXPECT_NEAR(last_loss, one_last_loss, 0.1 * one_last_loss);
}

TEST(MirroredStrategyTest, OneReplicaIsExactlyOneDevice) {
  Batches data(32, 5);
  auto mirrored = Make(Job(StrategyKind::kMirrored, 1));
  auto one = Make(Job(StrategyKind::kOneDevice, 0));
  for (int s = 0; s < 5; ++s) {
    ASSERT_TRUE(Step(*mirrored, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*one, data.features[s], data.labels[s]).ok());
  }
  EXPECT_EQ(ParameterChecksum(*mirrored->primary_model()),
            ParameterChecksum(*one->primary_model()));
}

// Creating the variables again replaces the replicas and the collective
// group they all-reduce over together: the strategy then trains exactly like
// a fresh one (a replica left on the old group would use a destroyed one).
TEST(MirroredStrategyTest, CreatingVariablesAgainStartsOver) {
  Batches data(32, 6);
  const JobConfig job = Job(StrategyKind::kMirrored, 4);
  auto again = Make(job);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(Step(*again, data.features[s], data.labels[s]).ok());
  ASSERT_TRUE(again->CreateVariables(Factory(job), job.training.optimizer).ok());
  auto fresh = Make(job);
  for (int s = 3; s < 6; ++s) {
    ASSERT_TRUE(Step(*again, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*fresh, data.features[s], data.labels[s]).ok());
  }
  auto replicas = ReplicaChecksum(again->local_models());
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_EQ(*replicas, ParameterChecksum(*fresh->primary_model()));
}

// A failed CreateVariables leaves the strategy as it was: it goes on
// training on its replicas and their group, step for step like a strategy
// that never saw the failed call.
TEST(MirroredStrategyTest, AFailedCreateVariablesKeepsTheReplicasItHad) {
  Batches data(32, 6);
  const JobConfig job = Job(StrategyKind::kMirrored, 4);
  auto failed = Make(job);
  auto untouched = Make(job);
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(Step(*failed, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*untouched, data.features[s], data.labels[s]).ok());
  }
  ModelFactory broken = []() -> absl::StatusOr<std::unique_ptr<Model>> {
    return absl::InvalidArgumentError("no model");
  };
  EXPECT_FALSE(failed->CreateVariables(broken, job.training.optimizer).ok());
  for (int s = 3; s < 6; ++s) {
    ASSERT_TRUE(Step(*failed, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*untouched, data.features[s], data.labels[s]).ok());
  }
  EXPECT_EQ(ParameterChecksum(*failed->primary_model()),
            ParameterChecksum(*untouched->primary_model()));
}

TEST(MirroredStrategyTest, RestoreReachesEveryReplicaAndResumesIdentically) {
  Batches data(32, 6);
  auto a = Make(Job(StrategyKind::kMirrored, 4));
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(Step(*a, data.features[s], data.labels[s]).ok());
  auto saved = a->SaveState(3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->metadata.at("optimizer_iterations"), "3");

  auto b = Make(Job(StrategyKind::kMirrored, 4));
  ASSERT_TRUE(b->RestoreState(*saved).ok());
  auto restored = ReplicaChecksum(b->local_models());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, ParameterChecksum(*a->primary_model()));
  for (int s = 3; s < 6; ++s) {
    ASSERT_TRUE(Step(*a, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*b, data.features[s], data.labels[s]).ok());
  }
  EXPECT_EQ(ParameterChecksum(*a->primary_model()), ParameterChecksum(*b->primary_model()));
}

TEST(MirroredStrategyTest, CapsBlasThreadsWhileAliveAndRestoresThem) {
  const int before = cpu::BlasThreads();
  {
    auto mirrored = Make(Job(StrategyKind::kMirrored, 4));
    EXPECT_EQ(cpu::BlasThreads(), std::max(1, before / 4));
  }
  EXPECT_EQ(cpu::BlasThreads(), before);
}

TEST(MirroredStrategyTest, RefusesSeveralTrainingTasks) {
  auto spec =
      ClusterSpec::Create({{"worker", {"localhost:1", "localhost:2"}}}, TaskId{"worker", 0});
  ASSERT_TRUE(spec.ok());
  MirroredStrategy s(/*gpus=*/0);
  absl::Status status = s.Init(*spec, Job(StrategyKind::kMirrored, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("MultiWorkerMirrored"), std::string::npos) << status;
}

struct DefaultReplicasCase {
  int hardware_threads;
  int64_t global_batch;
  int want;
};

class DefaultLocalReplicasTest : public ::testing::TestWithParam<DefaultReplicasCase> {};

TEST_P(DefaultLocalReplicasTest, OnePerCoreCappedAndDividingTheBatch) {
  const auto& c = GetParam();
  EXPECT_EQ(DefaultLocalReplicas(c.hardware_threads, c.global_batch), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Table, DefaultLocalReplicasTest,
    ::testing::Values(DefaultReplicasCase{2, 64, 2}, DefaultReplicasCase{1, 64, 1},
                      DefaultReplicasCase{0, 64, 1}, DefaultReplicasCase{64, 256, 8},
                      DefaultReplicasCase{6, 64, 4}, DefaultReplicasCase{3, 7, 1},
                      DefaultReplicasCase{8, 12, 6}));

}  // namespace
}  // namespace distrain

#include "tests/unit/worker/strategy/local_step_util.h"
#include "worker/strategy/central_storage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "worker/strategy/mirrored.h"
#include "worker/strategy/one_device.h"
#include "worker/strategy/param_checksum.h"
#include "worker/tensor/cpu_math.h"

namespace distrain {
namespace {

constexpr int kFeatures = testing::kLocalStepFeatures;
constexpr int kClasses = testing::kLocalStepClasses;

ClusterSpec LoneWorker() {
  auto spec = ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

JobConfig Job(StrategyKind strategy, int local_replicas, int64_t batch = 32,
              OptimizerType optimizer = OptimizerType::kAdam) {
  JobConfig c;
  c.strategy = strategy;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.training.global_batch_size = batch;
  c.training.local_replicas = local_replicas;
  c.training.model.hidden_units = {48, 24};
  c.training.optimizer.type = optimizer;
  c.training.optimizer.learning_rate = optimizer == OptimizerType::kAdam ? 0.01f : 0.05f;
  return c;
}

using testing::Batches;

// The job's model, as the Trainer builds it for every replica.
ModelFactory Factory(const JobConfig& config) {
  return [model = config.training.model, seed = config.training.seed]() {
    return Model::Create(model, kFeatures, kClasses, seed);
  };
}

template <typename S>
std::unique_ptr<S> Make(const JobConfig& config) {
  auto s = std::make_unique<S>(/*gpus=*/0);  // the CPU path on any machine
  absl::Status init = s->Init(LoneWorker(), config);
  EXPECT_TRUE(init.ok()) << init;
  absl::Status created = s->CreateVariables(Factory(config), config.training.optimizer);
  EXPECT_TRUE(created.ok()) << created;
  return s;
}

absl::StatusOr<StepOutput> Step(Strategy& s, const Tensor& features,
                                const std::vector<int32_t>& labels) {
  return testing::LocalReplicaStep(s, features, labels);
}
float MaxAbsDiff(Model& a, Model& b) { return testing::MaxAbsParameterDiff(a, b); }

struct MatchCase {
  std::string name;
  int replicas;
  int64_t batch;
  OptimizerType optimizer;
};

class CentralStorageMatchesOneDeviceTest : public ::testing::TestWithParam<MatchCase> {};

// Adam is nearly invariant to the gradients' scale, so momentum SGD runs too:
// it would expose a SUM where the MEAN belongs. Three replicas split the
// parameter elements unevenly between the reducing threads.
TEST_P(CentralStorageMatchesOneDeviceTest, ReplicasEqualTheHostCopyAndTrainLikeOneDevice) {
  const MatchCase& c = GetParam();
  constexpr int kSteps = 40;
  Batches data(c.batch, kSteps);
  auto central = Make<CentralStorageStrategy>(
      Job(StrategyKind::kCentralStorage, c.replicas, c.batch, c.optimizer));
  auto one = Make<OneDeviceStrategy>(Job(StrategyKind::kOneDevice, 0, c.batch, c.optimizer));
  ASSERT_EQ(central->num_local_replicas(), c.replicas);
  ASSERT_EQ(central->local_models().size(), static_cast<size_t>(c.replicas + 1));
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < kSteps; ++s) {
    auto cs = Step(*central, data.features[s], data.labels[s]);
    auto o = Step(*one, data.features[s], data.labels[s]);
    ASSERT_TRUE(cs.ok()) << cs.status();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(cs->examples, c.batch);
    EXPECT_NEAR(cs->loss, o->loss, 1e-4) << "step " << s;
    auto checksum = ReplicaChecksum(central->local_models());
    ASSERT_TRUE(checksum.ok()) << "after step " << s << ": " << checksum.status();
    ASSERT_LE(MaxAbsDiff(*central->primary_model(), *one->primary_model()), 1e-5f) << "step " << s;
    if (s == 0) first_loss = cs->loss;
    last_loss = cs->loss;
  }
  // One optimizer, updated once per step (not once per replica).
  EXPECT_EQ(central->optimizer().iterations(), kSteps);
  EXPECT_LT(last_loss, first_loss * 0.8) << "the model did not train";
}

INSTANTIATE_TEST_SUITE_P(
    Table, CentralStorageMatchesOneDeviceTest,
    ::testing::Values(MatchCase{"FourReplicasAdam", 4, 32, OptimizerType::kAdam},
                      MatchCase{"FourReplicasMomentum", 4, 32, OptimizerType::kMomentum},
                      MatchCase{"ThreeReplicasSgd", 3, 30, OptimizerType::kSgd}),
    [](const ::testing::TestParamInfo<MatchCase>& info) { return info.param.name; });

TEST(CentralStorageStrategyTest, OneReplicaIsExactlyOneDevice) {
  Batches data(32, 5);
  auto central = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 1));
  auto one = Make<OneDeviceStrategy>(Job(StrategyKind::kOneDevice, 0));
  ASSERT_EQ(central->local_models().size(), 1u);
  for (int s = 0; s < 5; ++s) {
    ASSERT_TRUE(Step(*central, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*one, data.features[s], data.labels[s]).ok());
  }
  EXPECT_EQ(ParameterChecksum(*central->primary_model()), ParameterChecksum(*one->primary_model()));
}

// Creating the variables again starts the strategy over: it then trains
// exactly like a fresh one, with as many replicas as before.
TEST(CentralStorageStrategyTest, CreatingVariablesAgainStartsOver) {
  Batches data(32, 6);
  const JobConfig job = Job(StrategyKind::kCentralStorage, 4);
  auto again = Make<CentralStorageStrategy>(job);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(Step(*again, data.features[s], data.labels[s]).ok());
  ASSERT_TRUE(again->CreateVariables(Factory(job), job.training.optimizer).ok());
  auto fresh = Make<CentralStorageStrategy>(job);
  ASSERT_EQ(again->local_models().size(), fresh->local_models().size());
  for (int s = 3; s < 6; ++s) {
    ASSERT_TRUE(Step(*again, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*fresh, data.features[s], data.labels[s]).ok());
  }
  EXPECT_EQ(ParameterChecksum(*again->primary_model()), ParameterChecksum(*fresh->primary_model()));
}

TEST(CentralStorageStrategyTest, RestoreReachesEveryReplicaAndResumesIdentically) {
  Batches data(32, 6);
  auto a = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 4));
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(Step(*a, data.features[s], data.labels[s]).ok());
  auto saved = a->SaveState(3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->metadata.at("optimizer_iterations"), "3");
  EXPECT_TRUE(saved->tensors.count("optimizer/dense_0/kernel/m")) << "Adam slots are checkpointed";

  auto b = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 4));
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

// Checkpoints use the names every strategy uses, so a job can switch.
TEST(CentralStorageStrategyTest, CheckpointRestoresIntoOneDevice) {
  Batches data(32, 4);
  auto central = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 4));
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(Step(*central, data.features[s], data.labels[s]).ok());
  auto saved = central->SaveState(2);
  ASSERT_TRUE(saved.ok());
  auto one = Make<OneDeviceStrategy>(Job(StrategyKind::kOneDevice, 0));
  ASSERT_TRUE(one->RestoreState(*saved).ok());
  EXPECT_EQ(ParameterChecksum(*one->primary_model()),
            ParameterChecksum(*central->primary_model()));
  for (int s = 2; s < 4; ++s) {
    ASSERT_TRUE(Step(*central, data.features[s], data.labels[s]).ok());
    ASSERT_TRUE(Step(*one, data.features[s], data.labels[s]).ok());
  }
  EXPECT_LE(MaxAbsDiff(*central->primary_model(), *one->primary_model()), 1e-5f);
}

TEST(CentralStorageStrategyTest, CapsBlasThreadsWhileAliveAndRestoresThem) {
  const int before = cpu::BlasThreads();
  {
    auto central = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 4));
    EXPECT_EQ(cpu::BlasThreads(), std::max(1, before / 4));
  }
  EXPECT_EQ(cpu::BlasThreads(), before);
}

TEST(CentralStorageStrategyTest, ZeroLocalReplicasMeansOnePerCoreDividingTheBatch) {
  auto central = Make<CentralStorageStrategy>(Job(StrategyKind::kCentralStorage, 0, 30));
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(central->num_local_replicas(), DefaultLocalReplicas(hardware, 30));
  EXPECT_EQ(30 % central->num_local_replicas(), 0);
}

TEST(CentralStorageStrategyTest, BatchNotDivisibleByReplicasNamesTheFieldAndTheFix) {
  CentralStorageStrategy s(/*gpus=*/0);
  absl::Status status = s.Init(LoneWorker(), Job(StrategyKind::kCentralStorage, 4, 30));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("spec.training.globalBatchSize: 30"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("multiple of 4"), std::string::npos) << status;
}

TEST(CentralStorageStrategyTest, RefusesSeveralTrainingTasks) {
  auto spec =
      ClusterSpec::Create({{"worker", {"localhost:1", "localhost:2"}}}, TaskId{"worker", 0});
  ASSERT_TRUE(spec.ok());
  CentralStorageStrategy s(/*gpus=*/0);
  absl::Status status = s.Init(*spec, Job(StrategyKind::kCentralStorage, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("MultiWorkerMirrored"), std::string::npos) << status;
}

}  // namespace
}  // namespace distrain

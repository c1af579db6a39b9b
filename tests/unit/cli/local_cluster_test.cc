#include "cli/local_cluster.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "common/cluster_spec.h"
#include "common/job_identity.h"

namespace distrain {
namespace {

TEST(LocalClusterTest, EveryReplicaGetsTheOperatorContractWithDistinctLoopbackPorts) {
  JobConfig c;
  c.name = "ps-job";
  c.strategy = StrategyKind::kParameterServer;
  c.replicas[ReplicaType::kChief].replicas = 1;
  c.replicas[ReplicaType::kWorker].replicas = 2;
  c.replicas[ReplicaType::kPS].replicas = 2;
  c.replicas[ReplicaType::kEvaluator].replicas = 1;
  // Every member named, gpu_ids too ({}: none): GCC 12 warns about an omitted one.
  auto plan = PlanLocalCluster(c, {"/tmp/w", "/tmp/w/ckpt", 6, {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 6u);

  std::set<std::string> addresses;
  std::set<std::string> metrics_ports;
  for (const LocalReplica& r : *plan) {
    for (const char* key : {"TF_CONFIG", "DISTRAIN_JOB_CONFIG", "DISTRAIN_METRICS_PORT",
                            "DISTRAIN_CHECKPOINT_DIR", "POD_NAME", "POD_NAMESPACE"}) {
      EXPECT_TRUE(r.env.count(key)) << r.label << " lacks " << key;
    }
    auto spec = ClusterSpec::Parse(r.env.at("TF_CONFIG"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->task().type, ReplicaTaskType(r.type));
    EXPECT_EQ(spec->task().index, r.index);
    EXPECT_EQ(spec->num_tasks("ps"), 2);
    EXPECT_EQ(spec->num_tasks("evaluator"), 1);
    addresses.insert(*spec->my_address());
    metrics_ports.insert(r.env.at("DISTRAIN_METRICS_PORT"));
    EXPECT_EQ(r.name, "ps-job-" + r.label);
    EXPECT_EQ(r.env.at("OPENBLAS_NUM_THREADS"), "1");  // 6 cores over 6 processes
  }
  EXPECT_EQ(addresses.size(), 6u) << "two tasks share an address";
  EXPECT_EQ(metrics_ports.size(), 6u);
  EXPECT_EQ((*plan)[0].label, "chief-0");  // TF_CONFIG order
  EXPECT_TRUE(IsCoordinator(c, (*plan)[0]));
  EXPECT_FALSE(IsCoordinator(c, (*plan)[1]));
}

TEST(LocalClusterTest, WorkerZeroCoordinatesWithoutAChief) {
  JobConfig c;
  c.replicas[ReplicaType::kWorker].replicas = 3;
  auto plan = PlanLocalCluster(c, {"/tmp/w", "/tmp/w/ckpt", 2, {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(IsCoordinator(c, (*plan)[0]));
  EXPECT_FALSE(IsCoordinator(c, (*plan)[1]));
}

// NCCL across workers puts one rank on a GPU: `distrain run` gives each
// MultiWorkerMirrored process its own GPUs (as the device plugin gives each
// pod its own), in the ids the parent's CUDA_VISIBLE_DEVICES uses; too few
// GPUs is refused naming the field; other jobs keep the parent's view.
TEST(LocalClusterTest, NcclAcrossWorkersGivesEachTrainingProcessItsOwnGpus) {
  JobConfig c;
  c.name = "mwms";
  c.strategy = StrategyKind::kMultiWorkerMirrored;
  c.replicas[ReplicaType::kChief].replicas = 1;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.replicas[ReplicaType::kEvaluator].replicas = 1;
  c.training.communication.implementation = CollectiveImplementation::kNccl;
  LocalClusterOptions options{"/tmp/w", "/tmp/w/ckpt", 2, {}};
  options.gpu_ids = {"4", "5", "6", "7"};
  auto plan = PlanLocalCluster(c, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].env.at("CUDA_VISIBLE_DEVICES"), "4,5");  // chief: 2 of 4 GPUs each
  EXPECT_EQ((*plan)[1].env.at("CUDA_VISIBLE_DEVICES"), "6,7");
  EXPECT_EQ((*plan)[2].env.count("CUDA_VISIBLE_DEVICES"), 0u);  // the evaluator

  c.training.local_replicas = 1;
  plan = PlanLocalCluster(c, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)[0].env.at("CUDA_VISIBLE_DEVICES"), "4");
  EXPECT_EQ((*plan)[1].env.at("CUDA_VISIBLE_DEVICES"), "5");

  options.gpu_ids = {"0"};
  plan = PlanLocalCluster(c, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find(
                "spec.training.communication.implementation: NCCL puts one rank on each GPU, and "
                "2 MultiWorkerMirrored process(es) x 1 local replica(s) need 2 GPUs"),
            std::string::npos)
      << plan.status();

  c.training.communication.implementation = CollectiveImplementation::kRing;
  plan = PlanLocalCluster(c, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const LocalReplica& r : *plan) EXPECT_EQ(r.env.count("CUDA_VISIBLE_DEVICES"), 0u);
}

struct RestartCase {
  std::string name;
  StrategyKind strategy;
  ReplicaType type;
  RestartPolicy policy;
  std::optional<int64_t> backoff_limit;
  int exit_code;
  int restarts;
  bool want;
  RecoveryPolicy recovery = RecoveryPolicy::kInPlace;
  bool has_chief = true;
};

class ShouldRestartLocallyTest : public ::testing::TestWithParam<RestartCase> {};

TEST_P(ShouldRestartLocallyTest, RestartsOnlyWorkersTheOthersGoOnWithoutAsTheirPolicySays) {
  const RestartCase& c = GetParam();
  JobConfig config;
  config.strategy = c.strategy;
  config.replicas[ReplicaType::kWorker].restart_policy = c.policy;
  config.replicas[ReplicaType::kWorker].replicas = 3;
  if (c.has_chief) {
    config.replicas[ReplicaType::kChief].restart_policy = c.policy;
    config.replicas[ReplicaType::kChief].replicas = 1;
  } else {
    config.replicas.erase(ReplicaType::kChief);
  }
  config.run_policy.backoff_limit = c.backoff_limit;
  config.run_policy.recovery_policy = c.recovery;
  LocalReplica replica;
  replica.type = c.type;
  EXPECT_EQ(ShouldRestartLocally(config, replica, c.exit_code, c.restarts), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ShouldRestartLocallyTest,
    ::testing::Values(
        RestartCase{"PsWorkerOnFailureKilled", StrategyKind::kParameterServer, ReplicaType::kWorker,
                    RestartPolicy::kOnFailure, std::nullopt, 137, 0, true},
        RestartCase{"PsWorkerOnFailurePermanentCode", StrategyKind::kParameterServer,
                    ReplicaType::kWorker, RestartPolicy::kOnFailure, std::nullopt, 1, 0, true},
        RestartCase{"PsWorkerExitCodeRetryable", StrategyKind::kParameterServer,
                    ReplicaType::kWorker, RestartPolicy::kExitCode, std::nullopt, 170, 0, true},
        RestartCase{"PsWorkerExitCodePermanent", StrategyKind::kParameterServer,
                    ReplicaType::kWorker, RestartPolicy::kExitCode, std::nullopt, 3, 0, false},
        RestartCase{"PsWorkerNever", StrategyKind::kParameterServer, ReplicaType::kWorker,
                    RestartPolicy::kNever, std::nullopt, 137, 0, false},
        RestartCase{"PsWorkerSucceeded", StrategyKind::kParameterServer, ReplicaType::kWorker,
                    RestartPolicy::kAlways, std::nullopt, 0, 0, false},
        RestartCase{"PsWorkerDefaultLimitReached", StrategyKind::kParameterServer,
                    ReplicaType::kWorker, RestartPolicy::kOnFailure, std::nullopt, 137,
                    kDefaultLocalRestarts, false},
        RestartCase{"PsWorkerBackoffLimitReached", StrategyKind::kParameterServer,
                    ReplicaType::kWorker, RestartPolicy::kOnFailure, 1, 137, 1, false},
        RestartCase{"PsChiefFailsTheJob", StrategyKind::kParameterServer, ReplicaType::kChief,
                    RestartPolicy::kOnFailure, std::nullopt, 137, 0, false},
        RestartCase{"PsTaskFailsTheJob", StrategyKind::kParameterServer, ReplicaType::kPS,
                    RestartPolicy::kOnFailure, std::nullopt, 137, 0, false},
        RestartCase{"MultiWorkerMirroredRestartGroupWorkerFailsTheJob",
                    StrategyKind::kMultiWorkerMirrored, ReplicaType::kWorker,
                    RestartPolicy::kOnFailure, std::nullopt, 137, 0, false,
                    RecoveryPolicy::kRestartGroup},
        RestartCase{"MultiWorkerMirroredInPlaceWorkerRejoins", StrategyKind::kMultiWorkerMirrored,
                    ReplicaType::kWorker, RestartPolicy::kExitCode, std::nullopt, 137, 0, true},
        RestartCase{"MultiWorkerMirroredInPlaceWorkerPermanentCode",
                    StrategyKind::kMultiWorkerMirrored, ReplicaType::kWorker,
                    RestartPolicy::kExitCode, std::nullopt, 1, 0, false},
        RestartCase{"MultiWorkerMirroredInPlaceAgreedStopIsNotRestarted",
                    StrategyKind::kMultiWorkerMirrored, ReplicaType::kWorker,
                    RestartPolicy::kExitCode, std::nullopt, 143, 0, false},
        RestartCase{"MultiWorkerMirroredChiefFailsTheJob", StrategyKind::kMultiWorkerMirrored,
                    ReplicaType::kChief, RestartPolicy::kExitCode, std::nullopt, 137, 0, false},
        RestartCase{"MultiWorkerMirroredCoordinatingWorkerZeroFailsTheJob",
                    StrategyKind::kMultiWorkerMirrored, ReplicaType::kWorker,
                    RestartPolicy::kExitCode, std::nullopt, 137, 0, false,
                    RecoveryPolicy::kInPlace, /*has_chief=*/false}),
    [](const ::testing::TestParamInfo<RestartCase>& info) { return info.param.name; });

TEST(LocalClusterTest, EveryReplicaGetsItsOwnTasksCredentialsUnlessTheJobOptsOut) {
  JobConfig c;
  c.name = "mwms";
  c.strategy = StrategyKind::kMultiWorkerMirrored;
  c.replicas[ReplicaType::kChief].replicas = 1;
  c.replicas[ReplicaType::kWorker].replicas = 2;
  const std::string work = ::testing::TempDir() + "/local_cluster_credentials";
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  auto plan = PlanLocalCluster(c, {work, work + "/ckpt", 2, {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(WriteLocalCredentials(c, work, &*plan).ok());
  std::string ca;
  for (const LocalReplica& r : *plan) {
    ASSERT_TRUE(r.env.count("DISTRAIN_CREDENTIALS_DIR")) << r.label;
    auto loaded = LoadCredentialsDir(r.env.at("DISTRAIN_CREDENTIALS_DIR"));
    ASSERT_TRUE(loaded.ok()) << r.label << ": " << loaded.status();
    EXPECT_EQ(loaded->task, (TaskId{ReplicaTaskType(r.type), r.index}));
    if (ca.empty()) ca = loaded->ca_cert_pem;
    EXPECT_EQ(loaded->ca_cert_pem, ca) << "one CA for the whole run";
  }
  c.transport = TransportMode::kPlaintext;
  auto plain = PlanLocalCluster(c, {work, work + "/ckpt", 2, {}});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(WriteLocalCredentials(c, work, &*plain).ok());
  for (const LocalReplica& r : *plain) EXPECT_FALSE(r.env.count("DISTRAIN_CREDENTIALS_DIR"));
  std::filesystem::remove_all(work);
}

}  // namespace
}  // namespace distrain

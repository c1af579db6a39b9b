#include "cli/local_cluster.h"

#include <gtest/gtest.h>

#include <set>

#include "common/cluster_spec.h"

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
  auto plan = PlanLocalCluster(c, {"/tmp/w", "/tmp/w/ckpt", 6});
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
  auto plan = PlanLocalCluster(c, {"/tmp/w", "/tmp/w/ckpt", 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(IsCoordinator(c, (*plan)[0]));
  EXPECT_FALSE(IsCoordinator(c, (*plan)[1]));
}

}  // namespace
}  // namespace distrain

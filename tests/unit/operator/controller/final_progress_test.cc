// A finished job's status.progress (controller/final_progress.h): the
// master's own last figures from its termination message, written with the
// Succeeded condition.
#include "operator/controller/final_progress.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using testing::Json;
using testing::MakeJob;
using testing::World;

const char kPs[] =
    "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
    "    Worker: {replicas: 2}\n    PS: {replicas: 1}\n  training: {steps: 1500}\n";

void Succeed(Json* pod, const std::string& message) {
  testing::SetPhase(pod, "Succeeded", 0);
  if (!message.empty()) {
    (*pod)["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message;
  }
}

// A running job whose last scrape saw step 713 (the issue's report).
World RunningJob() {
  World w{MakeJob(kPs)};
  w.Step();
  w.SetAll("Running");
  w.Step();
  w.job.status.progress = {{"step", 713}, {"totalSteps", 1500}, {"loss", 0.9},
                           {"examplesPerSecond", 100.0}};
  return w;
}

TEST(FinalProgressTest, TheChiefsTerminationMessageIsRecordedWithSuccess) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-chief-0"),
          R"({"step":1500,"totalSteps":1500,"loss":0.2134,"examplesPerSecond":5120.5,"accuracy":0.9712})");
  Plan plan = w.Step();
  ASSERT_TRUE(plan.status_changed);
  ASSERT_TRUE(plan.status.IsTrue(api::kConditionSucceeded));
  // One status write carries the condition and the final figures.
  EXPECT_EQ(plan.status.progress["step"], 1500);
  EXPECT_EQ(plan.status.progress["totalSteps"], 1500);
  EXPECT_DOUBLE_EQ(plan.status.progress["loss"].get<double>(), 0.2134);
  EXPECT_DOUBLE_EQ(plan.status.progress["accuracy"].get<double>(), 0.9712);
  EXPECT_DOUBLE_EQ(plan.status.progress["examplesPerSecond"].get<double>(), 5120.5);
  // Later reconciles of the finished job keep them.
  EXPECT_EQ(w.Step().status.progress, plan.status.progress);
}

// The chief's container has exited 0 with its message, and the kubelet has
// not reported the pod's phase yet (it does after tearing down the sandbox):
// the job already succeeds, and with the message's figures.
TEST(FinalProgressTest, TheMessageCountsBeforeTheKubeletReportsThePhase) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-chief-0"), R"({"step":1500,"loss":0.2134,"accuracy":0.9712})");
  w.Pod("mnist-chief-0")["status"]["phase"] = "Running";
  Plan plan = w.Step();
  ASSERT_TRUE(plan.status.IsTrue(api::kConditionSucceeded));
  EXPECT_EQ(plan.status.progress["step"], 1500);
  EXPECT_DOUBLE_EQ(plan.status.progress["loss"].get<double>(), 0.2134);
  EXPECT_DOUBLE_EQ(plan.status.progress["accuracy"].get<double>(), 0.9712);
}

TEST(FinalProgressTest, WithoutAMessageSuccessStillMeansEveryStep) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-chief-0"), "");
  Plan plan = w.Step();
  ASSERT_TRUE(plan.status.IsTrue(api::kConditionSucceeded));
  EXPECT_EQ(plan.status.progress["step"], 1500);
  // Nothing invented: the last scraped loss stays.
  EXPECT_DOUBLE_EQ(plan.status.progress["loss"].get<double>(), 0.9);
  EXPECT_FALSE(plan.status.progress.contains("accuracy"));
}

// A user's image counts its own steps (a TensorFlow script: epochs x steps per
// epoch); what its message says it ran is the total, not spec.training.steps.
TEST(FinalProgressTest, TheMastersOwnTotalWinsOverTheSpecs) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-chief-0"), R"({"step":60,"totalSteps":60,"loss":0.8})");
  Plan plan = w.Step();
  ASSERT_TRUE(plan.status.IsTrue(api::kConditionSucceeded));
  EXPECT_EQ(plan.status.progress["step"], 60);
  EXPECT_EQ(plan.status.progress["totalSteps"], 60);
}

TEST(FinalProgressTest, AMalformedMessageIsIgnoredFieldByField) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-chief-0"),
          R"({"step":"lots","loss":null,"accuracy":0.5,"examplesPerSecond":"fast","x":1})");
  Plan plan = w.Step();
  EXPECT_EQ(plan.status.progress["step"], 1500);
  EXPECT_DOUBLE_EQ(plan.status.progress["loss"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(plan.status.progress["accuracy"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(plan.status.progress["examplesPerSecond"].get<double>(), 100.0);
  EXPECT_FALSE(plan.status.progress.contains("x"));

  World text = RunningJob();
  Succeed(&text.Pod("mnist-chief-0"), "panic: something else wrote here");
  EXPECT_EQ(text.Step().status.progress["step"], 1500);
}

TEST(FinalProgressTest, OnlyTheMastersMessageCounts) {
  World w = RunningJob();
  Succeed(&w.Pod("mnist-worker-0"), R"({"step":7,"loss":5.0})");
  Succeed(&w.Pod("mnist-chief-0"), R"({"step":1500,"loss":0.25})");
  Plan plan = w.Step();
  EXPECT_EQ(plan.status.progress["step"], 1500);
  EXPECT_DOUBLE_EQ(plan.status.progress["loss"].get<double>(), 0.25);
}

TEST(FinalProgressTest, EveryPodIsToldWhereItsTerminationMessageGoes) {
  World w{MakeJob(R"(  strategy: OneDevice
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: distrain
            terminationMessagePath: /tmp/final.json
)")};
  const Json pod = w.Step().pods_to_create.at(0);
  bool found = false;
  for (const Json& e : pod["spec"]["containers"][0]["env"]) {
    if (e["name"] == kTerminationMessageEnv) {
      EXPECT_EQ(e["value"], "/tmp/final.json");
      found = true;
    }
  }
  EXPECT_TRUE(found);
  World d{MakeJob(kPs)};
  for (const Json& p : d.Step().pods_to_create) {
    bool has = false;
    for (const Json& e : p["spec"]["containers"][0]["env"]) {
      if (e["name"] == kTerminationMessageEnv) has = e["value"] == kDefaultTerminationMessagePath;
    }
    EXPECT_TRUE(has) << p["metadata"]["name"];
  }
}

}  // namespace
}  // namespace distrain::controller

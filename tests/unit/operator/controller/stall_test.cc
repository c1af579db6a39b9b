#include "operator/controller/stall.h"

#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/controller/reconcile.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::EventReasons;
using testing::Json;
using testing::MakeJob;
using testing::Names;
using testing::SetPhase;
using testing::T0;
using testing::World;

std::string OneDevice(const std::string& policy, const std::string& run_policy) {
  return absl::StrCat("  strategy: OneDevice\n  replicaSpecs:\n    Worker: {replicas: 1, "
                      "restartPolicy: ",
                      policy, "}\n", run_policy.empty() ? "" : "  runPolicy: " + run_policy + "\n");
}

// Every live pod runs, its process started at `started`.
void StartAll(World& w, absl::Time started) {
  for (auto& [name, pod] : w.pods) {
    if (pod["metadata"].contains("deletionTimestamp")) continue;
    SetPhase(&pod, "Running");
    pod["status"]["startTime"] = api::FormatKubeTime(started);
  }
}

// What the progress reporter writes when it sees the step move at `at`.
void StepSeen(World& w, int64_t step, absl::Time at, std::optional<int64_t> deadline = {}) {
  w.job.status.progress["step"] = step;
  w.job.status.progress[kProgressLastStepTime] = api::FormatKubeTime(at);
  if (deadline) w.job.status.progress[kProgressDeadlineSeconds] = *deadline;
}

// A job whose one pod runs since T0 and has been seen stepping until T0 + 100 s.
World Training(const std::string& spec) {
  World w(MakeJob(spec));
  w.Step();
  StartAll(w, T0());
  w.facts.now = T0() + absl::Seconds(5);
  w.Step();
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionRunning));
  StepSeen(w, 50, T0() + absl::Seconds(100));
  return w;
}

const api::Condition* Cond(const World& w, const char* type) {
  return w.job.status.FindCondition(type);
}

TEST(StallTest, NoStepWithinTheDeadlineSetsStalledNamesThePodAndRestartsIt) {
  World w = Training(OneDevice("ExitCode", "{progressDeadlineSeconds: 30}"));
  // 30 s, plus 10 s for the progress reporter's interval.
  w.facts.now = T0() + absl::Seconds(139);
  Plan before = w.Step();
  EXPECT_EQ(Cond(w, api::kConditionStalled), nullptr);
  EXPECT_THAT(before.pods_to_delete, IsEmpty());
  // Looked at again when the deadline runs out, not a poll later.
  ASSERT_TRUE(before.requeue_after.has_value());
  EXPECT_EQ(*before.requeue_after, absl::Seconds(1));

  w.facts.now = T0() + absl::Seconds(141);
  Plan plan = w.Step();
  const api::Condition* stalled = Cond(w, api::kConditionStalled);
  ASSERT_NE(stalled, nullptr);
  EXPECT_TRUE(stalled->is_true());
  EXPECT_EQ(stalled->reason, kReasonStalled);
  EXPECT_THAT(stalled->message, HasSubstr("pod mnist-worker-0 (Worker 0"));
  EXPECT_THAT(stalled->message, HasSubstr("completed no step for 41 s since step 50"));
  EXPECT_THAT(stalled->message, HasSubstr("spec.runPolicy.progressDeadlineSeconds"));
  bool named = false;
  for (const Event& e : plan.events) {
    if (e.reason == kReasonStalled) {
      named = true;
      EXPECT_EQ(e.type, "Warning");
      EXPECT_EQ(e.related, "mnist-worker-0");
    }
  }
  EXPECT_TRUE(named) << "a Warning event names the stalled replica";
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-0"));
  EXPECT_EQ(w.job.status.restart_count, 1);
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionRestarting));
  EXPECT_EQ(w.job.status.state, "Restarting");  // Stalled does not decide the state

  // The replacement starts up: the old lastStepTime does not make it stalled.
  w.Collect();
  w.facts.now = T0() + absl::Seconds(135);
  EXPECT_THAT(Names(w.Step().pods_to_create), ElementsAre("mnist-worker-0"));
  StartAll(w, T0() + absl::Seconds(140));
  w.facts.now = T0() + absl::Seconds(400);
  Plan starting = w.Step();
  EXPECT_THAT(starting.pods_to_delete, IsEmpty()) << "start-up gets max(deadline, 10 min)";
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionStalled)) << "no step yet: still stalled";
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionRunning));

  // The step moves: the condition clears.
  StepSeen(w, 3, T0() + absl::Seconds(405), 30);
  w.facts.now = T0() + absl::Seconds(406);
  Plan resumed = w.Step();
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionStalled));
  EXPECT_EQ(Cond(w, api::kConditionStalled)->reason, kReasonResumed);
  EXPECT_THAT(EventReasons(resumed), Contains(kReasonResumed));
  EXPECT_EQ(w.job.status.restart_count, 1);
}

TEST(StallTest, StartUpIsAllowedTenMinutesEvenWithAShortDeadline) {
  World w(MakeJob(OneDevice("ExitCode", "{progressDeadlineSeconds: 30}")));
  w.Step();
  StartAll(w, T0());
  w.facts.now = T0() + absl::Seconds(599);
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());
  EXPECT_EQ(Cond(w, api::kConditionStalled), nullptr);
  w.facts.now = T0() + absl::Seconds(601);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-0"));
  EXPECT_THAT(Cond(w, api::kConditionStalled)->message,
              HasSubstr("completed no step in the 601 s since it started"));
}

// A user's TensorFlow image exports no distrain metrics: its master never
// reports a step, and must not be restarted as stalled however long it trains.
TEST(StallTest, AMasterThatReportsNoProgressIsNeverJudged) {
  World w(MakeJob(
      "  strategy: OneDevice\n  replicaSpecs:\n    Worker:\n      replicas: 1\n"
      "      restartPolicy: ExitCode\n      template: {spec: {containers: [{name: tensorflow, "
      "image: \"my/tf:2.21\", command: [python3, /app/train.py]}]}}\n"
      "  runPolicy: {progressDeadlineSeconds: 30}\n"));
  w.Step();
  ASSERT_EQ(w.Pod("mnist-worker-0")["metadata"]["annotations"].count(kReportsProgressAnnotation), 0u);
  StartAll(w, T0());
  w.facts.now = T0() + absl::Hours(3);
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());
  EXPECT_EQ(Cond(w, api::kConditionStalled), nullptr);
  // Once it has reported a step it is judged like any other.
  StepSeen(w, 1, T0() + absl::Hours(3));
  w.facts.now = T0() + absl::Hours(4);
  EXPECT_THAT(Names(w.Step().pods_to_delete), ElementsAre("mnist-worker-0"));
}

TEST(StallTest, ADistrainWorkerIsMarkedAsReportingProgress) {
  World w(MakeJob(OneDevice("ExitCode", "")));
  w.Step();
  EXPECT_EQ(w.Pod("mnist-worker-0")["metadata"]["annotations"].value(kReportsProgressAnnotation, ""),
            "true");
}

TEST(StallTest, APodNotYetRunningIsNeverStalled) {
  World w(MakeJob(OneDevice("ExitCode", "{progressDeadlineSeconds: 30}")));
  w.Step();  // pods Pending, no start time
  w.facts.now = T0() + absl::Hours(2);
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());
  EXPECT_EQ(Cond(w, api::kConditionStalled), nullptr);
}

TEST(StallTest, WithoutASpecDeadlineTheMastersReportedDeadlineApplies) {
  World w = Training(OneDevice("ExitCode", ""));
  StepSeen(w, 60, T0() + absl::Seconds(100), /*deadline=*/90);
  w.facts.now = T0() + absl::Seconds(199);
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());
  w.facts.now = T0() + absl::Seconds(201);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-0"));
  EXPECT_THAT(Cond(w, api::kConditionStalled)->message, HasSubstr("past 90 s"));
}

// After an operator restart (or a failover) the lastStepTime in the status
// is as old as the outage: the new leader holds only the time it watched
// against the pod. Equally a pod start recorded by a node whose clock is
// behind.
TEST(StallTest, TimeNobodyWatchedIsNotHeldAgainstThePod) {
  World w = Training(OneDevice("ExitCode", "{progressDeadlineSeconds: 30}"));
  w.facts.progress_watch_start = T0() + absl::Hours(3);
  w.facts.now = T0() + absl::Hours(3) + absl::Seconds(5);
  Plan plan = w.Step();
  EXPECT_THAT(plan.pods_to_delete, IsEmpty());
  EXPECT_EQ(Cond(w, api::kConditionStalled), nullptr);
  // Still no step after the deadline (and the scrape slack) of watching.
  w.facts.now = T0() + absl::Hours(3) + absl::Seconds(41);
  plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-0"));
  EXPECT_THAT(Cond(w, api::kConditionStalled)->message,
              HasSubstr("in the 41 s since this operator began watching"));
}

TEST(StallTest, RestartPolicyNeverFailsTheJobInstead) {
  World w = Training(OneDevice("Never", "{progressDeadlineSeconds: 30}"));
  w.facts.now = T0() + absl::Seconds(141);
  w.Step();
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionFailed));
  EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "WorkerFailed");
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("Stalled"));
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("restartPolicy Never"));
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionStalled)) << "a finished job is not stalled";
  EXPECT_EQ(w.job.status.restart_count, 0);
}

TEST(StallTest, StallRestartsCountAgainstBackoffLimit) {
  World w = Training(OneDevice("OnFailure", "{progressDeadlineSeconds: 30, backoffLimit: 0}"));
  w.facts.now = T0() + absl::Seconds(141);
  w.Step();
  EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "BackoffLimitExceeded");
}

TEST(StallTest, SynchronousJobsRestartTheWholeGeneration) {
  World w(MakeJob(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 2}\n    Evaluator: {replicas: 1}\n  training: {globalBatchSize: 60}\n"
      "  runPolicy: {progressDeadlineSeconds: 30}\n"));
  w.Step();
  StartAll(w, T0());
  w.facts.now = T0() + absl::Seconds(5);
  w.Step();
  StepSeen(w, 50, T0() + absl::Seconds(100));
  w.facts.now = T0() + absl::Seconds(141);
  Plan plan = w.Step();
  EXPECT_THAT(Cond(w, api::kConditionStalled)->message, HasSubstr("pod mnist-chief-0 (Chief 0"));
  EXPECT_THAT(Names(plan.pods_to_delete),
              ::testing::UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_EQ(w.job.status.restart_count, 1);
}

}  // namespace
}  // namespace distrain::controller

#include "operator/controller/reconcile.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/controller/conditions.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;
using testing::EventReasons;
using testing::Json;
using testing::MakeJob;
using testing::Names;
using testing::SetPhase;
using testing::World;

const char kMwms[] =
    "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1, restartPolicy: %s}\n"
    "    Worker: {replicas: 2, restartPolicy: %s}\n  training: {globalBatchSize: 60}\n%s";

std::string Mwms(const std::string& policy = "ExitCode", const std::string& extra = "") {
  char buffer[1024];
  snprintf(buffer, sizeof(buffer), kMwms, policy.c_str(), policy.c_str(), extra.c_str());
  return buffer;
}

std::string Ps(const std::string& worker_policy = "ExitCode", const std::string& extra = "") {
  return absl::StrCat(
      "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 2, restartPolicy: ",
      worker_policy, "}\n    PS: {replicas: 2}\n    Evaluator: {replicas: 1}\n", extra);
}

const api::Condition* Cond(const World& w, const char* type) {
  return w.job.status.FindCondition(type);
}

// A world whose pods exist and run.
World Running(const std::string& spec) {
  World w(MakeJob(spec));
  w.Step();
  w.SetAll("Running");
  w.facts.now += absl::Seconds(10);
  w.Step();
  return w;
}

TEST(ReconcileTest, NewJobCreatesEverythingOnceAndReportsCreated) {
  World w(MakeJob(Mwms()));
  Plan plan = w.Step();
  EXPECT_EQ(plan.pods_to_create.size(), 3u);
  EXPECT_EQ(plan.services_to_create.size(), 3u);
  EXPECT_TRUE(plan.status_changed);
  EXPECT_THAT(EventReasons(plan), ElementsAre("JobCreated"));
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionCreated));
  EXPECT_EQ(w.job.status.state, "Created");
  EXPECT_EQ(w.job.status.start_time, testing::T0());
  EXPECT_EQ(w.job.status.observed_generation, 1);
  EXPECT_EQ(w.job.status.selector, "distrain.io/job-name=mnist,distrain.io/replica-type=worker");
  EXPECT_EQ(w.job.status.progress["totalSteps"], 1000);
  EXPECT_EQ(Cond(w, api::kConditionCreated)->observed_generation, 1);

  // Observed, the same children are never created again, whatever their phase.
  for (const char* phase : {"Pending", "Running", "Succeeded", "Failed", "Unknown"}) {
    World again = w;
    again.SetAll(phase);
    Plan p = Reconcile(again.job, again.Observe(), again.facts, again.options);
    EXPECT_THAT(p.pods_to_create, IsEmpty()) << phase;
    EXPECT_THAT(p.services_to_create, IsEmpty()) << phase;
  }
  // Nor while they are terminating.
  World terminating = w;
  for (auto& [name, pod] : terminating.pods) pod["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z";
  EXPECT_THAT(Reconcile(terminating.job, terminating.Observe(), terminating.facts,
                        terminating.options).pods_to_create,
              IsEmpty());
}

TEST(ReconcileTest, RunningWhenEveryTrainingPodRunsAndTransitionTimesAreKept) {
  World w(MakeJob(Mwms()));
  w.Step();
  w.facts.now += absl::Seconds(5);
  EXPECT_TRUE(w.Step().status_changed);  // the pods are observed: replicaStatuses count them
  w.facts.now += absl::Seconds(5);
  Plan pending = w.Step();
  EXPECT_FALSE(pending.status_changed);  // nothing moved
  EXPECT_EQ(Cond(w, api::kConditionRunning), nullptr);

  SetPhase(&w.Pod("mnist-chief-0"), "Running");
  SetPhase(&w.Pod("mnist-worker-0"), "Running");
  EXPECT_EQ(w.Step().events.size(), 0u);  // worker 1 still pending
  SetPhase(&w.Pod("mnist-worker-1"), "Running");
  w.facts.now += absl::Seconds(5);
  Plan running = w.Step();
  EXPECT_THAT(EventReasons(running), ElementsAre("JobRunning"));
  EXPECT_EQ(w.job.status.state, "Running");
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kWorker).active, 2);
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kChief).active, 1);
  const absl::Time created_at = Cond(w, api::kConditionCreated)->last_transition_time;
  const absl::Time running_at = Cond(w, api::kConditionRunning)->last_transition_time;
  EXPECT_EQ(running_at, testing::T0() + absl::Seconds(15));

  w.facts.now += absl::Minutes(3);
  Plan steady = w.Step();
  EXPECT_FALSE(steady.status_changed);
  EXPECT_THAT(steady.events, IsEmpty());
  EXPECT_EQ(Cond(w, api::kConditionCreated)->last_transition_time, created_at);
  EXPECT_EQ(Cond(w, api::kConditionRunning)->last_transition_time, running_at);
}

// ---------------------------------------------------------------------------
// Failures under each restart policy, MultiWorkerMirrored with
// recoveryPolicy RestartGroup (TensorFlow's behaviour: restarts are of the
// whole generation).

struct FailureCase {
  std::string name;
  std::string policy;
  std::optional<int> exit_code;  // nullopt: evicted
  bool restarts;                 // else the job fails
};

class MwmsFailureTest : public ::testing::TestWithParam<FailureCase> {};

const char kRestartGroup[] = "  runPolicy: {recoveryPolicy: RestartGroup}\n";

TEST_P(MwmsFailureTest, RestartsTheWholeGenerationOrFails) {
  const FailureCase& c = GetParam();
  World w = Running(Mwms(c.policy, kRestartGroup));
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", c.exit_code, c.exit_code ? "Error" : "Evicted");
  w.facts.now += absl::Seconds(10);
  Plan plan = w.Step();
  if (c.restarts) {
    EXPECT_THAT(Names(plan.pods_to_delete),
                UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
    for (const Deletion& d : plan.pods_to_delete) EXPECT_EQ(d.reason, "Restart");
    EXPECT_THAT(plan.pods_to_create, IsEmpty());
    EXPECT_EQ(w.job.status.restart_count, 1);
    EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kWorker).restarts, 1);
    EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kChief).restarts, 1);
    EXPECT_EQ(w.job.status.state, "Restarting");
    EXPECT_FALSE(w.job.status.IsTrue(api::kConditionRunning));
    EXPECT_THAT(EventReasons(plan), Contains("Restarting"));
    EXPECT_FALSE(w.job.status.IsTrue(api::kConditionFailed));
  } else {
    // cleanPodPolicy Running (the default): the pods still running go.
    EXPECT_THAT(Names(plan.pods_to_delete), UnorderedElementsAre("mnist-chief-0", "mnist-worker-0"));
    for (const Deletion& d : plan.pods_to_delete) EXPECT_EQ(d.reason, "CleanPodPolicy");
    EXPECT_TRUE(w.job.status.IsTrue(api::kConditionFailed));
    EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "WorkerFailed");
    EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("mnist-worker-1"));
    EXPECT_EQ(w.job.status.state, "Failed");
    EXPECT_EQ(w.job.status.completion_time, w.facts.now);
    EXPECT_FALSE(w.job.status.IsTrue(api::kConditionRunning));
    EXPECT_THAT(EventReasons(plan), ElementsAre("WorkerFailed"));
    EXPECT_EQ(plan.events[0].type, "Warning");
    EXPECT_EQ(w.job.status.restart_count, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, MwmsFailureTest,
    ::testing::Values(FailureCase{"ExitCode1", "ExitCode", 1, false},
                      FailureCase{"ExitCode137", "ExitCode", 137, true},
                      FailureCase{"ExitCode170PeerLost", "ExitCode", 170, true},
                      FailureCase{"ExitCodeEvicted", "ExitCode", std::nullopt, true},
                      FailureCase{"Never1", "Never", 1, false},
                      FailureCase{"Never137", "Never", 137, false},
                      FailureCase{"OnFailure1", "OnFailure", 1, true},
                      FailureCase{"OnFailure137", "OnFailure", 137, true},
                      FailureCase{"Always1", "Always", 1, true},
                      FailureCase{"Always137", "Always", 137, true}),
    [](const auto& info) { return info.param.name; });

// A worker that refuses to start (here: its pod holds GPUs this build would
// keep idle, common/device_use.h) exits 5 with its reason as the termination
// message; the job fails at once with that reason in its condition and event,
// and the pods still running are deleted, so no pod keeps holding a GPU.
TEST(ReconcileTest, AWorkerThatRefusesItsDevicesFailsTheJobWithItsOwnWords) {
  World w = Running(Mwms("ExitCode", kRestartGroup));
  const std::string why =
      "spec.replicaSpecs: this pod holds 2 GPU(s) (nvidia.com/gpu in its template's resources), "
      "but this build of distrain trains MultiWorkerMirrored on CPU threads only";
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 5, "Error");
  w.Pod("mnist-worker-1")["status"]["containerStatuses"][0]["state"]["terminated"]["message"] =
      Json({{"error", why}, {"exitCode", 5}}).dump();
  w.facts.now += absl::Seconds(3);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), UnorderedElementsAre("mnist-chief-0", "mnist-worker-0"));
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionFailed));
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message,
              HasSubstr("mnist-worker-1 exited with code 5 (Error): " + why));
  ASSERT_THAT(EventReasons(plan), ElementsAre("WorkerFailed"));
  EXPECT_THAT(plan.events[0].note, HasSubstr(why));
  EXPECT_EQ(w.job.status.restart_count, 0) << "exit code 5 is permanent: no pod is recreated";
}

// Other images leave their own text (or a crash dump) in the termination
// message; only a distrain-worker's JSON error is quoted.
TEST(ReconcileTest, AForeignTerminationMessageIsNotQuotedAsTheCause) {
  World w = Running(Mwms("ExitCode", kRestartGroup));
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 1, "Error");
  w.Pod("mnist-worker-1")["status"]["containerStatuses"][0]["state"]["terminated"]["message"] =
      "Traceback (most recent call last): ...";
  w.Step();
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionFailed));
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("exited with code 1 (Error)"));
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, Not(HasSubstr("Traceback")));
}

TEST(ReconcileTest, GenerationRestartWaitsForTheOldPodsThenRunsAgain) {
  World w = Running(Mwms("ExitCode", kRestartGroup));
  SetPhase(&w.Pod("mnist-worker-0"), "Failed", 137, "OOMKilled");
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 170);  // its peer was lost: same generation
  w.Step();
  EXPECT_EQ(w.job.status.restart_count, 1);  // one generation, one restart
  // The chief is still terminating: nobody is created yet.
  w.pods.erase("mnist-worker-0");
  w.pods.erase("mnist-worker-1");
  Plan waiting = w.Step();
  EXPECT_THAT(waiting.pods_to_create, IsEmpty());
  EXPECT_THAT(waiting.pods_to_delete, IsEmpty());  // not deleted twice
  w.Collect();
  Plan recreate = w.Step();
  EXPECT_THAT(Names(recreate.pods_to_create),
              ElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_THAT(recreate.services_to_create, IsEmpty());  // Services stay
  EXPECT_EQ(w.job.status.state, "Restarting");
  w.SetAll("Running");
  w.facts.now += absl::Seconds(30);
  Plan back = w.Step();
  EXPECT_EQ(w.job.status.state, "Running");
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionRestarting));
  EXPECT_EQ(Cond(w, api::kConditionRestarting)->last_transition_time, w.facts.now);
  EXPECT_EQ(w.job.status.restart_count, 1);
  EXPECT_THAT(EventReasons(back), ElementsAre("JobRunning"));
}

TEST(ReconcileTest, BackoffLimitExceededFailsAndStopsThePods) {
  World w = Running(Mwms("OnFailure", "  runPolicy: {backoffLimit: 1, recoveryPolicy: RestartGroup}\n"));
  SetPhase(&w.Pod("mnist-worker-0"), "Failed", 1);
  w.Step();
  EXPECT_EQ(w.job.status.restart_count, 1);
  w.Collect();
  w.Step();
  w.SetAll("Running");
  w.Step();
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 1);
  w.facts.now += absl::Seconds(1);
  Plan plan = w.Step();
  EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "BackoffLimitExceeded");
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("backoffLimit (1)"));
  EXPECT_EQ(w.job.status.restart_count, 1);
  // Stopped like a batch Job: the active pods go even under cleanPodPolicy None.
  EXPECT_THAT(Names(plan.pods_to_delete), UnorderedElementsAre("mnist-chief-0", "mnist-worker-0"));
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
}

// recoveryPolicy InPlace (the default): a lost worker is replaced alone, its
// survivors keep running; the master hosts the rendezvous, so losing it
// still restarts the group.
TEST(ReconcileTest, MultiWorkerMirroredInPlaceReplacesOnlyTheLostWorker) {
  World w = Running(Mwms());
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 137, "Error");
  w.facts.now += absl::Seconds(1);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-1"));
  EXPECT_TRUE(plan.pods_to_delete[0].finished);  // deleted at once: its name is free at once
  EXPECT_EQ(w.job.status.restart_count, 1);
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kWorker).restarts, 1);
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kChief).restarts, 0);
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionFailed));
  w.Collect();
  Plan recreate = w.Step();
  EXPECT_THAT(Names(recreate.pods_to_create), ElementsAre("mnist-worker-1"));
  // The survivors were never touched.
  EXPECT_EQ(w.Pod("mnist-chief-0")["status"]["phase"], "Running");
  EXPECT_EQ(w.Pod("mnist-worker-0")["status"]["phase"], "Running");
}

// The kubelet reports a pod's terminal phase only once it has torn down the
// sandbox; its containers' states say it is over first. A pod whose every
// container has exited is replaced then, deleted at once (nothing of it runs).
TEST(ReconcileTest, AWorkerWhoseContainerExitedIsReplacedBeforeTheKubeletReportsFailed) {
  World w = Running(Mwms());
  Json& pod = w.Pod("mnist-worker-1");
  ASSERT_EQ(pod["spec"].value("restartPolicy", ""), "Never");
  SetPhase(&pod, "Running", 137, "Error");  // phase still Running, the container terminated
  w.facts.now += absl::Seconds(1);
  Plan plan = w.Step();
  ASSERT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-1"));
  EXPECT_EQ(plan.pods_to_delete[0].reason, "Restart");
  EXPECT_TRUE(plan.pods_to_delete[0].finished);
  EXPECT_EQ(w.job.status.restart_count, 1);

  // A running container is not over, whatever else the status says.
  World other = Running(Mwms());
  other.facts.now += absl::Seconds(1);
  EXPECT_THAT(other.Step().pods_to_delete, IsEmpty());
}

TEST(ReconcileTest, MultiWorkerMirroredInPlaceStillRestartsTheGroupWhenTheMasterIsLost) {
  World w = Running(Mwms());
  SetPhase(&w.Pod("mnist-chief-0"), "Failed", 137, "Error");
  SetPhase(&w.Pod("mnist-worker-0"), "Failed", 170);  // lost its coordinator: same restart
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete),
              UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_EQ(w.job.status.restart_count, 1);
}

// SIGTERM (preemption) stops every process of the group after the same step:
// a worker's 143 means the others are stopping too, so the group restarts
// from the chief's final checkpoint.
TEST(ReconcileTest, MultiWorkerMirroredInPlaceRestartsTheGroupAfterAnAgreedStop) {
  World w = Running(Mwms());
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 143, "Error");
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete),
              UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
}

TEST(ReconcileTest, MultiWorkerMirroredInPlaceWithoutChiefRestartsTheGroupWhenWorkerZeroIsLost) {
  World w = Running(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 3}\n"
      "  training: {globalBatchSize: 60}\n");
  SetPhase(&w.Pod("mnist-worker-0"), "Failed", 137, "Error");
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete),
              UnorderedElementsAre("mnist-worker-0", "mnist-worker-1", "mnist-worker-2"));
  World w2 = Running(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 3}\n"
      "  training: {globalBatchSize: 60}\n");
  SetPhase(&w2.Pod("mnist-worker-2"), "Failed", 137, "Error");
  EXPECT_THAT(Names(w2.Step().pods_to_delete), ElementsAre("mnist-worker-2"));
}

TEST(ReconcileTest, BackoffLimitZeroFailsOnTheFirstRetryableFailure) {
  World w = Running(Mwms("ExitCode", "  runPolicy: {backoffLimit: 0}\n"));
  SetPhase(&w.Pod("mnist-chief-0"), "Failed", 143);
  w.Step();
  EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "BackoffLimitExceeded");
}

TEST(ReconcileTest, ParameterServerReplacesOnlyTheFailedWorker) {
  World w = Running(Ps("OnFailure"));
  ASSERT_EQ(w.job.status.state, "Running");
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 1);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-worker-1"));
  EXPECT_EQ(w.job.status.restart_count, 1);
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kWorker).restarts, 1);
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kChief).restarts, 0);
  w.Collect();
  Plan recreate = w.Step();
  EXPECT_THAT(Names(recreate.pods_to_create), ElementsAre("mnist-worker-1"));
}

TEST(ReconcileTest, ParameterServerRestartsTheGroupWhenAPsIsLost) {
  World w = Running(Ps());
  SetPhase(&w.Pod("mnist-ps-0"), "Failed", 137);
  SetPhase(&w.Pod("mnist-chief-0"), "Failed", 170);  // the coordinator saw it: one restart
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete),
              UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1",
                                   "mnist-ps-0", "mnist-ps-1"));
  EXPECT_EQ(w.job.status.restart_count, 1);
  // A worker whose name is free is not created while the group is going.
  w.pods.erase("mnist-worker-0");
  EXPECT_THAT(w.Step().pods_to_create, IsEmpty());
}

TEST(ReconcileTest, EvaluatorRestartsAloneAndItsPermanentFailureDoesNotFailTheJob) {
  World w = Running(Ps());
  SetPhase(&w.Pod("mnist-evaluator-0"), "Failed", 137);
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-evaluator-0"));
  EXPECT_EQ(w.job.status.replica_statuses.at(ReplicaType::kEvaluator).restarts, 1);
  w.Collect();
  w.Step();
  SetPhase(&w.Pod("mnist-evaluator-0"), "Failed", 2);
  Plan lost = w.Step();
  EXPECT_THAT(EventReasons(lost), Contains("EvaluatorFailed"));
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionFailed));
  EXPECT_THAT(lost.pods_to_delete, IsEmpty());
  EXPECT_THAT(EventReasons(w.Step()), IsEmpty());  // reported once
}

TEST(ReconcileTest, AlwaysRestartsAPsThatExitedZero) {
  World w = Running(absl::StrCat(
      "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 1, restartPolicy: Always}\n    PS: {replicas: 1, restartPolicy: Always}\n"));
  SetPhase(&w.Pod("mnist-ps-0"), "Succeeded", 0);
  SetPhase(&w.Pod("mnist-worker-0"), "Succeeded", 0);  // a worker finishing is not restarted
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete), ElementsAre("mnist-ps-0"));
}

// ---------------------------------------------------------------------------
// Success policies.

struct SuccessCase {
  std::string name;
  std::string spec;
  std::vector<std::string> succeeded;  // pods that exit 0
  bool job_succeeds;
};

class SuccessPolicyTest : public ::testing::TestWithParam<SuccessCase> {};

TEST_P(SuccessPolicyTest, DecidesFromTheRightPods) {
  const SuccessCase& c = GetParam();
  World w = Running(c.spec);
  for (const std::string& pod : c.succeeded) SetPhase(&w.Pod(pod), "Succeeded", 0);
  w.facts.now += absl::Seconds(60);
  Plan plan = w.Step();
  EXPECT_EQ(w.job.status.IsTrue(api::kConditionSucceeded), c.job_succeeds);
  if (c.job_succeeds) {
    EXPECT_EQ(w.job.status.state, "Succeeded");
    EXPECT_EQ(w.job.status.completion_time, w.facts.now);
    EXPECT_FALSE(w.job.status.IsTrue(api::kConditionRunning));
    EXPECT_EQ(Cond(w, api::kConditionRunning)->reason, "JobSucceeded");
    EXPECT_THAT(EventReasons(plan), ElementsAre("JobSucceeded"));
  } else {
    EXPECT_FALSE(w.job.status.completion_time.has_value());
  }
}

const char kWorkersOnly[] =
    "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Worker: {replicas: 2}\n"
    "    Evaluator: {replicas: 1}\n";

INSTANTIATE_TEST_SUITE_P(
    Policies, SuccessPolicyTest,
    ::testing::Values(
        SuccessCase{"DefaultChief", Mwms(), {"mnist-chief-0"}, true},
        SuccessCase{"DefaultWorkersWithoutChiefAreNotEnough", Mwms(),
                    {"mnist-worker-0", "mnist-worker-1"}, false},
        SuccessCase{"DefaultWorkerZeroWithoutChief", kWorkersOnly, {"mnist-worker-0"}, true},
        SuccessCase{"DefaultWorkerOneWithoutChief", kWorkersOnly, {"mnist-worker-1"}, false},
        SuccessCase{"EvaluatorNeverDecides", kWorkersOnly, {"mnist-evaluator-0"}, false},
        SuccessCase{"AllWorkersNeedsEvery", Mwms("ExitCode", "  successPolicy: AllWorkers\n"),
                    {"mnist-chief-0", "mnist-worker-0"}, false},
        SuccessCase{"AllWorkersDone", Mwms("ExitCode", "  successPolicy: AllWorkers\n"),
                    {"mnist-worker-0", "mnist-worker-1"}, true}),
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// cleanPodPolicy and TTL.

struct CleanCase {
  std::string policy;
  std::vector<std::string> deleted;
};

class CleanPodPolicyTest : public ::testing::TestWithParam<CleanCase> {};

TEST_P(CleanPodPolicyTest, DeletesThePodsThePolicyNames) {
  World w = Running(Ps("ExitCode", absl::StrCat("  runPolicy: {cleanPodPolicy: ",
                                                GetParam().policy, "}\n")));
  SetPhase(&w.Pod("mnist-chief-0"), "Succeeded", 0);
  SetPhase(&w.Pod("mnist-worker-0"), "Succeeded", 0);
  Plan plan = w.Step();
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionSucceeded));
  EXPECT_THAT(Names(plan.pods_to_delete), UnorderedElementsAreArray(GetParam().deleted));
  EXPECT_THAT(Names(plan.services_to_delete), UnorderedElementsAreArray(GetParam().deleted));
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());  // deleted once
}

INSTANTIATE_TEST_SUITE_P(
    Policies, CleanPodPolicyTest,
    ::testing::Values(CleanCase{"None", {}},
                      CleanCase{"Running",
                                {"mnist-worker-1", "mnist-ps-0", "mnist-ps-1", "mnist-evaluator-0"}},
                      CleanCase{"All",
                                {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1", "mnist-ps-0",
                                 "mnist-ps-1", "mnist-evaluator-0"}}),
    [](const auto& info) { return info.param.policy; });

TEST(ReconcileTest, TtlDeletesTheFinishedJobWhenItExpires) {
  World w = Running(Mwms("ExitCode", "  runPolicy: {ttlSecondsAfterFinished: 100}\n"));
  SetPhase(&w.Pod("mnist-chief-0"), "Succeeded", 0);
  Plan done = w.Step();
  EXPECT_FALSE(done.delete_job);
  EXPECT_EQ(done.requeue_after, absl::Seconds(100));
  w.facts.now += absl::Seconds(99);
  Plan early = w.Step();
  EXPECT_FALSE(early.delete_job);
  EXPECT_EQ(early.requeue_after, absl::Seconds(1));
  w.facts.now += absl::Seconds(1);
  EXPECT_TRUE(w.Step().delete_job);
}

// ---------------------------------------------------------------------------
// activeDeadlineSeconds and suspend.

TEST(ReconcileTest, DeadlinePassedFailsAndStopsThePods) {
  World w(MakeJob(Mwms("ExitCode", "  runPolicy: {activeDeadlineSeconds: 600}\n")));
  Plan first = w.Step();
  EXPECT_EQ(first.requeue_after, absl::Seconds(600));
  w.SetAll("Running");
  w.facts.now += absl::Seconds(599);
  Plan before = w.Step();
  EXPECT_EQ(before.requeue_after, absl::Seconds(1));
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionFailed));
  w.facts.now += absl::Seconds(1);
  Plan after = w.Step();
  EXPECT_EQ(Cond(w, api::kConditionFailed)->reason, "DeadlineExceeded");
  EXPECT_THAT(Cond(w, api::kConditionFailed)->message, HasSubstr("activeDeadlineSeconds (600 s)"));
  EXPECT_EQ(after.pods_to_delete.size(), 3u);
}

TEST(ReconcileTest, SuspendDeletesThePodsAndResumeStartsTheClockAgain) {
  World w(MakeJob(Mwms("ExitCode", "  runPolicy: {activeDeadlineSeconds: 600}\n")));
  w.Step();
  w.SetAll("Running");
  w.facts.now += absl::Seconds(500);
  w.Step();
  w.job.spec.run_policy.suspend = true;
  w.job.metadata.generation = 2;
  Plan suspend = w.Step();
  EXPECT_EQ(suspend.pods_to_delete.size(), 3u);
  for (const Deletion& d : suspend.pods_to_delete) EXPECT_EQ(d.reason, "Suspended");
  EXPECT_THAT(EventReasons(suspend), ElementsAre("JobSuspended"));
  EXPECT_EQ(w.job.status.state, "Suspended");
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionRunning));
  EXPECT_FALSE(w.job.status.start_time.has_value());
  EXPECT_EQ(Cond(w, api::kConditionSuspended)->observed_generation, 2);
  w.Collect();
  w.facts.now += absl::Hours(1);  // suspended time does not count
  EXPECT_THAT(w.Step().pods_to_create, IsEmpty());

  w.job.spec.run_policy.suspend = false;
  w.job.metadata.generation = 3;
  Plan resume = w.Step();
  EXPECT_EQ(resume.pods_to_create.size(), 3u);
  EXPECT_THAT(EventReasons(resume), ElementsAre("JobResumed"));
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionSuspended));
  EXPECT_EQ(w.job.status.start_time, w.facts.now);
  EXPECT_EQ(resume.requeue_after, absl::Seconds(600));
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionFailed));
  EXPECT_EQ(w.job.status.state, "Created");
  EXPECT_EQ(w.job.status.observed_generation, 3);
}

// ---------------------------------------------------------------------------
// Elastic membership.

// distrain-worker resizes MultiWorkerMirrored in place (elastic.h): a scale
// creates or deletes only the pods of the indices it adds or removes, and
// the survivors keep running with the TF_CONFIG they started with.
TEST(ReconcileTest, ElasticMultiWorkerMirroredOfDistrainWorkerResizesInPlace) {
  World w = Running(Mwms("ExitCode", "  elasticPolicy: {minReplicas: 1, maxReplicas: 5}\n"));
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 4;  // 1 + 4 divides 60
  Plan up = w.Step();
  EXPECT_THAT(up.pods_to_delete, IsEmpty());
  EXPECT_THAT(Names(up.pods_to_create), ElementsAre("mnist-worker-2", "mnist-worker-3"));
  EXPECT_EQ(Json::parse(testing::KubeletEnv(up.pods_to_create[0],
                                            testing::ConfigMaps(w.config_map))["TF_CONFIG"])
                ["cluster"]["worker"].size(),
            4u);
  EXPECT_THAT(EventReasons(up), Not(Contains("MembershipChanged")));
  w.SetAll("Running");
  w.Step();
  EXPECT_EQ(w.job.status.state, "Running");
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());  // old and new TF_CONFIGs live side by side

  w.job.spec.replicas[ReplicaType::kWorker].replicas = 2;  // 1 + 2 divides 60
  Plan down = w.Step();
  EXPECT_THAT(Names(down.pods_to_delete), UnorderedElementsAre("mnist-worker-2", "mnist-worker-3"));
  for (const Deletion& d : down.pods_to_delete) EXPECT_EQ(d.reason, "ScaledDown");
  EXPECT_THAT(down.pods_to_create, IsEmpty());
  EXPECT_EQ(w.job.status.restart_count, 0);

  // A departed worker (exit 143 after SIGTERM) is replaced alone: the
  // others trained on without it.
  w.Collect();
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 143);
  Plan replace = w.Step();
  EXPECT_THAT(Names(replace.pods_to_delete), ElementsAre("mnist-worker-1"));
}

// A user's TensorFlow image reads TF_CONFIG once: a resize is a new generation.
TEST(ReconcileTest, MultiWorkerMirroredScaleUpOfATensorFlowImageStartsANewGeneration) {
  World w = Running(absl::StrCat(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n"
      "    Chief:\n      replicas: 1\n      template: {spec: {containers: [{name: tensorflow, "
      "image: 'tensorflow/tensorflow:2.21.0'}]}}\n"
      "    Worker:\n      replicas: 2\n      template: {spec: {containers: [{name: tensorflow, "
      "image: 'tensorflow/tensorflow:2.21.0'}]}}\n",
      "  training: {globalBatchSize: 60}\n  elasticPolicy: {minReplicas: 1, maxReplicas: 5}\n"));
  // TF_CONFIG as the kubelet gives it to the container (pods.h).
  auto tf_config = [&w](const Json& pod) {
    return testing::KubeletEnv(pod, testing::ConfigMaps(w.config_map))["TF_CONFIG"];
  };
  const std::string old_tf_config = tf_config(w.Pod("mnist-worker-0"));
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 4;  // 1 + 4 divides 60
  Plan plan = w.Step();
  EXPECT_THAT(Names(plan.pods_to_delete),
              UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1"));
  EXPECT_THAT(plan.pods_to_create, IsEmpty());  // the generation starts whole
  EXPECT_THAT(Names(plan.services_to_create), ElementsAre("mnist-worker-2", "mnist-worker-3"));
  EXPECT_EQ(w.job.status.restart_count, 0);  // a resize is not a failure
  EXPECT_EQ(w.job.status.state, "Restarting");
  EXPECT_THAT(EventReasons(plan), Contains("MembershipChanged"));
  w.Collect();
  Plan recreate = w.Step();
  ASSERT_EQ(recreate.pods_to_create.size(), 5u);
  const Json& pod = recreate.pods_to_create[1];
  const std::string tf = tf_config(pod);
  EXPECT_NE(tf, old_tf_config);
  EXPECT_EQ(Json::parse(tf)["cluster"]["worker"].size(), 4u);
  w.SetAll("Running");
  w.Step();
  EXPECT_EQ(w.job.status.state, "Running");
  EXPECT_THAT(w.Step().pods_to_delete, IsEmpty());  // stable afterwards
}

TEST(ReconcileTest, ParameterServerScalingOnlyAddsOrRemovesWorkers) {
  World w = Running(Ps());
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 3;
  Plan up = w.Step();
  EXPECT_THAT(up.pods_to_delete, IsEmpty());
  EXPECT_THAT(Names(up.pods_to_create), ElementsAre("mnist-worker-2"));
  EXPECT_THAT(Names(up.services_to_create), ElementsAre("mnist-worker-2"));
  w.SetAll("Running");
  w.Step();
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 1;
  Plan down = w.Step();
  EXPECT_THAT(Names(down.pods_to_delete), UnorderedElementsAre("mnist-worker-1", "mnist-worker-2"));
  for (const Deletion& d : down.pods_to_delete) EXPECT_EQ(d.reason, "ScaledDown");
  EXPECT_THAT(Names(down.services_to_delete),
              UnorderedElementsAre("mnist-worker-1", "mnist-worker-2"));
  EXPECT_THAT(down.pods_to_create, IsEmpty());
}

// ---------------------------------------------------------------------------
// Gang scheduling.

TEST(ReconcileTest, GangCreatesAPodGroupAndSchedulesThroughIt) {
  World w(MakeJob(Ps("ExitCode", "  runPolicy:\n    scheduling: {gang: true, queue: q1, "
                                 "priorityClass: high}\n")));
  Plan plan = w.Step();
  ASSERT_TRUE(plan.pod_group_to_create.has_value());
  EXPECT_EQ((*plan.pod_group_to_create)["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ((*plan.pod_group_to_create)["metadata"]["name"], "mnist");
  EXPECT_EQ((*plan.pod_group_to_create)["spec"]["minMember"], 6);
  EXPECT_EQ(plan.pods_to_create.size(), 6u);
  for (const Json& pod : plan.pods_to_create) {
    EXPECT_EQ(pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "mnist");
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "q1");
    EXPECT_EQ(pod["spec"]["schedulerName"], "scheduler-plugins-scheduler");
    EXPECT_EQ(pod["spec"]["priorityClassName"], "high");
  }
  EXPECT_FALSE(w.Step().pod_group_to_create.has_value());  // observed now
}

TEST(ReconcileTest, GangFollowsAScale) {
  World w(MakeJob(Ps("ExitCode", "  runPolicy:\n    scheduling: {gang: true}\n")));
  ASSERT_EQ((*w.Step().pod_group_to_create)["spec"]["minMember"], 6);
  w.pod_group->at("metadata")["resourceVersion"] = "17";
  EXPECT_FALSE(w.Step().pod_group_to_update.has_value()) << "nothing changed";
  w.job.spec.replicas[ReplicaType::kWorker].replicas = 3;  // 1 chief + 3 + 2 ps + 1 evaluator
  Plan up = w.Step();
  ASSERT_TRUE(up.pod_group_to_update.has_value());
  EXPECT_EQ((*up.pod_group_to_update)["spec"]["minMember"], 7);
  EXPECT_EQ((*up.pod_group_to_update)["metadata"]["resourceVersion"], "17")
      << "the PUT carries the observed version, so a concurrent change conflicts";
  EXPECT_FALSE(w.Step().pod_group_to_update.has_value()) << "stable once written";
}

TEST(ReconcileTest, GangWithoutItsCrdSaysSoAndCreatesNothing) {
  World w(MakeJob(Mwms("ExitCode", "  runPolicy:\n    scheduling: {gang: true, minAvailable: 2}\n")));
  w.facts.pod_group_crd_installed = false;
  Plan plan = w.Step();
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
  EXPECT_FALSE(plan.pod_group_to_create.has_value());
  const api::Condition* created = Cond(w, api::kConditionCreated);
  ASSERT_NE(created, nullptr);
  EXPECT_FALSE(created->is_true());
  EXPECT_EQ(created->reason, "PodGroupCRDMissing");
  EXPECT_THAT(created->message, HasSubstr("podgroups.scheduling.x-k8s.io"));
  EXPECT_EQ(plan.events.at(0).type, "Warning");
  EXPECT_TRUE(plan.requeue_after.has_value());
  w.facts.pod_group_crd_installed = true;
  Plan installed = w.Step();
  EXPECT_EQ((*installed.pod_group_to_create)["spec"]["minMember"], 2);
  EXPECT_EQ(installed.pods_to_create.size(), 3u);
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionCreated));
}

// ---------------------------------------------------------------------------
// Objects.

TEST(ReconcileObjectTest, InvalidSpecFailsTheJobAndCreatesNothing) {
  Json object = {{"apiVersion", "distrain.io/v1alpha1"},
                 {"kind", "DistributedTrainingJob"},
                 {"metadata", {{"name", "bad"}, {"namespace", "a"}, {"generation", 4}}},
                 {"spec",
                  {{"strategy", "ParameterServer"},
                   {"replicaSpecs", {{"Worker", {{"replicas", 2}}}}}}}};
  Plan plan = ReconcileObject(object, {}, {testing::T0(), true}, {});
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
  EXPECT_TRUE(plan.status.IsTrue(api::kConditionFailed));
  const api::Condition* failed = plan.status.FindCondition(api::kConditionFailed);
  EXPECT_EQ(failed->reason, "InvalidSpec");
  EXPECT_THAT(failed->message, HasSubstr("spec.replicaSpecs.PS.replicas"));
  EXPECT_EQ(failed->observed_generation, 4);
  EXPECT_EQ(plan.status.observed_generation, 4);
  EXPECT_EQ(plan.status.state, "Failed");
  EXPECT_TRUE(plan.status_changed);
}

TEST(ReconcileObjectTest, UnreadableStatusIsRewritten) {
  World w(MakeJob(Mwms()));
  Json object = api::ToJson(w.job);
  object["status"] = {{"restartCount", "many"}};
  Plan plan = ReconcileObject(object, {}, {testing::T0(), true}, {});
  EXPECT_EQ(plan.pods_to_create.size(), 3u);
  EXPECT_TRUE(plan.status_changed);
  EXPECT_EQ(plan.events.at(0).reason, "InvalidStatus");
  EXPECT_THAT(plan.events.at(0).note, HasSubstr("status.restartCount"));
}

TEST(ReconcileTest, JobBeingDeletedIsLeftToGarbageCollection) {
  World w(MakeJob(Mwms()));
  w.job.metadata.deletion_timestamp = testing::T0();
  Plan plan = w.Step();
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
  EXPECT_FALSE(plan.status_changed);
}

TEST(ConditionsTest, SetConditionFollowsMetav1Semantics) {
  api::JobStatus s;
  const absl::Time t1 = testing::T0(), t2 = t1 + absl::Seconds(5);
  EXPECT_FALSE(SetCondition(&s, "Running", false, "R", "m", 1, t1));  // absent False: not added
  EXPECT_TRUE(s.conditions.empty());
  EXPECT_TRUE(SetCondition(&s, "Created", false, "Why", "m", 1, t1, /*record_false=*/true));
  EXPECT_EQ(s.conditions.at(0).status, "False");
  s.conditions.clear();
  EXPECT_TRUE(SetCondition(&s, "Running", true, "A", "m1", 1, t1));
  EXPECT_FALSE(SetCondition(&s, "Running", true, "B", "m2", 2, t2));  // same status
  EXPECT_EQ(s.conditions[0].last_transition_time, t1);
  EXPECT_EQ(s.conditions[0].reason, "B");
  EXPECT_EQ(s.conditions[0].observed_generation, 2);
  EXPECT_TRUE(SetCondition(&s, "Running", false, "C", "m3", 2, t2));
  EXPECT_EQ(s.conditions[0].last_transition_time, t2);
  EXPECT_EQ(s.conditions[0].status, "False");
}

}  // namespace
}  // namespace distrain::controller

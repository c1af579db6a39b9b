#include "operator/controller/kueue.h"

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
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing::EventReasons;
using testing::Json;
using testing::MakeJob;
using testing::SetPhase;
using testing::World;

// Chief + 2 Workers + 2 PS + Evaluator: six pods, four replica types.
std::string Ps(const std::string& run_policy = "") {
  return absl::StrCat(
      "  strategy: ParameterServer\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 2}\n    PS: {replicas: 2}\n    Evaluator: {replicas: 1}\n",
      run_policy);
}

std::string Mwms(const std::string& run_policy = "") {
  return absl::StrCat(
      "  strategy: MultiWorkerMirrored\n  replicaSpecs:\n    Chief: {replicas: 1}\n"
      "    Worker: {replicas: 2}\n  training: {globalBatchSize: 60}\n",
      run_policy);
}

const char kQueue[] = "  runPolicy:\n    scheduling: {queue: training}\n";

std::string Label(const Json& pod, const char* key) {
  return pod["metadata"].value("labels", Json::object()).value(key, "");
}
std::string Annotation(const Json& pod, const char* key) {
  return pod["metadata"].value("annotations", Json::object()).value(key, "");
}

// What Kueue's pod webhook does to a queued pod it admits later.
void Gate(Json* pod) {
  (*pod)["spec"]["schedulingGates"] = Json::array({{{"name", kKueueAdmissionGate}}});
}
void Ungate(Json* pod) { (*pod)["spec"].erase("schedulingGates"); }

void ApplyPatches(World* w, const Plan& plan) {
  for (const PodPatch& p : plan.pods_to_patch) {
    ASSERT_TRUE(w->pods.count(p.name)) << p.name;
    Json& pod = w->pods[p.name];
    EXPECT_EQ(p.patch["metadata"]["uid"], pod["metadata"]["uid"]) << p.name;
    pod.merge_patch(p.patch);
  }
}

TEST(KueueTest, JobWithoutQueueGetsNoKueueMetadata) {
  World w(MakeJob(Ps()));
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 6u);
  for (const Json& pod : plan.pods_to_create) {
    const std::string dump = pod["metadata"].dump();
    EXPECT_THAT(dump, ::testing::Not(HasSubstr("kueue.x-k8s.io"))) << dump;
  }
  for (auto& [name, pod] : w.pods) Gate(&pod);  // not Kueue's: nothing to say about it
  w.Step();
  EXPECT_EQ(w.job.status.FindCondition(api::kConditionQueued), nullptr);
  EXPECT_EQ(w.job.status.state, "Created");
}

TEST(KueueTest, EveryPodIsOneMemberOfTheJobsPodGroup) {
  World w(MakeJob(Ps(kQueue)));
  Plan plan = w.Step();
  ASSERT_EQ(plan.pods_to_create.size(), 6u);
  std::set<std::string> groups, roles;
  for (const Json& pod : plan.pods_to_create) {
    EXPECT_EQ(Label(pod, "kueue.x-k8s.io/queue-name"), "training");
    groups.insert(Label(pod, "kueue.x-k8s.io/pod-group-name"));
    // Every replica of the job, evaluator and PS included: Kueue admits them together.
    EXPECT_EQ(Annotation(pod, "kueue.x-k8s.io/pod-group-total-count"), "6");
    roles.insert(Annotation(pod, "kueue.x-k8s.io/role-hash"));
    EXPECT_EQ(Annotation(pod, "kueue.x-k8s.io/role-hash"),
              Label(pod, api::kLabelReplicaType));
    EXPECT_EQ(Annotation(pod, "kueue.x-k8s.io/retriable-in-group"), "");  // while it runs
  }
  EXPECT_THAT(groups, UnorderedElementsAre("mnist-uidmnist"));
  EXPECT_THAT(roles, UnorderedElementsAre("chief", "worker", "ps", "evaluator"));
}

TEST(KueueTest, QueueComesFromTheSpecElseFromTheJobsLabel) {
  api::DistributedTrainingJob labelled = MakeJob(Ps());
  labelled.metadata.labels[kQueueLabel] = "team-a-queue";
  World w(labelled);
  Plan plan = w.Step();
  ASSERT_FALSE(plan.pods_to_create.empty());
  EXPECT_EQ(Label(plan.pods_to_create[0], "kueue.x-k8s.io/queue-name"), "team-a-queue");
  EXPECT_EQ(Label(plan.pods_to_create[0], "kueue.x-k8s.io/pod-group-name"), "mnist-uidmnist");

  api::DistributedTrainingJob both = MakeJob(Ps(kQueue));
  both.metadata.labels[kQueueLabel] = "team-a-queue";
  EXPECT_EQ(KueueQueueName(both, both.spec), "training");
}

TEST(KueueTest, AQueueThatCannotNameALocalQueueFailsTheJobNamingTheField) {
  World w(MakeJob(Ps("  runPolicy:\n    scheduling: {queue: Team_Queue}\n")));
  Plan plan = w.Step();
  EXPECT_THAT(plan.pods_to_create, IsEmpty());
  const api::Condition* failed = w.job.status.FindCondition(api::kConditionFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason, "InvalidSpec");
  EXPECT_THAT(failed->message, HasSubstr("spec.runPolicy.scheduling.queue: \"Team_Queue\" cannot "
                                         "name a Kueue LocalQueue"));
  EXPECT_THAT(failed->message, HasSubstr("kubectl get localqueues -n team-a"));

  api::DistributedTrainingJob labelled = MakeJob(Ps());
  labelled.metadata.labels[kQueueLabel] = "-queue";
  absl::Status s = ValidateKueueQueue(labelled, labelled.spec);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("metadata.labels[kueue.x-k8s.io/queue-name]: \"-queue\""));
  for (const char* good : {"training", "team-a.gpu", "q1"}) {
    api::DistributedTrainingJob job = MakeJob(Ps());
    job.metadata.labels[kQueueLabel] = good;
    EXPECT_TRUE(ValidateKueueQueue(job, job.spec).ok()) << good;
  }
  for (const std::string& bad :
       std::vector<std::string>{"Training", "a b", "queue.", std::string(64, 'q')}) {
    api::DistributedTrainingJob job = MakeJob(Ps());
    job.spec.run_policy.scheduling.queue = bad;
    EXPECT_FALSE(ValidateKueueQueue(job, job.spec).ok()) << bad;
  }
}

TEST(KueueTest, GroupNameIsALabelValueUniquePerJobObject) {
  api::DistributedTrainingJob job = MakeJob(Ps());
  job.metadata.uid = "0d5c3a9e-1111-2222-3333-444455556666";
  EXPECT_EQ(KueuePodGroupName(job), "mnist-0d5c3a9e");
  // A job re-created under the same name is a new group (a new Workload).
  api::DistributedTrainingJob again = job;
  again.metadata.uid = "7f00aa01-1111-2222-3333-444455556666";
  EXPECT_NE(KueuePodGroupName(again), KueuePodGroupName(job));

  job.metadata.name = std::string(60, 'a');
  const std::string long_name = KueuePodGroupName(job);
  EXPECT_EQ(long_name.size(), 63u);
  EXPECT_EQ(long_name.substr(long_name.size() - 9), "-0d5c3a9e");
}

TEST(KueueTest, GatedPodsMakeTheJobQueuedUntilKueueAdmitsThemAll) {
  World w(MakeJob(Mwms(kQueue)));
  w.Step();
  ASSERT_EQ(w.pods.size(), 3u);
  // No pod of it has been seen yet when they are created: the clock waits.
  EXPECT_FALSE(w.job.status.start_time.has_value());
  for (auto& [name, pod] : w.pods) Gate(&pod);
  w.facts.now += absl::Seconds(1);
  Plan queued = w.Step();
  EXPECT_TRUE(w.job.status.IsTrue(api::kConditionQueued));
  EXPECT_EQ(w.job.status.state, "Queued");
  EXPECT_FALSE(w.job.status.start_time.has_value());
  const api::Condition* c = w.job.status.FindCondition(api::kConditionQueued);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->reason, "WaitingForKueueAdmission");
  EXPECT_THAT(c->message, HasSubstr("3 of 3 pods wait for Kueue to admit pod group mnist-uidmnist"));
  EXPECT_THAT(c->message, HasSubstr("LocalQueue training"));
  EXPECT_THAT(c->message, HasSubstr("kubectl get workload -n team-a mnist-uidmnist"));
  EXPECT_THAT(EventReasons(queued), Contains("WaitingForKueueAdmission"));

  // Waiting changes nothing.
  w.facts.now += absl::Seconds(30);
  Plan waiting = w.Step();
  EXPECT_FALSE(waiting.status_changed);
  EXPECT_THAT(waiting.pods_to_create, IsEmpty());
  EXPECT_THAT(waiting.pods_to_delete, IsEmpty());

  // Kueue ungated one pod only (it never does for a group, but the job says so).
  Ungate(&w.Pod("mnist-chief-0"));
  w.Step();
  EXPECT_THAT(w.job.status.FindCondition(api::kConditionQueued)->message,
              HasSubstr("2 of 3 pods wait"));

  // Admitted: the gates go, the pods run, the clock starts.
  for (auto& [name, pod] : w.pods) Ungate(&pod);
  w.SetAll("Running");
  w.facts.now += absl::Seconds(5);
  Plan admitted = w.Step();
  c = w.job.status.FindCondition(api::kConditionQueued);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, "False");
  EXPECT_EQ(c->reason, "KueueAdmitted");
  EXPECT_EQ(w.job.status.state, "Running");
  EXPECT_EQ(w.job.status.start_time, w.facts.now);
  EXPECT_THAT(EventReasons(admitted), Contains("KueueAdmitted"));
}

TEST(KueueTest, PodsOfAnotherJobObjectDoNotCount) {
  World w(MakeJob(Mwms(kQueue)));
  w.Step();
  w.SetAll("Running");
  w.Step();
  // A gated pod left from an earlier job of the same name (another uid).
  Json stranger = w.Pod("mnist-worker-0");
  stranger["metadata"]["name"] = "mnist-worker-9";
  stranger["metadata"]["ownerReferences"][0]["uid"] = "uid-earlier";
  Gate(&stranger);
  w.pods["mnist-worker-9"] = stranger;
  w.Step();
  EXPECT_FALSE(w.job.status.IsTrue(api::kConditionQueued));
  EXPECT_EQ(w.job.status.state, "Running");
}

TEST(KueueTest, FinishedJobMarksItsGroupUnretriableOnce) {
  World w(MakeJob(Ps(kQueue)));
  w.Step();
  w.SetAll("Running");
  w.Step();
  SetPhase(&w.Pod("mnist-chief-0"), "Succeeded", 0);
  Plan done = w.Step();
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionSucceeded));
  // Every pod, the PS that cleanPodPolicy deletes in the same plan included.
  std::vector<std::string> patched;
  for (const PodPatch& p : done.pods_to_patch) {
    patched.push_back(p.name);
    EXPECT_EQ(p.patch["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"], "false");
    EXPECT_EQ(p.patch["metadata"]["uid"], w.Pod(p.name)["metadata"]["uid"]);
  }
  EXPECT_THAT(patched, UnorderedElementsAre("mnist-chief-0", "mnist-worker-0", "mnist-worker-1",
                                            "mnist-ps-0", "mnist-ps-1", "mnist-evaluator-0"));
  EXPECT_THAT(testing::Names(done.pods_to_delete), Contains("mnist-ps-0"));
  ApplyPatches(&w, done);
  Plan after = w.Step();
  EXPECT_THAT(after.pods_to_patch, IsEmpty());
}

TEST(KueueTest, FailedJobReleasesItsQuotaToo) {
  World w(MakeJob(Mwms("  runPolicy:\n    scheduling: {queue: training}\n    backoffLimit: 0\n")));
  w.Step();
  w.SetAll("Running");
  w.Step();
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 170);  // retryable, but no restarts left
  Plan failed = w.Step();
  ASSERT_TRUE(w.job.status.IsTrue(api::kConditionFailed)) << w.job.status.state;
  EXPECT_EQ(failed.pods_to_patch.size(), 3u);
}

TEST(KueueTest, FinishedJobWithoutQueueIsNotPatched) {
  World w(MakeJob(Ps()));
  w.Step();
  w.SetAll("Running");
  w.Step();
  SetPhase(&w.Pod("mnist-chief-0"), "Succeeded", 0);
  EXPECT_THAT(w.Step().pods_to_patch, IsEmpty());
}

TEST(KueueTest, RestartedPodsJoinTheSameGroup) {
  World w(MakeJob(Mwms(kQueue)));
  w.Step();
  w.SetAll("Running");
  w.Step();
  const std::string group = Label(w.Pod("mnist-worker-0"), "kueue.x-k8s.io/pod-group-name");
  SetPhase(&w.Pod("mnist-worker-1"), "Failed", 170);
  Plan restart = w.Step();
  ASSERT_FALSE(restart.pods_to_delete.empty());  // the failed pod, or its whole generation
  EXPECT_THAT(restart.pods_to_patch, IsEmpty());  // a restart keeps the group retriable
  w.Collect();
  Plan recreate = w.Step();
  ASSERT_EQ(recreate.pods_to_create.size(), restart.pods_to_delete.size());
  for (const Json& pod : recreate.pods_to_create) {
    EXPECT_EQ(Label(pod, "kueue.x-k8s.io/pod-group-name"), group);
    EXPECT_EQ(Annotation(pod, "kueue.x-k8s.io/pod-group-total-count"), "3");
  }
}

}  // namespace
}  // namespace distrain::controller

#include "operator/controller/reconcile.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "operator/controller/checkpoint_volume.h"
#include "operator/controller/cleanup.h"
#include "operator/controller/conditions.h"
#include "operator/controller/elastic.h"
#include "operator/controller/final_progress.h"
#include "operator/controller/gang.h"
#include "operator/controller/kueue.h"
#include "operator/controller/network_policy.h"
#include "operator/controller/observed.h"
#include "operator/controller/pods.h"
#include "operator/controller/restart.h"
#include "operator/controller/stall.h"
#include "operator/controller/success.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

const char* RestartPolicyName(RestartPolicy p) {
  switch (p) {
    case RestartPolicy::kNever:
      return "Never";
    case RestartPolicy::kOnFailure:
      return "OnFailure";
    case RestartPolicy::kAlways:
      return "Always";
    case RestartPolicy::kExitCode:
      return "ExitCode";
  }
  return "?";
}

bool IsTrainingType(ReplicaType t) { return t != ReplicaType::kEvaluator; }

// How soon to look again when the ConfigMap of an earlier job of the same name
// is still there (normally its deletion event comes first).
constexpr absl::Duration kForeignConfigMapRetry = absl::Seconds(5);

// Whether a child is the job's own and not being deleted.
bool OwnedByJob(const Json& child, const std::string& job_uid) {
  if (!child.is_object() || !child.contains("metadata")) return false;
  const Json& metadata = child["metadata"];
  if (!metadata.is_object() || metadata.contains("deletionTimestamp")) return false;
  if (!metadata.contains("ownerReferences") || !metadata["ownerReferences"].is_array()) {
    return false;
  }
  for (const Json& ref : metadata["ownerReferences"]) {
    if (ref.is_object() && ref.value("uid", "") == job_uid) return true;
  }
  return false;
}

std::string Annotation(const Json& object, const char* key) {
  const Json& metadata = object.value("metadata", Json::object());
  if (!metadata.is_object() || !metadata.contains("annotations") ||
      !metadata["annotations"].is_object()) {
    return "";
  }
  const Json& value = metadata["annotations"].value(key, Json());
  return value.is_string() ? value.get<std::string>() : "";
}

// One reconcile's working state: the plan being built and what it needs.
class Reconciler {
 public:
  Reconciler(const api::DistributedTrainingJob& job, const Facts& facts)
      : job_(job), facts_(facts) {
    plan_.status = job.status;
  }

  Plan Run(const Observed& observed, const ControllerOptions& options);
  // Fails the job for a spec it cannot run.
  Plan RunInvalid(const std::string& message);

 private:
  api::JobStatus& status() { return plan_.status; }

  void Set(const std::string& type, bool value, const std::string& reason,
           const std::string& message, bool emit = true, bool record_false = false) {
    if (SetCondition(&status(), type, value, reason, message, job_.metadata.generation,
                     facts_.now, record_false) &&
        emit) {
      const bool warning = (value && (type == api::kConditionFailed ||
                                      type == api::kConditionRestarting)) ||
                           (!value && type == api::kConditionCreated);
      plan_.events.push_back({warning ? "Warning" : "Normal", reason, message, ""});
    }
  }

  void Finish(bool succeeded, const std::string& reason, const std::string& message) {
    Set(succeeded ? api::kConditionSucceeded : api::kConditionFailed, true, reason, message);
    Set(api::kConditionRunning, false, reason, message, /*emit=*/false);
    Set(api::kConditionRestarting, false, reason, message, /*emit=*/false);
    Set(api::kConditionStalled, false, reason, message, /*emit=*/false);
    status().completion_time = facts_.now;
    finished_ = true;
  }

  bool OwnedByJob(const Json& child) const {
    return controller::OwnedByJob(child, job_.metadata.uid);
  }

  void DeletePod(const ObservedPod& pod, const std::string& reason) {
    if (plan_.DeletesPod(pod.name)) return;
    plan_.pods_to_delete.push_back({.name = pod.name,
                                    .uid = pod.uid,
                                    .reason = reason,
                                    .finished = pod.phase == "Failed" || pod.phase == "Succeeded"});
  }

  void Finalize();
  void CleanUpFinished();
  void HandleFailures();
  void HandleScale();
  void CreateMissing(const ControllerOptions& options);
  bool CreateCheckpointClaim(const ControllerOptions& options);  // false: no pods now
  void UpdateRunning();
  void UpdateQueued();

  const api::DistributedTrainingJob& job_;
  const Facts& facts_;
  Plan plan_;
  Topology topology_;
  std::vector<ObservedPod> pods_;
  std::set<std::string> observed_pod_names_;
  std::map<std::string, std::string> observed_services_;  // name -> uid
  const Observed* observed_ = nullptr;
  bool finished_ = false;
  std::map<ReplicaType, int> new_restarts_;
};

Plan Reconciler::Run(const Observed& observed, const ControllerOptions& options) {
  observed_ = &observed;
  if (job_.metadata.deletion_timestamp) return std::move(plan_);

  absl::StatusOr<Topology> topology = BuildTopology(job_, options);
  if (!topology.ok()) return RunInvalid(std::string(topology.status().message()));
  topology_ = std::move(*topology);
  const JobConfig& config = topology_.config;

  pods_ = ParseObservedPods(observed.pods, job_.metadata.name, job_.metadata.uid);
  for (const ObjectRef& pod : observed.pods) {
    if (pod->contains("metadata") && (*pod)["metadata"].is_object()) {
      observed_pod_names_.insert((*pod)["metadata"].value("name", ""));
    }
  }
  for (const ObjectRef& svc : observed.services) {
    if (svc->contains("metadata") && (*svc)["metadata"].is_object()) {
      const Json& metadata = (*svc)["metadata"];
      observed_services_[metadata.value("name", "")] = metadata.value("uid", "");
    }
  }

  finished_ = status().IsTrue(api::kConditionSucceeded) || status().IsTrue(api::kConditionFailed);
  if (!finished_ && config.run_policy.suspend) {
    for (const ObservedPod& p : pods_) {
      if (!p.terminating) DeletePod(p, "Suspended");
    }
    const std::string message =
        "spec.runPolicy.suspend is true: the job's pods are deleted until it is set to false";
    Set(api::kConditionSuspended, true, "JobSuspended", message);
    Set(api::kConditionRunning, false, "JobSuspended", message, /*emit=*/false);
    Set(api::kConditionRestarting, false, "JobSuspended", message, /*emit=*/false);
    status().start_time.reset();  // batch/v1: the deadline clock restarts on resume
    Finalize();
    return std::move(plan_);
  }
  if (!finished_) {
    if (status().IsTrue(api::kConditionSuspended)) {
      Set(api::kConditionSuspended, false, "JobResumed",
          "spec.runPolicy.suspend is false: the job's pods are created again");
    }
    // 5. The deadline.
    const std::optional<int64_t>& deadline = config.run_policy.active_deadline_seconds;
    if (deadline && status().start_time) {
      const absl::Time expiry = *status().start_time + absl::Seconds(*deadline);
      if (facts_.now >= expiry) {
        Finish(false, "DeadlineExceeded",
               absl::StrCat("the job ran for longer than spec.runPolicy.activeDeadlineSeconds (",
                            *deadline, " s) since ", api::FormatKubeTime(*status().start_time),
                            "; its pods are stopped"));
      } else {
        plan_.RequeueAfter(expiry - facts_.now);
      }
    }
  }
  // 6. Success.
  if (!finished_) {
    if (std::optional<std::string> why = SucceededBecause(config, pods_)) {
      Finish(true, "JobSucceeded", *why);
      // The master's own last figures, written with the condition (final_progress.h).
      status().progress = FinalProgress(status().progress, observed.pods, config.training.steps);
    }
  }
  if (!finished_) HandleFailures();
  if (!finished_) HandleScale();
  if (!finished_) CreateMissing(options);
  if (!finished_) UpdateRunning();
  if (!finished_) UpdateQueued();
  if (finished_) CleanUpFinished();
  Finalize();
  return std::move(plan_);
}

void Reconciler::HandleFailures() {
  const JobConfig& config = topology_.config;
  // A master whose step has not moved within the progress deadline is
  // restarted like a pod that failed without its container exiting
  // (stall.h step 4): `judged` is the observed pods with that one Failed.
  std::vector<ObservedPod> judged = pods_;
  const StallDecision stall =
      DecideStall(config, status(), pods_, facts_.now, facts_.progress_watch_start);
  if (stall.stalled != nullptr) {
    for (ObservedPod& p : judged) {
      if (p.name != stall.stalled->name) continue;
      p.phase = "Failed";
      p.exit_code.reset();
      p.reason = "Stalled";
    }
    if (SetCondition(&status(), api::kConditionStalled, true, kReasonStalled, stall.message,
                     job_.metadata.generation, facts_.now)) {
      plan_.events.push_back({"Warning", kReasonStalled, stall.message, stall.stalled->name});
    }
  } else {
    if (stall.resumed) {
      Set(api::kConditionStalled, false, kReasonResumed,
          absl::StrCat("the step counter moves again (last step at ",
                       status().progress.value(kProgressLastStepTime, std::string()), ")"));
    }
    if (stall.check_at) plan_.RequeueAfter(*stall.check_at - facts_.now);
  }
  RestartDecision d = DecideRestarts(config, judged);
  if (!d.fatal.empty()) {
    const ObservedPod& pod = *d.fatal.front();
    const RestartPolicy policy = config.replicas.at(pod.id.type).restart_policy;
    std::string message = absl::StrCat("pod ", pod.name, " ", pod.Describe(), "; restartPolicy ",
                                       RestartPolicyName(policy), " does not restart it");
    if (policy == RestartPolicy::kExitCode) {
      absl::StrAppend(&message, " (exit codes 1-127 are permanent: fix the job and resubmit)");
    }
    Finish(false, absl::StrCat(ReplicaTypeName(pod.id.type), "Failed"), message);
    return;
  }
  for (const ObservedPod* pod : d.evaluator_lost) {
    // Once per failure: the Evaluator's failed count has just gone up.
    auto old = job_.status.replica_statuses.find(ReplicaType::kEvaluator);
    if (old == job_.status.replica_statuses.end() || old->second.failed == 0) {
      plan_.events.push_back({"Warning", "EvaluatorFailed",
                              absl::StrCat("pod ", pod->name, " ", pod->Describe(),
                                           "; it is not restarted and training goes on"),
                              pod->name});
    }
  }
  const int restarts = d.restarts();
  if (restarts == 0) return;
  const std::optional<int64_t>& limit = config.run_policy.backoff_limit;
  if (limit && status().restart_count + restarts > *limit) {
    const ObservedPod& pod = d.group_causes.empty() ? *d.individual.front() : *d.group_causes.front();
    Finish(false, "BackoffLimitExceeded",
           absl::StrCat("pod ", pod.name, " ", pod.Describe(), ", and the job has already been "
                        "restarted ", status().restart_count, " times, the limit of "
                        "spec.runPolicy.backoffLimit (", *limit, ")"));
    return;
  }
  std::vector<std::string> causes;
  if (!d.group_types.empty()) {
    for (const ObservedPod* pod : d.group_causes) {
      causes.push_back(absl::StrCat(pod->name, " ", pod->Describe()));
    }
    std::vector<std::string> types;
    for (ReplicaType t : d.group_types) {
      if (config.replicas_of(t) == 0) continue;
      types.push_back(ReplicaTypeName(t));
      ++new_restarts_[t];
    }
    for (const ObservedPod& p : pods_) {
      if (!p.terminating &&
          std::find(d.group_types.begin(), d.group_types.end(), p.id.type) != d.group_types.end()) {
        DeletePod(p, "Restart");
      }
    }
    plan_.events.push_back(
        {"Warning", "Restarting",
         absl::StrCat("restarting every ", absl::StrJoin(types, ", "), " pod as one generation (",
                      StrategyName(config.strategy), " cannot lose a member): ",
                      absl::StrJoin(causes, "; ")),
         d.group_causes.front()->name});
  }
  for (const ObservedPod* pod : d.individual) {
    const std::string cause = absl::StrCat(pod->name, " ", pod->Describe());
    causes.push_back(cause);
    ++new_restarts_[pod->id.type];
    DeletePod(*pod, "Restart");
    plan_.events.push_back({"Warning", "Restarting", absl::StrCat("replacing pod ", cause),
                            pod->name});
  }
  status().restart_count += restarts;
  const std::string message = absl::StrCat("restart ", status().restart_count,
                                           limit ? absl::StrCat(" of at most ", *limit) : "",
                                           ": ", absl::StrJoin(causes, "; "));
  Set(api::kConditionRestarting, true, "PodsRestarting", message, /*emit=*/false);
  Set(api::kConditionRunning, false, "PodsRestarting", message, /*emit=*/false);
}

void Reconciler::HandleScale() {
  ScaleDecision d = DecideScale(topology_, pods_);
  for (const ObservedPod* p : d.excess) DeletePod(*p, "ScaledDown");
  if (d.regenerate.empty()) return;
  bool any = false;
  for (const ObservedPod* p : d.regenerate) {
    if (!plan_.DeletesPod(p->name)) any = true;
    DeletePod(*p, "MembershipChanged");
  }
  if (!any) return;  // already restarting for a failure
  const std::string message = absl::StrCat(
      "the training cluster changed (", topology_.config.replicas_of(ReplicaType::kChief),
      " Chief, ", topology_.config.replicas_of(ReplicaType::kWorker),
      " Workers): restarting the Chief and Worker pods as one generation with the new TF_CONFIG");
  plan_.events.push_back({"Normal", "MembershipChanged", message, ""});
  Set(api::kConditionRestarting, true, "MembershipChanged", message, /*emit=*/false);
  Set(api::kConditionRunning, false, "MembershipChanged", message, /*emit=*/false);
}

void Reconciler::CreateMissing(const ControllerOptions& options) {
  const JobConfig& config = topology_.config;
  // 9. Gang scheduling.
  if (config.run_policy.scheduling.gang) {
    if (!facts_.pod_group_crd_installed) {
      Set(api::kConditionCreated, false, "PodGroupCRDMissing",
          absl::StrCat("spec.runPolicy.scheduling.gang is true, but the PodGroup CRD (",
                       kPodGroupResource,
                       ") is not installed, so no pod is created: install scheduler-plugins' "
                       "coscheduling, or set gang to false"),
          /*emit=*/true, /*record_false=*/true);
      plan_.RequeueAfter(kGangRetry);
      return;
    }
    if (!observed_->pod_group) {
      plan_.pod_group_to_create = BuildPodGroup(job_, topology_);
    } else if (const int size = GangSize(config);
               observed_->pod_group->value(Json::json_pointer("/spec/minMember"), -1) != size) {
      // A scale (kubectl scale, elastic policy) changed the gang: the
      // coscheduler must wait for the new count, not the old one.
      Json update = *observed_->pod_group;
      update["spec"]["minMember"] = size;
      plan_.pod_group_to_update = std::move(update);
    }
  }

  // The NetworkPolicy: written before any pod, so none runs unprotected.
  if (options.network_policy.enabled) {
    const Json desired = BuildNetworkPolicy(job_, topology_, options);
    const std::optional<Json>& observed_policy = observed_->network_policy;
    if (!observed_policy) {
      plan_.network_policy_to_create = desired;
    } else if (!OwnedByJob(*observed_policy)) {
      // An earlier job's of the same name, not yet garbage-collected; it
      // selects these pods the same way. Its deletion requeues the job.
      plan_.RequeueAfter(kForeignConfigMapRetry);
    } else if (Annotation(*observed_policy, kNetworkPolicyHashAnnotation) !=
               desired["metadata"]["annotations"][kNetworkPolicyHashAnnotation]) {
      Json update = *observed_policy;
      update["spec"] = desired["spec"];
      update["metadata"]["annotations"][kNetworkPolicyHashAnnotation] =
          desired["metadata"]["annotations"][kNetworkPolicyHashAnnotation];
      plan_.network_policy_to_update = std::move(update);
    }
  }

  // The checkpoint claim (checkpoint_volume.h): created before any pod that
  // mounts it; a claim of that name that is not the job's holds them back.
  if (!CreateCheckpointClaim(options)) return;

  // The cluster-spec ConfigMap: the apply layer writes it before any pod,
  // which reads it when it starts (pods.h).
  const Json desired_config_map = BuildClusterConfigMap(job_, topology_);
  const std::optional<Json>& config_map = observed_->cluster_config_map;
  if (!config_map) {
    plan_.config_map_to_create = desired_config_map;
  } else if (!OwnedByJob(*config_map)) {
    // An earlier job's of the same name, not yet garbage-collected: pods made
    // now could start with its cluster. Its deletion requeues the job.
    plan_.RequeueAfter(kForeignConfigMapRetry);
    return;
  } else if (config_map->value("data", Json()) != desired_config_map["data"]) {
    Json update = *config_map;
    update["data"] = desired_config_map["data"];
    update["metadata"]["annotations"][kClusterHashAnnotation] = topology_.cluster_hash;
    plan_.config_map_to_update = std::move(update);
  }

  // A new generation starts whole: no training pod of a synchronous job (or
  // of any job while a Chief or PS is going) is created while an old one is
  // still terminating.
  bool wait_for_generation = false;
  for (const ObservedPod& p : pods_) {
    if (!p.terminating && !plan_.DeletesPod(p.name)) continue;
    if (p.id.type == ReplicaType::kChief || p.id.type == ReplicaType::kPS ||
        (p.id.type == ReplicaType::kWorker && config.strategy != StrategyKind::kParameterServer)) {
      wait_for_generation = true;
    }
  }
  int created = 0;
  std::set<std::string> desired_names;
  for (ReplicaId id : DesiredReplicas(config)) {
    const std::string name = ReplicaName(job_.metadata.name, id.type, id.index);
    desired_names.insert(name);
    if (!observed_services_.count(name)) {
      plan_.services_to_create.push_back(BuildService(job_, topology_, id));
    }
    if (observed_pod_names_.count(name)) continue;
    if (IsTrainingType(id.type) && wait_for_generation) continue;
    plan_.pods_to_create.push_back(BuildPod(job_, topology_, id, options));
    ++created;
  }
  for (const auto& [name, uid] : observed_services_) {
    if (!desired_names.count(name)) plan_.services_to_delete.push_back({name, uid, "ScaledDown"});
  }
  Set(api::kConditionCreated, true, "JobCreated",
      absl::StrCat("the job's ", desired_names.size(), desired_names.size() == 1 ? " pod" : " pods",
                   " and Services are created by the operator"));
  if (!status().start_time && (created > 0 || !pods_.empty())) {
    status().start_time = facts_.now;
    if (config.run_policy.active_deadline_seconds) {
      plan_.RequeueAfter(absl::Seconds(*config.run_policy.active_deadline_seconds));
    }
  }
}

bool Reconciler::CreateCheckpointClaim(const ControllerOptions& options) {
  const CheckpointClaimDecision claim = DecideCheckpointClaim(
      job_, ResolveCheckpointStorage(job_, topology_.config, options.checkpoint_storage),
      observed_->checkpoint_claim);
  if (!claim.blocked.empty()) {
    Set(api::kConditionCreated, false, "CheckpointClaimConflict", claim.blocked,
        /*emit=*/true, /*record_false=*/true);
    plan_.RequeueAfter(kForeignConfigMapRetry);
    return false;
  }
  plan_.checkpoint_claim_to_create = claim.to_create;
  return true;
}

void Reconciler::UpdateRunning() {
  // Running: every training replica's pod runs (or has already finished), none
  // is being replaced, and at least one runs.
  std::map<ReplicaId, const ObservedPod*> by_id;
  for (const ObservedPod& p : pods_) {
    if (!p.terminating && !plan_.DeletesPod(p.name)) by_id[p.id] = &p;
  }
  int running = 0, training = 0;
  for (ReplicaId id : DesiredReplicas(topology_.config)) {
    if (!IsTrainingType(id.type)) continue;
    ++training;
    auto it = by_id.find(id);
    if (it == by_id.end() || !(it->second->running() || it->second->succeeded())) return;
    if (it->second->running()) ++running;
  }
  if (running == 0) return;
  const std::string message =
      absl::StrCat("all ", training, training == 1 ? " training pod is" : " training pods are",
                   " running");
  Set(api::kConditionRunning, true, "JobRunning", message);
  Set(api::kConditionRestarting, false, "JobRunning", message, /*emit=*/false);
}

// Queued (kueue.h): True while Kueue holds any of the pods at its admission
// gate; the activeDeadlineSeconds clock starts only once they are admitted.
void Reconciler::UpdateQueued() {
  if (KueueQueueName(job_, topology_.config).empty()) return;
  const std::optional<QueuedDecision> d = DecideQueued(job_, topology_.config, observed_->pods);
  if (d) Set(api::kConditionQueued, d->queued, d->reason, d->message);
  // No pods yet (being created now): Kueue's webhook will gate them.
  if ((!d || d->queued) && !job_.status.start_time) status().start_time.reset();
}

void Reconciler::CleanUpFinished() {
  const JobConfig& config = topology_.config;
  // Kueue releases the quota of a finished pod group (kueue.h).
  plan_.pods_to_patch = KueueFinishedPatches(job_, config, observed_->pods);
  Set(api::kConditionQueued, false, "JobFinished", "the job has finished", /*emit=*/false);
  const api::Condition* failed = status().FindCondition(api::kConditionFailed);
  const bool stop_active = failed != nullptr && failed->is_true() &&
                           (failed->reason == "DeadlineExceeded" ||
                            failed->reason == "BackoffLimitExceeded");
  for (const ObservedPod* p :
       PodsToCleanUp(config.run_policy.clean_pod_policy, stop_active, pods_)) {
    DeletePod(*p, "CleanPodPolicy");
    if (auto svc = observed_services_.find(p->name); svc != observed_services_.end()) {
      plan_.services_to_delete.push_back({svc->first, svc->second, "CleanPodPolicy"});
    }
  }
  TtlDecision ttl = DecideTtl(config.run_policy, status().completion_time, facts_.now);
  plan_.delete_job = ttl.delete_now;
  if (ttl.requeue_after) plan_.RequeueAfter(*ttl.requeue_after);
}

void Reconciler::Finalize() {
  const JobConfig& config = topology_.config;
  api::JobStatus& s = status();
  std::map<ReplicaType, api::ReplicaStatus> replicas;
  for (const auto& [type, spec] : config.replicas) {
    api::ReplicaStatus rs;
    auto old = job_.status.replica_statuses.find(type);
    rs.restarts = (old == job_.status.replica_statuses.end() ? 0 : old->second.restarts) +
                  new_restarts_[type];
    replicas[type] = rs;
  }
  for (const ObservedPod& p : pods_) {
    if (p.terminating) continue;
    api::ReplicaStatus& rs = replicas[p.id.type];
    if (p.succeeded()) {
      ++rs.succeeded;
    } else if (p.failed()) {
      ++rs.failed;
    } else {
      ++rs.active;
    }
  }
  s.replica_statuses = std::move(replicas);
  s.observed_generation = job_.metadata.generation;
  s.selector = api::WorkerSelector(job_.metadata.name);
  // Auto: the operator's choice from the spec, until the master reports the
  // one it made on the devices it found (progress_reporter.h), which stays.
  if (job_.spec.strategy == StrategyKind::kAuto && s.strategy_decided_by != api::kDecidedByWorker) {
    s.strategy = StrategyName(config.strategy);
    s.strategy_reason = topology_.auto_reason;
    s.strategy_decided_by = api::kDecidedByOperator;
  }
  // A succeeded job keeps the total its master reported (final_progress.h).
  if ((s.progress.is_null() || s.progress.is_object()) && !s.IsTrue(api::kConditionSucceeded)) {
    s.progress["totalSteps"] = config.training.steps;
  }
  s.state = StateOf(s);
  plan_.status_changed = s != job_.status;
}

Plan Reconciler::RunInvalid(const std::string& message) {
  topology_.config = job_.spec;
  if (!status().IsTrue(api::kConditionFailed) && !status().IsTrue(api::kConditionSucceeded)) {
    Finish(false, "InvalidSpec", message);
  }
  api::JobStatus& s = status();
  s.observed_generation = job_.metadata.generation;
  s.selector = api::WorkerSelector(job_.metadata.name);
  s.state = StateOf(s);
  plan_.status_changed = s != job_.status;
  return std::move(plan_);
}

}  // namespace

Plan Reconcile(const api::DistributedTrainingJob& job, const Observed& observed,
               const Facts& facts, const ControllerOptions& options) {
  return Reconciler(job, facts).Run(observed, options);
}

Plan ReconcileObject(const nlohmann::json& object, const Observed& observed, const Facts& facts,
                     const ControllerOptions& options) {
  absl::StatusOr<api::DistributedTrainingJob> job = api::ParseJob(object);
  if (job.ok()) return Reconcile(*job, observed, facts, options);
  Json without_status = object;
  if (without_status.is_object()) without_status.erase("status");
  absl::StatusOr<api::DistributedTrainingJob> fresh = api::ParseJob(without_status);
  if (fresh.ok()) {
    Plan plan = Reconcile(*fresh, observed, facts, options);
    plan.status_changed = true;
    plan.events.insert(plan.events.begin(),
                       {"Warning", "InvalidStatus",
                        absl::StrCat("status was unreadable and is rewritten: ",
                                     job.status().message()),
                        ""});
    return plan;
  }
  // The spec itself: report it on the job, as far as the object can be read.
  api::DistributedTrainingJob shell;
  const Json metadata = object.is_object() && object.contains("metadata") ? object["metadata"]
                                                                          : Json::object();
  if (metadata.is_object()) {
    shell.metadata.name = metadata.value("name", "");
    shell.metadata.namespace_ = metadata.value("namespace", "default");
    shell.metadata.uid = metadata.value("uid", "");
    if (metadata.contains("generation") && metadata["generation"].is_number_integer()) {
      shell.metadata.generation = metadata["generation"].get<int64_t>();
    }
  }
  if (object.is_object() && object.contains("status")) {
    if (absl::StatusOr<api::JobStatus> s = api::ParseStatus(object["status"]); s.ok()) {
      shell.status = *s;
    }
  }
  return Reconciler(shell, facts).RunInvalid(std::string(fresh.status().message()));
}

}  // namespace distrain::controller

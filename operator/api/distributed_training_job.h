#ifndef DISTRAIN_OPERATOR_API_DISTRIBUTED_TRAINING_JOB_H_
#define DISTRAIN_OPERATOR_API_DISTRIBUTED_TRAINING_JOB_H_

// The operator's view of a DistributedTrainingJob (distrain.io/v1alpha1), as
// the API server returns it, and back to JSON.
//
// The spec is not described twice: its typed form is common/job_config.h's
// JobConfig, which carries the CRD's defaults, and ParseJob() decodes the
// spec with the very parser (and the cross-field validator) that `distrain
// run` and the worker use. So the C++ defaulting and validation agree with
// crds/ by construction, and tests/unit/operator/api checks it on every
// example and every tests/kube/invalid spec. What JobConfig does not hold is
// kept here: object metadata, the replicas' pod templates (kept as JSON; the
// controller merges the contract into them) and the status.
//
// Value types, no shared state; thread-compatible.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "nlohmann/json.hpp"

namespace distrain::api {

inline constexpr char kGroup[] = "distrain.io";
inline constexpr char kVersion[] = "v1alpha1";
inline constexpr char kApiVersion[] = "distrain.io/v1alpha1";
inline constexpr char kKind[] = "DistributedTrainingJob";
inline constexpr char kPlural[] = "distributedtrainingjobs";

// Labels on every pod and service of a job. Values of replica-type are the
// TF_CONFIG task types (chief, worker, ps, evaluator).
inline constexpr char kLabelJobName[] = "distrain.io/job-name";
inline constexpr char kLabelReplicaType[] = "distrain.io/replica-type";
inline constexpr char kLabelReplicaIndex[] = "distrain.io/replica-index";
// "master" on the pod that coordinates: the chief, or worker 0 without one.
inline constexpr char kLabelJobRole[] = "distrain.io/job-role";
inline constexpr char kLabelManagedBy[] = "app.kubernetes.io/managed-by";
inline constexpr char kManagedBy[] = "distrain-operator";

// Condition types of status.conditions (docs/architecture.md §3).
inline constexpr char kConditionCreated[] = "Created";
inline constexpr char kConditionRunning[] = "Running";
inline constexpr char kConditionRestarting[] = "Restarting";
inline constexpr char kConditionSucceeded[] = "Succeeded";
inline constexpr char kConditionFailed[] = "Failed";
inline constexpr char kConditionSuspended[] = "Suspended";
// True while the master's step counter has not moved within the progress
// deadline (controller/stall.h); it does not change status.state: a stalled
// job is still Running (or Restarting, once the stall restarted it).
inline constexpr char kConditionStalled[] = "Stalled";
// True while Kueue holds the job's pods (its admission scheduling gate) until
// it admits their pod group (controller/kueue.h); status.state is then Queued.
inline constexpr char kConditionQueued[] = "Queued";

// metav1.Time: RFC 3339 in UTC with second precision ("2026-01-02T03:04:05Z").
std::string FormatKubeTime(absl::Time t);
// Accepts any RFC 3339 time (fractions and offsets too). Errors name `field`.
absl::StatusOr<absl::Time> ParseKubeTime(const std::string& text, const std::string& field);

// The ObjectMeta fields the operator reads or writes.
struct ObjectMeta {
  std::string name;
  std::string namespace_ = "default";
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  std::optional<absl::Time> creation_timestamp;
  std::optional<absl::Time> deletion_timestamp;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  bool operator==(const ObjectMeta&) const = default;
};

// A metav1.Condition.
struct Condition {
  std::string type;
  std::string status;  // "True", "False" or "Unknown"
  std::string reason;  // CamelCase
  std::string message;
  int64_t observed_generation = 0;
  absl::Time last_transition_time;
  bool operator==(const Condition&) const = default;
  bool is_true() const { return status == "True"; }
};

// status.replicaStatuses.<type>
struct ReplicaStatus {
  int active = 0;     // pods pending or running
  int succeeded = 0;
  int failed = 0;
  int restarts = 0;   // cumulative: pods of this type restarted after a failure
  bool operator==(const ReplicaStatus&) const = default;
};

// status.strategy.decidedBy.
inline constexpr char kDecidedByOperator[] = "operator";
inline constexpr char kDecidedByWorker[] = "worker";

struct JobStatus {
  std::string state;  // the latest condition's type, for the printer column
  std::vector<Condition> conditions;
  std::map<ReplicaType, ReplicaStatus> replica_statuses;
  std::optional<absl::Time> start_time;
  std::optional<absl::Time> completion_time;
  int restart_count = 0;
  int64_t observed_generation = 0;
  // Written by whoever reports the chief's progress; the controller keeps it
  // as it is, apart from totalSteps. Null when absent.
  nlohmann::json progress;
  std::string selector;  // the Worker pods' label selector, for /scale
  // spec.strategy Auto: what it chose and why (common/auto_strategy.h);
  // empty for a strategy the spec names.
  std::string strategy;
  std::string strategy_reason;
  // Who decided: kDecidedByOperator from the spec when it planned the pods,
  // kDecidedByWorker once the master reported the choice it made on the
  // devices and bandwidths it measured (operator/progress_reporter.h).
  std::string strategy_decided_by;
  bool operator==(const JobStatus&) const = default;

  const Condition* FindCondition(const std::string& type) const;
  bool IsTrue(const std::string& type) const {
    const Condition* c = FindCondition(type);
    return c != nullptr && c->is_true();
  }
};

struct DistributedTrainingJob {
  ObjectMeta metadata;
  // spec, typed and defaulted (name and namespace_ mirror metadata).
  JobConfig spec;
  // spec.replicaSpecs.<type>.template as given; null when the type has none.
  std::map<ReplicaType, nlohmann::json> templates;
  JobStatus status;
  bool operator==(const DistributedTrainingJob&) const = default;

  // The template of `type`, or null.
  const nlohmann::json& Template(ReplicaType type) const;
};

// Decodes a DistributedTrainingJob object (from the API server or a manifest
// converted to JSON). The spec goes through common/job_config's parser and
// ValidateJobConfig, so every rule of the CRD (schema and CEL) applies; errors
// are one per line and name the field path, e.g.
//   spec.replicaSpecs.PS.replicas: ParameterServer needs at least 1 PS ...
// A malformed status is an error naming status.<field> too.
absl::StatusOr<DistributedTrainingJob> ParseJob(const nlohmann::json& object);

// Like ParseJob but for the YAML text of a manifest (what kubectl applies).
absl::StatusOr<DistributedTrainingJob> ParseJobYamlText(const std::string& yaml_text);

// The object with every default written out: apiVersion, kind, metadata (the
// fields of ObjectMeta), spec and status. ParseJob(ToJson(job)) == job.
nlohmann::json ToJson(const DistributedTrainingJob& job);
nlohmann::json SpecToJson(const DistributedTrainingJob& job);
nlohmann::json StatusToJson(const JobStatus& status);
absl::StatusOr<JobStatus> ParseStatus(const nlohmann::json& status);

// The label selector of the Worker pods, as status.selector publishes it for
// the scale subresource: "distrain.io/job-name=<job>,distrain.io/replica-type=worker".
std::string WorkerSelector(const std::string& job_name);

}  // namespace distrain::api

#endif  // DISTRAIN_OPERATOR_API_DISTRIBUTED_TRAINING_JOB_H_

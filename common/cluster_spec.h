#ifndef DISTRAIN_COMMON_CLUSTER_SPEC_H_
#define DISTRAIN_COMMON_CLUSTER_SPEC_H_

// The cluster spec in TensorFlow's TF_CONFIG shape:
//   {"cluster": {"chief": [...], "worker": [...], "ps": [...], "evaluator": [...]},
//    "task": {"type": "worker", "index": 0}, "environment": "cloud"}
//
// TensorFlow's rules, enforced by Parse:
//   * task types are chief, worker, ps, evaluator;
//   * at most one chief and at most one evaluator;
//   * task.type must be a job in the cluster and task.index within its list;
//   * every address is host:port with a port in 1..65535, no duplicates.
// Training ranks: the chief (if any) is rank 0, then worker i is rank i+1;
// without a chief, worker 0 is rank 0 and plays the chief. ps and evaluator
// tasks have no training rank; the evaluator is never part of the training
// cluster (TrainingCluster() leaves it out).
//
// Value type, no shared state; thread-compatible.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace distrain {

struct TaskId {
  std::string type;  // "chief" | "worker" | "ps" | "evaluator"
  int index = 0;
  bool operator==(const TaskId&) const = default;
  std::string ToString() const { return type + ":" + std::to_string(index); }  // "worker:1"
};

class ClusterSpec {
 public:
  ClusterSpec() = default;

  // Parses TF_CONFIG JSON. Errors name the JSON path and the fix, e.g.
  //   TF_CONFIG.task.index: 3 is out of range, cluster.worker has 2 tasks (0..1)
  static absl::StatusOr<ClusterSpec> Parse(const std::string& tf_config_json);
  // Builds and validates from parts (used by distrain run and the operator).
  static absl::StatusOr<ClusterSpec> Create(std::map<std::string, std::vector<std::string>> jobs,
                                            TaskId task, std::string environment = "cloud");

  // TF_CONFIG JSON with keys in TensorFlow's order: cluster, task, environment.
  std::string ToJson() const;

  const std::map<std::string, std::vector<std::string>>& jobs() const { return jobs_; }
  const TaskId& task() const { return task_; }
  const std::string& environment() const { return environment_; }
  int num_tasks(const std::string& type) const;
  const std::vector<std::string>& addresses(const std::string& type) const;
  std::optional<std::string> address(const TaskId& task) const;
  std::optional<std::string> my_address() const { return address(task_); }

  bool has_chief() const { return num_tasks("chief") > 0; }
  // The task that coordinates: chief:0, or worker:0 when there is no chief.
  TaskId chief_task() const;
  bool is_chief() const { return task_ == chief_task(); }
  // chief + workers; the ranks of synchronous training.
  int num_training_tasks() const { return num_tasks("chief") + num_tasks("worker"); }
  // Rank of `task` among the training tasks; nullopt for ps / evaluator.
  std::optional<int> TrainingRank(const TaskId& task) const;
  std::optional<int> my_training_rank() const { return TrainingRank(task_); }
  TaskId TaskForTrainingRank(int rank) const;  // CHECKs range
  // Same spec without the evaluator job (what training peers must see).
  ClusterSpec TrainingCluster() const;

 private:
  std::map<std::string, std::vector<std::string>> jobs_;
  TaskId task_;
  std::string environment_ = "cloud";
};

}  // namespace distrain

#endif  // DISTRAIN_COMMON_CLUSTER_SPEC_H_

#include "common/cluster_spec.h"

#include <array>
#include <charconv>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "nlohmann/json.hpp"

namespace distrain {
namespace {

// TensorFlow's job names, in the order TF_CONFIG lists them.
constexpr std::array<const char*, 4> kTaskTypes = {"chief", "worker", "ps", "evaluator"};
constexpr char kRoot[] = "TF_CONFIG";

bool IsTaskType(const std::string& type) {
  for (const char* t : kTaskTypes) {
    if (type == t) return true;
  }
  return false;
}

std::string AllowedTaskTypes() { return absl::StrJoin(kTaskTypes, ", "); }

// Shortens a JSON value for an error message.
std::string Show(const nlohmann::json& value) {
  std::string s = value.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// nlohmann's what() starts with "[json.exception.parse_error.101] "; users do not need it.
std::string StripJsonExceptionPrefix(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

// Checks one "host:port" address; returns the problem, or "" when it is fine.
std::string AddressProblem(const std::string& address) {
  const std::string quoted = nlohmann::json(address).dump();
  if (address.empty()) return "address is empty; expected host:port";
  for (char c : address) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '/') {
      return absl::StrCat(quoted, " is not a host:port address (no spaces, slashes or schemes)");
    }
  }
  size_t colon;
  if (address[0] == '[') {  // [IPv6]:port
    size_t close = address.find(']');
    if (close == std::string::npos)
      return absl::StrCat(quoted, " has an unclosed '['; expected [ipv6]:port");
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::StrCat(quoted, " has no port; expected [ipv6]:port");
    }
    if (close == 1) return absl::StrCat(quoted, " has an empty host; expected [ipv6]:port");
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    if (colon == std::string::npos) return absl::StrCat(quoted, " has no port; expected host:port");
    if (colon == 0) return absl::StrCat(quoted, " has an empty host; expected host:port");
    if (address.find(':') != colon) {
      return absl::StrCat(quoted, " has more than one ':'; write IPv6 hosts as [addr]:port");
    }
  }
  const std::string port = address.substr(colon + 1);
  if (port.empty()) return absl::StrCat(quoted, " has no port; expected host:port");
  int value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec == std::errc::result_out_of_range) {
    return absl::StrCat("port \"", port, "\" in ", quoted, " is out of range; expected 1..65535");
  }
  if (ec != std::errc() || ptr != port.data() + port.size() || port[0] == '-' || port[0] == '+') {
    return absl::StrCat(quoted, " has a non-numeric port \"", port, "\"; expected host:port");
  }
  if (value < 1 || value > 65535) {
    return absl::StrCat("port \"", port, "\" in ", quoted, " is out of range; expected 1..65535");
  }
  return "";
}

// TensorFlow's rules for a cluster and a task (see the header). Paths are
// written as TF_CONFIG paths because that is where every spec ends up.
absl::Status Validate(const std::map<std::string, std::vector<std::string>>& jobs,
                      const TaskId& task) {
  std::map<std::string, std::string> seen;  // address -> "cluster.worker[0]"
  for (const auto& [type, addresses] : jobs) {
    const std::string job_path = absl::StrCat(kRoot, ".cluster.", type);
    if (!IsTaskType(type)) {
      return absl::InvalidArgumentError(absl::StrCat(job_path, ": unknown task type \"", type,
                                                     "\"; expected one of ", AllowedTaskTypes()));
    }
    if ((type == "chief" || type == "evaluator") && addresses.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          job_path, ": has ", addresses.size(), " tasks; TensorFlow allows at most one ", type));
    }
    for (size_t i = 0; i < addresses.size(); ++i) {
      const std::string path = absl::StrCat(job_path, "[", i, "]");
      if (std::string problem = AddressProblem(addresses[i]); !problem.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
      }
      auto [it, inserted] = seen.emplace(addresses[i], absl::StrCat("cluster.", type, "[", i, "]"));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": \"", addresses[i], "\" is also ",
                                                       it->second,
                                                       "; every task needs its own address"));
      }
    }
  }
  if (!jobs.count("chief") && !jobs.count("worker")) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRoot, ".cluster: has no chief and no worker; training needs at least one worker task"));
  }
  if (!IsTaskType(task.type)) {
    return absl::InvalidArgumentError(absl::StrCat(kRoot, ".task.type: unknown task type \"",
                                                   task.type, "\"; expected one of ",
                                                   AllowedTaskTypes()));
  }
  auto it = jobs.find(task.type);
  if (it == jobs.end()) {
    std::vector<std::string> names;
    for (const char* t : kTaskTypes) {
      if (jobs.count(t)) names.push_back(t);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task.type: \"", task.type, "\" is not a job in ", kRoot,
                     ".cluster (jobs: ", absl::StrJoin(names, ", "), ")"));
  }
  const int n = static_cast<int>(it->second.size());
  if (task.index < 0 || task.index >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task.index: ", task.index, " is out of range, cluster.", task.type,
                     " has ", n, n == 1 ? " task" : " tasks", " (0..", n - 1, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterSpec> ClusterSpec::Parse(const std::string& tf_config_json) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(tf_config_json);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number too large for a double ("1e400") is out_of_range.
    const auto* parse_error = dynamic_cast<const nlohmann::json::parse_error*>(&e);
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ": invalid JSON",
                     parse_error ? absl::StrCat(" at byte ", parse_error->byte) : "", ": ",
                     StripJsonExceptionPrefix(e.what())));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRoot,
        ": must be a JSON object {\"cluster\": ..., \"task\": ..., \"environment\": ...}, got ",
        Show(root)));
  }
  for (const auto& [key, value] : root.items()) {
    if (key != "cluster" && key != "task" && key != "environment" && key != "rpc_layer") {
      return absl::InvalidArgumentError(
          absl::StrCat(kRoot, ".", key, ": unknown field; expected cluster, task, environment"));
    }
  }

  std::map<std::string, std::vector<std::string>> jobs;
  auto cluster = root.find("cluster");
  if (cluster == root.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".cluster: required; set {\"worker\": [\"host:port\", ...]}"));
  }
  if (!cluster->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRoot, ".cluster: must be an object of job name to address list, got ", Show(*cluster)));
  }
  for (const auto& [type, list] : cluster->items()) {
    const std::string job_path = absl::StrCat(kRoot, ".cluster.", type);
    if (!IsTaskType(type)) {
      return absl::InvalidArgumentError(absl::StrCat(job_path, ": unknown task type \"", type,
                                                     "\"; expected one of ", AllowedTaskTypes()));
    }
    if (!list.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(job_path, ": must be a list of \"host:port\" strings, got ", Show(list)));
    }
    std::vector<std::string> addresses;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            job_path, "[", i, "]: must be a \"host:port\" string, got ", Show(list[i])));
      }
      addresses.push_back(list[i].get<std::string>());
    }
    // TensorFlow treats an empty job like a missing one; so do we.
    if (!addresses.empty()) jobs.emplace(type, std::move(addresses));
  }

  TaskId task;
  auto task_json = root.find("task");
  if (task_json == root.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task: required; set {\"type\": \"worker\", \"index\": 0}"));
  }
  if (!task_json->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task: must be an object {\"type\": \"worker\", \"index\": 0}, got ",
                     Show(*task_json)));
  }
  for (const auto& [key, value] : task_json->items()) {
    if (key != "type" && key != "index") {
      return absl::InvalidArgumentError(
          absl::StrCat(kRoot, ".task.", key, ": unknown field; expected type and index"));
    }
  }
  auto type = task_json->find("type");
  if (type == task_json->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task.type: required; one of ", AllowedTaskTypes()));
  }
  if (!type->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(kRoot, ".task.type: must be a string (one of ",
                                                   AllowedTaskTypes(), "), got ", Show(*type)));
  }
  task.type = type->get<std::string>();
  auto index = task_json->find("index");
  if (index == task_json->end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRoot, ".task.index: required; the task's position in ", "cluster.", task.type));
  }
  if (!index->is_number_integer() || (!index->is_number_unsigned() && index->get<int64_t>() < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task.index: must be a non-negative integer, got ", Show(*index)));
  }
  if (index->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".task.index: ", Show(*index), " is out of range"));
  }
  task.index = index->get<int>();

  std::string environment = "cloud";
  if (auto env = root.find("environment"); env != root.end()) {
    if (!env->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kRoot, ".environment: must be a string such as \"cloud\", got ", Show(*env)));
    }
    environment = env->get<std::string>();
  }
  if (auto rpc = root.find("rpc_layer"); rpc != root.end() && !rpc->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRoot, ".rpc_layer: must be a string such as \"grpc\", got ", Show(*rpc)));
  }
  return Create(std::move(jobs), std::move(task), std::move(environment));
}

absl::StatusOr<ClusterSpec> ClusterSpec::Create(
    std::map<std::string, std::vector<std::string>> jobs, TaskId task, std::string environment) {
  for (auto it = jobs.begin(); it != jobs.end();) {
    it = it->second.empty() ? jobs.erase(it) : std::next(it);
  }
  if (absl::Status status = Validate(jobs, task); !status.ok()) return status;
  ClusterSpec spec;
  spec.jobs_ = std::move(jobs);
  spec.task_ = std::move(task);
  spec.environment_ = std::move(environment);
  return spec;
}

std::string ClusterSpec::ToJson() const {
  nlohmann::ordered_json root;
  nlohmann::ordered_json cluster = nlohmann::ordered_json::object();
  for (const char* type : kTaskTypes) {
    auto it = jobs_.find(type);
    if (it != jobs_.end()) cluster[type] = it->second;
  }
  root["cluster"] = std::move(cluster);
  root["task"] = {{"type", task_.type}, {"index", task_.index}};
  root["environment"] = environment_;
  return root.dump();
}

int ClusterSpec::num_tasks(const std::string& type) const {
  auto it = jobs_.find(type);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

const std::vector<std::string>& ClusterSpec::addresses(const std::string& type) const {
  static const std::vector<std::string> kNone;
  auto it = jobs_.find(type);
  return it == jobs_.end() ? kNone : it->second;
}

std::optional<std::string> ClusterSpec::address(const TaskId& task) const {
  auto it = jobs_.find(task.type);
  if (it == jobs_.end() || task.index < 0 || task.index >= static_cast<int>(it->second.size())) {
    return std::nullopt;
  }
  return it->second[task.index];
}

TaskId ClusterSpec::chief_task() const {
  return has_chief() ? TaskId{"chief", 0} : TaskId{"worker", 0};
}

std::optional<int> ClusterSpec::TrainingRank(const TaskId& task) const {
  if (task.index < 0) return std::nullopt;
  if (task.type == "chief") {
    if (task.index >= num_tasks("chief")) return std::nullopt;
    return task.index;
  }
  if (task.type == "worker") {
    if (task.index >= num_tasks("worker")) return std::nullopt;
    return num_tasks("chief") + task.index;
  }
  return std::nullopt;
}

TaskId ClusterSpec::TaskForTrainingRank(int rank) const {
  DISTRAIN_CHECK(rank >= 0 && rank < num_training_tasks())
      << "rank " << rank << " of " << num_training_tasks() << " training tasks";
  const int chiefs = num_tasks("chief");
  if (rank < chiefs) return TaskId{"chief", rank};
  return TaskId{"worker", rank - chiefs};
}

ClusterSpec ClusterSpec::TrainingCluster() const {
  ClusterSpec spec = *this;
  spec.jobs_.erase("evaluator");
  return spec;
}

}  // namespace distrain

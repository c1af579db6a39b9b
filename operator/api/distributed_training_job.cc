#include "operator/api/distributed_training_job.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/yaml_json.h"

namespace distrain::api {
namespace {

using Json = nlohmann::json;

constexpr ReplicaType kReplicaTypes[] = {ReplicaType::kChief, ReplicaType::kWorker,
                                         ReplicaType::kPS, ReplicaType::kEvaluator};

std::optional<ReplicaType> ReplicaTypeFromName(const std::string& name) {
  for (ReplicaType t : kReplicaTypes) {
    if (name == ReplicaTypeName(t)) return t;
  }
  return std::nullopt;
}

std::string Show(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// common/job_config reports "line N: <path>: <problem>" for YAML input. The
// operator hands it JSON it re-serialised itself, whose line numbers mean
// nothing to the user, so they are dropped.
std::string StripLineNumbers(absl::string_view message) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    if (absl::StartsWith(line, "line ")) {
      const size_t colon = line.find(": ");
      bool digits = colon != absl::string_view::npos && colon > 5;
      for (size_t i = 5; digits && i < colon; ++i) digits = line[i] >= '0' && line[i] <= '9';
      if (digits) line.remove_prefix(colon + 2);
    }
    lines.emplace_back(line);
  }
  return absl::StrJoin(lines, "\n");
}

// Reads an optional field of `object`; a present value of the wrong JSON type
// is reported under `path`.
class Reader {
 public:
  explicit Reader(std::vector<std::string>* errors) : errors_(errors) {}

  const Json* Get(const Json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void String(const Json& object, const char* key, const std::string& path, std::string* out) {
    if (const Json* v = Get(object, key)) {
      if (v->is_string()) {
        *out = v->get<std::string>();
      } else {
        Error(path, absl::StrCat("must be a string, got ", Show(*v)));
      }
    }
  }
  template <typename Int>
  void Integer(const Json& object, const char* key, const std::string& path, Int* out) {
    if (const Json* v = Get(object, key)) {
      if (v->is_number_integer()) {
        *out = v->get<Int>();
      } else {
        Error(path, absl::StrCat("must be an integer, got ", Show(*v)));
      }
    }
  }
  void Time(const Json& object, const char* key, const std::string& path,
            std::optional<absl::Time>* out) {
    std::string text;
    String(object, key, path, &text);
    if (text.empty()) return;
    absl::StatusOr<absl::Time> t = ParseKubeTime(text, path);
    if (t.ok()) {
      *out = *t;
    } else {
      Error(path, std::string(t.status().message()));
    }
  }
  void StringMap(const Json& object, const char* key, const std::string& path,
                 std::map<std::string, std::string>* out) {
    const Json* v = Get(object, key);
    if (v == nullptr) return;
    if (!v->is_object()) {
      Error(path, absl::StrCat("must be a map of strings, got ", Show(*v)));
      return;
    }
    for (const auto& [k, value] : v->items()) {
      if (value.is_string()) {
        (*out)[k] = value.get<std::string>();
      } else {
        Error(absl::StrCat(path, ".", k), absl::StrCat("must be a string, got ", Show(value)));
      }
    }
  }
  void Error(const std::string& path, const std::string& problem) {
    errors_->push_back(absl::StrCat(path, ": ", problem));
  }

 private:
  std::vector<std::string>* errors_;
};

ObjectMeta ParseMetadata(const Json& metadata, Reader* r) {
  ObjectMeta m;
  r->String(metadata, "name", "metadata.name", &m.name);
  r->String(metadata, "namespace", "metadata.namespace", &m.namespace_);
  if (m.namespace_.empty()) m.namespace_ = "default";
  r->String(metadata, "uid", "metadata.uid", &m.uid);
  r->String(metadata, "resourceVersion", "metadata.resourceVersion", &m.resource_version);
  r->Integer(metadata, "generation", "metadata.generation", &m.generation);
  r->Time(metadata, "creationTimestamp", "metadata.creationTimestamp", &m.creation_timestamp);
  r->Time(metadata, "deletionTimestamp", "metadata.deletionTimestamp", &m.deletion_timestamp);
  r->StringMap(metadata, "labels", "metadata.labels", &m.labels);
  r->StringMap(metadata, "annotations", "metadata.annotations", &m.annotations);
  return m;
}

JobStatus ParseStatusWith(const Json& status, Reader* r) {
  JobStatus s;
  if (status.is_null()) return s;
  if (!status.is_object()) {
    r->Error("status", absl::StrCat("must be an object, got ", Show(status)));
    return s;
  }
  r->String(status, "state", "status.state", &s.state);
  if (const Json* conditions = r->Get(status, "conditions")) {
    if (!conditions->is_array()) {
      r->Error("status.conditions", absl::StrCat("must be a list, got ", Show(*conditions)));
    } else {
      for (size_t i = 0; i < conditions->size(); ++i) {
        const Json& c = (*conditions)[i];
        const std::string path = absl::StrCat("status.conditions[", i, "]");
        Condition condition;
        r->String(c, "type", path + ".type", &condition.type);
        r->String(c, "status", path + ".status", &condition.status);
        r->String(c, "reason", path + ".reason", &condition.reason);
        r->String(c, "message", path + ".message", &condition.message);
        r->Integer(c, "observedGeneration", path + ".observedGeneration",
                   &condition.observed_generation);
        std::optional<absl::Time> t;
        r->Time(c, "lastTransitionTime", path + ".lastTransitionTime", &t);
        condition.last_transition_time = t.value_or(absl::UnixEpoch());
        if (condition.type.empty()) {
          r->Error(path + ".type", "required");
        } else {
          s.conditions.push_back(std::move(condition));
        }
      }
    }
  }
  if (const Json* replicas = r->Get(status, "replicaStatuses")) {
    if (!replicas->is_object()) {
      r->Error("status.replicaStatuses", absl::StrCat("must be an object, got ", Show(*replicas)));
    } else {
      for (const auto& [key, value] : replicas->items()) {
        const std::string path = absl::StrCat("status.replicaStatuses.", key);
        std::optional<ReplicaType> type = ReplicaTypeFromName(key);
        if (!type) {
          r->Error(path, "unknown replica type; expected Chief, Worker, PS or Evaluator");
          continue;
        }
        ReplicaStatus rs;
        r->Integer(value, "active", path + ".active", &rs.active);
        r->Integer(value, "succeeded", path + ".succeeded", &rs.succeeded);
        r->Integer(value, "failed", path + ".failed", &rs.failed);
        r->Integer(value, "restarts", path + ".restarts", &rs.restarts);
        s.replica_statuses[*type] = rs;
      }
    }
  }
  r->Time(status, "startTime", "status.startTime", &s.start_time);
  r->Time(status, "completionTime", "status.completionTime", &s.completion_time);
  r->Integer(status, "restartCount", "status.restartCount", &s.restart_count);
  r->Integer(status, "observedGeneration", "status.observedGeneration", &s.observed_generation);
  if (const Json* progress = r->Get(status, "progress")) s.progress = *progress;
  r->String(status, "selector", "status.selector", &s.selector);
  if (const Json* chosen = r->Get(status, "strategy")) {
    r->String(*chosen, "name", "status.strategy.name", &s.strategy);
    r->String(*chosen, "reason", "status.strategy.reason", &s.strategy_reason);
    r->String(*chosen, "decidedBy", "status.strategy.decidedBy", &s.strategy_decided_by);
  }
  return s;
}

}  // namespace

std::string FormatKubeTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

absl::StatusOr<absl::Time> ParseKubeTime(const std::string& text, const std::string& field) {
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be an RFC 3339 time such as \"2026-01-02T03:04:05Z\", got \"", text,
        "\" (", error, ")"));
  }
  return t;
}

const Condition* JobStatus::FindCondition(const std::string& type) const {
  for (const Condition& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

const nlohmann::json& DistributedTrainingJob::Template(ReplicaType type) const {
  static const nlohmann::json* const kNull = new nlohmann::json();
  auto it = templates.find(type);
  return it == templates.end() ? *kNull : it->second;
}

absl::StatusOr<JobStatus> ParseStatus(const nlohmann::json& status) {
  std::vector<std::string> errors;
  Reader r(&errors);
  JobStatus s = ParseStatusWith(status, &r);
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return s;
}

absl::StatusOr<DistributedTrainingJob> ParseJob(const nlohmann::json& object) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a DistributedTrainingJob must be a JSON object with apiVersion, kind, metadata and spec, "
        "got ",
        Show(object)));
  }
  std::vector<std::string> errors;
  Reader r(&errors);
  DistributedTrainingJob job;
  const Json null_json;
  const Json* metadata = r.Get(object, "metadata");
  job.metadata = ParseMetadata(metadata ? *metadata : null_json, &r);

  // The spec: through common/job_config's parser, fed the fields it knows.
  // JSON is YAML, so the document goes in as text; the API server's extra
  // metadata (uid, managedFields, ...) stays out of it.
  Json document = Json::object();
  for (const char* key : {"apiVersion", "kind", "spec"}) {
    if (auto it = object.find(key); it != object.end()) document[key] = *it;
  }
  if (metadata != nullptr && metadata->is_object()) {
    Json m = Json::object();
    for (const char* key : {"name", "namespace"}) {
      if (auto it = metadata->find(key); it != metadata->end()) m[key] = *it;
    }
    document["metadata"] = std::move(m);
  } else if (metadata != nullptr) {
    document["metadata"] = *metadata;
  }
  absl::StatusOr<JobConfig> config =
      ParseJobYaml(document.dump(1, ' ', false, Json::error_handler_t::replace));
  if (config.ok()) {
    if (absl::Status valid = ValidateJobConfig(*config); !valid.ok()) config = valid;
  }
  if (!config.ok()) {
    errors.insert(errors.begin(), StripLineNumbers(config.status().message()));
  } else {
    job.spec = std::move(*config);
  }

  if (const Json* spec = r.Get(object, "spec"); spec != nullptr && spec->is_object()) {
    if (const Json* replicas = r.Get(*spec, "replicaSpecs");
        replicas != nullptr && replicas->is_object()) {
      for (const auto& [key, value] : replicas->items()) {
        std::optional<ReplicaType> type = ReplicaTypeFromName(key);
        if (!type || !value.is_object()) continue;  // reported by the parser
        if (const Json* tmpl = r.Get(value, "template")) job.templates[*type] = *tmpl;
      }
    }
  }

  const Json* status = r.Get(object, "status");
  job.status = ParseStatusWith(status ? *status : null_json, &r);
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return job;
}

absl::StatusOr<DistributedTrainingJob> ParseJobYamlText(const std::string& yaml_text) {
  absl::StatusOr<YamlJson> yaml = YamlToJson(yaml_text);
  if (!yaml.ok()) return yaml.status();
  // Keep the YAML's line numbers: re-parse the text itself for the spec so the
  // user sees where each problem is.
  absl::StatusOr<JobConfig> config = ParseJobYaml(yaml_text);
  if (config.ok()) {
    if (absl::Status valid = ValidateJobConfig(*config); !valid.ok()) return valid;
  } else {
    return config.status();
  }
  return ParseJob(Json::parse(yaml->value.dump()));
}

nlohmann::json SpecToJson(const DistributedTrainingJob& job) {
  // JobConfigToJson writes every field with the CRD's names; the spec is that
  // minus the DISTRAIN_JOB_CONFIG-only keys, with replicaSpecs rebuilt.
  Json flat = Json::parse(JobConfigToJson(job.spec));
  Json spec = Json::object();
  spec["strategy"] = flat["strategy"];
  Json replica_specs = Json::object();
  for (const auto& [type, rs] : job.spec.replicas) {
    Json r = Json::object();
    r["replicas"] = rs.replicas;
    r["restartPolicy"] = flat["restartPolicies"][ReplicaTypeName(type)];
    if (const Json& tmpl = job.Template(type); !tmpl.is_null()) r["template"] = tmpl;
    replica_specs[ReplicaTypeName(type)] = std::move(r);
  }
  spec["replicaSpecs"] = std::move(replica_specs);
  for (const char* key : {"successPolicy", "runPolicy", "training", "elasticPolicy", "security"}) {
    if (flat.contains(key)) spec[key] = flat[key];
  }
  return spec;
}

nlohmann::json StatusToJson(const JobStatus& status) {
  Json s = Json::object();
  if (!status.state.empty()) s["state"] = status.state;
  Json conditions = Json::array();
  for (const Condition& c : status.conditions) {
    conditions.push_back({{"type", c.type},
                          {"status", c.status},
                          {"reason", c.reason},
                          {"message", c.message},
                          {"observedGeneration", c.observed_generation},
                          {"lastTransitionTime", FormatKubeTime(c.last_transition_time)}});
  }
  if (!conditions.empty()) s["conditions"] = std::move(conditions);
  if (!status.replica_statuses.empty()) {
    Json replicas = Json::object();
    for (const auto& [type, rs] : status.replica_statuses) {
      replicas[ReplicaTypeName(type)] = {{"active", rs.active},
                                         {"succeeded", rs.succeeded},
                                         {"failed", rs.failed},
                                         {"restarts", rs.restarts}};
    }
    s["replicaStatuses"] = std::move(replicas);
  }
  if (status.start_time) s["startTime"] = FormatKubeTime(*status.start_time);
  if (status.completion_time) s["completionTime"] = FormatKubeTime(*status.completion_time);
  s["restartCount"] = status.restart_count;
  s["observedGeneration"] = status.observed_generation;
  if (!status.progress.is_null()) s["progress"] = status.progress;
  if (!status.selector.empty()) s["selector"] = status.selector;
  if (!status.strategy.empty()) {
    s["strategy"] = {{"name", status.strategy}, {"reason", status.strategy_reason}};
    if (!status.strategy_decided_by.empty()) s["strategy"]["decidedBy"] = status.strategy_decided_by;
  }
  return s;
}

nlohmann::json ToJson(const DistributedTrainingJob& job) {
  Json metadata = Json::object();
  const ObjectMeta& m = job.metadata;
  metadata["name"] = m.name;
  metadata["namespace"] = m.namespace_;
  if (!m.uid.empty()) metadata["uid"] = m.uid;
  if (!m.resource_version.empty()) metadata["resourceVersion"] = m.resource_version;
  if (m.generation != 0) metadata["generation"] = m.generation;
  if (m.creation_timestamp) metadata["creationTimestamp"] = FormatKubeTime(*m.creation_timestamp);
  if (m.deletion_timestamp) metadata["deletionTimestamp"] = FormatKubeTime(*m.deletion_timestamp);
  if (!m.labels.empty()) metadata["labels"] = m.labels;
  if (!m.annotations.empty()) metadata["annotations"] = m.annotations;
  return Json{{"apiVersion", kApiVersion},
              {"kind", kKind},
              {"metadata", std::move(metadata)},
              {"spec", SpecToJson(job)},
              {"status", StatusToJson(job.status)}};
}

std::string WorkerSelector(const std::string& job_name) {
  return absl::StrCat(kLabelJobName, "=", job_name, ",", kLabelReplicaType, "=worker");
}

}  // namespace distrain::api

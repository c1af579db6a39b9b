#include "operator/controller/job_identity_secret.h"

#include <map>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/job_identity.h"
#include "operator/kube/paths.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

constexpr char kCaCertKey[] = "ca.crt";
constexpr char kCaKeyKey[] = "ca.key";
constexpr char kRingKeyKey[] = "ring.key";

kube::Resource SecretsResource() { return {"", "v1", "secrets", true}; }

std::string TaskKeyPrefix(const std::string& type, int index) {
  return absl::StrCat(type, "-", index);
}

// The tasks of `pods` ("worker-0", ...), from the labels BuildPod sets.
std::set<std::pair<std::string, int>> TasksOf(const std::vector<Json>& pods) {
  std::set<std::pair<std::string, int>> tasks;
  for (const Json& pod : pods) {
    const Json labels = pod["metadata"].value("labels", Json::object());
    const std::string type = labels.value(api::kLabelReplicaType, "");
    const std::string index = labels.value(api::kLabelReplicaIndex, "");
    if (type.empty() || index.empty()) continue;
    tasks.emplace(type, std::stoi(index));
  }
  return tasks;
}

// Issues what is missing into `data` (Secret keys -> raw bytes).
absl::Status AddCertificates(const JobAuthority& authority,
                             const std::set<std::pair<std::string, int>>& tasks,
                             std::map<std::string, std::string>* data, bool* changed) {
  for (const auto& [type, index] : tasks) {
    const std::string prefix = TaskKeyPrefix(type, index);
    if (data->count(prefix + ".crt") && data->count(prefix + ".key")) continue;
    absl::StatusOr<TaskCredentials> creds = IssueTaskCredentials(authority, TaskId{type, index});
    if (!creds.ok()) return creds.status();
    (*data)[prefix + ".crt"] = creds->cert_pem;
    (*data)[prefix + ".key"] = creds->key_pem;
    *changed = true;
  }
  return absl::OkStatus();
}

// The API server refuses a Secret whose data exceed 1 MiB. A task's pair is
// about 950 bytes, so a job of more than about 1,100 tasks does not fit;
// say so instead of failing every reconcile with the API server's 422.
absl::Status CheckSecretSize(const std::map<std::string, std::string>& data, size_t tasks,
                             const std::string& name) {
  constexpr size_t kMaxSecretBytes = 1 << 20;
  size_t bytes = 0;
  for (const auto& [k, v] : data) bytes += v.size();
  if (bytes <= kMaxSecretBytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the identity Secret ", name, " would hold ", bytes, " bytes for ", tasks,
      " task certificates, over a Secret's limit of ", kMaxSecretBytes,
      " bytes (about 1,100 tasks); set spec.security.transport: Plaintext for a job this large"));
}

Json EncodeData(const std::map<std::string, std::string>& data) {
  Json out = Json::object();
  for (const auto& [k, v] : data) out[k] = absl::Base64Escape(v);
  return out;
}

}  // namespace

std::string IdentitySecretName(const std::string& job_name) {
  return job_name + kIdentitySecretSuffix;
}

void MountJobIdentity(const api::DistributedTrainingJob& job, const JobConfig& config, ReplicaId id,
                      Json* pod_spec, Json* main, Json* env) {
  if (config.transport != TransportMode::kMutualTls) return;
  Json& volumes = (*pod_spec)["volumes"];
  if (!volumes.is_array()) volumes = Json::array();
  for (const Json& v : volumes) {
    if (v.is_object() && v.value("name", "") == kIdentityVolumeName) return;  // the user's own
  }
  const std::string prefix = TaskKeyPrefix(ReplicaTaskType(id.type), id.index);
  // 0444: the container runs as a non-root user the operator does not know,
  // and Secret files belong to root; only this pod's key is in the volume.
  volumes.push_back(
      {{"name", kIdentityVolumeName},
       {"secret",
        {{"secretName", IdentitySecretName(job.metadata.name)},
         {"defaultMode", 0444},
         {"items", Json::array({{{"key", kCaCertKey}, {"path", kCredentialsCaFile}},
                                {{"key", prefix + ".crt"}, {"path", kCredentialsCertFile}},
                                {{"key", prefix + ".key"}, {"path", kCredentialsKeyFile}},
                                {{"key", kRingKeyKey}, {"path", kCredentialsRingKeyFile}}})}}}});
  Json& mounts = (*main)["volumeMounts"];
  if (!mounts.is_array()) mounts = Json::array();
  mounts.push_back(
      {{"name", kIdentityVolumeName}, {"mountPath", kDefaultCredentialsDir}, {"readOnly", true}});
  bool has_env = false;
  for (const Json& e : *env) has_env = has_env || e.value("name", "") == "DISTRAIN_CREDENTIALS_DIR";
  if (!has_env) {
    env->push_back({{"name", "DISTRAIN_CREDENTIALS_DIR"}, {"value", kDefaultCredentialsDir}});
  }
}

absl::Status EnsureJobIdentity(kube::Client& client, const Json& job_object,
                               const std::vector<Json>& pods) {
  absl::StatusOr<api::DistributedTrainingJob> job = api::ParseJob(job_object);
  if (!job.ok()) return job.status();
  if (job->spec.transport != TransportMode::kMutualTls || pods.empty()) return absl::OkStatus();
  const std::string& ns = job->metadata.namespace_;
  const std::string name = IdentitySecretName(job->metadata.name);
  const std::set<std::pair<std::string, int>> tasks = TasksOf(pods);

  // 1. Read it.
  absl::StatusOr<kube::ApiResponse> got =
      client.Request("GET", kube::ResourcePath(SecretsResource(), ns, name));
  if (!got.ok()) return got.status();
  if (got->not_found()) {
    absl::StatusOr<JobAuthority> authority =
        NewJobAuthority(absl::StrCat(ns, "/", job->metadata.name));
    if (!authority.ok()) return authority.status();
    std::map<std::string, std::string> data = {{kCaCertKey, authority->ca_cert_pem},
                                               {kCaKeyKey, authority->ca_key_pem},
                                               {kRingKeyKey, authority->ring_key_hex}};
    bool changed = false;
    if (absl::Status s = AddCertificates(*authority, tasks, &data, &changed); !s.ok()) return s;
    if (absl::Status s = CheckSecretSize(data, tasks.size(), name); !s.ok()) return s;
    Json secret = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"type", "Opaque"},
                   {"metadata",
                    {{"name", name},
                     {"namespace", ns},
                     {"labels",
                      {{api::kLabelJobName, job->metadata.name},
                       {api::kLabelManagedBy, api::kManagedBy}}},
                     {"ownerReferences", Json::array({ControllerReference(*job)})}}},
                   {"data", EncodeData(data)}};
    absl::StatusOr<kube::ApiResponse> r =
        client.Request("POST", kube::ResourcePath(SecretsResource(), ns), &secret);
    if (!r.ok()) return r.status();
    if (!r->ok()) {
      return absl::UnavailableError(absl::StrCat("creating Secret ", ns, "/", name, ": ",
                                                 r->message(),
                                                 "; the job's pods are created once it exists"));
    }
    return absl::OkStatus();
  }
  if (!got->ok()) {
    return absl::UnavailableError(
        absl::StrCat("reading Secret ", ns, "/", name, ": ", got->message()));
  }
  // 2. Present: add what the new pods need.
  std::map<std::string, std::string> data;
  const Json stored =
      got->body.is_object() && got->body.contains("data") && got->body["data"].is_object()
          ? got->body["data"]
          : Json::object();
  for (const auto& [k, v] : stored.items()) {
    std::string raw;
    if (!v.is_string() || !absl::Base64Unescape(v.get<std::string>(), &raw)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Secret ", ns, "/", name, ": data.", k, " is not base64; delete the Secret so the "
          "operator issues a new one (the job's pods restart with it)"));
    }
    data[k] = std::move(raw);
  }
  if (!data.count(kCaCertKey) || !data.count(kCaKeyKey) || !data.count(kRingKeyKey)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Secret ", ns, "/", name, " lacks ca.crt, ca.key or ring.key (not made by distrain?); "
        "delete it so the operator issues a new one"));
  }
  const JobAuthority authority{data[kCaCertKey], data[kCaKeyKey], data[kRingKeyKey]};
  bool changed = false;
  if (absl::Status s = AddCertificates(authority, tasks, &data, &changed); !s.ok()) return s;
  if (!changed) return absl::OkStatus();
  if (absl::Status s = CheckSecretSize(data, data.size() / 2, name); !s.ok()) return s;
  Json secret = got->body;
  secret["data"] = EncodeData(data);
  absl::StatusOr<kube::ApiResponse> r =
      client.Request("PUT", kube::ResourcePath(SecretsResource(), ns, name), &secret);
  if (!r.ok()) return r.status();
  if (r->conflict()) {
    return absl::AbortedError(
        absl::StrCat("updating Secret ", ns, "/", name, ": ", r->message(), "; retrying"));
  }
  if (!r->ok()) {
    return absl::UnavailableError(
        absl::StrCat("updating Secret ", ns, "/", name, ": ", r->message()));
  }
  return absl::OkStatus();
}

}  // namespace distrain::controller

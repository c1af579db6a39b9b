// Connecting, reading the job and its state: shared by the three commands.

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/kubectl_dtj/kubectl_dtj.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/paths.h"

namespace distrain::kubectl_dtj {
namespace {

kube::Resource JobsResource() { return {api::kGroup, api::kVersion, api::kPlural, true}; }

// The most decisive True condition first, as the printer column orders them
// (operator/controller/conditions.h StateOf).
constexpr const char* kStateOrder[] = {api::kConditionFailed,     api::kConditionSucceeded,
                                       api::kConditionSuspended,  api::kConditionRestarting,
                                       api::kConditionQueued,     api::kConditionRunning,
                                       api::kConditionCreated};

}  // namespace

absl::StatusOr<std::unique_ptr<kube::RestClient>> Connect(const ConnectionFlags& flags,
                                                          std::string* namespace_name) {
  auto config = kube::LoadRestConfig({.kubeconfig_path = flags.kubeconfig, .context = flags.context});
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(config.status().message(),
                                     " (pass --kubeconfig or set KUBECONFIG, as for kubectl)"));
  }
  *namespace_name = flags.namespace_name.empty() ? config->namespace_name : flags.namespace_name;
  if (namespace_name->empty()) *namespace_name = "default";
  // A CLI should fail within seconds when the server is away, not retry for a minute.
  kube::RestClientOptions options;
  options.qps = 0;
  options.max_retries = 2;
  options.timeout = std::chrono::seconds(20);
  options.user_agent = "kubectl-dtj";
  return kube::RestClient::Create(*config, options);
}

absl::StatusOr<nlohmann::json> GetJob(kube::Client& client, const Target& target) {
  const std::string path = kube::ResourcePath(JobsResource(), target.namespace_name, target.job);
  auto response = client.Request("GET", path);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach the API server: ",
                                               response.status().message(),
                                               "; check --kubeconfig / --context"));
  }
  if (response->not_found()) {
    return absl::NotFoundError(absl::StrCat("no DistributedTrainingJob ", target.job, " in namespace ",
                                            target.namespace_name, "; kubectl get dtj -n ",
                                            target.namespace_name));
  }
  if (!response->ok()) {
    return absl::UnknownError(absl::StrCat("GET DistributedTrainingJob ", target.namespace_name, "/",
                                           target.job, " from ", client.server(), ": HTTP ",
                                           response->status_code, ": ", response->message()));
  }
  return std::move(response->body);
}

std::string JobState::ToString() const {
  if (state.empty()) return "Pending (no condition yet; is the operator running?)";
  std::string out = state;
  if (!reason.empty() || !message.empty()) {
    absl::StrAppend(&out, " (", reason, reason.empty() || message.empty() ? "" : ": ", message, ")");
  }
  return out;
}

JobState StateOf(const nlohmann::json& job) {
  JobState out;
  if (!job.is_object() || !job.contains("status") || !job["status"].is_object()) return out;
  const nlohmann::json& status = job["status"];
  const nlohmann::json conditions =
      status.contains("conditions") && status["conditions"].is_array() ? status["conditions"]
                                                                         : nlohmann::json::array();
  auto is_true = [&](const std::string& type) -> const nlohmann::json* {
    for (const nlohmann::json& c : conditions) {
      if (c.is_object() && c.value("type", "") == type && c.value("status", "") == "True") return &c;
    }
    return nullptr;
  };
  out.succeeded = is_true(api::kConditionSucceeded) != nullptr;
  out.failed = is_true(api::kConditionFailed) != nullptr;
  // status.state is the operator's own summary; the conditions decide when it is absent.
  std::string state = status.value("state", "");
  const nlohmann::json* condition = nullptr;
  if (!state.empty()) condition = is_true(state);
  if (condition == nullptr) {
    for (const char* type : kStateOrder) {
      if ((condition = is_true(type)) != nullptr) break;
    }
  }
  if (condition != nullptr) {
    out.state = condition->value("type", "");
    out.reason = condition->value("reason", "");
    out.message = condition->value("message", "");
  } else {
    out.state = state;
  }
  return out;
}

}  // namespace distrain::kubectl_dtj

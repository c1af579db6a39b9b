#include "operator/controller/observed.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

std::string StringAt(const Json& object, const char* a, const char* b) {
  if (!object.is_object() || !object.contains(a) || !object[a].is_object()) return "";
  const Json& inner = object[a];
  auto it = inner.find(b);
  return it != inner.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string Label(const Json& pod, const char* key) {
  if (!pod.contains("metadata") || !pod["metadata"].is_object()) return "";
  return StringAt(pod["metadata"], "labels", key);
}

// Every container of the spec has a status whose current state is terminated.
bool AllContainersTerminated(const Json& pod) {
  if (!pod.contains("spec") || !pod["spec"].contains("containers") ||
      !pod["spec"]["containers"].is_array() || !pod.contains("status") ||
      !pod["status"].is_object() || !pod["status"].contains("containerStatuses") ||
      !pod["status"]["containerStatuses"].is_array()) {
    return false;
  }
  const Json& statuses = pod["status"]["containerStatuses"];
  if (statuses.size() != pod["spec"]["containers"].size() || statuses.empty()) return false;
  const Json::json_pointer terminated("/state/terminated");
  for (const Json& cs : statuses) {
    if (!cs.is_object() || !cs.contains(terminated) || !cs.at(terminated).is_object()) return false;
  }
  return true;
}

}  // namespace

const Json* MainContainerStatus(const Json& pod) {
  const Json& spec = pod.contains("spec") ? pod["spec"] : Json();
  const Json* main = MainContainer(spec);
  const std::string main_name = main != nullptr ? main->value("name", "") : kMainContainerName;
  if (!pod.contains("status") || !pod["status"].is_object()) return nullptr;
  const Json& status = pod["status"];
  if (!status.contains("containerStatuses") || !status["containerStatuses"].is_array()) {
    return nullptr;
  }
  for (const Json& cs : status["containerStatuses"]) {
    if (cs.is_object() && cs.value("name", "") == main_name) return &cs;
  }
  return nullptr;
}

std::string EffectivePhase(const Json& pod) {
  const std::string phase =
      pod.contains("status") && pod["status"].is_object() ? pod["status"].value("phase", "") : "";
  if (phase != "Running" && phase != "Pending") return phase;
  if (!pod.contains("spec") || pod["spec"].value("restartPolicy", "") != "Never" ||
      !AllContainersTerminated(pod)) {
    return phase;
  }
  const Json* main = MainContainerStatus(pod);
  const Json::json_pointer code("/state/terminated/exitCode");
  if (main == nullptr || !main->contains(code) || !main->at(code).is_number_integer()) return phase;
  return main->at(code).get<int64_t>() == 0 ? "Succeeded" : "Failed";
}

namespace {

// The "error" of a distrain-worker's termination message, or "".
std::string WorkerError(const Json& terminated) {
  if (!terminated.contains("message") || !terminated["message"].is_string()) return "";
  const Json message = Json::parse(terminated["message"].get<std::string>(), nullptr,
                                   /*allow_exceptions=*/false);
  if (!message.is_object() || !message.contains("error") || !message["error"].is_string()) {
    return "";
  }
  return message["error"].get<std::string>();
}

}  // namespace

std::string ObservedPod::Describe() const {
  std::string out;
  if (exit_code) {
    out = absl::StrCat("exited with code ", *exit_code);
    if (!reason.empty()) absl::StrAppend(&out, " (", reason, ")");
    if (!error.empty()) absl::StrAppend(&out, ": ", error);
  } else {
    out = absl::StrCat("failed", reason.empty() ? "" : ": ", reason);
  }
  return out;
}

std::optional<ObservedPod> ParseObservedPod(const nlohmann::json& pod, const std::string& job_name,
                                            const std::string& job_uid) {
  if (!pod.is_object() || !pod.contains("metadata") || !pod["metadata"].is_object()) {
    return std::nullopt;
  }
  const Json& metadata = pod["metadata"];
  if (Label(pod, api::kLabelJobName) != job_name) return std::nullopt;
  std::optional<ReplicaType> type = ReplicaTypeFromTaskType(Label(pod, api::kLabelReplicaType));
  int index = -1;
  if (!type || !absl::SimpleAtoi(Label(pod, api::kLabelReplicaIndex), &index) || index < 0) {
    return std::nullopt;
  }
  // A pod controlled by something else (say a previous job of the same name
  // that is still being collected) is not ours to count or restart.
  if (!job_uid.empty() && metadata.contains("ownerReferences") &&
      metadata["ownerReferences"].is_array()) {
    for (const Json& ref : metadata["ownerReferences"]) {
      if (ref.is_object() && ref.value("controller", false) && ref.value("uid", "") != job_uid) {
        return std::nullopt;
      }
    }
  }
  ObservedPod p;
  p.name = metadata.value("name", "");
  p.uid = metadata.value("uid", "");
  p.id = {*type, index};
  p.terminating = metadata.contains("deletionTimestamp") && !metadata["deletionTimestamp"].is_null();
  if (metadata.contains("annotations") && metadata["annotations"].is_object()) {
    p.cluster_hash = metadata["annotations"].value(kClusterHashAnnotation, "");
    p.reports_progress = metadata["annotations"].value(kReportsProgressAnnotation, "") == "true";
  }
  if (pod.contains("status") && pod["status"].is_object()) {
    p.reason = pod["status"].value("reason", "");
    const Json& start = pod["status"].value("startTime", Json());
    if (start.is_string()) {
      if (auto t = api::ParseKubeTime(start.get<std::string>(), "status.startTime"); t.ok()) {
        p.started = *t;
      }
    }
  }
  if (const Json* cs = MainContainerStatus(pod)) {
    const Json::json_pointer running_since("/state/running/startedAt");
    if (cs->contains(running_since) && cs->at(running_since).is_string()) {
      if (auto t = api::ParseKubeTime(cs->at(running_since).get<std::string>(), "startedAt");
          t.ok()) {
        p.started = *t;
      }
    }
    for (const char* state : {"state", "lastState"}) {
      if (!cs->contains(state) || !(*cs)[state].is_object()) continue;
      const Json& s = (*cs)[state];
      if (s.contains("terminated") && s["terminated"].is_object() &&
          s["terminated"].contains("exitCode") && s["terminated"]["exitCode"].is_number_integer()) {
        p.exit_code = s["terminated"]["exitCode"].get<int>();
        const std::string why = s["terminated"].value("reason", "");
        if (!why.empty()) p.reason = why;
        if (*p.exit_code != 0) p.error = WorkerError(s["terminated"]);
        break;
      }
    }
  }
  p.phase = EffectivePhase(pod);
  return p;
}

std::vector<ObservedPod> ParseObservedPods(const std::vector<ObjectRef>& pods,
                                           const std::string& job_name,
                                           const std::string& job_uid) {
  std::vector<ObservedPod> out;
  for (const ObjectRef& pod : pods) {
    if (std::optional<ObservedPod> p = ParseObservedPod(*pod, job_name, job_uid)) {
      out.push_back(std::move(*p));
    }
  }
  return out;
}

}  // namespace distrain::controller

#include "operator/controller/kueue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxLabelValue = 63;
constexpr size_t kUidDigits = 8;

const Json& Metadata(const Json& object) {
  static const Json kEmpty = Json::object();
  if (!object.is_object()) return kEmpty;
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string StringAt(const Json& object, const char* key, const std::string& field) {
  auto map = object.find(key);
  if (map == object.end() || !map->is_object()) return "";
  auto value = map->find(field);
  return value != map->end() && value->is_string() ? value->get<std::string>() : "";
}

// A pod the job owns (controller reference with the job's uid).
bool OwnedBy(const Json& metadata, const std::string& uid) {
  auto refs = metadata.find("ownerReferences");
  if (refs == metadata.end() || !refs->is_array()) return false;
  return std::any_of(refs->begin(), refs->end(), [&](const Json& ref) {
    return ref.is_object() && ref.value("uid", "") == uid;
  });
}

}  // namespace

std::string KueueQueueName(const api::DistributedTrainingJob& job, const JobConfig& config) {
  if (!config.run_policy.scheduling.queue.empty()) return config.run_policy.scheduling.queue;
  auto label = job.metadata.labels.find(kQueueLabel);
  return label == job.metadata.labels.end() ? "" : label->second;
}

absl::Status ValidateKueueQueue(const api::DistributedTrainingJob& job, const JobConfig& config) {
  const std::string queue = KueueQueueName(job, config);
  if (queue.empty()) return absl::OkStatus();
  bool ok = queue.size() <= kMaxLabelValue;
  for (size_t i = 0; ok && i < queue.size(); ++i) {
    const char c = queue[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    ok = alnum || ((c == '-' || c == '.') && i > 0 && i + 1 < queue.size());
  }
  if (ok) return absl::OkStatus();
  const std::string field = config.run_policy.scheduling.queue.empty()
                                ? absl::StrCat("metadata.labels[", kQueueLabel, "]")
                                : "spec.runPolicy.scheduling.queue";
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": \"", queue,
      "\" cannot name a Kueue LocalQueue: use the name of a LocalQueue in namespace ",
      job.metadata.namespace_,
      " (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at "
      "most 63 characters; kubectl get localqueues -n ",
      job.metadata.namespace_, ")"));
}

std::string KueuePodGroupName(const api::DistributedTrainingJob& job) {
  std::string digits;
  for (char c : job.metadata.uid) {
    if (c == '-') continue;
    digits += c;
    if (digits.size() == kUidDigits) break;
  }
  if (digits.empty()) return job.metadata.name.substr(0, kMaxLabelValue);
  const std::string name = job.metadata.name.substr(0, kMaxLabelValue - 1 - digits.size());
  return absl::StrCat(name, "-", digits);
}

void AddKueuePodGroup(const api::DistributedTrainingJob& job, const JobConfig& config, ReplicaId id,
                      Json* metadata) {
  const std::string queue = KueueQueueName(job, config);
  if (queue.empty()) return;
  (*metadata)["labels"][kQueueLabel] = queue;
  (*metadata)["labels"][kKueuePodGroupNameLabel] = KueuePodGroupName(job);
  (*metadata)["annotations"][kKueuePodGroupTotalCountAnnotation] =
      std::to_string(DesiredReplicas(config).size());
  (*metadata)["annotations"][kKueueRoleHashAnnotation] = ReplicaTaskType(id.type);
}

bool GatedByKueue(const Json& pod) {
  if (!pod.is_object()) return false;
  const Json gates = pod.value(Json::json_pointer("/spec/schedulingGates"), Json::array());
  if (!gates.is_array()) return false;
  return std::any_of(gates.begin(), gates.end(), [](const Json& gate) {
    return gate.is_object() && gate.value("name", "") == kKueueAdmissionGate;
  });
}

std::optional<QueuedDecision> DecideQueued(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const std::vector<ObjectRef>& pods) {
  const std::string queue = KueueQueueName(job, config);
  if (queue.empty()) return std::nullopt;
  int present = 0, gated = 0;
  for (const ObjectRef& pod : pods) {
    const Json& metadata = Metadata(*pod);
    if (metadata.contains("deletionTimestamp") || !OwnedBy(metadata, job.metadata.uid)) continue;
    ++present;
    if (GatedByKueue(*pod)) ++gated;
  }
  if (present == 0) return std::nullopt;
  const std::string group = KueuePodGroupName(job);
  QueuedDecision d;
  if (gated > 0) {
    d.queued = true;
    d.reason = kReasonKueueWaiting;
    d.message = absl::StrCat(
        gated, " of ", present, present == 1 ? " pod waits" : " pods wait",
        " for Kueue to admit pod group ", group, " (", DesiredReplicas(config).size(),
        " pods) from LocalQueue ", queue, " (scheduling gate ", kKueueAdmissionGate,
        "); see kubectl get workload -n ", job.metadata.namespace_, " ", group);
  } else {
    d.reason = kReasonKueueAdmitted;
    d.message = absl::StrCat("Kueue admitted pod group ", group, " from LocalQueue ", queue);
  }
  return d;
}

std::vector<PodPatch> KueueFinishedPatches(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const std::vector<ObjectRef>& pods) {
  std::vector<PodPatch> patches;
  if (KueueQueueName(job, config).empty()) return patches;
  for (const ObjectRef& pod : pods) {
    const Json& metadata = Metadata(*pod);
    if (!OwnedBy(metadata, job.metadata.uid)) continue;
    if (StringAt(metadata, "labels", kKueuePodGroupNameLabel).empty()) continue;
    if (StringAt(metadata, "annotations", kKueueRetriableInGroupAnnotation) == "false") continue;
    const std::string name = metadata.value("name", "");
    const std::string uid = metadata.value("uid", "");
    patches.push_back(
        {name, uid,
         {{"metadata",
           {{"uid", uid}, {"annotations", {{kKueueRetriableInGroupAnnotation, "false"}}}}}}});
  }
  return patches;
}

}  // namespace distrain::controller

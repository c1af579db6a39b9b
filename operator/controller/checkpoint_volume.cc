#include "operator/controller/checkpoint_volume.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

// Whether `mount_path` is `dir` or a directory above it ("/data" covers
// "/data/ckpt"; "/dat" does not).
bool Covers(std::string mount_path, const std::string& dir) {
  while (mount_path.size() > 1 && mount_path.back() == '/') mount_path.pop_back();
  if (mount_path == "/") return false;  // a volume at / is not a storage choice
  return dir == mount_path || absl::StartsWith(dir, mount_path + "/");
}

// Whether some replica's template mounts a volume of its own at `dir` or above.
bool TemplateMounts(const api::DistributedTrainingJob& job, const std::string& dir) {
  for (const auto& [type, tmpl] : job.templates) {
    if (!tmpl.is_object() || !tmpl.contains("spec")) continue;
    const Json* main = MainContainer(tmpl["spec"]);
    if (main == nullptr || !main->contains("volumeMounts") ||
        !(*main)["volumeMounts"].is_array()) {
      continue;
    }
    for (const Json& m : (*main)["volumeMounts"]) {
      if (!m.is_object() || m.value("name", "") == kCheckpointVolumeName) continue;
      const Json& path = m.value("mountPath", Json());
      if (path.is_string() && Covers(path.get<std::string>(), dir)) return true;
    }
  }
  return false;
}

bool OwnedBy(const Json& object, const std::string& uid) {
  const Json& refs = object.value("metadata", Json::object()).value("ownerReferences", Json());
  if (!refs.is_array()) return false;
  for (const Json& ref : refs) {
    if (ref.is_object() && ref.value("uid", "") == uid) return true;
  }
  return false;
}

}  // namespace

std::string CheckpointClaimName(const std::string& job_name) {
  return absl::StrCat(job_name, kCheckpointClaimSuffix);
}

CheckpointStorage ResolveCheckpointStorage(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const CheckpointStorageOptions& options) {
  const CheckpointConfig& ckpt = config.training.checkpoint;
  CheckpointStorage s;
  if (!ckpt.volume.is_null()) {
    s.source = CheckpointStorage::Source::kJobVolume;
    s.dir = ckpt.dir.empty() ? kDefaultCheckpointDir : ckpt.dir;
    s.volume_source = ckpt.volume;
    return s;
  }
  if (!ckpt.dir.empty() && TemplateMounts(job, ckpt.dir)) {
    s.source = CheckpointStorage::Source::kTemplate;
    s.dir = ckpt.dir;
    return s;
  }
  if (!options.provision) {
    s.dir = ckpt.dir;
    return s;
  }
  s.source = CheckpointStorage::Source::kProvisioned;
  s.dir = ckpt.dir.empty() ? kDefaultCheckpointDir : ckpt.dir;
  s.claim_name = CheckpointClaimName(job.metadata.name);
  s.storage_class = !ckpt.storage.storage_class_name.empty() ? ckpt.storage.storage_class_name
                                                             : options.storage_class;
  s.size = !ckpt.storage.size.empty() ? ckpt.storage.size : options.size;
  s.access_mode =
      !ckpt.storage.access_mode.empty() ? ckpt.storage.access_mode : options.access_mode;
  s.volume_source = {{"persistentVolumeClaim", {{"claimName", s.claim_name}}}};
  return s;
}

bool MountsCheckpointVolume(const JobConfig& config, const CheckpointStorage& storage,
                            ReplicaId id) {
  if (storage.source != CheckpointStorage::Source::kJobVolume &&
      storage.source != CheckpointStorage::Source::kProvisioned) {
    return false;
  }
  if (IsMaster(config, id) || id.type == ReplicaType::kPS ||
      id.type == ReplicaType::kEvaluator) {
    return true;
  }
  // The other workers neither read nor write checkpoints: they mount only a
  // claim every node can attach.
  return storage.source == CheckpointStorage::Source::kProvisioned &&
         storage.access_mode == "ReadWriteMany";
}

std::string MountCheckpointStorage(const CheckpointStorage& storage, const JobConfig& config,
                                   ReplicaId id, Json* metadata, Json* spec, Json* main) {
  if (!MountsCheckpointVolume(config, storage, id)) {
    // The storage the template names (kTemplate), the operator's choice of
    // none (kNone), or a worker that never touches checkpoints: the directory
    // as before, so a worker that looks finds nothing rather than a stray path.
    return storage.source == CheckpointStorage::Source::kTemplate ||
                   storage.source == CheckpointStorage::Source::kNone
               ? storage.dir
               : "";
  }
  Json& volumes = (*spec)["volumes"];
  if (!volumes.is_array()) volumes = Json::array();
  for (auto it = volumes.begin(); it != volumes.end();) {
    it = it->is_object() && it->value("name", "") == kCheckpointVolumeName ? volumes.erase(it)
                                                                            : it + 1;
  }
  Json volume = storage.volume_source;
  volume["name"] = kCheckpointVolumeName;
  volumes.push_back(std::move(volume));

  Json& mounts = (*main)["volumeMounts"];
  if (!mounts.is_array()) mounts = Json::array();
  for (auto it = mounts.begin(); it != mounts.end();) {
    const bool ours = it->is_object() && (it->value("name", "") == kCheckpointVolumeName ||
                                          it->value("mountPath", "") == storage.dir);
    it = ours ? mounts.erase(it) : it + 1;
  }
  mounts.push_back({{"name", kCheckpointVolumeName}, {"mountPath", storage.dir}});

  if (storage.source == CheckpointStorage::Source::kProvisioned &&
      storage.access_mode == "ReadWriteOnce") {
    // One node attaches the claim: every pod that mounts it goes where the
    // others already are. A pod whose term matches only itself (the first
    // one) may go anywhere (the scheduler's rule for self-affinity).
    (*metadata)["labels"][kCheckpointVolumeLabel] = storage.claim_name;
    Json& required =
        (*spec)["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if (!required.is_array()) required = Json::array();
    required.push_back(
        {{"labelSelector", {{"matchLabels", {{kCheckpointVolumeLabel, storage.claim_name}}}}},
         {"topologyKey", "kubernetes.io/hostname"}});
  }
  return storage.dir;
}

Json BuildCheckpointClaim(const api::DistributedTrainingJob& job,
                          const CheckpointStorage& storage) {
  Json spec = {{"accessModes", Json::array({storage.access_mode})},
               {"resources", {{"requests", {{"storage", storage.size}}}}}};
  if (!storage.storage_class.empty()) spec["storageClassName"] = storage.storage_class;
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata",
           {{"name", storage.claim_name},
            {"namespace", job.metadata.namespace_},
            {"labels",
             {{api::kLabelJobName, job.metadata.name}, {api::kLabelManagedBy, api::kManagedBy}}},
            {"ownerReferences", Json::array({ControllerReference(job)})}}},
          {"spec", std::move(spec)}};
}

CheckpointClaimDecision DecideCheckpointClaim(const api::DistributedTrainingJob& job,
                                              const CheckpointStorage& storage,
                                              const std::optional<Json>& observed) {
  CheckpointClaimDecision d;
  if (storage.source != CheckpointStorage::Source::kProvisioned) return d;
  if (!observed) {
    d.to_create = BuildCheckpointClaim(job, storage);
    return d;
  }
  const Json& metadata = observed->value("metadata", Json::object());
  if (metadata.contains("deletionTimestamp") || !OwnedBy(*observed, job.metadata.uid)) {
    d.blocked = absl::StrCat(
        "the PersistentVolumeClaim ", job.metadata.namespace_, "/", storage.claim_name,
        " that would hold the job's checkpoints exists and is not this job's",
        metadata.contains("deletionTimestamp") ? " (it is being deleted)" : "",
        ", so no pod is created: wait for an earlier job's claim to go, or name the claim to "
        "use in spec.training.checkpoint.volume.persistentVolumeClaim.claimName");
  }
  return d;
}

}  // namespace distrain::controller

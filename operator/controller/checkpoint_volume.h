#ifndef DISTRAIN_OPERATOR_CONTROLLER_CHECKPOINT_VOLUME_H_
#define DISTRAIN_OPERATOR_CONTROLLER_CHECKPOINT_VOLUME_H_

// Where a job's checkpoints live on Kubernetes, and the storage the operator
// provisions for them (docs/architecture.md §6b, "Durable checkpoints").
//
// A restarted pod resumes only from checkpoints that outlived its
// predecessor, so by default every job gets durable storage:
//
//   1. spec.training.checkpoint.volume set (a core/v1 VolumeSource: an
//      existing claim, nfs, csi, ...; emptyDir opts out): that volume is the
//      job's storage (kJobVolume).
//   2. Else, when spec.training.checkpoint.dir is set and a replica's
//      template already mounts a volume of its own at dir or above it (how
//      jobs named their storage before the operator provisioned any), that
//      mount is the storage and nothing is added (kTemplate).
//   3. Else, unless provisioning is off (--checkpoint-volumes=false:
//      kNone, the old behaviour), the operator provisions a
//      PersistentVolumeClaim "<job>-checkpoints" (kProvisioned): storage
//      class, size and access mode from spec.training.checkpoint.storage,
//      else the operator's options. The claim is owned by the job (controller
//      ownerReference) and labelled like its pods.
//
// Lifetime of a provisioned claim: created before the first pod that mounts
// it (the reconciler creates no such pod until the claim exists); never
// deleted by the operator while the job exists (cleanPodPolicy and restarts
// leave it, so a Succeeded or Failed job's checkpoints stay readable for
// `distrain export` and for a resubmission under another name that mounts the
// claim through `volume`); deleted by the garbage collector together with the
// job (kubectl delete, ttlSecondsAfterFinished). A claim of that name that is
// not the job's (an earlier job's still being deleted, or someone else's)
// holds the job's pods back rather than being shared.
//
// Mounting: the volume "distrain-checkpoints" is mounted at the checkpoint
// directory (spec.training.checkpoint.dir, else kDefaultCheckpointDir) in the
// main container, and DISTRAIN_CHECKPOINT_DIR points there, in every pod that
// reads or writes checkpoints: the master (the chief, or worker 0, which
// saves and restores), every PS (each saves its own shards) and the
// Evaluator (reads). Other workers never touch checkpoints (MultiWorkerMirrored
// broadcasts the chief's restored state), so they mount it only when the
// claim is ReadWriteMany. A ReadWriteOnce claim attaches to one node: the
// pods that mount it carry the label kCheckpointVolumeLabel and a required
// pod affinity to pods with that label on the same host, so they land on one
// node (the first one anywhere, a restarted one beside those still running).
//
// Pure functions; thread-safe.

#include <optional>
#include <string>

#include "common/job_config.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

// Where the checkpoints are mounted when spec.training.checkpoint.dir is empty.
inline constexpr char kDefaultCheckpointDir[] = "/var/lib/distrain/checkpoints";
// The pod volume that holds them.
inline constexpr char kCheckpointVolumeName[] = "distrain-checkpoints";
// "<job>-checkpoints": the claim the operator provisions.
inline constexpr char kCheckpointClaimSuffix[] = "-checkpoints";
// On pods that mount a ReadWriteOnce claim (value: the claim's name).
inline constexpr char kCheckpointVolumeLabel[] = "distrain.io/checkpoint-volume";

using CheckpointStorageOptions = ControllerOptions::CheckpointStorageOptions;

struct CheckpointStorage {
  enum class Source { kNone, kTemplate, kJobVolume, kProvisioned };
  Source source = Source::kNone;
  // DISTRAIN_CHECKPOINT_DIR; "" (kNone without spec.training.checkpoint.dir): no checkpoints.
  std::string dir;
  // kJobVolume, kProvisioned: the source of the pod volume kCheckpointVolumeName.
  nlohmann::json volume_source;
  // kProvisioned: the claim's name and spec.
  std::string claim_name;
  std::string storage_class;  // "": leave storageClassName out (the cluster default)
  std::string size;
  std::string access_mode;
};

// "<job>-checkpoints".
std::string CheckpointClaimName(const std::string& job_name);

// Steps 1-3 of the file comment for the job (`config`: its spec with Auto resolved).
CheckpointStorage ResolveCheckpointStorage(const api::DistributedTrainingJob& job,
                                           const JobConfig& config,
                                           const CheckpointStorageOptions& options);

// Whether replica `id` mounts the checkpoint volume (file comment, "Mounting").
bool MountsCheckpointVolume(const JobConfig& config, const CheckpointStorage& storage,
                            ReplicaId id);

// Adds the volume, its mount, and for ReadWriteOnce claims the label and pod
// affinity, to the pod of replica `id` under construction (`metadata`, `spec`,
// and `main`, its main container inside `spec`). Returns the value of
// DISTRAIN_CHECKPOINT_DIR for the pod ("" when it gets none). A volume of the
// template named kCheckpointVolumeName is replaced, and so is a mount of the
// main container at the checkpoint directory.
std::string MountCheckpointStorage(const CheckpointStorage& storage, const JobConfig& config,
                                   ReplicaId id, nlohmann::json* metadata, nlohmann::json* spec,
                                   nlohmann::json* main);

// The PersistentVolumeClaim of a kProvisioned storage: labelled with the
// job's name and managed-by, owned by the job.
nlohmann::json BuildCheckpointClaim(const api::DistributedTrainingJob& job,
                                    const CheckpointStorage& storage);

// What the reconcile does about the claim, given the one observed (if any).
struct CheckpointClaimDecision {
  std::optional<nlohmann::json> to_create;
  // Non-empty: a claim of that name exists and is not this job's; no pod
  // that would mount it may be created. The message says why and the fix.
  std::string blocked;
};
CheckpointClaimDecision DecideCheckpointClaim(const api::DistributedTrainingJob& job,
                                              const CheckpointStorage& storage,
                                              const std::optional<nlohmann::json>& observed);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_CHECKPOINT_VOLUME_H_

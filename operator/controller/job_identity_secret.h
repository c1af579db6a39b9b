#ifndef DISTRAIN_OPERATOR_CONTROLLER_JOB_IDENTITY_SECRET_H_
#define DISTRAIN_OPERATOR_CONTROLLER_JOB_IDENTITY_SECRET_H_

// The job's identity Secret, "<job>-identity" (docs/security.md): what lets
// the job's processes recognise each other and nothing else
// (common/job_identity.h has the choice of a CA per job and a certificate
// per task, and why).
//
// Keys of the Secret:
//   ca.crt, ca.key           the job's CA (ca.key is never mounted: only the
//                            operator issues certificates with it)
//   ring.key                 the 256-bit key of the ring's HMAC handshake
//   <type>-<index>.crt/.key  one task's certificate and key
// Each pod mounts, read-only at /var/run/distrain/identity, only ca.crt,
// ring.key and its own task's pair (as tls.crt, tls.key): a pod never holds
// another task's key, so a server knows which task calls it.
//
// Protocol (JobReconciler, before it creates pods):
//   1. GET the Secret. 404: create it with a new CA, ring key and a
//      certificate for every pod about to be created. A 409 on that POST
//      (a concurrent reconcile won) goes back to 1 on the next reconcile.
//   2. Present: add certificates, issued by its CA, for the tasks of the
//      pods about to be created that have none yet (a scale-up), with a PUT
//      carrying the resourceVersion read (409: retried next reconcile).
//   3. Only then are the pods created: a pod whose Secret item is missing
//      would wait in ContainerCreating.
// The Secret is owned by the job (garbage-collected with it) and labelled
// like the job's other children. Nothing for spec.security.transport:
// Plaintext.
//
// Pure functions except EnsureJobIdentity (API calls); thread-safe.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/pods.h"
#include "operator/kube/client.h"

namespace distrain::controller {

inline constexpr char kIdentitySecretSuffix[] = "-identity";
inline constexpr char kIdentityVolumeName[] = "distrain-identity";

// "<job>-identity".
std::string IdentitySecretName(const std::string& job_name);

// With MutualTLS: mounts the pod's items of the Secret at
// kDefaultCredentialsDir in `main` and sets DISTRAIN_CREDENTIALS_DIR in
// `env`. A template volume or mount of the same name wins (the user's own
// credentials).
void MountJobIdentity(const api::DistributedTrainingJob& job, const JobConfig& config, ReplicaId id,
                      nlohmann::json* pod_spec, nlohmann::json* main, nlohmann::json* env);

// Steps 1-2 of the protocol for the pods in `pods` (objects as BuildPod
// makes them). OK when the Secret holds a certificate for each of them.
absl::Status EnsureJobIdentity(kube::Client& client, const nlohmann::json& job_object,
                               const std::vector<nlohmann::json>& pods);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_JOB_IDENTITY_SECRET_H_

#ifndef DISTRAIN_COMMON_JOB_IDENTITY_H_
#define DISTRAIN_COMMON_JOB_IDENTITY_H_

// A job's identity: who may take part in a job's traffic (docs/security.md).
//
// Choice: a certificate authority per job, and a certificate per task, rather
// than one key shared by every pod. Both keep strangers and other jobs out
// (a peer must present a certificate signed by this job's CA), but only a
// certificate per task lets a server know *which* task calls: the
// coordination service refuses a Join for worker:2 from anyone but worker:2's
// certificate, a ps refuses Save/Restore/CreateVariables from anyone but the
// chief, a worker's PsWorker service answers only the chief. The ring's raw
// TCP handshake has no TLS; it is an HMAC-SHA256 challenge-response over a
// 256-bit job key (RingKey) that every task of the job holds.
//
// Material, and where it lives:
//   JobAuthority   the CA (EC P-256 key + self-signed certificate) and the
//                  ring key. The operator keeps it in the job's Secret (the CA
//                  key is never projected into a pod); `distrain run` keeps
//                  it in memory.
//   TaskCredentials one task's certificate (CN "worker:2", SAN DNS
//                  TaskServerName) and EC P-256 key, signed by the job CA,
//                  valid for clients and servers.
//   A task's credentials directory holds exactly the four files below; the
//   worker loads it from $DISTRAIN_CREDENTIALS_DIR.
//
// Pure functions over value types; thread-safe (OpenSSL 3 is).

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"

namespace distrain {

// Files of a task's credentials directory.
inline constexpr char kCredentialsCaFile[] = "ca.crt";
inline constexpr char kCredentialsCertFile[] = "tls.crt";
inline constexpr char kCredentialsKeyFile[] = "tls.key";
inline constexpr char kCredentialsRingKeyFile[] = "ring.key";  // 64 hex digits
// Where the operator mounts them in a pod.
inline constexpr char kDefaultCredentialsDir[] = "/var/run/distrain/identity";

struct JobAuthority {
  std::string ca_cert_pem;
  std::string ca_key_pem;
  std::string ring_key_hex;  // 32 random bytes as 64 lowercase hex digits
};

struct TaskCredentials {
  std::string cert_pem;
  std::string key_pem;
};

// A fresh CA for `job_name` ("ns/name", in the CA's subject, for people
// reading certificates) and a fresh ring key. Certificates issued from it
// and the CA itself are valid from 5 minutes ago (clock skew) for `validity`.
absl::StatusOr<JobAuthority> NewJobAuthority(const std::string& job_name,
                                             absl::Duration validity = absl::Hours(24 * 365));

// A certificate for `task` signed by `authority`.
absl::StatusOr<TaskCredentials> IssueTaskCredentials(
    const JobAuthority& authority, const TaskId& task,
    absl::Duration validity = absl::Hours(24 * 365));

// The DNS name in a task's certificate, which clients expect when they dial
// that task (gRPC's target-name check): "worker-2.task.distrain". Pods reach
// each other by Service names, which the certificate need not know: the
// identity is the task, not the address.
std::string TaskServerName(const TaskId& task);

// The task named by a certificate's common name ("worker:2"); InvalidArgument
// for anything else.
absl::StatusOr<TaskId> ParseTaskCommonName(const std::string& common_name);

// What a worker loads from its credentials directory, checked: the PEMs
// parse, the key is the certificate's, the certificate chains to the CA and
// is valid now, its CN names a task, and the ring key is 64 hex digits.
struct LoadedCredentials {
  TaskId task;  // from the certificate
  std::string ca_cert_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string ring_key;  // 32 raw bytes
};
absl::StatusOr<LoadedCredentials> LoadCredentialsDir(const std::string& dir);
// The same checks over material in memory (tests, `distrain run`).
absl::StatusOr<LoadedCredentials> CheckCredentials(const std::string& ca_cert_pem,
                                                   const TaskCredentials& task,
                                                   const std::string& ring_key_hex);

// Writes a task's credentials directory (created 0700 if missing; files 0600,
// each written to a temporary name and renamed).
absl::Status WriteCredentialsDir(const std::string& dir, const JobAuthority& authority,
                                 const TaskCredentials& task);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_JOB_IDENTITY_H_

#ifndef DISTRAIN_COMMON_EXIT_CODES_H_
#define DISTRAIN_COMMON_EXIT_CODES_H_

// Process exit codes of distrain-worker and `distrain run`. The operator's
// ExitCode restart policy reads them: 1-127 are permanent (restarting cannot
// help: fix the job), 128-255 are retryable (a peer or the node went away).
// Documented in README.md ("Exit codes").
#include "common/job_config.h"

namespace distrain {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;         // a bug in distrain; please report
inline constexpr int kExitUsage = 2;            // bad command-line flags
inline constexpr int kExitInvalidConfig = 3;    // job YAML / DISTRAIN_JOB_CONFIG / TF_CONFIG rejected
inline constexpr int kExitInvalidData = 4;      // dataset missing, unreadable or malformed
inline constexpr int kExitUnsupported = 5;      // strategy or device not available in this build
inline constexpr int kExitCheckpoint = 6;       // checkpoint directory unusable
inline constexpr int kExitInterrupted = 130;    // SIGINT (128 + 2); state saved when possible
inline constexpr int kExitTerminated = 143;     // SIGTERM (128 + 15); final checkpoint written
inline constexpr int kExitPeerLost = 170;       // a peer died or stopped answering
inline constexpr int kExitUnreachable = 171;    // peers never came up before the deadline

inline bool IsRetryableExitCode(int code) { return code >= 128 && code <= 255; }

// Whether a replica whose process exited with `exit_code` (not 0) restarts
// under `policy` (spec.replicaSpecs.<type>.restartPolicy). One rule for the
// operator's pods and `distrain run`'s local processes, so both read the
// codes above the same way.
inline bool ShouldRestart(RestartPolicy policy, int exit_code) {
  switch (policy) {
    case RestartPolicy::kNever:
      return false;
    case RestartPolicy::kOnFailure:
    case RestartPolicy::kAlways:
      return true;
    case RestartPolicy::kExitCode:
      return IsRetryableExitCode(exit_code);
  }
  return false;
}

}  // namespace distrain

#endif  // DISTRAIN_COMMON_EXIT_CODES_H_

#ifndef DISTRAIN_CLI_RUN_COMMAND_H_
#define DISTRAIN_CLI_RUN_COMMAND_H_

#include <string>

namespace distrain {

struct RunOptions {
  std::string job_file;
  std::string worker_binary;   // "" = distrain-worker next to this binary, else $PATH
  std::string work_dir;        // "" = a new directory under $TMPDIR
  std::string checkpoint_dir;  // "" = <work_dir>/checkpoints (fresh each run)
  bool progress = true;        // progress bar when stdout is a terminal
  double grace_seconds = 30;   // SIGTERM -> SIGKILL when stopping replicas
};

// `distrain run job.yaml`: validates the job (before any process starts),
// starts every replica as a local distrain-worker process with the pod
// environment of docs/architecture.md §5, prefixes their output lines with the replica
// label, shows progress, forwards SIGINT/SIGTERM, prints a summary and
// returns the job's exit code (0 on success, else the failing replica's code,
// or common/exit_codes.h for errors found before start).
//
// Job result (spec.successPolicy): Default — the chief (worker 0 without a
// chief) exits 0; AllWorkers — chief and every worker exit 0. Any chief/
// worker/ps exiting non-zero first fails the job and stops the rest. Once
// the job has succeeded, ps and evaluator tasks (which serve until told) are
// stopped with SIGTERM.
int RunJob(const RunOptions& options);

}  // namespace distrain

#endif  // DISTRAIN_CLI_RUN_COMMAND_H_

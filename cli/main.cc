// distrain: the command-line tool. `distrain run job.yaml` runs a
// DistributedTrainingJob on this machine as local processes.
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/run_command.h"
#include "common/exit_codes.h"

int main(int argc, char** argv) {
  CLI::App app{"distrain: TensorFlow-style distributed training. See README.md."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("distrain ") + DISTRAIN_VERSION);

  distrain::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand(
      "run", "Run a DistributedTrainingJob YAML on this machine: every replica becomes a local "
             "distrain-worker process with the environment the operator gives pods");
  run_cmd->add_option("job", run.job_file, "DistributedTrainingJob YAML (e.g. examples/onedevice.yaml)")
      ->required()
      ->check(CLI::ExistingFile);
  run_cmd->add_option("--worker-binary", run.worker_binary,
                      "distrain-worker to start (default: next to this binary, else $PATH)");
  run_cmd->add_option("--work-dir", run.work_dir,
                      "directory for status files and default checkpoints (default: new temp dir)");
  run_cmd->add_option("--checkpoint-dir", run.checkpoint_dir,
                      "checkpoint directory; reuse it to resume an interrupted run "
                      "(default: <work-dir>/checkpoints; spec.training.checkpoint.dir wins)");
  run_cmd->add_option("--grace-period", run.grace_seconds,
                      "seconds replicas get to stop after SIGTERM before SIGKILL")
      ->capture_default_str();
  bool no_progress = false;
  run_cmd->add_flag("--no-progress", no_progress, "plain progress lines even on a terminal");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? distrain::kExitOk : distrain::kExitUsage;
  }
  if (*run_cmd) {
    run.progress = !no_progress;
    return distrain::RunJob(run);
  }
  return distrain::kExitUsage;
}

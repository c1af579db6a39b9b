// distrain: the command-line tool. `distrain run job.yaml` runs a
// DistributedTrainingJob on this machine as local processes; `distrain
// export` and `distrain import-keras` move models to and from Keras.
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/credentials_command.h"
#include "cli/keras_commands.h"
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

  distrain::ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a checkpoint's model as a Keras 3 .keras file that "
                "keras.saving.load_model opens (compiled, with the optimizer's state)");
  export_cmd->add_option("checkpoint_dir", export_options.checkpoint_dir,
                         "checkpoint directory (files ckpt-<step>.dtc)")
      ->required()
      ->check(CLI::ExistingDirectory);
  export_cmd->add_option("-o,--output", export_options.output, "the .keras file to write")
      ->required();
  export_cmd->add_option("--job", export_options.job_file,
                         "the job YAML that trained it (default: the job the checkpoint records)")
      ->check(CLI::ExistingFile);
  export_cmd->add_option("--step", export_options.step,
                         "export this step's checkpoint (default: the newest valid one)");

  distrain::ImportKerasOptions import_options;
  CLI::App* import_cmd = app.add_subcommand(
      "import-keras", "Turn a Keras Sequential (model.to_json(), a config.json, or a .keras "
                      "file) into the spec.training model block");
  import_cmd->add_option("model", import_options.json_file, "the Keras JSON or .keras file")
      ->required()
      ->check(CLI::ExistingFile);
  import_cmd->add_option("-o,--output", import_options.output, "write here (default: stdout)");
  import_cmd->add_option("--checkpoint-dir", import_options.checkpoint_dir,
                         "a .keras file's weights become a step-0 checkpoint in this (empty) "
                         "directory; `distrain run --checkpoint-dir` then starts from them");

  distrain::CredentialsOptions credentials_options;
  CLI::App* credentials_cmd = app.add_subcommand(
      "credentials", "Write a new job's credentials (CA, a certificate per task, ring key) as "
                     "one directory per task, for workers started by hand: pass "
                     "<output>/<type>-<index> to each as DISTRAIN_CREDENTIALS_DIR");
  credentials_cmd->add_option("tasks", credentials_options.tasks, "tasks, e.g. chief:0 worker:0 worker:1")
      ->required();
  credentials_cmd->add_option("-o,--output", credentials_options.output, "parent directory")
      ->required();
  credentials_cmd->add_option("--job", credentials_options.job, "job name for the CA's subject");

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
  if (*export_cmd) return distrain::ExportCommand(export_options);
  if (*import_cmd) return distrain::ImportKerasCommand(import_options);
  if (*credentials_cmd) return distrain::CredentialsCommand(credentials_options);
  return distrain::kExitUsage;
}

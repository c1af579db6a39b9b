#include "cli/keras_commands.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "common/exit_codes.h"
#include "common/job_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/keras_format.h"

namespace distrain {
namespace {

int Fail(int code, const std::string& message) {
  std::cerr << "distrain: " << message << "\n";
  return code;
}

}  // namespace

int ExportCommand(const ExportOptions& options) {
  // 1. The checkpoint: the newest valid one (corrupt files are skipped with a
  //    warning, as a resuming job does), or the asked-for step.
  CheckpointManager checkpoints(options.checkpoint_dir, /*keep=*/1 << 30);
  std::optional<CheckpointState> state;
  if (options.step >= 0) {
    absl::StatusOr<CheckpointState> read =
        CheckpointManager::ReadFile(checkpoints.PathForStep(options.step));
    if (!read.ok()) return Fail(kExitCheckpoint, std::string(read.status().message()));
    state = *std::move(read);
  } else {
    absl::StatusOr<std::optional<CheckpointState>> latest = checkpoints.RestoreLatest();
    if (!latest.ok()) return Fail(kExitCheckpoint, std::string(latest.status().message()));
    if (!latest->has_value()) {
      return Fail(kExitCheckpoint, "no checkpoint in '" + options.checkpoint_dir +
                                       "' (files ckpt-<step>.dtc); point at the directory a "
                                       "job's spec.training.checkpoint.dir or --checkpoint-dir "
                                       "names");
    }
    state = std::move(**latest);
  }
  // 2. The model: as the checkpoint records it, or from the job's YAML.
  absl::StatusOr<KerasModelSpec> spec = KerasModelSpecFromCheckpoint(*state);
  if (!options.job_file.empty()) {
    absl::StatusOr<JobConfig> job = LoadJobYamlFile(options.job_file);
    if (!job.ok()) return Fail(kExitInvalidConfig, std::string(job.status().message()));
    KerasModelSpec from_job;
    from_job.model = job->training.model;
    from_job.optimizer = job->training.optimizer;
    absl::StatusOr<std::vector<int64_t>> shape = spec.ok()
                                                     ? spec->example_shape
                                                     : ExampleShapeOf(job->training.dataset);
    if (!shape.ok()) return Fail(kExitInvalidData, std::string(shape.status().message()));
    from_job.example_shape = *shape;
    from_job.num_classes = spec.ok() ? spec->num_classes : job->training.dataset.num_classes;
    if (auto it = state->metadata.find(kCheckpointNumClassesKey); it != state->metadata.end()) {
      from_job.num_classes = std::stoi(it->second);
    }
    spec = from_job;
  }
  if (!spec.ok()) return Fail(kExitCheckpoint, std::string(spec.status().message()));
  // 3. The file.
  if (absl::Status s = ExportKerasModel(*spec, *state, options.output); !s.ok()) {
    const int code =
        s.code() == absl::StatusCode::kInvalidArgument ? kExitInvalidConfig : kExitCheckpoint;
    return Fail(code, std::string(s.message()));
  }
  std::cout << "wrote " << options.output << " (step " << state->step
            << "); load it with keras.saving.load_model(\"" << options.output << "\")\n";
  return kExitOk;
}

int ImportKerasCommand(const ImportKerasOptions& options) {
  std::ifstream in(options.json_file);
  if (!in) return Fail(kExitUsage, "cannot read '" + options.json_file + "'");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<KerasImport> imported = ImportKerasModelJson(text.str());
  if (!imported.ok()) {
    return Fail(kExitInvalidConfig, options.json_file + ":\n" + std::string(imported.status().message()));
  }
  const std::string yaml = KerasImportYaml(*imported, options.json_file);
  if (options.output.empty()) {
    std::cout << yaml;
  } else {
    std::ofstream out(options.output);
    out << yaml;
    if (!out) return Fail(kExitInternal, "cannot write '" + options.output + "'");
    std::cerr << "wrote " << options.output << "\n";
  }
  for (const std::string& w : imported->warnings) std::cerr << "distrain: note: " << w << "\n";
  return kExitOk;
}

}  // namespace distrain

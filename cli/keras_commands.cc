#include "cli/keras_commands.h"

#include <filesystem>
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
  std::ifstream in(options.json_file, std::ios::binary);
  if (!in) return Fail(kExitUsage, "cannot read '" + options.json_file + "'");
  std::stringstream text;
  text << in.rdbuf();
  // A .keras file is a zip (it starts with "PK"); anything else is JSON.
  const bool archive = text.str().rfind("PK", 0) == 0;
  if (!archive && !options.checkpoint_dir.empty()) {
    return Fail(kExitUsage, "--checkpoint-dir needs a .keras file (JSON carries no weights)");
  }
  absl::StatusOr<KerasImport> imported;
  std::optional<CheckpointState> weights;
  if (archive) {
    absl::StatusOr<KerasFileImport> file = ImportKerasFile(options.json_file);
    if (!file.ok()) {
      return Fail(kExitInvalidConfig, options.json_file + ":\n" + std::string(file.status().message()));
    }
    imported = std::move(file->imported);
    weights = std::move(file->weights);
  } else {
    imported = ImportKerasModelJson(text.str());
  }
  if (!imported.ok()) {
    return Fail(kExitInvalidConfig, options.json_file + ":\n" + std::string(imported.status().message()));
  }
  if (!options.checkpoint_dir.empty()) {
    // Only into an empty directory: a newer checkpoint there would win on
    // resume and the imported weights would be silently ignored.
    CheckpointManager checkpoints(options.checkpoint_dir, /*keep=*/1 << 30);
    if (!checkpoints.ListSteps().empty()) {
      return Fail(kExitCheckpoint, "'" + options.checkpoint_dir +
                                       "' already holds checkpoints; import into an empty "
                                       "directory");
    }
    std::error_code ignored;
    std::filesystem::create_directories(options.checkpoint_dir, ignored);
    if (absl::Status s = checkpoints.Save(*weights); !s.ok()) {
      return Fail(kExitCheckpoint, std::string(s.message()));
    }
    std::cerr << "wrote the Keras weights to " << checkpoints.PathForStep(0)
              << "; distrain run JOB --checkpoint-dir " << options.checkpoint_dir
              << " starts from them\n";
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

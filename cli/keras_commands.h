#ifndef DISTRAIN_CLI_KERAS_COMMANDS_H_
#define DISTRAIN_CLI_KERAS_COMMANDS_H_

// `distrain export` and `distrain import-keras`: the command-line ends of
// worker/model/keras_format.h (docs/keras.md).

#include <cstdint>
#include <string>

namespace distrain {

struct ExportOptions {
  std::string checkpoint_dir;
  std::string output;    // must end in .keras
  std::string job_file;  // "": the job recorded in the checkpoint
  int64_t step = -1;     // -1: the newest valid checkpoint
};
// Writes the checkpoint's model as a .keras file; prints where and what.
// Exit codes: common/exit_codes.h (6 for an unusable checkpoint directory).
int ExportCommand(const ExportOptions& options);

struct ImportKerasOptions {
  std::string json_file;       // model.to_json() output, a config.json, or a .keras file
  std::string output;          // "": stdout
  std::string checkpoint_dir;  // .keras only: write its weights here as a step-0 checkpoint
};
// Prints (or writes) the spec.training model block for the Keras model; for
// a .keras file with checkpoint_dir, also its weights, so `distrain run
// --checkpoint-dir` starts from them.
int ImportKerasCommand(const ImportKerasOptions& options);

}  // namespace distrain

#endif  // DISTRAIN_CLI_KERAS_COMMANDS_H_

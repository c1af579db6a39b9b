#ifndef DISTRAIN_CLI_PROGRESS_H_
#define DISTRAIN_CLI_PROGRESS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace distrain {

// The chief's progress as written by the worker (worker/trainer.h,
// TrainerEnv::status_file).
struct Progress {
  std::string state;  // Running | Succeeded | Failed | Terminated
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double examples_per_second = 0;
  double wall_seconds = 0;
  std::optional<double> eval_accuracy;
  std::optional<double> eval_loss;
  std::string message;
};

absl::StatusOr<Progress> ParseProgress(const std::string& json);
// nullopt while the file does not exist yet or is unreadable.
std::optional<Progress> ReadProgressFile(const std::string& path);

// One line, `width` columns at most:
//   [#########...........] 120/400  30% loss 0.3123  5120 ex/s  ETA 0:12
std::string RenderProgressBar(const Progress& p, int width);
// The same facts as a plain log line, for output that is not a terminal.
std::string RenderProgressLine(const Progress& p);
std::string FormatDuration(double seconds);  // "0:12", "1:02:03"

}  // namespace distrain

#endif  // DISTRAIN_CLI_PROGRESS_H_

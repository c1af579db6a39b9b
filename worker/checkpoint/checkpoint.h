#ifndef DISTRAIN_WORKER_CHECKPOINT_CHECKPOINT_H_
#define DISTRAIN_WORKER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// Metadata key: the model's class count (what an Evaluator needs to build
// the model from the eval data alone).
inline constexpr char kCheckpointNumClassesKey[] = "num_classes";

// What a checkpoint holds: model variables, optimizer slots (by name), the
// step, and string metadata (strategy, model summary, ...).
struct CheckpointState {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Checkpoint files "ckpt-<step 12 digits>.dtc" in one directory.
//
// Save protocol (crash-safe at every point):
//   1. serialise to "<final>.tmp-<pid>" and fsync it;
//   2. rename over the final name (atomic on POSIX);
//   3. fsync the directory so the rename survives power loss;
//   4. delete all but the newest `keep` checkpoints.
// Every file carries CRC-32s (zlib) of its index and tensors; RestoreLatest walks newest to
// oldest and skips (with a warning log naming the file and the reason) any
// that is truncated or corrupt, so a crash mid-write never loses the previous
// good checkpoint. Leftover .tmp files are ignored and cleaned.
// Thread-safety: one manager per directory per process; calls serialised by
// the caller.
class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int keep);

  absl::Status Save(const CheckpointState& state);
  // nullopt when the directory holds no valid checkpoint.
  absl::StatusOr<std::optional<CheckpointState>> RestoreLatest();
  // Steps of the checkpoint files present, ascending (validity not checked).
  std::vector<int64_t> ListSteps() const;
  std::string PathForStep(int64_t step) const;
  const std::string& dir() const { return dir_; }

  // File format helpers, exposed for tests and tools.
  static absl::Status WriteFile(const std::string& path, const CheckpointState& state);
  static absl::StatusOr<CheckpointState> ReadFile(const std::string& path);

 private:
  std::string dir_;
  int keep_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_CHECKPOINT_CHECKPOINT_H_

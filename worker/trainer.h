#ifndef DISTRAIN_WORKER_TRAINER_H_
#define DISTRAIN_WORKER_TRAINER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/cluster_spec.h"
#include "common/job_config.h"
#include "worker/progress_watchdog.h"
#include "worker/strategy/strategy.h"
#include "worker/training_metrics.h"

namespace distrain {

// Where the trainer writes things, from the pod contract (docs/architecture.md §5).
struct TrainerEnv {
  std::string checkpoint_dir;  // "" = no checkpoints
  // When set, progress is written here as one JSON object (atomically
  // replaced every log interval and at the end) for `distrain run`:
  //   {"state": "Running"|"Succeeded"|"Failed"|"Terminated", "step": 120,
  //    "totalSteps": 400, "loss": 0.31, "examplesPerSecond": 5120.0,
  //    "evalAccuracy": 0.97, "evalLoss": 0.08, "wallSeconds": 3.2, "message": ""}
  std::string status_file;
  // When set (DISTRAIN_TERMINATION_MESSAGE_PATH: the pod's
  // terminationMessagePath), the chief writes its final figures here once
  // training succeeded, for the kubelet to keep in the pod's status and the
  // operator to record in the job's (operator/controller/final_progress.h):
  //   {"step": 1500, "totalSteps": 1500, "loss": 0.21,
  //    "examplesPerSecond": 5120.3, "accuracy": 0.97}
  // (accuracy: the final evaluation's, present when the job has eval data).
  std::string termination_message_file;
  TrainingMetrics* metrics = nullptr;  // optional; not owned
  // Told of every step, checkpoint write and evaluation; what /healthz
  // answers from (worker/progress_watchdog.h). Optional; not owned.
  ProgressWatchdog* watchdog = nullptr;
};

struct TrainOutcome {
  int exit_code = 0;  // common/exit_codes.h
  absl::Status status;
  int64_t steps_done = 0;
  double final_loss = 0;
  std::optional<double> eval_accuracy;
  std::optional<double> eval_loss;
  double wall_seconds = 0;
};

// The training loop shared by every strategy: open this process's data
// shard, build variables through the strategy, resume from the newest valid
// checkpoint, run steps until config.training.steps, evaluate, checkpoint.
//
// Protocol on stop (SIGTERM/SIGINT sets `stop`): finish the current step,
// write a checkpoint (chief), report "Terminated" and return the retryable
// kExitTerminated so a restarted process resumes where this one stopped.
// With several processes (Strategy::RequestStop) the request first travels
// with the next step, so every process stops after that same step.
// Owns the strategy. Run is called once, from one thread.
class Trainer {
 public:
  Trainer(JobConfig config, ClusterSpec cluster, TrainerEnv env, std::unique_ptr<Strategy> strategy);
  TrainOutcome Run(const std::atomic<bool>& stop);
  Strategy& strategy() { return *strategy_; }

 private:
  void WriteStatus(const std::string& state, int64_t step, double loss, double examples_per_second,
                   const TrainOutcome* final_outcome, const std::string& message);
  // The chief's final figures to env_.termination_message_file (TrainerEnv).
  // `ran_steps`: whether this process ran any step (one that resumed at the
  // final step has no loss or rate of its own, and must not report 0).
  void WriteTerminationMessage(int64_t step, bool ran_steps, double loss, double examples_per_second,
                               const TrainOutcome& outcome);

  JobConfig config_;
  ClusterSpec cluster_;
  TrainerEnv env_;
  std::unique_ptr<Strategy> strategy_;
  double start_seconds_ = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_TRAINER_H_

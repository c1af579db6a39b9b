#ifndef DISTRAIN_WORKER_EVALUATOR_H_
#define DISTRAIN_WORKER_EVALUATOR_H_

// The side-car evaluator (TensorFlow's `evaluator` task): a process of the job
// that never joins the training cluster — no strategy, no rendezvous, no
// collective; training peers never wait for it (ClusterSpec::TrainingCluster
// leaves it out) — and only reads the checkpoints the chief writes to the
// shared checkpoint directory.
//
// Protocol (Evaluator::Run):
//   1. every poll interval, list the checkpoint directory; a file newer than
//      any seen before (valid or not) counts as training progress;
//   2. read the newest checkpoint newer than the last evaluated one; one that
//      is corrupt or truncated is skipped with a warning naming the file and
//      the reason (once per file), and the next older new one is tried; one
//      deleted by the chief's retention meanwhile is skipped silently. When
//      the evaluator falls behind it evaluates only the newest checkpoint
//      (TensorFlow's checkpoints_iterator does the same);
//   3. restore its variables into the evaluation model and evaluate the eval
//      dataset of spec.training.dataset (what the Trainer evaluates); log
//      "evaluator: checkpoint step S/T eval_loss L eval_accuracy A", set
//      distrain_eval_loss, distrain_eval_accuracy, distrain_eval_checkpoint_step,
//      and append `loss` and `accuracy` at the checkpoint's step to the
//      TensorBoard run <checkpoint dir>/validation (docs/tensorboard.md; the
//      chief leaves that run to the Evaluator; best effort, like the chief's),
//      the process's first one after a SessionLog START at that step;
//   4. stop:
//      * exit 0 once a checkpoint at step >= spec.training.steps has been
//        evaluated (the job is done: the chief writes that checkpoint last;
//        an evaluator started after the job finished evaluates it at once);
//      * timeout policy: when no new checkpoint file appeared for `timeout`
//        (default 1 h, DISTRAIN_EVAL_TIMEOUT_SECONDS), training is presumed
//        dead or stuck and the evaluator exits with the retryable
//        kExitUnreachable, naming the directory and the last step seen — so it
//        never hangs forever, and a restarted job gets a restarted evaluator.
//        Pick a timeout above the chief's time between checkpoints
//        (spec.training.checkpoint.everySteps; with 0 there is only the final
//        one). In `distrain run` and in Kubernetes (cleanPodPolicy) the
//        supervisor normally stops the evaluator long before that;
//      * SIGTERM (`stop`): one last poll (so the final checkpoint is not
//        missed when the supervisor stops the evaluator right after the
//        chief finished), then exit 0 if the final checkpoint was evaluated,
//        else the retryable kExitTerminated;
//      * the final checkpoint unreadable, or a checkpoint of a different
//        model: permanent kExitCheckpoint naming the file.
//
// Owns its model and eval dataset; borrows the metrics (may be null). Driven
// by one thread; not thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/model/event_file_writer.h"
#include "worker/model/model.h"

namespace distrain {

// The evaluator's Prometheus metrics (stable names; Grafana reads them):
//   distrain_eval_loss                       gauge    eval loss of the latest evaluated checkpoint
//   distrain_eval_accuracy                   gauge    its eval accuracy
//   distrain_eval_checkpoint_step            gauge    its training step
//   distrain_evaluations_total               counter  checkpoints evaluated
//   distrain_eval_checkpoints_skipped_total  counter  checkpoints skipped as unreadable
// The first two share their names with the chief's TrainingMetrics gauges
// (same meaning: the latest evaluation); they are told apart by the pod.
// References into the registry; prometheus-cpp metrics are thread-safe.
struct EvaluatorMetrics {
  explicit EvaluatorMetrics(prometheus::Registry& registry);
  prometheus::Gauge& eval_loss;
  prometheus::Gauge& eval_accuracy;
  prometheus::Gauge& checkpoint_step;
  prometheus::Counter& evaluations;
  prometheus::Counter& skipped;
};

struct EvalSummary {
  double loss = 0;
  double accuracy = 0;
  int64_t examples = 0;
};

// Mean loss and accuracy of `model` over every example of `data`, in batches.
EvalSummary EvaluateModel(Model& model, const Dataset& data);

struct Evaluation {
  int64_t step = 0;  // of the checkpoint
  EvalSummary result;
};

struct EvaluatorOptions {
  std::string checkpoint_dir;
  absl::Duration poll_interval = absl::Seconds(1);
  absl::Duration timeout = absl::Hours(1);  // without a new checkpoint (see above)
  // Injected for tests: the clock, and how to wait between polls.
  std::function<absl::Time()> now = [] { return absl::Now(); };
  std::function<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
};

// Options from the environment: DISTRAIN_EVAL_POLL_SECONDS (default 1) and
// DISTRAIN_EVAL_TIMEOUT_SECONDS (default 3600); errors name the variable.
absl::StatusOr<EvaluatorOptions> EvaluatorOptionsFromEnv(std::string checkpoint_dir);

struct EvaluatorOutcome {
  int exit_code = 0;  // common/exit_codes.h
  absl::Status status;
  int evaluations = 0;
  std::optional<Evaluation> last;
};

class Evaluator {
 public:
  // Opens the eval dataset of config.training.dataset (its errors as the
  // loaders return them). FailedPrecondition when there is no checkpoint
  // directory or no eval data: the job's configuration must change (the
  // messages say what to set).
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const JobConfig& config,
                                                           EvaluatorOptions options,
                                                           EvaluatorMetrics* metrics);
  // With a given eval dataset (tests).
  static absl::StatusOr<std::unique_ptr<Evaluator>> CreateWithDataset(
      const JobConfig& config, EvaluatorOptions options, std::unique_ptr<Dataset> eval_data,
      EvaluatorMetrics* metrics);

  // Steps 1-3 once: the evaluation of the newest new valid checkpoint, or
  // nullopt when there is none. Errors: the final checkpoint is unreadable,
  // or a checkpoint does not fit the model (FailedPrecondition).
  absl::StatusOr<std::optional<Evaluation>> Poll();
  // The loop; returns when one of step 4's conditions holds.
  EvaluatorOutcome Run(const std::atomic<bool>& stop);

  // The last evaluated checkpoint's step; -1 before the first.
  int64_t last_evaluated_step() const { return last_evaluated_step_; }
  bool final_evaluated() const { return last_evaluated_step_ >= final_step_; }

 private:
  Evaluator(const JobConfig& config, EvaluatorOptions options, std::unique_ptr<Dataset> eval_data,
            EvaluatorMetrics* metrics);
  // Loads `state`'s variables into model_, building it on first use from the
  // checkpoint's shapes (the number of classes is the training data's).
  absl::Status LoadVariables(const CheckpointState& state, const std::string& path);

  JobConfig config_;
  EvaluatorOptions options_;
  std::unique_ptr<Dataset> eval_data_;
  EvaluatorMetrics* metrics_;
  CheckpointManager checkpoints_;
  std::unique_ptr<Model> model_;
  const int64_t final_step_;
  int64_t last_evaluated_step_ = -1;
  int64_t newest_seen_step_ = -1;
  std::set<int64_t> unreadable_steps_;  // warned about once
  SummaryRun events_;                   // <checkpoint dir>/validation
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_EVALUATOR_H_

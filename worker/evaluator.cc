#include "worker/evaluator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "spdlog/spdlog.h"
#include "worker/strategy/variable_state.h"

namespace distrain {
namespace {

constexpr char kVariablePrefix[] = "variables/";

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}
prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

absl::StatusOr<absl::Duration> SecondsFromEnv(const char* name, absl::Duration fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  double seconds = 0;
  if (!absl::SimpleAtod(value, &seconds) || !(seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be a positive number of seconds, got \"", value, "\""));
  }
  return absl::Seconds(seconds);
}

}  // namespace

EvaluatorMetrics::EvaluatorMetrics(prometheus::Registry& registry)
    : eval_loss(AddGauge(registry, "distrain_eval_loss",
                         "Eval loss of the latest evaluated checkpoint")),
      eval_accuracy(AddGauge(registry, "distrain_eval_accuracy",
                             "Eval accuracy of the latest evaluated checkpoint")),
      checkpoint_step(AddGauge(registry, "distrain_eval_checkpoint_step",
                               "Training step of the latest checkpoint the evaluator evaluated")),
      evaluations(AddCounter(registry, "distrain_evaluations_total",
                             "Checkpoints the evaluator evaluated")),
      skipped(AddCounter(registry, "distrain_eval_checkpoints_skipped_total",
                         "Checkpoints the evaluator skipped because they were unreadable")) {}

EvalSummary EvaluateModel(Model& model, const Dataset& data) {
  // Batches whose largest activation stays near 8 MiB: the model keeps its
  // activation buffers at their largest size, so a 1,024-example batch of
  // the guide's CNN (86 KB of conv output per example) would hold ~200 MB
  // for the rest of the job. An MLP still gets the full 1,024.
  constexpr int64_t kActivationBudget = (8 << 20) / sizeof(float);
  const int64_t kEvalBatch = std::clamp<int64_t>(
      kActivationBudget / std::max<int64_t>(1, model.largest_activation_per_example()), 32, 1024);
  const int64_t n = data.size();
  const int f = data.num_features();
  Tensor features;
  std::vector<int32_t> labels;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += kEvalBatch) {
    const int64_t b = std::min(kEvalBatch, n - begin);
    features.Resize({b, f});
    labels.resize(b);
    for (int64_t i = 0; i < b; ++i) data.Get(begin + i, features.data() + i * f, &labels[i]);
    LossResult r = model.Evaluate(features, labels);
    loss_sum += r.loss * b;
    correct += r.correct;
  }
  EvalSummary out;
  out.examples = n;
  if (n > 0) {
    out.loss = loss_sum / n;
    out.accuracy = static_cast<double>(correct) / n;
  }
  return out;
}

absl::StatusOr<EvaluatorOptions> EvaluatorOptionsFromEnv(std::string checkpoint_dir) {
  EvaluatorOptions options;
  options.checkpoint_dir = std::move(checkpoint_dir);
  auto poll = SecondsFromEnv("DISTRAIN_EVAL_POLL_SECONDS", options.poll_interval);
  if (!poll.ok()) return poll.status();
  auto timeout = SecondsFromEnv("DISTRAIN_EVAL_TIMEOUT_SECONDS", options.timeout);
  if (!timeout.ok()) return timeout.status();
  options.poll_interval = *poll;
  options.timeout = *timeout;
  return options;
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const JobConfig& config,
                                                             EvaluatorOptions options,
                                                             EvaluatorMetrics* metrics) {
  auto eval = OpenEvalDataset(config.training.dataset, config.training.seed);
  if (!eval.ok()) return eval.status();
  if (absl::Status ids = CheckTokenIds(**eval, config.training.model); !ids.ok()) return ids;
  return CreateWithDataset(config, std::move(options), std::move(*eval), metrics);
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::CreateWithDataset(
    const JobConfig& config, EvaluatorOptions options, std::unique_ptr<Dataset> eval_data,
    EvaluatorMetrics* metrics) {
  if (options.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        "the Evaluator evaluates the checkpoints the chief writes, but no checkpoint directory "
        "is set: set spec.training.checkpoint.dir or DISTRAIN_CHECKPOINT_DIR (--checkpoint-dir) "
        "to a directory shared with the chief");
  }
  if (eval_data == nullptr || eval_data->size() == 0) {
    return absl::FailedPreconditionError(
        "spec.training.dataset: the Evaluator needs held-out data but the job has none; set "
        "evalFiles (idx/csv) or numEvalExamples (synthetic), or remove "
        "spec.replicaSpecs.Evaluator");
  }
  return std::unique_ptr<Evaluator>(
      new Evaluator(config, std::move(options), std::move(eval_data), metrics));
}

Evaluator::Evaluator(const JobConfig& config, EvaluatorOptions options,
                     std::unique_ptr<Dataset> eval_data, EvaluatorMetrics* metrics)
    : config_(config),
      options_(std::move(options)),
      eval_data_(std::move(eval_data)),
      metrics_(metrics),
      // keep is only used by Save, which the evaluator never calls.
      checkpoints_(options_.checkpoint_dir, config.training.checkpoint.keep),
      final_step_(config.training.steps),
      events_(options_.checkpoint_dir + "/validation") {}

absl::Status Evaluator::LoadVariables(const CheckpointState& state, const std::string& path) {
  auto tensor_of = [&](const std::string& name) -> const Tensor* {
    auto it = state.tensors.find(absl::StrCat(kVariablePrefix, name));
    return it == state.tensors.end() ? nullptr : &it->second;
  };
  if (model_ == nullptr) {
    // The class count is the training data's, which the eval data alone may
    // not show; the checkpoint records it (older checkpoints of the mlp
    // shorthand: the output layer's width).
    int num_classes = 0;
    if (auto it = state.metadata.find(kCheckpointNumClassesKey); it != state.metadata.end()) {
      if (!absl::SimpleAtoi(it->second, &num_classes) || num_classes < 2) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": bad ", kCheckpointNumClassesKey, " '", it->second, "'"));
      }
    } else {
      const std::string output =
          absl::StrCat("dense_", config_.training.model.hidden_units.size(), "/kernel");
      const Tensor* kernel = tensor_of(output);
      if (kernel == nullptr || kernel->rank() != 2) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": has no 2-D variable '", output, "' for the output layer of the model in "
            "spec.training.model; it was written by a different job — point the Evaluator at "
            "this job's checkpoint directory"));
      }
      num_classes = static_cast<int>(kernel->dim(1));
    }
    auto model = Model::Create(config_.training.model, eval_data_->example_shape(), num_classes,
                               config_.training.seed);
    if (!model.ok()) return model.status();
    model_ = std::move(*model);
  }
  for (Parameter* p : AllVariables(*model_)) {
    const Tensor* t = tensor_of(p->name);
    if (t == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": has no variable '", p->name,
                       "' of the model in spec.training.model; it was written by a different "
                       "job — point the Evaluator at this job's checkpoint directory"));
    }
    if (!t->SameShape(p->value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": variable '", p->name, "' has shape ", t->ShapeString(), " but the model of "
          "spec.training.model with ", eval_data_->num_features(), " eval features needs ",
          p->value.ShapeString(), "; the eval data or the model does not match the training job"));
    }
    std::memcpy(p->value.data(), t->data(), p->value.bytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Evaluation>> Evaluator::Poll() {
  const std::vector<int64_t> steps = checkpoints_.ListSteps();
  if (!steps.empty()) newest_seen_step_ = std::max(newest_seen_step_, steps.back());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const int64_t step = *it;
    if (step <= last_evaluated_step_) break;
    if (unreadable_steps_.count(step)) continue;
    const std::string path = checkpoints_.PathForStep(step);
    auto state = CheckpointManager::ReadFile(path);
    if (!state.ok()) {
      // Deleted by the chief's retention since the listing: not a problem.
      if (state.status().code() == absl::StatusCode::kNotFound) continue;
      unreadable_steps_.insert(step);
      if (metrics_ != nullptr) metrics_->skipped.Increment();
      if (step >= final_step_) {
        return absl::DataLossError(absl::StrCat(
            "the final checkpoint (step ", step, ") is unreadable: ", state.status().message(),
            "; rerun the job's last step or delete the file and evaluate an earlier one"));
      }
      spdlog::warn("evaluator: skipping unreadable checkpoint {}: {}", path,
                   state.status().message());
      continue;
    }
    if (absl::Status s = LoadVariables(*state, path); !s.ok()) return s;
    const absl::Time t0 = options_.now();
    Evaluation evaluation;
    evaluation.step = step;
    evaluation.result = EvaluateModel(*model_, *eval_data_);
    // This process's first point: a restarted Evaluator re-evaluates the
    // newest checkpoint, and the START makes TensorBoard replace the point
    // its predecessor wrote for it instead of showing both.
    if (last_evaluated_step_ < 0) events_.WriteSessionStart(step);
    last_evaluated_step_ = step;
    if (metrics_ != nullptr) {
      metrics_->eval_loss.Set(evaluation.result.loss);
      metrics_->eval_accuracy.Set(evaluation.result.accuracy);
      metrics_->checkpoint_step.Set(static_cast<double>(step));
      metrics_->evaluations.Increment();
    }
    spdlog::info("evaluator: checkpoint step {}/{} eval_loss {:.4f} eval_accuracy {:.4f} "
                 "({} examples, {:.0f} ms)",
                 step, final_step_, evaluation.result.loss, evaluation.result.accuracy,
                 evaluation.result.examples, absl::ToDoubleMilliseconds(options_.now() - t0));
    events_.WriteScalars(step, {{"loss", evaluation.result.loss},
                                {"accuracy", evaluation.result.accuracy}});
    return evaluation;
  }
  return std::nullopt;
}

EvaluatorOutcome Evaluator::Run(const std::atomic<bool>& stop) {
  EvaluatorOutcome outcome;
  spdlog::info("evaluator: watching {} for checkpoints up to step {} (poll every {}, give up "
               "after {} without a new checkpoint)",
               options_.checkpoint_dir, final_step_, absl::FormatDuration(options_.poll_interval),
               absl::FormatDuration(options_.timeout));
  absl::Time last_progress = options_.now();
  while (true) {
    const bool stopping = stop.load();
    const int64_t seen_before = newest_seen_step_;
    auto polled = Poll();
    if (!polled.ok()) {
      outcome.exit_code = kExitCheckpoint;
      outcome.status = polled.status();
      return outcome;
    }
    if (polled->has_value()) {
      ++outcome.evaluations;
      outcome.last = **polled;
    }
    if (final_evaluated()) {
      spdlog::info("evaluator: evaluated the final checkpoint (step {}); done",
                   last_evaluated_step_);
      outcome.exit_code = kExitOk;
      return outcome;
    }
    if (stopping) {
      outcome.exit_code = kExitTerminated;
      outcome.status = absl::CancelledError(absl::StrCat(
          "evaluator stopped by signal before the final checkpoint (last evaluated step ",
          last_evaluated_step_, " of ", final_step_, ")"));
      return outcome;
    }
    const absl::Time now = options_.now();
    if (newest_seen_step_ > seen_before) last_progress = now;
    if (now - last_progress >= options_.timeout) {
      outcome.exit_code = kExitUnreachable;
      outcome.status = absl::DeadlineExceededError(absl::StrCat(
          "evaluator: no new checkpoint in ", options_.checkpoint_dir, " for ",
          absl::FormatDuration(options_.timeout), " (newest step seen ", newest_seen_step_,
          ", job ends at step ", final_step_,
          "); training looks stopped. Is the chief running, and is the checkpoint directory "
          "shared with the evaluator? Raise DISTRAIN_EVAL_TIMEOUT_SECONDS if checkpoints are "
          "further apart"));
      return outcome;
    }
    // A fresh evaluation may have taken a while; look again at once if so.
    if (!polled->has_value()) options_.sleep(options_.poll_interval);
  }
}

}  // namespace distrain

#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/evaluator.h"
#include "worker/model/event_file_writer.h"
#include "worker/model/keras_format.h"
#include "worker/strategy/param_checksum.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TrainOutcome Fail(int exit_code, absl::Status status) {
  TrainOutcome outcome;
  outcome.exit_code = exit_code;
  outcome.status = std::move(status);
  return outcome;
}

// Peers that vanish or time out are retryable; everything else the strategy
// reports is a permanent problem with the job.
int ExitCodeForStrategyError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return kExitPeerLost;
    case absl::StatusCode::kUnimplemented:
      return kExitUnsupported;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return kExitInvalidConfig;
    default:
      return kExitInternal;
  }
}

// Copies rows [begin, end) of a batch into a replica's slice.
void SliceBatch(const Batch& batch, int64_t begin, int64_t end, Tensor* features,
                std::vector<int32_t>* labels) {
  const int64_t f = batch.features.dim(1);
  features->Resize({end - begin, f});
  std::memcpy(features->data(), batch.features.data() + begin * f, (end - begin) * f * sizeof(float));
  labels->assign(batch.labels.begin() + begin, batch.labels.begin() + end);
}

// The DISTRAIN_PARAM_CHECKSUM_FILE test/debug hook (strategy.h).
class ParamChecksumHook {
 public:
  absl::Status Open(const TaskId& task) {
    const char* path = std::getenv("DISTRAIN_PARAM_CHECKSUM_FILE");
    if (path == nullptr || *path == '\0') return absl::OkStatus();
    path_ = absl::StrReplaceAll(path, {{"{task}", absl::StrCat(task.type, "-", task.index)}});
    out_.open(path_, std::ios::app);
    if (!out_) {
      return absl::InternalError(absl::StrCat("DISTRAIN_PARAM_CHECKSUM_FILE: cannot open ", path_,
                                              ": ", std::strerror(errno)));
    }
    enabled_ = true;
    return absl::OkStatus();
  }
  absl::Status Record(int64_t step, const std::vector<Model*>& models) {
    if (!enabled_) return absl::OkStatus();
    auto checksum = ReplicaChecksum(models);
    if (!checksum.ok()) {
      return absl::InternalError(absl::StrCat("after step ", step, ": ", checksum.status().message()));
    }
    out_ << step << " " << ChecksumHex(*checksum) << "\n" << std::flush;
    if (!out_) return absl::InternalError(absl::StrCat("cannot append to ", path_));
    return absl::OkStatus();
  }

 private:
  bool enabled_ = false;
  std::string path_;
  std::ofstream out_;
};

// The chief's TensorBoard runs (docs/tensorboard.md): <checkpoint dir>/train
// and <checkpoint dir>/validation, the layout of Keras' TensorBoard callback.
// A run may be disabled (no checkpoint directory; no eval data; validation
// written by the job's Evaluator instead).
struct TensorBoardRuns {
  SummaryRun train;
  SummaryRun validation;
};

// `first_step`: the first step this process runs. Each run starts with a
// SessionLog START there, so TensorBoard drops what a previous chief wrote
// after the checkpoint this one resumed from.
TensorBoardRuns OpenTensorBoardRuns(const JobConfig& config, const std::string& checkpoint_dir,
                                    bool has_eval_data, int64_t first_step) {
  TensorBoardRuns runs;
  if (checkpoint_dir.empty()) {
    spdlog::info("no checkpoint directory: no TensorBoard event files are written (they go "
                 "next to the checkpoints; set spec.training.checkpoint.dir or --checkpoint-dir)");
    return runs;
  }
  runs.train = SummaryRun(checkpoint_dir + "/train");
  // One writer per run: TensorBoard follows only the newest event file of a
  // run directory, so the chief and an Evaluator writing validation/ side by
  // side would lose points. The Evaluator, when the job has one, owns it.
  const bool evaluator = config.replicas_of(ReplicaType::kEvaluator) > 0;
  if (has_eval_data && !evaluator) runs.validation = SummaryRun(checkpoint_dir + "/validation");
  runs.train.WriteSessionStart(first_step);
  runs.validation.WriteSessionStart(first_step);
  spdlog::info("TensorBoard event files: {}{} (tensorboard --logdir {})", runs.train.dir(),
               runs.validation.enabled() ? absl::StrCat(" and ", runs.validation.dir())
               : evaluator              ? " (validation/: the Evaluator's)"
                                        : "",
               checkpoint_dir);
  return runs;
}

}  // namespace

Trainer::Trainer(JobConfig config, ClusterSpec cluster, TrainerEnv env,
                 std::unique_ptr<Strategy> strategy)
    : config_(std::move(config)),
      cluster_(std::move(cluster)),
      env_(std::move(env)),
      strategy_(std::move(strategy)) {}

void Trainer::WriteStatus(const std::string& state, int64_t step, double loss,
                          double examples_per_second, const TrainOutcome* final_outcome,
                          const std::string& message) {
  if (env_.status_file.empty()) return;
  nlohmann::json j = {{"state", state},
                      {"step", step},
                      {"totalSteps", config_.training.steps},
                      {"loss", loss},
                      // Job-wide: synchronous strategies split every step evenly over
                      // the input shards, so this process's rate times the shard count.
                      {"examplesPerSecond", examples_per_second * strategy_->num_input_shards()},
                      {"wallSeconds", NowSeconds() - start_seconds_},
                      {"message", message}};
  if (final_outcome != nullptr) {
    if (final_outcome->eval_accuracy) j["evalAccuracy"] = *final_outcome->eval_accuracy;
    if (final_outcome->eval_loss) j["evalLoss"] = *final_outcome->eval_loss;
  }
  // Readers must never see a half-written file: write aside, then rename.
  const std::string tmp = env_.status_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    if (!out) {
      spdlog::warn("cannot write status file {}: {}", tmp, std::strerror(errno));
      return;
    }
  }
  std::rename(tmp.c_str(), env_.status_file.c_str());
}

void Trainer::WriteTerminationMessage(int64_t step, bool ran_steps, double loss,
                                      double examples_per_second, const TrainOutcome& outcome) {
  if (env_.termination_message_file.empty() || !strategy_->is_chief()) return;
  nlohmann::json j = {{"step", step}, {"totalSteps", config_.training.steps}};
  if (ran_steps) {
    j["loss"] = loss;
    // Job-wide, as in the status file.
    j["examplesPerSecond"] = examples_per_second * strategy_->num_input_shards();
  }
  if (outcome.eval_accuracy) j["accuracy"] = *outcome.eval_accuracy;
  // The kubelet reads at most 4096 bytes; this is about 100.
  std::ofstream out(env_.termination_message_file, std::ios::trunc);
  out << j.dump();
  out.close();
  if (!out) {
    // Only the job's status loses its final figures; training did succeed.
    spdlog::warn("cannot write the termination message {}: {}", env_.termination_message_file,
                 std::strerror(errno));
  }
}

TrainOutcome Trainer::Run(const std::atomic<bool>& stop) {
  start_seconds_ = NowSeconds();
  const TrainingConfig& tc = config_.training;
  // Whatever ends the run, the process is about to exit with a code that
  // says how it went: /healthz must not call it stalled meanwhile.
  absl::Cleanup done = [this] {
    if (env_.watchdog != nullptr) env_.watchdog->Done();
  };
  // Brackets a checkpoint write or an evaluation (ProgressWatchdog rule step 3).
  auto long_phase = [this](const std::string& what) {
    if (env_.watchdog != nullptr) env_.watchdog->BeginLongPhase(what);
    return absl::Cleanup([this] {
      if (env_.watchdog != nullptr) env_.watchdog->EndLongPhase();
    });
  };
  auto fail = [&](int code, absl::Status s) {
    WriteStatus("Failed", 0, 0, 0, nullptr, std::string(s.message()));
    return Fail(code, std::move(s));
  };

  if (env_.metrics != nullptr) strategy_->AttachMetrics(env_.metrics->registry);
  if (absl::Status s = strategy_->Init(cluster_, config_); !s.ok()) {
    // Peers that never showed up (or whose names never resolved) before the
    // rendezvous deadline: retryable, distinct from losing a peer mid-job.
    const bool unreachable = s.code() == absl::StatusCode::kDeadlineExceeded ||
                             s.code() == absl::StatusCode::kUnavailable;
    return fail(unreachable ? kExitUnreachable : ExitCodeForStrategyError(s), s);
  }
  const bool chief = strategy_->is_chief();

  // 1. This process's data shard and the held-out set.
  auto input = OpenTrainingInput(tc.dataset, tc.seed, strategy_->input_shard_index(),
                                 strategy_->num_input_shards());
  if (!input.ok()) return fail(kExitInvalidData, input.status());
  std::shared_ptr<const Dataset> train_data = std::move(input->dataset);
  std::unique_ptr<Dataset> eval_data;
  if (chief) {
    auto eval = OpenEvalDataset(tc.dataset, tc.seed);
    if (!eval.ok()) return fail(kExitInvalidData, eval.status());
    eval_data = std::move(*eval);
  }
  for (const Dataset* data : {train_data.get(), static_cast<const Dataset*>(eval_data.get())}) {
    if (data == nullptr) continue;
    if (absl::Status ids = CheckTokenIds(*data, tc.model); !ids.ok()) {
      return fail(kExitInvalidData, ids);
    }
  }
  int num_classes = train_data->num_classes();
  if (eval_data != nullptr) num_classes = std::max(num_classes, eval_data->num_classes());
  if (eval_data != nullptr && eval_data->example_shape() != train_data->example_shape()) {
    return fail(kExitInvalidData,
                absl::InvalidArgumentError(absl::StrCat(
                    "spec.training.dataset.evalFiles: eval examples have shape [",
                    absl::StrJoin(eval_data->example_shape(), ", "),
                    "] but training examples have [",
                    absl::StrJoin(train_data->example_shape(), ", "), "]")));
  }

  // 2. Variables, identical on every replica.
  const std::vector<int64_t> example_shape = train_data->example_shape();
  ModelFactory factory = [&]() {
    return Model::Create(tc.model, example_shape, num_classes, tc.seed);
  };
  if (absl::Status s = strategy_->CreateVariables(factory, tc.optimizer); !s.ok()) {
    return fail(ExitCodeForStrategyError(s), s);
  }
  spdlog::info("strategy {} | {} | replicas in sync {} | this process: shard {}/{}, {} local replica(s)",
               strategy_->name(), strategy_->primary_model()->Summary(),
               strategy_->num_replicas_in_sync(), strategy_->input_shard_index(),
               strategy_->num_input_shards(), strategy_->num_local_replicas());
  if (const Model* model = strategy_->primary_model();
      model != nullptr && model->device().kind == Device::kCpu) {
    spdlog::info("CPU matrix products: {}", ops::CpuMatrixProductLibrary());
  }
  if (const Model* model = strategy_->primary_model();
      model != nullptr && tc.model.precision != Precision::kFloat32) {
    const char* where = "; on this CPU the products run on float32 kernels: the numerics of "
                        "mixed precision without its speed";
    if (model->device().kind != Device::kCpu) {
      where = "; products on tensor cores";
    } else if (model->compute_type() == ComputeType::kBfloat16 &&
               ops::CpuHasBfloat16Convolutions()) {
      where = "; on this CPU the convolutions and large matrix products run on oneDNN's "
              "bfloat16 kernels";
    }
    spdlog::info("precision {}: float32 variables and optimizer, {} activations and gradients{}{}",
                 PrecisionName(tc.model.precision), ComputeTypeName(model->compute_type()),
                 tc.model.precision == Precision::kMixedFloat16 ? ", dynamic loss scaling" : "",
                 where);
  }

  // 3. Resume from the newest valid checkpoint.
  std::unique_ptr<CheckpointManager> checkpoints;
  int64_t start_step = 0;
  if (!env_.checkpoint_dir.empty()) {
    checkpoints = std::make_unique<CheckpointManager>(env_.checkpoint_dir, tc.checkpoint.keep);
    auto restored = checkpoints->RestoreLatest();
    if (!restored.ok()) return fail(kExitCheckpoint, restored.status());
    if (restored->has_value()) {
      if (absl::Status s = strategy_->RestoreState(**restored); !s.ok()) {
        return fail(kExitCheckpoint, s);
      }
      start_step = (*restored)->step;
      spdlog::info("resumed from checkpoint step {} in {}", start_step, env_.checkpoint_dir);
    }
  }
  // Every process starts from the same variables and step (for several
  // processes: the chief's, whether or not this process could read a checkpoint).
  if (auto synced = strategy_->SynchronizeInitialState(start_step); !synced.ok()) {
    return fail(ExitCodeForStrategyError(synced.status()), synced.status());
  } else {
    start_step = *synced;
  }
  if (env_.metrics) env_.metrics->step.Set(static_cast<double>(start_step));
  TensorBoardRuns tensorboard;
  if (chief) {
    tensorboard = OpenTensorBoardRuns(config_, env_.checkpoint_dir, eval_data != nullptr,
                                      start_step + 1);
  }
  auto write_eval_events = [&](int64_t at_step, const EvalSummary& ev) {
    tensorboard.validation.WriteScalars(at_step, {{"loss", ev.loss}, {"accuracy", ev.accuracy}});
  };
  // A strategy that cannot assemble its state because a peer is gone (a lost
  // ps) is a retryable peer failure, not an unusable checkpoint directory.
  bool strategy_save_failed = false;
  auto save_exit_code = [&](const absl::Status& s) {
    return strategy_save_failed ? ExitCodeForStrategyError(s) : kExitCheckpoint;
  };
  // The state as a checkpoint holds it: variables, slots and what `distrain
  // export` and an Evaluator need to rebuild the model without the data.
  auto capture = [&](int64_t step) -> absl::StatusOr<CheckpointState> {
    auto state = strategy_->SaveState(step);
    if (!state.ok()) {
      strategy_save_failed = true;
      return state.status();
    }
    const Model& model = *strategy_->primary_model();
    state->metadata["strategy"] = strategy_->name();
    state->metadata[kCheckpointNumClassesKey] = absl::StrCat(model.num_classes());
    state->metadata[kCheckpointExampleShapeKey] = absl::StrJoin(model.example_shape(), ",");
    state->metadata[kCheckpointJobConfigKey] = JobConfigToJson(config_);
    return state;
  };
  // The final save keeps its state in *kept (when not null) for the export.
  auto save = [&](int64_t step, std::optional<CheckpointState>* kept = nullptr) -> absl::Status {
    if (!chief || checkpoints == nullptr) return absl::OkStatus();
    auto phase = long_phase("writing a checkpoint");
    const double t0 = NowSeconds();
    auto state = capture(step);
    if (!state.ok()) return state.status();
    if (absl::Status s = checkpoints->Save(*state); !s.ok()) return s;
    if (kept != nullptr) *kept = *state;
    if (env_.metrics) env_.metrics->checkpoint_duration.Observe(NowSeconds() - t0);
    // state->step: an asynchronous strategy stopping early may have completed
    // fewer steps than it scheduled (ParameterServerStrategy::RequestStop).
    spdlog::info("checkpoint step {} written to {} ({:.0f} ms)", state->step,
                 checkpoints->PathForStep(state->step), (NowSeconds() - t0) * 1000);
    return absl::OkStatus();
  };

  // 4. The loop.
  int64_t per_process_batch = strategy_->per_process_batch_size(tc.global_batch_size);
  int input_shard = strategy_->input_shard_index();
  int input_shards = strategy_->num_input_shards();
  // A process without local replicas (ParameterServer's coordinator) feeds
  // no data: its workers read their own shards.
  std::unique_ptr<BatchSource> source;
  if (strategy_->num_local_replicas() > 0) {
    source = std::make_unique<ShardedBatcher>(
        train_data, input->effective_policy, strategy_->input_shard_index(),
        strategy_->num_input_shards(), per_process_batch, tc.seed, tc.dataset.shuffle, start_step);
    if (tc.dataset.prefetch_batches > 0) {
      source =
          std::make_unique<PrefetchingBatchSource>(std::move(source), tc.dataset.prefetch_batches);
    }
  }
  if (env_.metrics) env_.metrics->total_steps.Set(static_cast<double>(tc.steps));

  ParamChecksumHook checksums;
  if (absl::Status s = checksums.Open(cluster_.task()); !s.ok()) return fail(kExitInternal, s);

  const int local_replicas = strategy_->num_local_replicas();
  std::vector<Tensor> slice_features(local_replicas);
  std::vector<std::vector<int32_t>> slice_labels(local_replicas);
  TrainOutcome outcome;
  int64_t step = start_step;
  double last_loss = 0;
  double window_start = NowSeconds();
  int64_t window_examples = 0;
  int64_t window_steps = 0;
  double examples_per_second = 0;
  WriteStatus("Running", step, 0, 0, nullptr, "");

  bool stop_voted = false;   // this process asked its peers to stop with it
  bool stop_agreed = false;  // stop before the next step
  while (step < tc.steps) {
    if (stop.load() && !stop_voted && !stop_agreed) {
      if (strategy_->RequestStop()) {
        stop_voted = true;
        spdlog::warn("stop requested at step {}; stopping together with the other processes", step);
      } else {
        stop_agreed = true;
      }
    }
    if (stop_agreed) {
      spdlog::warn("stop requested at step {}; saving a checkpoint before exiting", step);
      if (absl::Status s = save(step); !s.ok()) spdlog::error("final checkpoint failed: {}", s.ToString());
      strategy_->Shutdown();
      WriteStatus("Terminated", step, last_loss, examples_per_second, nullptr, "stopped by signal");
      outcome.exit_code = kExitTerminated;
      outcome.status = absl::CancelledError(absl::StrCat("stopped by signal at step ", step));
      outcome.steps_done = step;
      outcome.final_loss = last_loss;
      return outcome;
    }
    const double t0 = NowSeconds();
    Batch batch;
    if (source != nullptr) batch = source->Next();
    const int64_t b = static_cast<int64_t>(batch.labels.size());
    StepFn step_fn = [&](ReplicaContext& ctx) {
      const StepContext step_context{step, ctx.replica_id_in_sync};
      if (local_replicas == 1) {
        return ctx.model->TrainStep(batch.features, batch.labels, ctx.on_layer_grads_ready, {},
                                    step_context);
      }
      const int64_t per_replica = b / local_replicas;
      const int r = ctx.local_replica;
      SliceBatch(batch, r * per_replica, (r + 1) * per_replica, &slice_features[r], &slice_labels[r]);
      return ctx.model->TrainStep(slice_features[r], slice_labels[r], ctx.on_layer_grads_ready, {},
                                  step_context);
    };
    auto out = strategy_->Run(step_fn, b);
    if (!out.ok()) {
      // In-place recovery (strategy.h): the group re-forms around a
      // replacement and every process goes on from the step they agree on.
      absl::StatusOr<int64_t> resumed = [&] {
        auto phase = long_phase("recovering from a lost peer");
        return strategy_->Recover(out.status(), step, [&stop] { return stop.load(); });
      }();
      if (!resumed.ok()) {
        if (stop.load() && resumed.status().code() == absl::StatusCode::kCancelled) {
          // Stopped while waiting for a replacement: the state is still that
          // of a completed step, so the chief checkpoints it as on any stop.
          // The strategy hears of the stop too (an elastic worker departs).
          if (!stop_voted) strategy_->RequestStop();
          stop_agreed = true;
          continue;
        }
        return fail(ExitCodeForStrategyError(resumed.status()), resumed.status());
      }
      step = *resumed;
      if (env_.metrics) env_.metrics->step.Set(static_cast<double>(step));
      if (strategy_->input_shard_index() != input_shard ||
          strategy_->num_input_shards() != input_shards) {
        // An elastic resize (multi_worker_mirrored.h, E3): the same global
        // batches, re-split among the new group from the agreed step on.
        input_shard = strategy_->input_shard_index();
        input_shards = strategy_->num_input_shards();
        per_process_batch = strategy_->per_process_batch_size(tc.global_batch_size);
        if (input->effective_policy == AutoShardPolicy::kFile) {
          // Files are dealt to shards: the new shard owns other files.
          source.reset();
          auto reopened = OpenTrainingInput(tc.dataset, tc.seed, input_shard, input_shards);
          if (!reopened.ok()) return fail(kExitInvalidData, reopened.status());
          input = std::move(reopened);
          train_data = std::move(input->dataset);
        }
        spdlog::info("input re-split at step {}: shard {}/{}, {} examples a step", step,
                     input_shard, input_shards, per_process_batch);
      }
      if (source != nullptr) {
        // Re-positioned at the agreed step (R5).
        source.reset();  // a prefetcher's thread stops before the new one reads
        source = std::make_unique<ShardedBatcher>(train_data, input->effective_policy, input_shard,
                                                  input_shards, per_process_batch, tc.seed,
                                                  tc.dataset.shuffle, step);
        if (tc.dataset.prefetch_batches > 0) {
          source = std::make_unique<PrefetchingBatchSource>(std::move(source),
                                                            tc.dataset.prefetch_batches);
        }
      }
      continue;
    }
    ++step;
    last_loss = out->loss;
    if (out->stop_requested) stop_agreed = true;
    if (absl::Status s = checksums.Record(step, strategy_->local_models()); !s.ok()) {
      return fail(kExitInternal, s);
    }
    const double dt = NowSeconds() - t0;
    window_examples += out->examples;
    ++window_steps;
    if (env_.metrics) {
      env_.metrics->steps.Increment();
      env_.metrics->step.Set(static_cast<double>(step));
      env_.metrics->examples.Increment(static_cast<double>(out->examples));
      env_.metrics->step_duration.Observe(dt);
      env_.metrics->loss.Set(out->loss);
    }
    if (env_.watchdog != nullptr) env_.watchdog->StepCompleted(step, dt);
    const bool log_now = tc.log_every_steps > 0 && (step % tc.log_every_steps == 0 || step == tc.steps);
    if (log_now) {
      const double now = NowSeconds();
      examples_per_second = window_examples / std::max(now - window_start, 1e-9);
      const double step_seconds = (now - window_start) / std::max<int64_t>(window_steps, 1);
      window_start = now;
      window_examples = 0;
      window_steps = 0;
      if (env_.metrics) {
        if (const Model* m = strategy_->primary_model(); m != nullptr) {
          env_.metrics->loss_scale.Set(m->loss_scale());
        }
        env_.metrics->examples_per_second.Set(examples_per_second);
        env_.metrics->job_examples_per_second.Set(examples_per_second *
                                                  strategy_->num_input_shards());
      }
      const double accuracy = out->job_accuracy.value_or(
          out->examples > 0 ? static_cast<double>(out->correct) / out->examples : 0.0);
      const Model* primary = strategy_->primary_model();
      if (tc.model.precision == Precision::kMixedFloat16 && primary != nullptr) {
        spdlog::info("step {}/{} loss {:.4f} accuracy {:.4f} examples/s {:.0f} loss scale {:g}",
                     step, tc.steps, out->loss, accuracy, examples_per_second,
                     primary->loss_scale());
      } else {
        spdlog::info("step {}/{} loss {:.4f} accuracy {:.4f} examples/s {:.0f}", step, tc.steps,
                     out->loss, accuracy, examples_per_second);
      }
      WriteStatus("Running", step, last_loss, examples_per_second, nullptr, "");
      std::vector<Scalar> scalars;
      // A ParameterServer coordinator step in which no closure finished has
      // no loss of its own: its curve gets no point rather than a stale one.
      if (out->examples > 0) scalars = {{"loss", out->loss}, {"accuracy", accuracy}};
      // Job-wide, like the status file's (WriteStatus).
      scalars.push_back(
          {"examples_per_second", examples_per_second * strategy_->num_input_shards()});
      scalars.push_back({"step_time_seconds", step_seconds});
      // The rate this step's update used (the schedule's, at step - 1).
      scalars.push_back({"learning_rate", tc.optimizer.LearningRate(step > 0 ? step - 1 : 0)});
      tensorboard.train.WriteScalars(step, scalars);
    }
    if (chief && eval_data != nullptr && tc.eval_every_steps > 0 && step % tc.eval_every_steps == 0 &&
        step < tc.steps) {
      auto phase = long_phase("evaluating");
      EvalSummary ev = EvaluateModel(*strategy_->primary_model(), *eval_data);
      if (env_.metrics) {
        env_.metrics->eval_accuracy.Set(ev.accuracy);
        env_.metrics->eval_loss.Set(ev.loss);
      }
      spdlog::info("eval at step {}: loss {:.4f} accuracy {:.4f}", step, ev.loss, ev.accuracy);
      write_eval_events(step, ev);
    }
    const bool checkpoint_now =
        tc.checkpoint.every_steps > 0 && step % tc.checkpoint.every_steps == 0 && step < tc.steps;
    if (checkpoint_now) {
      if (absl::Status s = save(step); !s.ok()) return fail(save_exit_code(s), s);
    }
    // The other processes of a synchronous job wait for the chief's
    // checkpoint or evaluation inside their next step (rule step 3).
    const bool chief_may_evaluate =
        tc.eval_every_steps > 0 && step % tc.eval_every_steps == 0 && step < tc.steps;
    if (!chief && env_.watchdog != nullptr && (checkpoint_now || chief_may_evaluate)) {
      env_.watchdog->ExpectLongStep(checkpoint_now ? "the chief writes a checkpoint"
                                                   : "the chief evaluates");
    }
  }

  // 5. Final evaluation and checkpoint. The other processes of a synchronous
  //    job wait for the chief's in Shutdown, so all of them get the long
  //    allowance until the run ends (ProgressWatchdog rule step 3).
  if (env_.watchdog != nullptr) env_.watchdog->BeginLongPhase("the final evaluation and checkpoint");
  outcome.steps_done = step;
  outcome.final_loss = last_loss;
  if (chief && eval_data != nullptr) {
    auto phase = long_phase("the final evaluation");
    EvalSummary ev = EvaluateModel(*strategy_->primary_model(), *eval_data);
    outcome.eval_accuracy = ev.accuracy;
    outcome.eval_loss = ev.loss;
    write_eval_events(step, ev);
    if (env_.metrics) {
      env_.metrics->eval_accuracy.Set(ev.accuracy);
      env_.metrics->eval_loss.Set(ev.loss);
    }
  }
  std::optional<CheckpointState> final_state;
  if (absl::Status s = save(step, &final_state); !s.ok()) return fail(save_exit_code(s), s);
  // 6. The trained model for Keras (spec.training.export), from the same
  //    state as the final checkpoint.
  if (chief && !tc.export_model.path.empty()) {
    if (!final_state) {
      auto state = capture(step);
      if (!state.ok()) return fail(save_exit_code(state.status()), state.status());
      final_state = *std::move(state);
    }
    KerasModelSpec spec{tc.model, tc.optimizer, strategy_->primary_model()->example_shape(),
                        strategy_->primary_model()->num_classes()};
    if (absl::Status s = ExportKerasModel(spec, *final_state, tc.export_model.path); !s.ok()) {
      return fail(kExitCheckpoint,
                  absl::Status(s.code(), absl::StrCat("spec.training.export.path: ", s.message())));
    }
    spdlog::info("exported the model at step {} to {} (Keras: keras.saving.load_model)",
                 final_state->step, tc.export_model.path);
  }
  strategy_->Shutdown();
  outcome.wall_seconds = NowSeconds() - start_seconds_;
  if (outcome.eval_accuracy) {
    spdlog::info("training complete: steps {} loss {:.4f} eval_loss {:.4f} eval_accuracy {:.4f} wall {:.1f}s",
                 step, last_loss, *outcome.eval_loss, *outcome.eval_accuracy, outcome.wall_seconds);
  } else {
    spdlog::info("training complete: steps {} loss {:.4f} wall {:.1f}s", step, last_loss,
                 outcome.wall_seconds);
  }
  WriteStatus("Succeeded", step, last_loss, examples_per_second, &outcome, "");
  WriteTerminationMessage(step, step > start_step, last_loss, examples_per_second, outcome);
  return outcome;
}

}  // namespace distrain

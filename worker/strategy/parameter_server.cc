#include "worker/strategy/parameter_server.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"
#include "worker/coordination/coordination_service.h"
#include "worker/ps/ps_service.h"
#include "worker/strategy/ps_worker.h"
#include "worker/strategy/variable_state.h"

namespace distrain {
namespace {

constexpr char kVariablePrefix[] = "variables/";

}  // namespace

absl::StatusOr<ShardingPlan> PsShardingPlan(Model& model, int num_ps) {
  std::vector<VariableSpec> specs;
  for (Parameter* p : model.parameters()) specs.push_back(VariableSpec{p->name, p->value.shape()});
  // After the trainable ones, so that they keep their placement: the state
  // the model moves itself, which the ps updates by deltas (PsService).
  for (Parameter* p : model.state_variables()) {
    specs.push_back(VariableSpec{p->name, p->value.shape(), /*trainable=*/false});
  }
  // TF's usual ParameterServerStrategy setup: shards of at least 256 KiB, at
  // most one per ps, so a large kernel spreads its load over every ps.
  auto partitioner = Partitioner::MinSize(256 << 10, std::max(1, num_ps));
  if (!partitioner.ok()) return partitioner.status();
  return ShardingPlan::Create(specs, *partitioner, num_ps);
}

absl::StatusOr<ModelDims> ModelDimsOf(Model& model) {
  ModelDims dims;
  dims.example_shape = model.example_shape();
  dims.num_features = static_cast<int>(Tensor::NumElements(dims.example_shape));
  dims.num_classes = model.num_classes();
  if (dims.example_shape.empty() || dims.num_features < 1 || dims.num_classes < 2) {
    return absl::InternalError(absl::StrCat("ParameterServer: cannot read the input shape and ",
                                            "class count of model ", model.Summary()));
  }
  return dims;
}

std::string PsCheckpointRoot(const std::string& checkpoint_dir) {
  return checkpoint_dir.empty() ? "" : absl::StrCat(checkpoint_dir, "/ps");
}

ParameterServerStrategy::ParameterServerStrategy() = default;

ParameterServerStrategy::~ParameterServerStrategy() {
  // Error paths end here without Shutdown: stop scheduling, leave the workers
  // running (a restarted chief re-admits them).
  if (membership_) membership_->Shutdown();
  if (coordinator_) coordinator_->Stop();
}

absl::Status ParameterServerStrategy::Init(const ClusterSpec& cluster, const JobConfig& config) {
  config_ = config;
  cluster_ = cluster;
  if (cluster.task().type != "chief") {
    return absl::FailedPreconditionError(absl::StrCat(
        "ParameterServer: the Trainer runs on the chief (the coordinator); task ",
        cluster.task().ToString(), " must run its own role (distrain-worker does this for "
        "worker and ps tasks)"));
  }
  num_workers_ = cluster.num_tasks("worker");
  num_ps_ = cluster.num_tasks("ps");
  if (num_workers_ < 1 || num_ps_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParameterServer needs at least one worker and one ps task in TF_CONFIG; got ",
        num_workers_, " worker(s) and ", num_ps_,
        " ps; set spec.replicaSpecs.Worker.replicas and spec.replicaSpecs.PS.replicas"));
  }
  ps_checkpoint_root_ = PsCheckpointRoot(config.training.checkpoint.dir);
  total_steps_ = config.training.steps;
  spdlog::info("ParameterServer: coordinator for {} worker(s) and {} ps task(s); staleness {}",
               num_workers_, num_ps_,
               config.training.max_staleness
                   ? absl::StrCat("<= ", *config.training.max_staleness,
                                  " (spec.training.maxStaleness)")
                   : std::string("unbounded (asynchronous)"));
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::CreateVariables(const ModelFactory& factory,
                                                      const OptimizerConfig& optimizer) {
  auto model = factory();
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  auto opt = Optimizer::Create(optimizer);
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  auto plan = PsShardingPlan(*model_, num_ps_);
  if (!plan.ok()) return plan.status();
  auto dims = ModelDimsOf(*model_);
  if (!dims.ok()) return dims.status();

  PsClientOptions ps_options;
  ps_options.rpc_timeout = absl::Seconds(config_.training.communication.timeout_seconds);
  ps_options.connect_timeout = absl::Minutes(5);
  ps_options.registry = registry_;
  const std::string fingerprint = plan->Fingerprint();
  auto ps = PsClient::Create(cluster_.addresses("ps"), std::move(*plan), ps_options);
  if (!ps.ok()) return ps.status();
  ps_ = std::move(*ps);
  if (absl::Status s = ps_->WaitForReady(); !s.ok()) return s;
  if (absl::Status s = ps_->CreateVariables(); !s.ok()) return s;
  spdlog::info("ParameterServer: {} variables in {} shard(s) over {} ps task(s) (plan {})",
               ps_->plan().variables().size(), ps_->plan().shards().size(), num_ps_, fingerprint);

  GrpcWorkerTransport::Options transport_options;
  transport_options.dims = *dims;
  transport_options.plan_fingerprint = fingerprint;
  transport_options.step_timeout = absl::Seconds(config_.training.communication.timeout_seconds);
  transport_ = std::make_unique<GrpcWorkerTransport>(cluster_.addresses("worker"),
                                                     transport_options);
  ClusterCoordinatorOptions coordinator_options;
  coordinator_options.registry = registry_;
  coordinator_ = std::make_unique<ClusterCoordinator>(transport_.get(), coordinator_options);
  return ServeWorkerSet();
}

absl::Status ParameterServerStrategy::ServeWorkerSet() {
  const std::optional<std::string> mine = cluster_.my_address();
  if (!mine) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG: no address for this task ", cluster_.task().ToString(),
                     "; set cluster.chief[0] to host:port"));
  }
  absl::StatusOr<std::string> listen = CoordinatorListenAddress(*mine);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TF_CONFIG cluster.chief[0] '", *mine, "': ", listen.status().message()));
  }
  PsMembershipServerOptions options;
  options.on_change = [this](const PsMembershipChange& change) {
    // Under the worker set's lock, in order: the coordinator never calls back.
    if (change.kind == PsMembershipChange::Kind::kJoined) {
      transport_->SetWorkerAddress(change.worker, change.address);
      coordinator_->AddWorker(change.worker);
    } else {
      coordinator_->RemoveWorker(change.worker, change.reason);
    }
  };
  auto server = PsMembershipServer::Start(*listen, std::move(options));
  if (!server.ok()) return server.status();
  membership_ = std::move(*server);
  spdlog::info("ParameterServer: serving the worker set on {}: workers that join it (a scale-up's "
               "too) get closures; workers that leave get none",
               *listen);
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::RestoreState(const CheckpointState& state) {
  // Only the variables matter here (the chief runs no optimizer); the ps
  // restores its own slots in SynchronizeInitialState.
  CheckpointState variables;
  variables.step = state.step;
  for (const auto& [name, tensor] : state.tensors) {
    if (absl::StartsWith(name, kVariablePrefix)) variables.tensors.emplace(name, tensor);
  }
  auto fresh = Optimizer::Create(config_.training.optimizer);
  if (!fresh.ok()) return fresh.status();
  if (absl::Status s = RestoreVariableState(variables, *model_, **fresh); !s.ok()) return s;
  restored_ = true;
  restored_step_ = state.step;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServerStrategy::SynchronizeInitialState(int64_t local_start_step) {
  bool ps_restored = false;
  if (restored_ && !ps_checkpoint_root_.empty()) {
    absl::StatusOr<int64_t> step = ps_->Restore(restored_step_);
    if (step.ok()) {
      ps_restored = true;
      spdlog::info("ParameterServer: every ps restored its shards and optimizer slots of step {}",
                   *step);
    } else if (step.status().code() == absl::StatusCode::kUnavailable ||
               step.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return step.status();
    } else {
      spdlog::warn("ParameterServer: the ps tasks cannot restore step {} ({}); uploading the "
                   "chief's checkpoint values instead; optimizer slots restart from zero",
                   restored_step_, step.status().message());
    }
  }
  if (!ps_restored) {
    std::vector<TensorRef> values;
    for (Parameter* p : AllVariables(*model_)) values.push_back(TensorRef{p->name, &p->value});
    // overwrite: the chief is the authority, even over a ps that kept values
    // from an earlier chief.
    auto init = ps_->Initialize(values, /*overwrite=*/true);
    if (!init.ok()) return init.status();
  }
  start_step_ = local_start_step;
  coordinator_->Start(local_start_step);
  return local_start_step;
}

absl::StatusOr<StepOutput> ParameterServerStrategy::Run(const StepFn&, int64_t) {
  if (absl::Status s = coordinator_->Schedule(); !s.ok()) return s;
  const int64_t step = start_step_ + coordinator_->scheduled();
  const int64_t eval_every = config_.training.eval_every_steps;
  if (step >= total_steps_ || (eval_every > 0 && step % eval_every == 0)) {
    // The Trainer evaluates primary_model() after this step.
    if (absl::Status s = JoinAndPull(); !s.ok()) return s;
  }
  CompletedClosures done = coordinator_->TakeCompleted();
  max_staleness_seen_ = std::max(max_staleness_seen_, done.max_staleness);
  stale_retries_ += done.stale_retries;
  StepOutput out;
  if (done.examples > 0) last_loss_ = done.loss_sum / static_cast<double>(done.examples);
  out.loss = last_loss_;
  out.correct = done.correct;
  out.examples = done.examples;
  return out;
}

absl::Status ParameterServerStrategy::JoinAndPull() {
  if (absl::Status s = coordinator_->Join(); !s.ok()) return s;
  // The moving statistics too: evaluation on the chief normalises with them.
  std::vector<MutableTensorRef> targets;
  for (Parameter* p : AllVariables(*model_)) {
    targets.push_back(MutableTensorRef{p->name, &p->value});
  }
  return ps_->PullInto(targets, nullptr);
}

absl::StatusOr<CheckpointState> ParameterServerStrategy::SaveState(int64_t step) {
  // 6. Nothing in flight: every ps holds exactly `step` closures' updates.
  if (stop_requested_) {
    absl::StatusOr<int64_t> dropped = coordinator_->Drain();
    if (!dropped.ok()) return dropped.status();
    step = start_step_ + coordinator_->completed();
    spdlog::info("ParameterServer: stopping; {} queued closure(s) not started are left for the "
                 "rerun, which resumes at step {}",
                 *dropped, step);
    std::vector<MutableTensorRef> targets;
    for (Parameter* p : AllVariables(*model_)) {
      targets.push_back(MutableTensorRef{p->name, &p->value});
    }
    if (absl::Status s = ps_->PullInto(targets, nullptr); !s.ok()) return s;
  } else if (absl::Status s = JoinAndPull(); !s.ok()) {
    return s;
  }
  // 7. Values and slots as the ps tasks hold them.
  if (!ps_checkpoint_root_.empty()) {
    absl::Status saved = ps_->Save(step);
    if (saved.code() == absl::StatusCode::kUnavailable ||
        saved.code() == absl::StatusCode::kDeadlineExceeded) {
      return saved;
    }
    if (saved.ok()) {
      absl::StatusOr<PsCheckpoint> files = LoadPsCheckpoint(ps_checkpoint_root_, step);
      if (files.ok()) {
        CheckpointState state = files->ToCheckpointState();
        state.step = step;
        state.metadata["model"] = model_->Summary();
        state.metadata["ps_tasks"] = absl::StrCat(num_ps_);
        return state;
      }
      saved = files.status();
    }
    if (!warned_no_ps_checkpoint_) {
      warned_no_ps_checkpoint_ = true;
      spdlog::warn("ParameterServer: the chief cannot read the ps tasks' checkpoint files under "
                   "{} ({}); checkpoints hold the variables only and a resumed job restarts the "
                   "optimizer slots from zero. Give the ps pods and the chief one shared volume "
                   "for the checkpoint directory to keep them.",
                   ps_checkpoint_root_, saved.message());
    }
  }
  return CaptureVariableState(*model_, *optimizer_, step);
}

void ParameterServerStrategy::Shutdown() {
  if (!coordinator_) return;
  if (coordinator_->Join().ok()) {
    spdlog::info("ParameterServer: {} closure(s) completed, {} retried after a lost worker, "
                 "{} worker admission(s); staleness at most {}, {} push(es) redone for staleness",
                 coordinator_->completed(), coordinator_->retried(), coordinator_->admissions(),
                 max_staleness_seen_, stale_retries_);
    // Only a finished job releases the workers: after a stop (SIGTERM) the
    // restarted chief needs them again.
    if (start_step_ + coordinator_->completed() >= total_steps_) coordinator_->FinishWorkers();
    const std::vector<int64_t> by_worker = coordinator_->completed_by_worker();
    std::string per_worker;
    for (size_t w = 0; w < by_worker.size(); ++w) {
      absl::StrAppend(&per_worker, w ? ", " : "", "worker:", w, " ", by_worker[w]);
    }
    spdlog::info("ParameterServer: closures per worker: {}", per_worker);
  }
  coordinator_->Stop();
  if (membership_) membership_->Shutdown();
}

}  // namespace distrain

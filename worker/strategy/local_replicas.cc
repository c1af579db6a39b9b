#include "worker/strategy/local_replicas.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/variable_state.h"
#include "worker/tensor/cpu_math.h"

namespace distrain {

namespace {
// The layout of each replica's extras_: then the packed state variables.
constexpr size_t kExtraStopVote = 0;
constexpr size_t kExtraLoss = 1;
constexpr size_t kExtraCorrect = 2;
constexpr size_t kExtraHeader = 3;

// Header floats in and out of a replica's extras_, which may be GPU memory.
void WriteExtras(Tensor& extras, size_t offset, std::initializer_list<float> values) {
  CopyFloats(DeviceId::Cpu(), values.begin(), extras.device_id(), extras.data() + offset,
             static_cast<int64_t>(values.size()));
}
std::array<float, kExtraHeader> ReadHeader(const Tensor& extras) {
  std::array<float, kExtraHeader> header{};
  CopyFloats(extras.device_id(), extras.data(), DeviceId::Cpu(), header.data(), kExtraHeader);
  return header;
}
}  // namespace

DeviceId LocalReplicaDevice(int replica, int visible_gpus) {
  return visible_gpus > 0 ? DeviceId::Cuda(replica) : DeviceId::Cpu();
}

absl::StatusOr<std::unique_ptr<LocalReplicas>> LocalReplicas::Create(
    const ModelFactory& factory, const OptimizerConfig& optimizer,
    std::vector<Collective*> collectives, Options options) {
  DISTRAIN_CHECK(!collectives.empty());
  std::unique_ptr<LocalReplicas> set(new LocalReplicas());
  set->collectives_ = std::move(collectives);
  set->options_ = options;
  const int n = static_cast<int>(set->collectives_.size());
  DISTRAIN_CHECK(options.devices.empty() || static_cast<int>(options.devices.size()) == n);
  auto device = [&options](int r) {
    return options.devices.empty() ? DeviceId::Cpu() : options.devices[r];
  };
  for (int r = 0; r < n; ++r) {
    auto model = factory();
    if (!model.ok()) return model.status();
    (*model)->MoveTo(device(r));  // the optimizer's slots follow on first use
    auto opt = Optimizer::Create(optimizer, (*model)->precision());
    if (!opt.ok()) return opt.status();
    set->models_.push_back(std::move(*model));
    set->optimizers_.push_back(std::move(*opt));
  }
  const int64_t state_size = StateVariableSize(*set->models_[0]);
  for (int r = 0; r < n; ++r) {
    set->extras_.emplace_back(
        std::vector<int64_t>{static_cast<int64_t>(kExtraHeader) + state_size}, device(r));
    set->state_before_step_.emplace_back(std::vector<int64_t>{state_size}, device(r));
  }
  set->ResetCollectives(set->collectives_);
  // The strategy has given OpenBLAS each replica's share of the cores;
  // oneDNN's per-thread teams get the same.
  set->runner_ = std::make_unique<ReplicaRunner>(n, cpu::BlasThreads());
  return set;
}

void LocalReplicas::ResetCollectives(std::vector<Collective*> collectives) {
  DISTRAIN_CHECK(collectives.size() == models_.size());
  reducers_.clear();  // joins the communication threads of the old collectives
  collectives_ = std::move(collectives);
  // A failed reduction on one replica would leave the others waiting for it
  // inside the collective until the timeout; abort them all instead.
  auto abort_all = [this](const absl::Status& reason) {
    for (Collective* c : collectives_) c->Abort(reason);
  };
  for (size_t r = 0; r < models_.size(); ++r) {
    reducers_.push_back(std::make_unique<OverlappedGradientReducer>(
        models_[r].get(), collectives_[r], options_.bytes_per_pack, options_.collective_options,
        options_.metrics, abort_all,
        absl::MakeSpan(extras_[r].data(), static_cast<size_t>(extras_[r].size()))));
  }
}

std::vector<Model*> LocalReplicas::models() {
  std::vector<Model*> out;
  for (auto& m : models_) out.push_back(m.get());
  return out;
}

absl::StatusOr<StepOutput> LocalReplicas::Run(const StepFn& step_fn, int64_t examples) {
  const int n = size();
  std::vector<LossResult> results(n);
  std::vector<absl::Status> statuses(n);
  for (Tensor& extra : extras_) WriteExtras(extra, kExtraStopVote, {stop_vote_ ? 1.0f : 0.0f});
  runner_->Run([&](int r) {
    OverlappedGradientReducer& reducer = *reducers_[r];
    Model& model = *models_[r];
    Tensor& extras = extras_[r];
    const DeviceId device = extras.device_id();
    float* extra = extras.data();  // device memory for a GPU replica
    // The forward pass has updated the state by the time backward reports
    // its first layer, and the last bucket (which carries `extra`) cannot
    // start before that report or FinishStep.
    bool state_staged = false;
    auto stage_state = [&] {
      if (state_staged) return;
      // By the first layer's report the forward pass has set the loss.
      static_assert(kExtraCorrect == kExtraLoss + 1);
      WriteExtras(extras, kExtraLoss,
                  {static_cast<float>(model.last_train_loss().loss),
                   static_cast<float>(model.last_train_loss().correct)});
      if (extras.size() > static_cast<int64_t>(kExtraHeader)) {
        PackStateVariables(model, extra + kExtraHeader, device);
      }
      state_staged = true;
    };
    ReplicaContext ctx;
    ctx.local_replica = r;
    ctx.replica_id_in_sync = options_.first_replica_id + r;
    ctx.num_local_replicas = n;
    ctx.num_replicas_in_sync = options_.num_replicas_in_sync;
    ctx.model = &model;
    ctx.on_layer_grads_ready = [&reducer, &stage_state](int layer) {
      stage_state();
      reducer.OnLayerGradsReady(layer);
    };
    const bool has_state = extras.size() > static_cast<int64_t>(kExtraHeader);
    if (has_state) PackStateVariables(model, state_before_step_[r].data(), device);
    reducer.BeginStep();
    model.set_loss_scale(optimizers_[r]->loss_scale());
    results[r] = step_fn(ctx);
    stage_state();
    statuses[r] = reducer.FinishStep();
    if (statuses[r].ok()) {
      if (has_state) UnpackStateVariables(extra + kExtraHeader, model, device);
      optimizers_[r]->Apply(model.parameters());
    } else if (has_state) {
      UnpackStateVariables(state_before_step_[r].data(), model, device);  // as before the step
    }
  });
  // Report the root cause: the replica that failed first reports its own
  // error; the others usually report the Abort that followed it (which carries
  // the same message), so any non-OK status will do, but prefer a non-Aborted one.
  const absl::Status* first_error = nullptr;
  for (const absl::Status& s : statuses) {
    if (s.ok()) continue;
    if (first_error == nullptr || (first_error->code() == absl::StatusCode::kAborted &&
                                   s.code() != absl::StatusCode::kAborted)) {
      first_error = &s;
    }
  }
  replica_zero_applied_ = statuses[0].ok();
  if (first_error != nullptr) return *first_error;
  StepOutput out = CombineReplicaResults(results, examples);
  const std::array<float, kExtraHeader> header = ReadHeader(extras_[0]);
  out.stop_requested = header[kExtraStopVote] > 0;  // the mean of 0/1 votes
  if (options_.num_replicas_in_sync > n && examples > 0) {
    // Equal slices everywhere: the mean of the replicas' means is the job's
    // batch mean, and the mean correct count over one slice's size its accuracy.
    out.loss = header[kExtraLoss];
    out.job_accuracy = header[kExtraCorrect] / (static_cast<double>(examples) / n);
  }
  return out;
}

CheckpointState LocalReplicas::Capture(int64_t step) {
  return CaptureVariableState(*models_[0], *optimizers_[0], step);
}

absl::Status LocalReplicas::Restore(const CheckpointState& state) {
  for (int r = 0; r < size(); ++r) {
    if (absl::Status s = RestoreVariableState(state, *models_[r], *optimizers_[r]); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalReplicas::CopyReplicaZeroToOthers() {
  if (size() == 1) return absl::OkStatus();
  CheckpointState state = Capture(0);
  for (int r = 1; r < size(); ++r) {
    if (absl::Status s = RestoreVariableState(state, *models_[r], *optimizers_[r]); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

StepOutput CombineReplicaResults(const std::vector<LossResult>& results, int64_t examples) {
  StepOutput out;
  for (const LossResult& r : results) {
    out.loss += r.loss;
    out.correct += r.correct;
  }
  // Equal slices: the mean of the replicas' means is the batch mean.
  out.loss /= static_cast<int>(results.size());
  out.examples = examples;
  return out;
}

absl::StatusOr<int> ResolveLocalReplicas(const TrainingConfig& training, int hardware_threads,
                                         int visible_gpus, const char* strategy) {
  if (visible_gpus > 0 && training.local_replicas > visible_gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.localReplicas: ", training.local_replicas, " replicas, but this process "
        "sees ", visible_gpus, " GPU(s) and ", strategy, " puts one replica on each GPU (NCCL "
        "cannot put two ranks on one GPU; TensorFlow places one replica per device); use "
        "localReplicas: 0 (one per GPU) or at most ", visible_gpus));
  }
  const int replicas = training.local_replicas > 0 ? training.local_replicas
                       : visible_gpus > 0
                           ? visible_gpus
                           : DefaultLocalReplicas(hardware_threads, training.global_batch_size);
  if (training.global_batch_size % replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.globalBatchSize: ", training.global_batch_size,
        " is not divisible by the ", replicas, " local replicas (spec.training.localReplicas",
        training.local_replicas == 0 && visible_gpus > 0 ? ": 0, one per visible GPU" : "",
        "); use a multiple of ", replicas));
  }
  return replicas;
}

int ShareBlasThreads(int replicas, int hardware_threads, int* previous) {
  const int cores = std::max(1, std::min(hardware_threads, cpu::BlasThreads()));
  const int blas = std::max(1, cores / replicas);
  if (blas != cpu::BlasThreads()) {
    *previous = cpu::BlasThreads();
    cpu::SetBlasThreads(blas);
  }
  return blas;
}

}  // namespace distrain

#include "worker/strategy/central_storage.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "spdlog/spdlog.h"
#include "worker/strategy/local_replicas.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/variable_state.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain {

void CentralStorageStrategy::PinnedDeleter::operator()(float* p) const {
#ifdef DISTRAIN_HAVE_CUDA
  cuda::FreePinnedFloats(p);
#else
  (void)p;  // never allocated: GPU replicas need a CUDA build
#endif
}

void CentralStorageStrategy::StepBarrier::Wait() {
  absl::MutexLock lock(&mu_);
  const int64_t generation = generation_;
  if (++waiting_ == parties_) {
    waiting_ = 0;
    ++generation_;
    return;
  }
  struct Args {
    StepBarrier* self;
    int64_t generation;
  } args{this, generation};
  mu_.Await(absl::Condition(
      +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->self->generation_ != a->generation; },
      &args));
}

CentralStorageStrategy::~CentralStorageStrategy() {
  runner_.reset();  // joins the replica threads before the models go away
#ifdef DISTRAIN_HAVE_CUDA
  // The last step's copies out of pinned_params_ were queued without a wait
  // (CopyHostToReplica); they must have run before the members free it.
  if (pinned_params_ != nullptr) {
    for (int r = 0; r < num_replicas_; ++r) {
      const DeviceId device = LocalReplicaDevice(r, gpus_);
      if (device.kind == Device::kCuda) cuda::Synchronize(device.ordinal);
    }
  }
#endif
  if (previous_blas_threads_ > 0) cpu::SetBlasThreads(previous_blas_threads_);
}

absl::Status CentralStorageStrategy::Init(const ClusterSpec& cluster, const JobConfig& config) {
  if (cluster.num_training_tasks() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CentralStorage trains in a single process (its replicas are local devices) but "
        "TF_CONFIG lists ",
        cluster.num_training_tasks(),
        " chief/worker tasks; use strategy MultiWorkerMirrored or ParameterServer to train "
        "across processes"));
  }
  const TrainingConfig& t = config.training;
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto replicas = ResolveLocalReplicas(t, hardware, gpus_, "CentralStorage");
  if (!replicas.ok()) return replicas.status();
  num_replicas_ = *replicas;
  if (gpus_ > 0) {
    spdlog::info("CentralStorage: {} local replica(s) on GPU:0..{}{}, {}", num_replicas_,
                 num_replicas_ - 1,
                 t.local_replicas > 0 ? "" : " (localReplicas 0: one per visible GPU)",
                 num_replicas_ == 1 ? "variables and optimizer on GPU:0 (one device)"
                                    : "variables and optimizer on the host");
    return absl::OkStatus();
  }
  // The replicas share the cores; see MirroredStrategy for why this is safe.
  const int blas = ShareBlasThreads(num_replicas_, hardware, &previous_blas_threads_);
  spdlog::info("CentralStorage: {} local replica(s) as threads{}, variables and optimizer on the "
               "host, {} BLAS thread(s) each",
               num_replicas_, t.local_replicas > 0 ? "" : " (localReplicas 0: one per core)", blas);
  return absl::OkStatus();
}

absl::Status CentralStorageStrategy::CreateVariables(const ModelFactory& factory,
                                                     const OptimizerConfig& optimizer) {
  // A repeated call starts over: the runner's threads first (they use the
  // rest), then everything sized by the previous variables.
  runner_.reset();
  barrier_.reset();
  replica_params_.clear();
  replica_model_ptrs_.clear();
  replica_models_.clear();
  pinned_grads_.clear();
  pinned_params_.reset();
  param_offsets_.clear();
  auto host = factory();
  if (!host.ok()) return host.status();
  host_model_ = std::move(*host);
  host_params_ = host_model_->parameters();
  auto opt = Optimizer::Create(optimizer, host_model_->precision());
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  if (num_replicas_ == 1) {
    // One device holds the variables: the GPU when there is one.
    host_model_->MoveTo(LocalReplicaDevice(0, gpus_));
    host_params_ = host_model_->parameters();
    return absl::OkStatus();
  }

  for (int r = 0; r < num_replicas_; ++r) {
    auto model = factory();
    if (!model.ok()) return model.status();
    (*model)->MoveTo(LocalReplicaDevice(r, gpus_));
    replica_params_.push_back((*model)->parameters());
    replica_model_ptrs_.push_back(model->get());
    replica_models_.push_back(std::move(*model));
  }
  int64_t total = 0;
  for (Parameter* p : host_params_) {
    param_offsets_.push_back(total);
    total += p->value.size();
  }
  if (gpus_ > 0) {
#ifdef DISTRAIN_HAVE_CUDA
    for (int r = 0; r < num_replicas_; ++r) {
      pinned_grads_.emplace_back(cuda::AllocatePinnedFloats(total));
    }
    pinned_params_.reset(cuda::AllocatePinnedFloats(total));
#else
    return absl::InternalError("CentralStorage: GPU replicas in a CPU-only build");
#endif
  }
  // The factory is deterministic in the seed, but the host copy is the
  // definition of the variables: make that true by construction.
  PackHostParams();
  for (int r = 0; r < num_replicas_; ++r) CopyHostToReplica(r);

  // Split the concatenation of every parameter's elements into N ranges.
  reduce_slices_.assign(num_replicas_, {});
  for (int r = 0; r < num_replicas_; ++r) {
    const int64_t slice_begin = total * r / num_replicas_;
    const int64_t slice_end = total * (r + 1) / num_replicas_;
    int64_t offset = 0;  // of the current parameter in the concatenation
    for (int i = 0; i < static_cast<int>(host_params_.size()); ++i) {
      const int64_t size = host_params_[i]->value.size();
      const int64_t begin = std::max(slice_begin, offset);
      const int64_t end = std::min(slice_end, offset + size);
      if (begin < end) reduce_slices_[r].push_back({i, begin - offset, end - offset});
      offset += size;
    }
  }
  barrier_ = std::make_unique<StepBarrier>(num_replicas_);
  runner_ = std::make_unique<ReplicaRunner>(num_replicas_, cpu::BlasThreads());
  return absl::OkStatus();
}

std::vector<Model*> CentralStorageStrategy::local_models() {
  std::vector<Model*> out = {host_model_.get()};
  for (auto& m : replica_models_) out.push_back(m.get());
  return out;
}

const float* CentralStorageStrategy::HostGrad(int replica, int param) const {
  return pinned_grads_.empty() ? replica_params_[replica][param]->grad.data()
                               : pinned_grads_[replica].get() + param_offsets_[param];
}

void CentralStorageStrategy::PackHostParams() {
  if (pinned_params_ == nullptr) return;
  for (size_t i = 0; i < host_params_.size(); ++i) {
    const Tensor& v = host_params_[i]->value;
    std::memcpy(pinned_params_.get() + param_offsets_[i], v.data(), v.bytes());
  }
}

void CentralStorageStrategy::CopyGradsToHost(int replica) {
#ifdef DISTRAIN_HAVE_CUDA
  const int device = LocalReplicaDevice(replica, gpus_).ordinal;
  for (size_t i = 0; i < replica_params_[replica].size(); ++i) {
    const Tensor& g = replica_params_[replica][i]->grad;
    cuda::CopyDeviceToPinnedAsync(device, g.data(), pinned_grads_[replica].get() + param_offsets_[i],
                                  g.size());
  }
  cuda::Synchronize(device);
#else
  (void)replica;
#endif
}

void CentralStorageStrategy::ReduceToHost(int replica) {
  const float inv_n = 1.0f / static_cast<float>(num_replicas_);
  for (const Segment& seg : reduce_slices_[replica]) {
    float* out = host_params_[seg.param]->grad.data() + seg.begin;
    const int64_t n = seg.end - seg.begin;
    // Replica order is fixed, so the sum is the same whatever the timing.
    std::memcpy(out, HostGrad(0, seg.param) + seg.begin, n * sizeof(float));
    for (int r = 1; r < num_replicas_; ++r) {
      cpu::Axpy(n, 1.0f, HostGrad(r, seg.param) + seg.begin, out);
    }
    cpu::Scale(n, inv_n, out);
  }
}

void CentralStorageStrategy::CopyHostToReplica(int replica) {
  if (pinned_params_ != nullptr) {
#ifdef DISTRAIN_HAVE_CUDA
    // Queued, not waited for: the replica's next kernels are behind them on
    // its stream, and pinned_params_ changes only after every replica has
    // waited for its stream again (step 1 of the next step).
    const int device = LocalReplicaDevice(replica, gpus_).ordinal;
    for (size_t i = 0; i < host_params_.size(); ++i) {
      Tensor& v = replica_params_[replica][i]->value;
      cuda::CopyPinnedToDeviceAsync(device, pinned_params_.get() + param_offsets_[i], v.data(),
                                    v.size());
    }
#endif
  } else {
    // A memcpy per parameter for a CPU replica.
    for (size_t i = 0; i < host_params_.size(); ++i) {
      ops::Copy(host_params_[i]->value, &replica_params_[replica][i]->value);
    }
  }
  std::vector<Parameter*> host_state = host_model_->state_variables();
  std::vector<Parameter*> replica_state = replica_models_[replica]->state_variables();
  for (size_t i = 0; i < host_state.size(); ++i) {
    ops::Copy(host_state[i]->value, &replica_state[i]->value);
  }
}

absl::StatusOr<StepOutput> CentralStorageStrategy::Run(const StepFn& step_fn, int64_t examples) {
  if (num_replicas_ == 1) {
    ReplicaContext ctx;
    ctx.model = host_model_.get();
    host_model_->set_loss_scale(optimizer_->loss_scale());
    LossResult result = step_fn(ctx);
    optimizer_->Apply(host_params_);
    return StepOutput{result.loss, result.correct, examples, /*job_accuracy=*/std::nullopt,
                      /*stop_requested=*/false};
  }
  const int n = num_replicas_;
  std::vector<LossResult> results(n);
  runner_->Run([&](int r) {
    ReplicaContext ctx;
    ctx.local_replica = r;
    ctx.replica_id_in_sync = r;
    ctx.num_local_replicas = n;
    ctx.num_replicas_in_sync = n;
    ctx.model = replica_models_[r].get();
    replica_models_[r]->set_loss_scale(optimizer_->loss_scale());
    results[r] = step_fn(ctx);  // 1.
    if (!pinned_grads_.empty()) CopyGradsToHost(r);  // a GPU replica's, to its host buffer
    barrier_->Wait();
    ReduceToHost(r);  // 2.
    barrier_->Wait();
    if (r == 0) {  // 3.
      optimizer_->Apply(host_params_);
      AverageStateVariables(replica_model_ptrs_, *host_model_);
      PackHostParams();
    }
    barrier_->Wait();
    CopyHostToReplica(r);  // 4.
  });
  return CombineReplicaResults(results, examples);
}

absl::StatusOr<CheckpointState> CentralStorageStrategy::SaveState(int64_t step) {
  return CaptureVariableState(*host_model_, *optimizer_, step);
}

absl::Status CentralStorageStrategy::RestoreState(const CheckpointState& state) {
  if (absl::Status s = RestoreVariableState(state, *host_model_, *optimizer_); !s.ok()) return s;
  PackHostParams();
  for (int r = 0; r < static_cast<int>(replica_models_.size()); ++r) CopyHostToReplica(r);
  return absl::OkStatus();
}

}  // namespace distrain

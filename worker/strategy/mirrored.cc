#include "worker/strategy/mirrored.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "worker/tensor/cpu_math.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/collective/nccl/nccl_collective.h"
#endif

namespace distrain {

int DefaultLocalReplicas(int hardware_threads, int64_t global_batch_size) {
  int n = std::clamp(hardware_threads, 1, MirroredStrategy::kMaxAutoReplicas);
  while (n > 1 && global_batch_size % n != 0) --n;
  return n;
}

MirroredStrategy::~MirroredStrategy() {
  replicas_.reset();  // joins the replica threads before the group goes away
  if (previous_blas_threads_ > 0) cpu::SetBlasThreads(previous_blas_threads_);
}

absl::Status MirroredStrategy::Init(const ClusterSpec& cluster, const JobConfig& config) {
  if (cluster.num_training_tasks() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mirrored trains in a single process (its replicas are local devices) but TF_CONFIG "
        "lists ",
        cluster.num_training_tasks(),
        " chief/worker tasks; use strategy MultiWorkerMirrored to train across processes"));
  }
  const TrainingConfig& t = config.training;
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto replicas = ResolveLocalReplicas(t, hardware, gpus_, "Mirrored");
  if (!replicas.ok()) return replicas.status();
  num_replicas_ = *replicas;
  bytes_per_pack_ = t.communication.bytes_per_pack;
  collective_options_.timeout = absl::Seconds(t.communication.timeout_seconds);
  collective_options_.tag = "gradients";

  if (gpus_ > 0) {
    spdlog::info("Mirrored: {} local replica(s) on GPU:0..{}{}, gradients all-reduced by NCCL",
                 num_replicas_, num_replicas_ - 1,
                 t.local_replicas > 0 ? "" : " (localReplicas 0: one per visible GPU)");
    return absl::OkStatus();
  }
  const int blas = ShareBlasThreads(num_replicas_, hardware, &previous_blas_threads_);
  spdlog::info("Mirrored: {} local replica(s) as threads{}, {} BLAS thread(s) each", num_replicas_,
               t.local_replicas > 0 ? "" : " (localReplicas 0: one per core)", blas);
  return absl::OkStatus();
}

void MirroredStrategy::AttachMetrics(prometheus::Registry& registry) {
  metrics_ = std::make_unique<CollectiveMetrics>(registry);
}

absl::Status MirroredStrategy::CreateVariables(const ModelFactory& factory,
                                               const OptimizerConfig& optimizer) {
  // The new group is built aside and installed only with the replicas that
  // borrow it, so a failed call leaves the strategy as it was and a repeated
  // one never leaves replicas pointing at destroyed collectives.
  std::vector<std::unique_ptr<Collective>> group;
  LocalReplicas::Options options;
  if (gpus_ > 0) {
#ifdef DISTRAIN_HAVE_CUDA
    // Ranks in device order: replica r is rank r on GPU r.
    auto nccl = NcclCollective::CreateLocalGroup(num_replicas_);
    if (!nccl.ok()) return nccl.status();
    for (auto& c : *nccl) group.push_back(std::move(c));
#else
    return absl::InternalError("Mirrored: GPU replicas in a CPU-only build");  // gpus_ is 0 there
#endif
    for (int r = 0; r < num_replicas_; ++r) {
      options.devices.push_back(LocalReplicaDevice(r, gpus_));
    }
  } else {
    std::vector<std::string> names;
    for (int r = 0; r < num_replicas_; ++r) names.push_back(absl::StrCat("local replica ", r));
    for (auto& c : InProcessCollective::CreateGroup(num_replicas_, std::move(names))) {
      group.push_back(std::move(c));
    }
  }
  std::vector<Collective*> collectives;
  for (auto& c : group) collectives.push_back(c.get());
  options.first_replica_id = 0;
  options.num_replicas_in_sync = num_replicas_;
  options.bytes_per_pack = bytes_per_pack_;
  options.collective_options = collective_options_;
  options.metrics = metrics_.get();
  auto replicas = LocalReplicas::Create(factory, optimizer, std::move(collectives), options);
  if (!replicas.ok()) return replicas.status();
  replicas_.reset();  // before the group it borrows
  group_ = std::move(group);
  replicas_ = std::move(*replicas);
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> MirroredStrategy::Run(const StepFn& step_fn, int64_t examples) {
  return replicas_->Run(step_fn, examples);
}

absl::StatusOr<CheckpointState> MirroredStrategy::SaveState(int64_t step) {
  return replicas_->Capture(step);
}

absl::Status MirroredStrategy::RestoreState(const CheckpointState& state) {
  return replicas_->Restore(state);
}

}  // namespace distrain

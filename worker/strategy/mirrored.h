#ifndef DISTRAIN_WORKER_STRATEGY_MIRRORED_H_
#define DISTRAIN_WORKER_STRATEGY_MIRRORED_H_

#include <memory>
#include <vector>

#include "worker/collective/in_process.h"
#include "worker/strategy/collective_metrics.h"
#include "worker/strategy/local_replicas.h"
#include "worker/strategy/strategy.h"

namespace distrain {

// MirroredStrategy: one process (exactly one Worker), N local replicas that
// train in sync (docs/architecture.md §4). On CPU every replica is a thread with its own
// Model copy (identical initialisation from the job's seed) and Optimizer;
// the Trainer splits the process's batch evenly over them, the gradients are
// all-reduced (MEAN) in process through InProcessCollective bucket by bucket
// while backward continues, and every replica applies the identical update,
// so the copies never diverge (bit-identical; see LocalReplicas).
//
// On GPUs (a CUDA build that sees some; docs/architecture.md §6a,
// "Placement"): replica r is GPU r — its model, gradients and optimizer
// slots in that GPU's memory — and the gradients are all-reduced (ncclAvg)
// by an NcclCollective local group instead of InProcessCollective, bucket by
// bucket as on CPU. NCCL gives every rank the same result, so the copies stay
// bit-identical there too.
//
// N = spec.training.localReplicas; 0 means one per local device: one per
// visible GPU, or on CPU one per hardware thread capped at kMaxAutoReplicas
// (more threads than that only shrink each replica's slice of the batch),
// lowered to the largest count that divides globalBatchSize. More replicas
// than GPUs is an error (ResolveLocalReplicas).
//
// BLAS (CPU replicas only): OpenBLAS's pool is process-wide, so Init caps it at
// max(1, cores / N) where cores = min(hardware threads, the pool size this
// process was given — distrain run sets OPENBLAS_NUM_THREADS per process); the
// destructor restores the previous size. The thread count changes GEMM
// rounding slightly, but every replica runs under the same count, and the
// update is computed from the all-reduced gradients, so replicas stay
// bit-identical regardless.
//
// Owns its replicas, the collective group (in-process or NCCL) and its
// metrics. Driven by one thread (see Strategy).
class MirroredStrategy : public Strategy {
 public:
  static constexpr int kMaxAutoReplicas = 8;

  // `gpus`: the GPUs to place replicas on; kDetectGpus (local_replicas.h)
  // takes the visible ones, 0 trains on CPU threads (tests).
  explicit MirroredStrategy(int gpus = kDetectGpus) : gpus_(GpusOrDetect(gpus)) {}
  ~MirroredStrategy() override;
  const char* name() const override { return "Mirrored"; }
  absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) override;
  int input_shard_index() const override { return 0; }
  int num_input_shards() const override { return 1; }
  int num_local_replicas() const override { return num_replicas_; }
  int num_replicas_in_sync() const override { return num_replicas_; }
  bool is_chief() const override { return true; }
  absl::Status CreateVariables(const ModelFactory& factory,
                               const OptimizerConfig& optimizer) override;
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) override;
  Model* primary_model() override { return replicas_->model(0); }
  std::vector<Model*> local_models() override { return replicas_->models(); }
  absl::StatusOr<CheckpointState> SaveState(int64_t step) override;
  absl::Status RestoreState(const CheckpointState& state) override;
  void AttachMetrics(prometheus::Registry& registry) override;

  // Replica r's model / optimizer (tests).
  LocalReplicas& replicas() { return *replicas_; }

 private:
  const int gpus_;  // 0: replicas are CPU threads
  int num_replicas_ = 1;
  int64_t bytes_per_pack_ = 4 << 20;
  CollectiveOptions collective_options_;
  int previous_blas_threads_ = 0;  // 0: not changed
  std::unique_ptr<CollectiveMetrics> metrics_;
  std::vector<std::unique_ptr<Collective>> group_;  // InProcessCollective, or NCCL on GPUs
  std::unique_ptr<LocalReplicas> replicas_;  // declared last: borrows group_ and metrics_
};

// The replica count localReplicas = 0 resolves to (see MirroredStrategy).
int DefaultLocalReplicas(int hardware_threads, int64_t global_batch_size);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_MIRRORED_H_

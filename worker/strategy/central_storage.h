#ifndef DISTRAIN_WORKER_STRATEGY_CENTRAL_STORAGE_H_
#define DISTRAIN_WORKER_STRATEGY_CENTRAL_STORAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/strategy/local_replicas.h"
#include "worker/strategy/replica_runner.h"
#include "worker/strategy/strategy.h"

namespace distrain {

// CentralStorageStrategy: one process (exactly one Worker), N local replicas,
// synchronous, with the job's variables and the optimizer in host memory —
// one copy (docs/architecture.md §4; TensorFlow's CentralStorageStrategy). Unlike
// Mirrored, whose replicas each keep variables and optimizer slots, the slots
// exist once, and the update runs once per step.
//
// One step (Run), all on the ReplicaRunner's threads:
//   1. every replica runs step_fn on its slice of the process's batch (the
//      Trainer slices it), computing gradients into its own model copy;
//   2. barrier; the gradients are reduced to the host: the host model's grad
//      = MEAN over replicas. The parameter elements are split into N ranges
//      and replica r sums range r over every replica in a fixed order, so the
//      result does not depend on thread timing;
//   3. barrier; replica 0's thread applies the one optimizer to the host
//      variables, and sets the host's non-trainable state (BN moving
//      statistics, which each replica updated from its slice) to the
//      replicas' mean, as TensorFlow reads ON_READ/MEAN variables;
//   4. barrier; every replica copies the host variables and state into its
//      own copy, so all copies equal the host copy when Run returns.
// With one replica there is nothing to reduce or copy: the host model is the
// replica's model and a step is exactly OneDeviceStrategy's.
//
// On GPUs (docs/architecture.md §6a, "Placement"), as TensorFlow defines it:
// replica r is GPU r; the variables and the optimizer state stay in host
// memory. After step 1 each replica copies its gradients to a host buffer of
// its own, step 2 reduces those buffers in the same fixed order, step 3 is the
// one host update, and step 4 copies the parameters and state back to every
// GPU. With ONE GPU the variables live on that GPU (TensorFlow's rule for a
// single device): the "host model" is moved there and a step equals
// OneDeviceStrategy's on that GPU.
//
// N and BLAS threads: as MirroredStrategy (spec.training.localReplicas; 0 =
// one per visible GPU, else one per core capped at
// MirroredStrategy::kMaxAutoReplicas, lowered to a divisor of globalBatchSize;
// more replicas than GPUs is refused, as TensorFlow puts one replica on each
// device; OpenBLAS capped at cores / N while the strategy lives).
//
// Checkpoints hold the host variables and the optimizer's slots (the same
// names as every other strategy: worker/strategy/variable_state.h), so a
// CentralStorage checkpoint restores into OneDevice or Mirrored and back.
//
// Owns the host model, the optimizer, the replica models and their threads.
// Driven by one thread (see Strategy); internally synchronised by StepBarrier.
class CentralStorageStrategy : public Strategy {
 public:
  // `gpus`: kDetectGpus (local_replicas.h) takes the visible GPUs; 0 trains
  // on CPU threads whatever the machine has (tests).
  explicit CentralStorageStrategy(int gpus = kDetectGpus) : gpus_(GpusOrDetect(gpus)) {}
  ~CentralStorageStrategy() override;
  const char* name() const override { return "CentralStorage"; }
  absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) override;
  int input_shard_index() const override { return 0; }
  int num_input_shards() const override { return 1; }
  int num_local_replicas() const override { return num_replicas_; }
  int num_replicas_in_sync() const override { return num_replicas_; }
  bool is_chief() const override { return true; }
  absl::Status CreateVariables(const ModelFactory& factory,
                               const OptimizerConfig& optimizer) override;
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) override;
  // The host copy (with one GPU: on that GPU): the job's variables.
  Model* primary_model() override { return host_model_.get(); }
  // The host copy first, then every replica's copy (the consistency hook
  // checks that they are identical after every step).
  std::vector<Model*> local_models() override;
  absl::StatusOr<CheckpointState> SaveState(int64_t step) override;
  absl::Status RestoreState(const CheckpointState& state) override;

  // Tests.
  Model* replica_model(int replica) { return replica_models_[replica].get(); }
  const Optimizer& optimizer() const { return *optimizer_; }

 private:
  // A reusable barrier for the replica threads of one step.
  class StepBarrier {
   public:
    explicit StepBarrier(int parties) : parties_(parties) {}
    void Wait();

   private:
    const int parties_;
    absl::Mutex mu_;
    int waiting_ ABSL_GUARDED_BY(mu_) = 0;
    int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  };

  // Range [begin, end) of parameter `param`'s elements.
  struct Segment {
    int param = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  void ReduceToHost(int replica);
  // GPU replicas: the host variables into pinned_params_, which every
  // replica's CopyHostToReplica reads.
  void PackHostParams();
  void CopyHostToReplica(int replica);
  // Step 1 on a GPU: the replica's gradients into its pinned buffer, queued
  // parameter by parameter, one wait at the end.
  void CopyGradsToHost(int replica);
  // Replica r's gradient of parameter i in host memory: the replica's own
  // tensor on CPU, its slice of the pinned buffer it was copied to on a GPU.
  const float* HostGrad(int replica, int param) const;

  const int gpus_;  // 0: replicas are CPU threads
  int num_replicas_ = 1;
  int previous_blas_threads_ = 0;  // 0: not changed
  std::unique_ptr<Model> host_model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Parameter*> host_params_;
  // Empty with one replica (the host model is then the replica's model).
  std::vector<std::unique_ptr<Model>> replica_models_;
  std::vector<Model*> replica_model_ptrs_;  // replica_models_, for AverageStateVariables
  std::vector<std::vector<Parameter*>> replica_params_;
  // GPU replicas only (several): page-locked host memory, so the copies of
  // step 1 and 4 are queued without staging or a wait per parameter. Every
  // parameter's elements at param_offsets_[i] of the concatenation.
  struct PinnedDeleter {
    void operator()(float* p) const;
  };
  using PinnedFloats = std::unique_ptr<float, PinnedDeleter>;
  std::vector<PinnedFloats> pinned_grads_;  // [replica]: its gradients
  PinnedFloats pinned_params_;              // the host variables after the update
  std::vector<int64_t> param_offsets_;
  std::vector<std::vector<Segment>> reduce_slices_;  // [replica] -> what it reduces
  std::unique_ptr<StepBarrier> barrier_;
  // Declared last: its threads are joined before what they use goes away.
  std::unique_ptr<ReplicaRunner> runner_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_CENTRAL_STORAGE_H_

#ifndef DISTRAIN_WORKER_STRATEGY_LOCAL_REPLICAS_H_
#define DISTRAIN_WORKER_STRATEGY_LOCAL_REPLICAS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "worker/collective/collective.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/strategy/collective_metrics.h"
#include "worker/strategy/gradient_buckets.h"
#include "worker/strategy/replica_runner.h"
#include "worker/strategy/strategy.h"

namespace distrain {

// The local replicas of a synchronous (mirrored) strategy, shared by
// MirroredStrategy and MultiWorkerMirroredStrategy: one Model copy and one
// Optimizer per replica, a persistent thread per replica (ReplicaRunner), and
// per replica an OverlappedGradientReducer on that replica's collective
// handle. One step (Run):
//   1. every replica thread runs step_fn on its slice of the batch; as
//      backward finishes each layer, full gradient buckets are all-reduced
//      (MEAN over every replica in sync) on the replica's communication thread;
//   2. each replica waits for its buckets, then applies its optimizer to the
//      (now identical) mean gradients — identical inputs, identical updates,
//      so the copies stay bit-identical without ever copying variables;
//   3. the non-trainable state (BatchNormalization's moving statistics, which
//      each replica updated from its own slice in step 1) rides with the last
//      bucket as a MEAN and replaces every replica's copy. The moving average
//      is linear, so this equals TensorFlow's ON_READ/MEAN variables, which
//      let each replica's copy drift and average them when read.
// On GPUs (Options::devices) each replica's model, gradients, optimizer slots
// and its per-step buffers (`extras_`, `state_before_step_`) live in its GPU's
// memory, the collectives reduce device spans (NCCL), and only the step's
// header (stop vote, loss, correct count) crosses to the host; checkpoints
// and CopyReplicaZeroToOthers go through host copies (variable_state.h).
// When one replica's reduction fails, every local collective is aborted so the
// other replicas return at once rather than wait for it; Run then returns the
// first error. A failed step leaves each replica as it was before the step
// (its optimizer did not run and its state variables are put back), so a
// strategy that recovers in place can go on from it; only some replicas may
// have applied it, and the strategy makes them agree (ResetCollectives and a
// broadcast, multi_worker_mirrored.h).

//
// Owns models, optimizers, reducers and threads; borrows the collectives and
// metrics (they must outlive it). Driven by one thread.
class LocalReplicas {
 public:
  struct Options {
    int first_replica_id = 0;      // replica_id_in_sync of local replica 0
    int num_replicas_in_sync = 1;  // across the job
    int64_t bytes_per_pack = 4 << 20;
    CollectiveOptions collective_options;
    CollectiveMetrics* metrics = nullptr;  // may be null
    // Replica r's device (empty: every replica on the host). Create moves
    // each model there; the collectives must take buffers on it (a GPU
    // replica's collective is an NcclCollective of that GPU).
    std::vector<DeviceId> devices;
  };

  // One replica per element of `collectives` (replica r uses collectives[r]).
  static absl::StatusOr<std::unique_ptr<LocalReplicas>> Create(const ModelFactory& factory,
                                                               const OptimizerConfig& optimizer,
                                                               std::vector<Collective*> collectives,
                                                               Options options);

  int size() const { return static_cast<int>(models_.size()); }
  Model* model(int replica) { return models_[replica].get(); }
  Optimizer* optimizer(int replica) { return optimizers_[replica].get(); }
  std::vector<Model*> models();
  const std::vector<GradientBucket>& buckets() const { return reducers_[0]->buckets(); }

  // One synchronous step over every local replica; `examples` is the number
  // this process feeds the step (split evenly by step_fn). Every replica's
  // stop vote (1 once VoteStop was called, else 0), loss and correct count
  // are averaged with the last gradient bucket; StepOutput::stop_requested =
  // some replica of the job voted, and with replicas in other processes the
  // loss and job_accuracy are the job's.
  // step_fn must pass ctx.on_layer_grads_ready to Model::TrainStep.
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples);
  void VoteStop() { stop_vote_ = true; }
  // After a Run that failed: whether replica 0 applied that step anyway (its
  // reduction finished before another replica's failed).
  bool replica_zero_applied_failed_step() const { return replica_zero_applied_; }

  // Swaps the collectives (one per replica, as in Create) after the old ones
  // were aborted: in-place recovery re-forms the group. Between steps only.
  void ResetCollectives(std::vector<Collective*> collectives);
  // After an elastic resize: this process's first replica id and the job's
  // replica count changed with its rank and the group's size. Between steps only.
  void SetReplicaIds(int first_replica_id, int num_replicas_in_sync) {
    options_.first_replica_id = first_replica_id;
    options_.num_replicas_in_sync = num_replicas_in_sync;
  }

  // Replica 0's variables and slots (all replicas are identical).
  CheckpointState Capture(int64_t step);
  // Restores `state` into every replica.
  absl::Status Restore(const CheckpointState& state);
  // Copies replica 0's variables, optimizer slots and iterations into the
  // other replicas (after replica 0 received them from elsewhere).
  absl::Status CopyReplicaZeroToOthers();

 private:
  LocalReplicas() = default;

  Options options_;
  bool stop_vote_ = false;
  bool replica_zero_applied_ = false;
  // Per replica, on its device: [stop vote, loss, correct, packed state
  // variables...], reduced (MEAN) in place with the last gradient bucket
  // every step.
  std::vector<Tensor> extras_;
  // Per replica, on its device: its state variables before the step, put
  // back if it fails.
  std::vector<Tensor> state_before_step_;
  std::vector<Collective*> collectives_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<Optimizer>> optimizers_;
  // Declared after what they borrow, so they are destroyed (threads joined) first.
  std::vector<std::unique_ptr<OverlappedGradientReducer>> reducers_;
  std::unique_ptr<ReplicaRunner> runner_;
};

// One step's output from the replicas' results on equal slices of a batch of
// `examples`: the mean loss and the total correct.
StepOutput CombineReplicaResults(const std::vector<LossResult>& results, int64_t examples);

// A strategy's constructor argument for its GPUs: detect them (VisibleGpus,
// worker/tensor/tensor.h: the devices this process sees).
// Tests pass a count instead (0: train on CPU threads on any machine).
inline constexpr int kDetectGpus = -1;
inline int GpusOrDetect(int gpus) { return gpus == kDetectGpus ? VisibleGpus() : gpus; }

// The number of local replicas of a single-process strategy (Mirrored,
// CentralStorage; `strategy` names it in errors) on a host with
// `visible_gpus` GPUs (docs/architecture.md §6a, "Placement"):
//   * no GPU: spec.training.localReplicas, or with 0 DefaultLocalReplicas
//     (mirrored.h) for `hardware_threads` — CPU threads, as always;
//   * GPUs: one replica per GPU (localReplicas 0: every visible GPU; an
//     explicit count uses GPUs 0..count-1). More replicas than GPUs is an
//     InvalidArgument naming spec.training.localReplicas: NCCL cannot put two
//     ranks on one GPU, and TensorFlow puts one replica on each device.
// InvalidArgument, naming both fields, when the count does not divide
// globalBatchSize (each replica takes an equal slice). With GPUs the count is
// never lowered to a divisor, as on CPU: that would leave GPUs idle.
absl::StatusOr<int> ResolveLocalReplicas(const TrainingConfig& training, int hardware_threads,
                                         int visible_gpus = 0, const char* strategy = "Mirrored");

// Where local replica `replica` lives: GPU `replica` when the host has GPUs
// (ResolveLocalReplicas never makes more replicas than GPUs), else the host.
DeviceId LocalReplicaDevice(int replica, int visible_gpus);

// Gives each of `replicas` replica threads an equal share (at least one) of
// the cores for its BLAS calls, so that concurrent replicas do not
// oversubscribe them. Returns the share. When it changes the BLAS thread
// count, *previous receives the count it replaced (for the strategy to
// restore when it is destroyed); otherwise *previous is left as it was.
int ShareBlasThreads(int replicas, int hardware_threads, int* previous);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_LOCAL_REPLICAS_H_

#ifndef DISTRAIN_WORKER_STRATEGY_MULTI_WORKER_MIRRORED_H_
#define DISTRAIN_WORKER_STRATEGY_MULTI_WORKER_MIRRORED_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/collective.h"
#include "worker/collective/ring.h"
#include "worker/coordination/rendezvous.h"
#include "worker/strategy/collective_metrics.h"
#include "worker/strategy/host_staged_collective.h"
#include "worker/strategy/local_replicas.h"
#include "worker/strategy/strategy.h"

namespace distrain {

// MultiWorkerMirroredStrategy: synchronous data-parallel training across the
// chief and worker tasks of TF_CONFIG (docs/architecture.md §4). Rank = the task's
// training rank (chief 0, then worker i at i + 1; without a chief worker 0 is
// rank 0 and plays the chief); the chief trains too, like TensorFlow's. Each
// process reads input shard `rank` of `W` (the number of training tasks;
// autoShardPolicy DATA/FILE/OFF is applied by worker/data) and feeds
// globalBatchSize / W examples a step to its local replicas
// (spec.training.localReplicas, 0 = 1 on CPU).
//
// Protocol:
//   Init
//   1. communication.implementation: Auto/Ring -> ring over TCP (GPU
//      replicas reach it through host staging); NCCL (GPU processes only,
//      common/device_use.h) -> one NCCL communicator over every GPU replica
//      of every process, the ring kept for the state broadcasts of step 5.
//   2. Rendezvous through the coordination service the chief hosts (late
//      tasks are waited for up to the rendezvous deadline).
//   3. RingCollective across the processes, bootstrapped through the
//      rendezvous Store under "mwms/g<generation>"; with L > 1 local replicas
//      a HierarchicalCollective on top (local reduce -> ring -> local broadcast).
//      With NCCL: rank 0 publishes a fresh ncclUniqueId (hex) under
//      "mwms/g<generation>/nccl_unique_id", and each process joins its L
//      ranks (process rank x L + l on its GPU l) in one NCCL group; a new
//      generation (recovery, resize) makes new communicators from a new id.
//   4. Membership watcher: when the coordinator reports a dead peer, every
//      collective is aborted with that reason (Unavailable, naming the peer
//      and its address), so blocked operations return at once and the step
//      fails; the Trainer then exits with the retryable kExitPeerLost.
//   SynchronizeInitialState (after the Trainer's optional restore)
//   5. The chief (the root of R4 below: rank 0 when no process survives a
//      previous generation) publishes a manifest {step, optimizer
//      iterations, slot names and shapes} in the Store, then broadcasts its
//      variables and slots over the ring; every other process adopts them and
//      the chief's step. So a job restores correctly when only the chief can
//      read the checkpoint directory (Kubernetes), and starts from the
//      chief's variables otherwise.
//   Run (every step)
//   6. Gradients are all-reduced (MEAN over all W x L replicas) in buckets of
//      at most communication.bytesPerPack, last layer first, on a
//      communication thread while backward continues; each replica then
//      applies the identical update (LocalReplicas). Every collective
//      operation times out after communication.timeoutSeconds.
//      A stop request (SIGTERM) is a vote carried with the last bucket, so
//      every process stops after the same step (Strategy::RequestStop).
//   7. On a collective error the step waits briefly for the membership
//      watcher, so the error reported names the process that died rather
//      than the ring neighbour that merely saw its connection close.
//   Recover (runPolicy.recoveryPolicy InPlace, the default; Strategy::Recover)
//   R1. A step failed and the membership watcher names a lost peer (within
//       the explain wait). Any other failure (a collective timeout with no
//       one lost: a hung peer) is not recovered: the process exits as before.
//   R2. Wait, bounded by runPolicy.recoveryTimeoutSeconds, until the
//       coordinator has re-admitted a replacement for every lost task, i.e.
//       the group is whole at a newer generation (Rendezvous::AwaitRegroup;
//       the operator recreates only the lost pod, `distrain run` restarts
//       the process by its restartPolicy). The replacement starts normally:
//       Init joins that generation, its Trainer restores nothing it could
//       use and calls SynchronizeInitialState. Losing the coordinator (chief
//       or worker 0) cannot be recovered this way: nobody is left to admit
//       anyone, the survivors exit 170 and the whole group restarts from the
//       durable checkpoint.
//   R3. Every process forms a new ring under "mwms/g<new generation>" and
//       swaps it into its replicas (LocalReplicas::ResetCollectives; the
//       failed step left every replica as it was before it, or after it if
//       it had already applied it).
//   R4. State agreement (also what step 5 does on a normal start): each
//       process publishes its candidate step — survivors the steps they
//       completed (one more when their replica 0 applied the failed step),
//       fresh processes -1 — and the process with the highest candidate
//       (the lowest rank among equals) broadcasts variables, optimizer slots
//       and step; with no survivor (a start, a group restart) that is rank 0,
//       the chief, which alone may read the checkpoint. Everyone resumes at
//       that step, so a loss costs at most the step in flight.
//   R5. The Trainer re-positions its input at the agreed step: the batcher's
//       order is a function of (seed, epoch, step), so no example of the
//       epoch is skipped or seen twice.
//       A second loss during R2-R4 starts again at R2 within the same
//       deadline.
//   Elastic (spec.elasticPolicy with InPlace; coordination_service.h step E)
//   E1. Any worker index below elasticPolicy.maxReplicas may join. The
//       coordinator admits a group whose worker count is within the policy's
//       bounds and whose W x L replicas divide globalBatchSize.
//   E2. A lost worker shrinks the group at once when the smaller size is
//       allowed (else R2 waits for a replacement, as above); a replacement,
//       or a new worker of a scale-up, grows it. Survivors hear of a growth
//       as a membership update: the step in flight is abandoned (the
//       collectives are aborted) and R2-R5 run with the new set: ranks
//       re-numbered densely, ring re-formed, state agreed.
//   E3. The global batch of step s is the same examples at every size
//       (worker/data/batcher.h), so the Trainer re-splits it from the agreed
//       step on (globalBatchSize / W per process): no example of the epoch
//       is skipped or seen twice.
//   E4. SIGTERM on a worker that is not the coordinator: after its step it
//       departs (LeaveRequest.departing) and exits with the terminated code;
//       the others go on without it (E2). SIGTERM on the coordinator stops
//       every process as in step 6.
//   Shutdown
//   8. Leave the rendezvous; the chief (coordinator) waits, bounded, until
//      every other task has left so none loses the service mid-call.
//
// Ownership: owns the rendezvous, the collectives, the replicas and its
// metrics. Driven by one thread (see Strategy); the watcher callback runs on
// the rendezvous' thread and only aborts collectives.
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  // `gpus`: the GPUs of this process to place its local replicas on;
  // kDetectGpus (local_replicas.h) finds them, 0 trains on CPU threads. On
  // GPUs every replica's reductions go through host memory to the TCP ring
  // (HostStagedCollective): localReplicas 0 means one replica per GPU.
  explicit MultiWorkerMirroredStrategy(int gpus = kDetectGpus) : gpus_(GpusOrDetect(gpus)) {}
  ~MultiWorkerMirroredStrategy() override;
  const char* name() const override { return "MultiWorkerMirrored"; }
  absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) override;
  int input_shard_index() const override { return rank_; }
  int num_input_shards() const override { return num_workers_; }
  int num_local_replicas() const override { return local_replicas_; }
  int num_replicas_in_sync() const override { return num_workers_ * local_replicas_; }
  bool is_chief() const override { return chief_; }
  absl::Status CreateVariables(const ModelFactory& factory,
                               const OptimizerConfig& optimizer) override;
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) override;
  Model* primary_model() override { return replicas_->model(0); }
  std::vector<Model*> local_models() override { return replicas_->models(); }
  absl::StatusOr<CheckpointState> SaveState(int64_t step) override;
  absl::Status RestoreState(const CheckpointState& state) override;
  absl::StatusOr<int64_t> SynchronizeInitialState(int64_t local_start_step) override;
  absl::StatusOr<int64_t> Recover(const absl::Status& error, int64_t steps_done,
                                  const std::function<bool()>& stop_requested) override;
  bool RequestStop() override;
  void AttachMetrics(prometheus::Registry& registry) override;
  void Shutdown() override;

 private:
  void OnPeerFailure(const absl::Status& reason);
  // Step 3 / R3: the ring (and local group) of `generation`, swapped into the
  // replicas when they exist.
  absl::Status FormCollectives(int64_t generation);
  // Init / R3: rank, size and peer names from the rendezvous' current group
  // (elastic: it may differ from TF_CONFIG's and from the previous one).
  void AdoptMembership();
  std::vector<Collective*> ReplicaCollectives();
  // Step 3 with NCCL: this process's ranks of generation `prefix`.
  absl::StatusOr<std::vector<std::unique_ptr<Collective>>> FormNcclRanks(const std::string& prefix);
  // Step 5 / R4: `candidate_step` is -1 for a process that holds no state of
  // a previous generation. Returns the agreed step.
  absl::StatusOr<int64_t> AgreeOnState(int64_t candidate_step, int64_t local_start_step);
  // The membership failure that explains `error`, if the watcher reports one soon.
  absl::Status ExplainFailure(const absl::Status& error);

  int rank_ = 0;
  int num_workers_ = 1;
  int local_replicas_ = 1;
  bool chief_ = false;
  int64_t bytes_per_pack_ = 4 << 20;
  CollectiveOptions collective_options_;
  int previous_blas_threads_ = 0;  // 0: not changed
  std::string store_prefix_;       // "mwms/g<generation>"
  int64_t generation_ = 0;         // of the current ring
  std::string task_name_;
  RingOptions ring_options_;       // key_prefix set per generation
  RecoveryPolicy recovery_policy_ = RecoveryPolicy::kInPlace;
  bool elastic_ = false;    // spec.elasticPolicy with InPlace: membership may resize
  bool departing_ = false;  // elastic, stopped: leaves a group that trains on
  absl::Duration recovery_timeout_ = absl::Seconds(300);

  std::unique_ptr<CollectiveMetrics> metrics_;
  std::unique_ptr<Rendezvous> rendezvous_;
  std::shared_ptr<Collective> ring_;                       // across processes
  std::vector<std::unique_ptr<Collective>> hierarchical_;  // L > 1: one per local replica
  // On GPUs: per local replica, its ring or hierarchical handle behind host staging.
  std::vector<std::unique_ptr<HostStagedCollective>> staged_;
  // implementation: NCCL: per local replica, its rank of the job-wide NCCL
  // communicator (NcclCollective; empty otherwise).
  std::vector<std::unique_ptr<Collective>> nccl_;
  bool use_nccl_ = false;
  const int gpus_;  // 0: replicas are CPU threads

  absl::Mutex mu_;  // orders the watcher's aborts against teardown
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  std::unique_ptr<LocalReplicas> replicas_;  // last: borrows the collectives and metrics
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_MULTI_WORKER_MIRRORED_H_

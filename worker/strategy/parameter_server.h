#ifndef DISTRAIN_WORKER_STRATEGY_PARAMETER_SERVER_H_
#define DISTRAIN_WORKER_STRATEGY_PARAMETER_SERVER_H_

// ParameterServerStrategy: asynchronous data-parallel training with the
// variables sharded over the `ps` tasks (docs/architecture.md §4), TensorFlow's
// ParameterServerStrategy + ClusterCoordinator. Three roles:
//   chief   this class, driven by the Trainer: the coordinator. It trains
//           nothing itself; every Trainer step schedules one step closure.
//   worker  worker/strategy/ps_worker.h: runs closures (pull, compute, push).
//   ps      worker/strategy/ps_worker.h: serves PsService (worker/ps/).
// One Trainer step = one closure = globalBatchSize examples on one worker, so
// spec.training.steps counts closures (TensorFlow's `steps_per_execution` 1).
//
// Protocol (chief):
//   Init
//   1. TF_CONFIG must have a chief (this task), >= 1 worker and >= 1 ps.
//   CreateVariables
//   2. Build the model (initial values from the job's seed), derive the
//      ShardingPlan (PsShardingPlan: MinSize(256 KiB, #ps) like TF's usual
//      setup), wait until every ps answers (connect timeout 5 min: pods start
//      late) and declare the shards. The model's non-trainable state
//      (BatchNormalization's moving statistics) is sharded too, after the
//      parameters, as non-trainable shards: workers push the deltas their
//      forward passes made and the ps adds them (no optimizer, no staleness
//      bound), like TensorFlow's moving averages of ps variables.
//   RestoreState / SynchronizeInitialState
//   3. Fresh start: upload the initial values of every variable, trainable
//      and not (Initialize, overwrite: the chief is the authority even if the
//      ps survived an earlier chief).
//      Resume from checkpoint step s: every ps restores its own files of step
//      s (values, optimizer slots, versions; PsClient::Restore) when they are
//      readable; otherwise the chief uploads the checkpoint's values and the
//      optimizer slots restart from zero (logged).
//   4. Start the ClusterCoordinator at closure id s. Before that
//      (CreateVariables) the chief serves its worker set, PsMembership, on
//      the port of its own TF_CONFIG address (ps_membership.h): workers
//      that join it — TF_CONFIG's and any a scale added — are added to the
//      coordinator with the address they serve on; workers that leave
//      (SIGTERM) or whose stream breaks are removed, so closures go to the
//      workers that exist now, not to the list the chief read at start.
//   Run (every Trainer step)
//   5. Schedule one closure; return the loss statistics of closures completed
//      since the previous step (job-wide examples). At the final step and at
//      evaluation steps, Join and pull the variables into primary_model()
//      (the moving statistics too, which evaluation normalises with).
//   SaveState(step) — a consistent checkpoint of all shards
//   6. Join: no closure in flight, so no push lands while saving; exactly
//      `step` closures have completed. After RequestStop: Drain instead
//      (queued closures are dropped) and the checkpoint's step is
//      start + completed, which the rerun resumes at.
//   7. Every ps writes its shards + slots + versions at `step` under its own
//      <checkpoint dir>/ps/ps-<t>-of-<n>/ (PsClient::Save names only the
//      step; each ps reads the directory from its own DISTRAIN_CHECKPOINT_DIR);
//      the chief reads them back (LoadPsCheckpoint) from its own
//      <checkpoint dir>/ps into the CheckpointState it returns, so
//      the chief's checkpoint holds variables ("variables/<name>", moving
//      statistics included, as variable_state.h names them) and optimizer
//      slots. If a ps cannot write there (no checkpoint directory, no shared
//      volume) the chief pulls the variables instead (slots are then not
//      checkpointed; logged once).
//   Staleness
//   Every push carries the shard versions its gradient was computed from;
//   with spec.training.maxStaleness the ps rejects a push older than that and
//   the worker redoes the closure's gradient on fresh parameters. Unset: no
//   bound (TensorFlow's behaviour).
//   Failures
//   8. A lost worker is handled by the coordinator (re-queue, re-admit). A
//      failed ps fails the step with UNAVAILABLE naming the ps; the Trainer
//      exits with kExitPeerLost (170, retryable) and the rerun resumes at the
//      last checkpoint (step 3).
//   Shutdown
//   9. When every step is done, tell every admitted worker (they exit 0);
//      after a stop (SIGTERM) they stay up for the restarted chief. ps tasks
//      serve until their process is stopped (SIGTERM), like TensorFlow's.
//
// Ownership: owns the model, the ps client, the worker transport and the
// coordinator. Driven by the Trainer's thread (see Strategy).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/ps/partitioner.h"
#include "worker/ps/ps_client.h"
#include "worker/strategy/cluster_coordinator.h"
#include "worker/strategy/ps_membership.h"
#include "worker/strategy/strategy.h"

namespace distrain {

class GrpcWorkerTransport;

// The plan every process of a ParameterServer job derives from the model:
// variables in Model::parameters() order, then Model::state_variables()
// (non-trainable), MinSize(256 KiB, num_ps) shards.
absl::StatusOr<ShardingPlan> PsShardingPlan(Model& model, int num_ps);

// Input shape and class count of a model built by Model::Create, which
// workers need to build the same model.
struct ModelDims {
  int num_features = 0;                // product of example_shape
  std::vector<int64_t> example_shape;  // one example (images: {28, 28, 1})
  int num_classes = 0;
};
absl::StatusOr<ModelDims> ModelDimsOf(Model& model);

// Where the ps tasks write their checkpoint files: <checkpoint dir>/ps
// ("" without a checkpoint directory). The chief reads there, and each ps
// task gets it as PsServiceOptions::checkpoint_dir from its own environment.
std::string PsCheckpointRoot(const std::string& checkpoint_dir);

class ParameterServerStrategy : public Strategy {
 public:
  ParameterServerStrategy();
  ~ParameterServerStrategy() override;
  const char* name() const override { return "ParameterServer"; }
  absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) override;
  // The chief feeds no data: the workers read their own shards.
  int input_shard_index() const override { return 0; }
  int num_input_shards() const override { return 1; }
  int num_local_replicas() const override { return 0; }
  // The workers of the coordinator's membership now (TF_CONFIG's before it exists).
  int num_replicas_in_sync() const override {
    return coordinator_ ? coordinator_->members() : num_workers_;
  }
  bool is_chief() const override { return true; }
  absl::Status CreateVariables(const ModelFactory& factory,
                               const OptimizerConfig& optimizer) override;
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) override;
  Model* primary_model() override { return model_.get(); }
  absl::StatusOr<CheckpointState> SaveState(int64_t step) override;
  absl::Status RestoreState(const CheckpointState& state) override;
  absl::StatusOr<int64_t> SynchronizeInitialState(int64_t local_start_step) override;
  void AttachMetrics(prometheus::Registry& registry) override { registry_ = &registry; }
  // Returns false (the Trainer stops after this step and saves), and makes
  // that save drain rather than join: closures in flight finish, queued ones
  // are dropped and the checkpoint's step is the number actually completed,
  // so a stop does not wait for work that its workers (stopping too) will
  // never run.
  bool RequestStop() override {
    stop_requested_ = true;
    return false;
  }
  void Shutdown() override;

  // For tests and logs.
  const ClusterCoordinator* coordinator() const { return coordinator_.get(); }
  // The worker set's port (0 before CreateVariables).
  int membership_port() const { return membership_ ? membership_->port() : 0; }
  // Over the closures Run has reported so far.
  int64_t max_staleness_seen() const { return max_staleness_seen_; }
  int64_t stale_retries() const { return stale_retries_; }

 private:
  // Join, then copy the ps's current variables into model_.
  absl::Status JoinAndPull();
  // Step 4's worker set, on the chief's TF_CONFIG port.
  absl::Status ServeWorkerSet();

  JobConfig config_;
  ClusterSpec cluster_;
  int num_workers_ = 0;
  int num_ps_ = 0;
  std::string ps_checkpoint_root_;  // "" without a checkpoint directory
  bool warned_no_ps_checkpoint_ = false;
  prometheus::Registry* registry_ = nullptr;

  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;  // holds restored slots for SaveState fallbacks
  std::unique_ptr<PsClient> ps_;
  bool restored_ = false;
  bool stop_requested_ = false;
  int64_t restored_step_ = 0;
  int64_t start_step_ = 0;
  double last_loss_ = 0;
  int64_t max_staleness_seen_ = 0;
  int64_t stale_retries_ = 0;
  int64_t total_steps_ = 0;

  std::unique_ptr<GrpcWorkerTransport> transport_;
  std::unique_ptr<ClusterCoordinator> coordinator_;  // after transport_: borrows it
  // Last: destroyed first, so its callbacks never see the two above gone.
  std::unique_ptr<PsMembershipServer> membership_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_PARAMETER_SERVER_H_

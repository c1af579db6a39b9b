#ifndef DISTRAIN_WORKER_STRATEGY_STRATEGY_H_
#define DISTRAIN_WORKER_STRATEGY_STRATEGY_H_

// The distribution-strategy interface (docs/architecture.md §6). Strategies differ only
// in placement and communication; model, data and optimizer code is shared,
// and the Trainer drives every strategy through this interface:
//
//   1. Init(cluster, config)        — join peers, decide replicas and shards;
//   2. CreateVariables(factory)     — build one Model per local replica and the
//                                     optimizer; every replica starts identical;
//                                     the Trainer calls it once (the local
//                                     strategies start over if called again);
//   3. RestoreState / SaveState     — checkpoints (variables + optimizer slots);
//      SynchronizeInitialState      — then make every process agree on the
//                                     starting variables and step;
//   4. Run(step_fn) once per step   — step_fn computes one replica's gradients;
//                                     the strategy reduces and applies them;
//   5. Shutdown()                   — leave the group cleanly.
//
// Test/debug hook (implemented once, in the Trainer, for every strategy): when
// the environment variable DISTRAIN_PARAM_CHECKSUM_FILE is set, the Trainer
// appends "<step> <checksum>\n" after every step, where checksum is the FNV-1a
// hash of the bytes of every parameter of local replica 0 (see
// worker/strategy/param_checksum.h). Before writing it checks that every model
// in local_models() hashes the same and fails the job (exit 1, naming the
// replica) if not. "{task}" in the path is replaced by the task ("worker-1"),
// so the processes of one `distrain run` write separate files.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cluster_spec.h"
#include "common/device_use.h"
#include "common/job_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace distrain {

// What one replica's step function sees.
struct ReplicaContext {
  int local_replica = 0;          // 0..num_local_replicas()-1 in this process
  int replica_id_in_sync = 0;     // 0..num_replicas_in_sync()-1 across the job
  int num_local_replicas = 1;
  int num_replicas_in_sync = 1;
  Model* model = nullptr;         // this replica's copy; owned by the strategy
  // Pass to Model::TrainStep: lets the strategy start reducing a layer's
  // gradients while backward continues. May be empty.
  std::function<void(int layer_index)> on_layer_grads_ready;
};

// Computes the gradients of one replica's share of the step (its grads land
// in ctx.model's parameters) and returns its loss statistics.
using StepFn = std::function<LossResult(ReplicaContext& ctx)>;

// Loss statistics of a step, combined over the replicas of this process.
struct StepOutput {
  // Mean over the job's batch when the strategy reduces it across processes
  // (MultiWorkerMirrored, as Keras reports it), else over this process's examples.
  double loss = 0;
  int64_t correct = 0;   // this process's
  int64_t examples = 0;  // this process's
  // The job's batch accuracy when reduced across processes (then preferred
  // over correct / examples); unset otherwise.
  std::optional<double> job_accuracy;
  // Some process of the job asked to stop (Strategy::RequestStop); every
  // process of the job sees the same value for the same step.
  bool stop_requested = false;
};

using ModelFactory = std::function<absl::StatusOr<std::unique_ptr<Model>>()>;

// Thread-safety: a Strategy is driven by one thread (the Trainer's); it may
// run replicas on threads of its own inside Run.
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual const char* name() const = 0;

  virtual absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) = 0;

  // The input pipeline this process runs: shard `input_shard_index()` of
  // `num_input_shards()`, yielding `per_process_batch_size()` examples a step
  // that Run splits evenly over the local replicas.
  virtual int input_shard_index() const = 0;
  virtual int num_input_shards() const = 0;
  virtual int num_local_replicas() const = 0;
  virtual int num_replicas_in_sync() const = 0;
  int64_t per_process_batch_size(int64_t global_batch_size) const {
    return global_batch_size / num_input_shards();
  }
  // Whether this process writes checkpoints and reports job progress.
  virtual bool is_chief() const = 0;

  virtual absl::Status CreateVariables(const ModelFactory& factory,
                                       const OptimizerConfig& optimizer) = 0;

  // One synchronous (or, for ParameterServer, asynchronous) training step;
  // `examples` is the number of examples this process feeds the step.
  virtual absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) = 0;

  // The model whose variables represent the job (replica 0's copy); used
  // for evaluation and by tests.
  virtual Model* primary_model() = 0;
  // Every local replica's model (replica 0 first); the consistency hook
  // checks they are bit-identical.
  virtual std::vector<Model*> local_models() { return {primary_model()}; }

  // Variables + optimizer slots for a checkpoint, and their restoration.
  // RestoreState must leave every local replica with the restored values; it
  // is only called in processes that found a checkpoint.
  virtual absl::StatusOr<CheckpointState> SaveState(int64_t step) = 0;
  virtual absl::Status RestoreState(const CheckpointState& state) = 0;
  // Called by every process after the (optional) restore, with the step this
  // process would start at; returns the step the job starts at. Strategies
  // with several processes make every peer agree here (MultiWorkerMirrored
  // broadcasts the chief's variables, optimizer slots and step, because in
  // Kubernetes only the chief may be able to read the checkpoint).
  virtual absl::StatusOr<int64_t> SynchronizeInitialState(int64_t local_start_step) {
    return local_start_step;
  }

  // In-place recovery: Run failed with `error` after `steps_done` steps. A
  // strategy that can re-form its group without this process exiting (a
  // MultiWorkerMirrored survivor whose lost peer is replaced) does so and
  // returns the step the job goes on from: every process of the job then
  // holds the same variables and resumes at that step, at most one step
  // before the failure. `stop_requested` is polled while it waits. Any error
  // (the default returns `error`) ends this process as before.
  virtual absl::StatusOr<int64_t> Recover(const absl::Status& error, int64_t steps_done,
                                          const std::function<bool()>& stop_requested) {
    return error;
  }

  // Stopping together: SIGTERM reaches the processes of a job at slightly
  // different times, and one that left mid-job would fail the others. A
  // strategy that coordinates returns true and carries the request to every
  // process with the next step's communication; that step's StepOutput has
  // stop_requested set everywhere, so all processes stop after the same step
  // and the chief's final checkpoint is the job's. false (the default): the
  // Trainer stops this process at once.
  virtual bool RequestStop() { return false; }

  // Gives the strategy the process's Prometheus registry for its own
  // metrics (worker/strategy/collective_metrics.h). Called before Init, at
  // most once; the registry outlives the strategy.
  virtual void AttachMetrics(prometheus::Registry& registry) {}

  virtual void Shutdown() {}
};

// Creates the strategy the job asks for. Strategies whose implementation is
// not available in this build return Unimplemented naming the strategy;
// TPU always returns FailedPrecondition (TPU jobs run the user's TF image).
absl::StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const JobConfig& config);
// The same check without constructing anything (distrain run calls it before
// starting processes, so the user hears about it at once). Includes the
// device rule (common/device_use.h) with this process's facts.
absl::Status CheckStrategySupported(const JobConfig& config);
// What this process has of GPUs: a CUDA build, the devices it can open; no
// held GPUs (distrain-worker adds the pod's from DISTRAIN_POD_GPUS).
DeviceUseFacts ThisProcessDeviceFacts();

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_STRATEGY_H_

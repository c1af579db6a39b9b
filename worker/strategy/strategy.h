#ifndef DISTRAIN_WORKER_STRATEGY_STRATEGY_H_
#define DISTRAIN_WORKER_STRATEGY_STRATEGY_H_

// The distribution-strategy interface (DESIGN.md §6). Strategies differ only
// in placement and communication; model, data and optimizer code is shared,
// and the Trainer drives every strategy through this interface:
//
//   1. Init(cluster, config)        — join peers, decide replicas and shards;
//   2. CreateVariables(factory)     — build one Model per local replica and the
//                                     optimizer; every replica starts identical;
//   3. RestoreState / SaveState     — checkpoints (variables + optimizer slots);
//   4. Run(step_fn) once per step   — step_fn computes one replica's gradients;
//                                     the strategy reduces and applies them;
//   5. Shutdown()                   — leave the group cleanly.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cluster_spec.h"
#include "common/job_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"

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
  double loss = 0;       // mean over this process's examples
  int64_t correct = 0;
  int64_t examples = 0;
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

  // Variables + optimizer slots for a checkpoint, and their restoration.
  // RestoreState must leave every replica (and, across processes, every
  // peer) with the restored values.
  virtual absl::StatusOr<CheckpointState> SaveState(int64_t step) = 0;
  virtual absl::Status RestoreState(const CheckpointState& state) = 0;

  virtual void Shutdown() {}
};

// Creates the strategy the job asks for. Strategies whose implementation is
// not available in this build return Unimplemented naming the strategy;
// TPU always returns FailedPrecondition (TPU jobs run the user's TF image).
absl::StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const JobConfig& config);
// The same check without constructing anything (distrain run calls it before
// starting processes, so the user hears about it at once).
absl::Status CheckStrategySupported(const JobConfig& config);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_STRATEGY_H_

#ifndef DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_
#define DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_

#include <memory>

#include "worker/strategy/local_replicas.h"
#include "worker/strategy/strategy.h"

namespace distrain {

// OneDeviceStrategy: one replica, one process, no communication. The
// reference every other strategy is tested against ("sync training matches
// single-process training"). Its device is GPU 0 when the process sees a GPU
// (the model moved there, its optimizer slots created there; the Model copies
// each step's host features to it, labels stay on the host), else the host
// (docs/architecture.md §6a, "Placement").
// Owns its model and optimizer. Driven by one thread.
class OneDeviceStrategy : public Strategy {
 public:
  // `gpus`: kDetectGpus (local_replicas.h) takes the visible GPUs; 0 trains
  // on the host whatever the machine has (tests).
  explicit OneDeviceStrategy(int gpus = kDetectGpus) : gpus_(GpusOrDetect(gpus)) {}
  const char* name() const override { return "OneDevice"; }
  absl::Status Init(const ClusterSpec& cluster, const JobConfig& config) override;
  int input_shard_index() const override { return 0; }
  int num_input_shards() const override { return 1; }
  int num_local_replicas() const override { return 1; }
  int num_replicas_in_sync() const override { return 1; }
  bool is_chief() const override { return true; }
  absl::Status CreateVariables(const ModelFactory& factory, const OptimizerConfig& optimizer) override;
  absl::StatusOr<StepOutput> Run(const StepFn& step_fn, int64_t examples) override;
  Model* primary_model() override { return model_.get(); }
  absl::StatusOr<CheckpointState> SaveState(int64_t step) override;
  absl::Status RestoreState(const CheckpointState& state) override;

  DeviceId device() const { return LocalReplicaDevice(0, gpus_); }

 private:
  const int gpus_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_

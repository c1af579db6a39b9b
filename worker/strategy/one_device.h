#ifndef DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_
#define DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_

#include <memory>

#include "worker/strategy/strategy.h"

namespace distrain {

// OneDeviceStrategy: one replica, one process, no communication. The
// reference every other strategy is tested against ("sync training matches
// single-process training").
// Owns its model and optimizer. Driven by one thread.
class OneDeviceStrategy : public Strategy {
 public:
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

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_ONE_DEVICE_H_

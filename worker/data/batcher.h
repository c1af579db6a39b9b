#ifndef DISTRAIN_WORKER_DATA_BATCHER_H_
#define DISTRAIN_WORKER_DATA_BATCHER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/data/dataset.h"
#include "worker/tensor/tensor.h"

namespace distrain {

struct Batch {
  int64_t step = 0;          // training step this batch belongs to
  Tensor features;           // [batch, num_features]
  std::vector<int32_t> labels;
};

// An infinite stream of batches.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch Next() = 0;
};

// Batches for one input pipeline (one worker), deterministic in (seed, step).
//
// The global example order is an endless concatenation of epochs; epoch e is
// a permutation of [0, size) drawn from (seed, e) (identity when shuffle is
// off). With DATA sharding this pipeline keeps positions p of that order with
// p % num_shards == shard_index; with FILE/OFF it keeps every position.
// Batch s holds the next batch_size kept positions after s * batch_size.
// Hence: the union of the DATA shards' batch s is exactly the OneDevice
// global batch s (what makes synchronous strategies match single-process
// training), and starting at `start_step` yields the same batches an
// uninterrupted run would (what makes resume exact).
// Not thread-safe; PrefetchingBatchSource moves it onto its own thread.
class ShardedBatcher : public BatchSource {
 public:
  ShardedBatcher(std::shared_ptr<const Dataset> dataset, AutoShardPolicy effective_policy,
                 int shard_index, int num_shards, int64_t batch_size, uint64_t seed, bool shuffle,
                 int64_t start_step);
  Batch Next() override;

 private:
  const std::vector<int64_t>& EpochOrder(int64_t epoch);

  std::shared_ptr<const Dataset> dataset_;
  int64_t stride_;  // num_shards for DATA, 1 otherwise
  int64_t offset_;  // shard_index for DATA, 0 otherwise
  int64_t batch_size_;
  uint64_t seed_;
  bool shuffle_;
  int64_t next_step_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

// Runs a BatchSource on a background thread, keeping up to `depth` batches
// ready. Next() blocks until one is ready. The destructor stops and joins
// the thread. Next() must be called from one thread at a time.
class PrefetchingBatchSource : public BatchSource {
 public:
  PrefetchingBatchSource(std::unique_ptr<BatchSource> inner, int depth);
  ~PrefetchingBatchSource() override;
  Batch Next() override;

 private:
  void Loop();

  std::unique_ptr<BatchSource> inner_;
  const size_t depth_;
  absl::Mutex mu_;
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_DATA_BATCHER_H_

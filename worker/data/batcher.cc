#include "worker/data/batcher.h"

#include <numeric>
#include <utility>

#include "common/check.h"

namespace distrain {
namespace {

constexpr uint64_t kEpochStream = 0x65706f6368000000ULL;  // "epoch"

}  // namespace

ShardedBatcher::ShardedBatcher(std::shared_ptr<const Dataset> dataset,
                               AutoShardPolicy effective_policy, int shard_index, int num_shards,
                               int64_t batch_size, uint64_t seed, bool shuffle, int64_t start_step)
    : dataset_(std::move(dataset)),
      stride_(effective_policy == AutoShardPolicy::kData ? num_shards : 1),
      offset_(effective_policy == AutoShardPolicy::kData ? shard_index : 0),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle),
      next_step_(start_step) {
  DISTRAIN_CHECK(dataset_ != nullptr);
  DISTRAIN_CHECK_GT(dataset_->size(), 0);
  DISTRAIN_CHECK(effective_policy != AutoShardPolicy::kAuto)
      << "resolve AUTO with OpenTrainingInput";
  DISTRAIN_CHECK_GE(num_shards, 1);
  DISTRAIN_CHECK(shard_index >= 0 && shard_index < num_shards)
      << shard_index << " of " << num_shards;
  DISTRAIN_CHECK_GT(batch_size_, 0);
  DISTRAIN_CHECK_GE(start_step, 0);
}

const std::vector<int64_t>& ShardedBatcher::EpochOrder(int64_t epoch) {
  if (epoch == cached_epoch_) return order_;
  const int64_t n = dataset_->size();
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (shuffle_) {
    // Fisher-Yates with PortableRng: the same permutation on every platform.
    PortableRng rng(PortableRng::MixKey(PortableRng::MixKey(seed_, kEpochStream),
                                        static_cast<uint64_t>(epoch)));
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.NextBelow(static_cast<uint64_t>(i) + 1));
      std::swap(order_[i], order_[j]);
    }
  }
  cached_epoch_ = epoch;
  return order_;
}

Batch ShardedBatcher::Next() {
  const int64_t n = dataset_->size();
  const int nf = dataset_->num_features();
  Batch batch;
  batch.step = next_step_;
  batch.features = Tensor({batch_size_, nf});
  batch.labels.resize(batch_size_);
  // Kept position k (k-th example this pipeline keeps) is global position
  // k * stride + offset; batch s covers k in [s * batch_size, (s+1) * batch_size).
  const int64_t first_kept = next_step_ * batch_size_;
  for (int64_t j = 0; j < batch_size_; ++j) {
    const int64_t position = (first_kept + j) * stride_ + offset_;
    const std::vector<int64_t>& order = EpochOrder(position / n);
    dataset_->Get(order[position % n], batch.features.data() + j * nf, &batch.labels[j]);
  }
  ++next_step_;
  return batch;
}

// ---------------------------------------------------------------------------

PrefetchingBatchSource::PrefetchingBatchSource(std::unique_ptr<BatchSource> inner, int depth)
    : inner_(std::move(inner)), depth_(static_cast<size_t>(depth)) {
  DISTRAIN_CHECK(inner_ != nullptr);
  DISTRAIN_CHECK_GE(depth, 1);
  thread_ = std::thread([this] { Loop(); });
}

PrefetchingBatchSource::~PrefetchingBatchSource() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;  // wakes a producer waiting for room (its Await re-checks)
  }
  thread_.join();
}

void PrefetchingBatchSource::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PrefetchingBatchSource* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stop_ || self->ready_.size() < self->depth_;
          },
          this));
      if (stop_) return;
    }
    // Produce without the lock so the consumer can take ready batches meanwhile.
    Batch batch = inner_->Next();
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    ready_.push_back(std::move(batch));
  }
}

Batch PrefetchingBatchSource::Next() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](PrefetchingBatchSource* self)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return !self->ready_.empty(); },
      this));
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  return batch;
}

}  // namespace distrain

#include "worker/data/batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::ElementsAreArray;

constexpr int kClasses = 7;

// Example i has features {i, i + 0.5} and label i % kClasses, so a batch's
// example indices can be read back from its features.
std::shared_ptr<const Dataset> IndexDataset(int64_t size) {
  std::vector<float> features;
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < size; ++i) {
    features.push_back(static_cast<float>(i));
    features.push_back(static_cast<float>(i) + 0.5f);
    labels.push_back(static_cast<int32_t>(i % kClasses));
  }
  return std::make_shared<InMemoryDataset>("index", 2, kClasses, std::move(features),
                                           std::move(labels));
}

// Example indices of a batch, checking that features and labels agree.
std::vector<int64_t> Indices(const Batch& batch) {
  EXPECT_EQ(batch.features.rank(), 2);
  EXPECT_EQ(batch.features.dim(1), 2);
  EXPECT_EQ(batch.features.dim(0), static_cast<int64_t>(batch.labels.size()));
  std::vector<int64_t> out;
  for (size_t j = 0; j < batch.labels.size(); ++j) {
    const int64_t index = static_cast<int64_t>(batch.features.at(j, 0));
    EXPECT_EQ(batch.features.at(j, 1), static_cast<float>(index) + 0.5f);
    EXPECT_EQ(batch.labels[j], index % kClasses);
    out.push_back(index);
  }
  return out;
}

std::vector<std::vector<int64_t>> Take(BatchSource& source, int n, int64_t first_step = 0) {
  std::vector<std::vector<int64_t>> batches;
  for (int i = 0; i < n; ++i) {
    Batch batch = source.Next();
    EXPECT_EQ(batch.step, first_step + i);
    batches.push_back(Indices(batch));
  }
  return batches;
}

TEST(ShardedBatcherTest, DataShardsTogetherFormTheGlobalBatch) {
  const int64_t kSize = 37;  // not a multiple of any batch: batches straddle epochs
  const int64_t kGlobalBatch = 12;
  const int kSteps = 12;  // 144 examples: ~4 epochs
  auto dataset = IndexDataset(kSize);
  ShardedBatcher global(dataset, AutoShardPolicy::kData, 0, 1, kGlobalBatch, 9, true, 0);
  auto expected = Take(global, kSteps);
  for (int num_shards = 1; num_shards <= 4; ++num_shards) {
    std::vector<std::vector<std::vector<int64_t>>> per_shard;
    for (int shard = 0; shard < num_shards; ++shard) {
      ShardedBatcher batcher(dataset, AutoShardPolicy::kData, shard, num_shards,
                             kGlobalBatch / num_shards, 9, true, 0);
      per_shard.push_back(Take(batcher, kSteps));
    }
    for (int s = 0; s < kSteps; ++s) {
      std::vector<int64_t> merged;
      for (int shard = 0; shard < num_shards; ++shard) {
        ASSERT_EQ(per_shard[shard][s].size(), static_cast<size_t>(kGlobalBatch / num_shards));
        merged.insert(merged.end(), per_shard[shard][s].begin(), per_shard[shard][s].end());
      }
      std::vector<int64_t> want = expected[s];
      std::sort(merged.begin(), merged.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(merged, want) << num_shards << " shards, step " << s;
    }
  }
}

TEST(ShardedBatcherTest, EachEpochIsAFreshPermutation) {
  const int64_t kSize = 20;
  auto dataset = IndexDataset(kSize);
  ShardedBatcher batcher(dataset, AutoShardPolicy::kData, 0, 1, kSize, 5, true, 0);
  auto epochs = Take(batcher, 3);
  std::vector<int64_t> identity(kSize);
  std::iota(identity.begin(), identity.end(), 0);
  for (const auto& epoch : epochs) {
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity);
    EXPECT_NE(epoch, identity);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(ShardedBatcherTest, NoShuffleReadsInOrder) {
  auto dataset = IndexDataset(5);
  ShardedBatcher batcher(dataset, AutoShardPolicy::kData, 0, 1, 3, 5, false, 0);
  EXPECT_THAT(Take(batcher, 3),
              ElementsAreArray(std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 0}, {1, 2, 3}}));
  ShardedBatcher shard1(dataset, AutoShardPolicy::kData, 1, 2, 2, 5, false, 0);
  // Positions 1, 3, 5, 7, ... of 0 1 2 3 4 | 0 1 2 3 4 | ...
  EXPECT_THAT(Take(shard1, 2), ElementsAreArray(std::vector<std::vector<int64_t>>{{1, 3}, {0, 2}}));
}

TEST(ShardedBatcherTest, SameSeedSameStreamOtherSeedOtherStream) {
  auto dataset = IndexDataset(50);
  ShardedBatcher a(dataset, AutoShardPolicy::kData, 0, 1, 10, 1, true, 0);
  ShardedBatcher b(dataset, AutoShardPolicy::kData, 0, 1, 10, 1, true, 0);
  ShardedBatcher c(dataset, AutoShardPolicy::kData, 0, 1, 10, 2, true, 0);
  auto from_a = Take(a, 8);
  EXPECT_EQ(from_a, Take(b, 8));
  EXPECT_NE(from_a, Take(c, 8));
}

TEST(ShardedBatcherTest, OffGivesEveryShardTheSameStream) {
  auto dataset = IndexDataset(23);
  ShardedBatcher reference(dataset, AutoShardPolicy::kOff, 0, 1, 4, 3, true, 0);
  auto expected = Take(reference, 10);
  for (int shard = 0; shard < 3; ++shard) {
    ShardedBatcher batcher(dataset, AutoShardPolicy::kOff, shard, 3, 4, 3, true, 0);
    EXPECT_EQ(Take(batcher, 10), expected) << "shard " << shard;
  }
}

TEST(ShardedBatcherTest, FilePolicyKeepsEveryPositionOfItsOwnDataset) {
  // FILE sharding already split the files; the batcher must not stride again.
  auto dataset = IndexDataset(23);
  ShardedBatcher reference(dataset, AutoShardPolicy::kData, 0, 1, 4, 3, true, 0);
  ShardedBatcher file_shard(dataset, AutoShardPolicy::kFile, 2, 3, 4, 3, true, 0);
  EXPECT_EQ(Take(file_shard, 10), Take(reference, 10));
}

TEST(ShardedBatcherTest, StartStepResumesWhereAnUninterruptedRunWouldBe) {
  auto dataset = IndexDataset(29);
  for (int num_shards : {1, 3}) {
    for (int shard = 0; shard < num_shards; ++shard) {
      ShardedBatcher full(dataset, AutoShardPolicy::kData, shard, num_shards, 5, 77, true, 0);
      auto all = Take(full, 20);
      for (int64_t start : {1, 6, 13, 19}) {
        ShardedBatcher resumed(dataset, AutoShardPolicy::kData, shard, num_shards, 5, 77, true,
                               start);
        auto tail = Take(resumed, static_cast<int>(20 - start), start);
        EXPECT_EQ(tail, std::vector<std::vector<int64_t>>(all.begin() + start, all.end()))
            << "shard " << shard << "/" << num_shards << " start " << start;
      }
    }
  }
}

TEST(ShardedBatcherTest, FarStartStepIsCheap) {
  // Resume at step 10^9 of a 1000-example set: must not replay earlier batches.
  auto dataset = IndexDataset(1000);
  const auto begin = std::chrono::steady_clock::now();
  ShardedBatcher batcher(dataset, AutoShardPolicy::kData, 1, 2, 8, 1, true, 1'000'000'000);
  Batch batch = batcher.Next();
  EXPECT_EQ(batch.step, 1'000'000'000);
  EXPECT_EQ(batch.labels.size(), 8u);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(1));
}

TEST(ShardedBatcherTest, BatchLargerThanDatasetWrapsAcrossEpochs) {
  auto dataset = IndexDataset(3);
  ShardedBatcher batcher(dataset, AutoShardPolicy::kData, 0, 1, 7, 4, true, 0);
  auto batch = Take(batcher, 1)[0];
  ASSERT_EQ(batch.size(), 7u);
  std::vector<int> counts(3);
  for (int64_t i : batch) ++counts[i];
  // Epochs 0 and 1 complete, plus one example of epoch 2.
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int>{2, 2, 3}));
}

// Counts batches; optionally blocks in Next() until released.
class CountingSource : public BatchSource {
 public:
  Batch Next() override {
    Batch batch;
    batch.step = produced_.fetch_add(1);
    batch.features = Tensor({1, 1}, static_cast<float>(batch.step));
    batch.labels = {static_cast<int32_t>(batch.step)};
    return batch;
  }
  int64_t produced() const { return produced_.load(); }

 private:
  std::atomic<int64_t> produced_{0};
};

TEST(PrefetchingBatchSourceTest, YieldsTheSameSequenceAsTheInnerSource) {
  auto dataset = IndexDataset(31);
  ShardedBatcher direct(dataset, AutoShardPolicy::kData, 1, 2, 4, 8, true, 3);
  auto expected = Take(direct, 25, 3);
  PrefetchingBatchSource prefetched(
      std::make_unique<ShardedBatcher>(dataset, AutoShardPolicy::kData, 1, 2, 4, 8, true, 3), 3);
  EXPECT_EQ(Take(prefetched, 25, 3), expected);
}

TEST(PrefetchingBatchSourceTest, KeepsAtMostDepthBatchesReady) {
  auto inner = std::make_unique<CountingSource>();
  CountingSource* counter = inner.get();
  PrefetchingBatchSource source(std::move(inner), 2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (counter->produced() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The producer asks the inner source only when the queue has room.
  EXPECT_EQ(counter->produced(), 2);
  EXPECT_EQ(source.Next().step, 0);
  EXPECT_EQ(source.Next().step, 1);
  EXPECT_EQ(source.Next().step, 2);
}

// Runs `fn` on a detached thread and reports whether it finished in time, so
// a hang fails the test instead of stalling the suite.
bool FinishesWithin(std::function<void()> fn, std::chrono::milliseconds limit) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> future = done->get_future();
  std::thread([fn = std::move(fn), done] {
    fn();
    done->set_value();
  }).detach();
  return future.wait_for(limit) == std::future_status::ready;
}

TEST(PrefetchingBatchSourceTest, DestructionWhileProducerIsBlockedDoesNotHang) {
  auto* source = new PrefetchingBatchSource(std::make_unique<CountingSource>(), 1);
  EXPECT_EQ(source->Next().step, 0);
  std::this_thread::sleep_for(
      std::chrono::milliseconds(20));  // producer refills and blocks on the full queue
  EXPECT_TRUE(FinishesWithin([source] { delete source; }, std::chrono::seconds(5)));
}

TEST(PrefetchingBatchSourceTest, DestructionBeforeAnyNextDoesNotHang) {
  EXPECT_TRUE(FinishesWithin(
      [] {
        for (int i = 0; i < 50; ++i)
          PrefetchingBatchSource source(std::make_unique<CountingSource>(), 2);
      },
      std::chrono::seconds(5)));
}

}  // namespace
}  // namespace distrain

// The CUDA backend's caching allocator over a host fake of cudaMalloc: a
// training loop that frees and reallocates the same sizes every step reaches
// the raw allocator only while its working set grows, and running out of
// memory empties the cache before giving up.
#include "worker/tensor/cuda/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <vector>

namespace distrain::cuda {
namespace {

// malloc with a capacity, counting calls; shared with the test through a
// raw pointer (the allocator owns it).
class FakeDeviceMemory : public RawAllocator {
 public:
  explicit FakeDeviceMemory(size_t capacity) : capacity_(capacity) {}
  void* Allocate(size_t bytes) override {
    ++allocations;
    if (used + bytes > capacity_) return nullptr;
    used += bytes;
    void* block = std::malloc(bytes);
    live.insert(block);
    return block;
  }
  void Free(void* block, size_t bytes) override {
    ++frees;
    used -= bytes;
    live.erase(block);
    std::free(block);
  }
  int allocations = 0;
  int frees = 0;
  size_t used = 0;
  std::set<void*> live;

 private:
  const size_t capacity_;
};

struct Fixture {
  explicit Fixture(size_t capacity) {
    auto raw = std::make_unique<FakeDeviceMemory>(capacity);
    fake = raw.get();
    allocator = std::make_unique<CachingAllocator>(std::move(raw));
  }
  FakeDeviceMemory* fake;
  std::unique_ptr<CachingAllocator> allocator;
};

TEST(CachingAllocatorTest, ASteadyTrainingLoopStopsCallingTheRawAllocatorAfterItsFirstStep) {
  Fixture f(size_t{1} << 30);
  const std::vector<size_t> step_sizes = {784 * 256 * 4, 1024 * 256 * 4, 10 * 256 * 4, 40, 4096};
  for (int step = 0; step < 50; ++step) {
    std::vector<void*> blocks;
    for (size_t bytes : step_sizes) {
      void* block = f.allocator->Allocate(bytes);
      ASSERT_NE(block, nullptr);
      blocks.push_back(block);
    }
    for (size_t i = 0; i < blocks.size(); ++i) f.allocator->Free(blocks[i], step_sizes[i]);
  }
  EXPECT_EQ(f.fake->allocations, static_cast<int>(step_sizes.size()));
  const CachingAllocator::Stats stats = f.allocator->stats();
  EXPECT_EQ(stats.raw_allocations, static_cast<int64_t>(step_sizes.size()));
  EXPECT_EQ(stats.cache_hits, static_cast<int64_t>(49 * step_sizes.size()));
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_GE(stats.peak_bytes_in_use, 784u * 256 * 4 + 1024u * 256 * 4);
}

TEST(CachingAllocatorTest, BlocksInUseAreNeverHandedOutTwice) {
  Fixture f(size_t{1} << 30);
  std::set<void*> seen;
  for (int i = 0; i < 100; ++i) {
    void* block = f.allocator->Allocate(1000);
    ASSERT_TRUE(seen.insert(block).second) << "block " << i << " handed out while in use";
  }
}

TEST(CachingAllocatorTest, SizesRoundToClassesWithBoundedWaste) {
  EXPECT_EQ(CachingAllocator::RoundedSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundedSize(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundedSize((size_t{1} << 20) + 1), (size_t{1} << 20) + (128 << 10));
  for (size_t bytes : {size_t{3}, size_t{700}, size_t{123457}, size_t{5} << 20, size_t{987654321}}) {
    const size_t rounded = CachingAllocator::RoundedSize(bytes);
    EXPECT_GE(rounded, bytes);
    EXPECT_LT(rounded - bytes, std::max<size_t>(512, bytes / 8)) << bytes;
  }
}

TEST(CachingAllocatorTest, RunningOutOfMemoryEmptiesTheCacheAndRetriesBeforeFailing) {
  Fixture f(4 << 20);  // a 4 MiB "device"
  void* a = f.allocator->Allocate(3 << 20);
  ASSERT_NE(a, nullptr);
  f.allocator->Free(a, 3 << 20);  // cached: the device still holds 3 MiB
  // 2 MiB does not fit beside the cached block; the cache is released and
  // the request succeeds.
  void* b = f.allocator->Allocate(2 << 20);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(f.fake->frees, 1);
  EXPECT_EQ(f.allocator->stats().bytes_cached, 0u);
  // More than the device has fails cleanly: nullptr, and the block in use
  // is still the only one the device holds.
  EXPECT_EQ(f.allocator->Allocate(8 << 20), nullptr);
  EXPECT_EQ(f.fake->live.size(), 1u);
  EXPECT_EQ(f.allocator->stats().bytes_in_use, size_t{2} << 20);
  f.allocator->Free(b, 2 << 20);
  f.allocator->ReleaseCached();
  EXPECT_TRUE(f.fake->live.empty());
}

TEST(CachingAllocatorTest, DestructionReturnsEveryCachedBlockToTheDevice) {
  // The fake dies with the allocator, so its ledger lives here.
  struct Ledger : FakeDeviceMemory {
    Ledger(int* frees_out) : FakeDeviceMemory(size_t{1} << 30), frees_out(frees_out) {}
    void Free(void* block, size_t bytes) override {
      ++*frees_out;
      FakeDeviceMemory::Free(block, bytes);
    }
    int* frees_out;
  };
  int frees = 0;
  {
    CachingAllocator allocator(std::make_unique<Ledger>(&frees));
    for (size_t bytes : {size_t{100}, size_t{5000}, size_t{2} << 20}) {
      allocator.Free(allocator.Allocate(bytes), bytes);
    }
    EXPECT_EQ(frees, 0) << "freed blocks stay cached while the allocator lives";
  }
  EXPECT_EQ(frees, 3);
}

}  // namespace
}  // namespace distrain::cuda

#include "worker/tensor/cuda/caching_allocator.h"

#include <algorithm>

namespace distrain::cuda {
namespace {
constexpr size_t kSmallGranule = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{128} << 10;

size_t RoundUp(size_t n, size_t granule) { return (n + granule - 1) / granule * granule; }
}  // namespace

size_t CachingAllocator::RoundedSize(size_t bytes) {
  return bytes <= kSmallLimit ? RoundUp(bytes, kSmallGranule) : RoundUp(bytes, kLargeGranule);
}

CachingAllocator::~CachingAllocator() { ReleaseCached(); }

void* CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = RoundedSize(bytes);
  absl::MutexLock lock(&mu_);
  void* block = nullptr;
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= size;
    ++stats_.cache_hits;
  } else {
    block = raw_->Allocate(size);
    if (block == nullptr && stats_.bytes_cached > 0) {
      ReleaseCachedLocked();
      block = raw_->Allocate(size);
    }
    if (block == nullptr) return nullptr;
    ++stats_.raw_allocations;
  }
  stats_.bytes_in_use += size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return block;
}

void CachingAllocator::Free(void* block, size_t bytes) {
  if (block == nullptr) return;
  const size_t size = RoundedSize(bytes);
  absl::MutexLock lock(&mu_);
  free_[size].push_back(block);
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
}

void CachingAllocator::ReleaseCached() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  for (auto& [size, blocks] : free_) {
    for (void* block : blocks) raw_->Free(block, size);
  }
  free_.clear();
  stats_.bytes_cached = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace distrain::cuda

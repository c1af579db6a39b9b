#ifndef DISTRAIN_WORKER_TENSOR_CUDA_CACHING_ALLOCATOR_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_CACHING_ALLOCATOR_H_

// A caching allocator over a raw allocator (cudaMalloc on a device; a test's
// malloc on the host). cudaMalloc and cudaFree synchronise the whole device
// and cost tens of microseconds, while a training step frees and reallocates
// the same activation and gradient sizes every step; so freed blocks are kept
// in per-size free lists and handed out again, and the raw allocator is
// called only while the working set still grows (docs/architecture.md §6a).
//
// Sizes are rounded to a class: multiples of 512 bytes up to 1 MiB, of
// 128 KiB above, so a block is reused only by requests of its own class
// (waste under 512 B or 12.5%, and no splitting or coalescing to get wrong).
// When the raw allocator fails, every cached block is returned to it and the
// request is retried once.
//
// Stream order: a freed block may still be read by kernels queued before the
// Free. That is safe because every user of a device's blocks queues on the
// same compute stream, so the next owner's kernels run after them; a block
// handed to another stream (NCCL's) stays owned until that stream is done.
//
// Thread-safety: all methods are safe from any thread (one mutex).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace distrain::cuda {

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // nullptr when the memory is not there.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* block, size_t bytes) = 0;
};

class CachingAllocator {
 public:
  struct Stats {
    size_t bytes_in_use = 0;     // handed out, not yet freed
    size_t bytes_cached = 0;     // freed, kept for reuse
    size_t peak_bytes_in_use = 0;
    int64_t raw_allocations = 0;  // calls that reached the raw allocator
    int64_t cache_hits = 0;
  };

  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw) : raw_(std::move(raw)) {}
  ~CachingAllocator();  // returns the cached blocks; blocks in use are the owners' bug
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr only when the raw allocator fails even with the cache emptied.
  // `bytes` == 0 returns nullptr.
  void* Allocate(size_t bytes);
  // `bytes` as passed to the Allocate that returned `block`.
  void Free(void* block, size_t bytes);
  // Returns every cached block to the raw allocator.
  void ReleaseCached();
  Stats stats() const;

  static size_t RoundedSize(size_t bytes);

 private:
  void ReleaseCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<RawAllocator> raw_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_CACHING_ALLOCATOR_H_

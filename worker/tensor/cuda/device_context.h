#ifndef DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_CONTEXT_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_CONTEXT_H_

// The CUDA backend's per-device state (docs/architecture.md §6a), for the
// backend's own files only (it includes CUDA, cuBLAS and cuDNN headers; host
// code uses device_memory.h and ops.h).
//
// One DeviceContext per visible device, created on first use and kept for
// the process. It owns:
//   * the compute stream, on which every op, copy and fill of the device is
//     queued, in the order the host issues them;
//   * the communication stream, on which NCCL all-reduces run while the
//     compute stream goes on with backward (the strategy orders the two with
//     events);
//   * a cuBLAS and a cuDNN handle bound to the compute stream;
//   * the caching allocator of the device (caching_allocator.h);
//   * a scratch buffer for cuDNN workspaces and reductions (stream-ordered:
//     reused by the next op on the same stream);
//   * a pinned host staging buffer for transfers from pageable memory.
//
// Thread-safety: Get() and the allocator are safe from any thread. An op's
// kernels run on the compute stream whichever host thread queues them; the
// handles and the scratch buffer are used under the context's op lock
// (OpLock), since cuBLAS and cuDNN handles must not be used by two host
// threads at once. Strategies run one replica thread per device, so the lock
// is uncontended in practice.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "worker/tensor/cuda/caching_allocator.h"
#include "worker/tensor/cuda/cuda_library_api.h"

#define DISTRAIN_CUDA_CHECK(expr)                                                         \
  do {                                                                                    \
    const cudaError_t distrain_cuda_status_ = (expr);                                     \
    DISTRAIN_CHECK(distrain_cuda_status_ == cudaSuccess)                                  \
        << #expr << ": " << cudaGetErrorName(distrain_cuda_status_) << " ("              \
        << cudaGetErrorString(distrain_cuda_status_) << ")";                              \
  } while (0)

#define DISTRAIN_CUBLAS_CHECK(expr)                                                        \
  do {                                                                                     \
    const cublasStatus_t distrain_cublas_status_ = (expr);                                 \
    DISTRAIN_CHECK(distrain_cublas_status_ == CUBLAS_STATUS_SUCCESS)                       \
        << #expr << ": " << Cublas().cublasGetStatusName(distrain_cublas_status_);                  \
  } while (0)

#define DISTRAIN_CUDNN_CHECK(expr)                                                         \
  do {                                                                                     \
    const cudnnStatus_t distrain_cudnn_status_ = (expr);                                   \
    DISTRAIN_CHECK(distrain_cudnn_status_ == CUDNN_STATUS_SUCCESS)                         \
        << #expr << ": " << Cudnn().cudnnGetErrorString(distrain_cudnn_status_);                   \
  } while (0)

namespace distrain::cuda {

class DeviceContext {
 public:
  // The context of `device` (an ordinal below VisibleDeviceCount()); makes it
  // the calling thread's current device.
  static DeviceContext& Get(int device);

  int device() const { return device_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t comm_stream() const { return comm_; }
  CachingAllocator& allocator() { return *allocator_; }

  // Held while an op uses the handles or the scratch buffer.
  absl::Mutex& op_mutex() ABSL_LOCK_RETURNED(op_mu_) { return op_mu_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // At least `bytes` of device memory, valid for kernels queued on the
  // compute stream until the next Scratch call; caller holds op_mutex().
  void* Scratch(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);

  // Held by NcclCollective from queuing an operation on comm_stream() until
  // that stream has drained it (or the operation was aborted), and around
  // every cudaFree of this device's memory (the caching allocator's raw
  // frees, Scratch growth). cudaFree waits for the whole device, NCCL
  // kernel included, and that kernel waits for the peers' kernels, which
  // other threads of this process launch on other devices: NCCL documents
  // that a CUDA call blocking between those launches deadlocks the group
  // (docs/architecture.md §6a, "NCCL and device memory"). Under this lock a
  // cudaFree finds no NCCL kernel of its device in flight, and waits for
  // compute kernels only. Lock order: op_mutex() and the allocator's lock
  // before this one; nothing is acquired while holding it but the NCCL
  // collective's own state lock.
  absl::Mutex& nccl_mutex() ABSL_LOCK_RETURNED(nccl_mu_) { return nccl_mu_; }

  // Pinned host memory of at least `bytes` for one staged transfer; the
  // caller holds staging_mutex() until the copy that reads or fills it has
  // completed (the transfer functions synchronise before releasing it).
  absl::Mutex& staging_mutex() ABSL_LOCK_RETURNED(staging_mu_) { return staging_mu_; }
  void* Staging(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);
  size_t staging_capacity() const { return kStagingBytes; }

  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

 private:
  // Transfers larger than this are staged in pieces (double-buffered would be
  // the next step; one 8 MiB piece already reaches most of PCIe's rate).
  static constexpr size_t kStagingBytes = size_t{8} << 20;

  explicit DeviceContext(int device);

  const int device_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_ = nullptr;
  absl::Mutex nccl_mu_;  // before allocator_, whose raw frees take it
  std::unique_ptr<CachingAllocator> allocator_;
  absl::Mutex op_mu_;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* scratch_ ABSL_GUARDED_BY(op_mu_) = nullptr;
  size_t scratch_bytes_ ABSL_GUARDED_BY(op_mu_) = 0;
  absl::Mutex staging_mu_;
  void* staging_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
};

// Launch geometry for an element-wise kernel over n elements.
inline unsigned BlocksFor(int64_t n, unsigned threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  // Grid-stride loops cover the rest; 65535 * 256 threads saturate any GPU.
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_CONTEXT_H_

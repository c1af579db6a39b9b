// DeviceContext (device_context.h) and the storage/transfer functions of
// device_memory.h that Tensor calls. Host code: CUDA runtime API only.

#include "worker/tensor/cuda/device_context.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "worker/tensor/cuda/backend.h"
#include "worker/tensor/cuda/device_memory.h"

namespace distrain::cuda {
namespace {

// cudaMalloc/cudaFree on one device, for the caching allocator.
class CudaRawAllocator : public RawAllocator {
 public:
  // `nccl_mu`: the device context's nccl_mutex(), held around cudaFree.
  CudaRawAllocator(int device, absl::Mutex* nccl_mu) : device_(device), nccl_mu_(nccl_mu) {}
  void* Allocate(size_t bytes) override {
    DISTRAIN_CUDA_CHECK(cudaSetDevice(device_));
    void* block = nullptr;
    const cudaError_t status = cudaMalloc(&block, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls see success
      return nullptr;
    }
    DISTRAIN_CUDA_CHECK(status);
    return block;
  }
  void Free(void* block, size_t) override {
    DISTRAIN_CUDA_CHECK(cudaSetDevice(device_));
    // cudaFree waits for the device, so a block still read by queued
    // kernels is never handed back to the driver early. It runs only while
    // no NCCL operation of the device is in flight (nccl_mutex(),
    // device_context.h): waiting on an NCCL kernel here could deadlock.
    absl::MutexLock lock(nccl_mu_);
    DISTRAIN_CUDA_CHECK(cudaFree(block));
  }

 private:
  const int device_;
  absl::Mutex* const nccl_mu_;
};

constexpr int kMaxDevices = 64;

struct Registry {
  absl::Mutex mu;
  std::array<std::unique_ptr<DeviceContext>, kMaxDevices> contexts ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: contexts outlive static dtors
  return *registry;
}

}  // namespace

DeviceContext::DeviceContext(int device)
    : device_(device), allocator_(std::make_unique<CachingAllocator>(
                           std::make_unique<CudaRawAllocator>(device, &nccl_mu_))) {
  DISTRAIN_CUDA_CHECK(cudaSetDevice(device));
  // Non-blocking: neither stream synchronises with the legacy default stream,
  // which a library or a test might use.
  DISTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  DISTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasCreate(&cublas_));
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasSetStream(cublas_, compute_));
  // FP32 GEMMs stay FP32: TF32 would change results by ~1e-3 relative, and
  // the GPU must equal the CPU within 1e-4 (mixed precision is opt-in).
  DISTRAIN_CUBLAS_CHECK(Cublas().cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnCreate(&cudnn_));
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetStream(cudnn_, compute_));
}

DeviceContext& DeviceContext::Get(int device) {
  DISTRAIN_CHECK(device >= 0 && device < kMaxDevices) << "CUDA device ordinal " << device;
  Registry& registry = GetRegistry();
  DeviceContext* context = nullptr;
  {
    absl::MutexLock lock(&registry.mu);
    std::unique_ptr<DeviceContext>& slot = registry.contexts[device];
    if (slot == nullptr) {
      DISTRAIN_CHECK(device < VisibleDeviceCount())
          << "CUDA device " << device << " is not visible to this process ("
          << VisibleDeviceCount() << " visible; CUDA_VISIBLE_DEVICES selects them)";
      slot.reset(new DeviceContext(device));
    }
    context = slot.get();
  }
  DISTRAIN_CUDA_CHECK(cudaSetDevice(device));
  return *context;
}

void* DeviceContext::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Queued kernels may still use the old buffer: wait for them before
  // giving it back (growth happens on the first steps only).
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_));
  if (scratch_ != nullptr) {
    // Growth happens during the first steps' backward passes, while the
    // gradient buckets' all-reduces run: wait for the one in flight first
    // (nccl_mutex(), device_context.h).
    absl::MutexLock nccl_lock(&nccl_mu_);
    DISTRAIN_CUDA_CHECK(cudaFree(scratch_));
  }
  scratch_ = nullptr;
  const size_t rounded = CachingAllocator::RoundedSize(bytes);
  DISTRAIN_CUDA_CHECK(cudaMalloc(&scratch_, rounded));
  scratch_bytes_ = rounded;
  return scratch_;
}

void* DeviceContext::Staging(size_t bytes) {
  DISTRAIN_CHECK(bytes <= kStagingBytes) << "staging piece of " << bytes << " bytes";
  if (staging_ == nullptr) DISTRAIN_CUDA_CHECK(cudaMallocHost(&staging_, kStagingBytes));
  return staging_;
}

// ---- device_memory.h ----------------------------------------------------------------

int VisibleDeviceCount() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

float* AllocateFloats(int device, int64_t count) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  void* block = ctx.allocator().Allocate(bytes);
  if (block == nullptr) {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    const CachingAllocator::Stats stats = ctx.allocator().stats();
    DISTRAIN_CHECK(false) << "GPU:" << device << " is out of memory allocating " << bytes
                          << " bytes (" << stats.bytes_in_use << " in use by distrain, "
                          << free_bytes << " of " << total_bytes
                          << " free on the device); lower spec.training.globalBatchSize or "
                             "use more replicas";
  }
  return static_cast<float*>(block);
}

void FreeFloats(int device, float* block, int64_t count) {
  DeviceContext::Get(device).allocator().Free(block,
                                              static_cast<size_t>(count) * sizeof(float));
}

namespace {

// A host<->device transfer piece by piece through the device's pinned
// staging buffer: the copy engine reads and writes pinned memory at full
// speed, and the host's memcpy into or out of it is the only extra pass.
// Each piece waits for its copy, since the next piece (and the next call)
// reuses the buffer.
void StagedCopy(int device, const float* host_src, float* host_dst, const float* device_src,
                float* device_dst, int64_t count) {
  DeviceContext& ctx = DeviceContext::Get(device);
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  const bool to_device = device_dst != nullptr;
  absl::MutexLock lock(&ctx.staging_mutex());
  for (size_t done = 0; done < bytes;) {
    const size_t piece = std::min(bytes - done, ctx.staging_capacity());
    char* staging = static_cast<char*>(ctx.Staging(piece));
    if (to_device) {
      std::memcpy(staging, reinterpret_cast<const char*>(host_src) + done, piece);
      DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(device_dst) + done, staging,
                                          piece, cudaMemcpyHostToDevice, ctx.compute_stream()));
    } else {
      DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(staging, reinterpret_cast<const char*>(device_src) + done,
                                          piece, cudaMemcpyDeviceToHost, ctx.compute_stream()));
    }
    DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
    if (!to_device) std::memcpy(reinterpret_cast<char*>(host_dst) + done, staging, piece);
    done += piece;
  }
}

}  // namespace

void CopyHostToDevice(int device, const float* host, float* dst, int64_t count) {
  StagedCopy(device, host, nullptr, nullptr, dst, count);
}

void CopyDeviceToHost(int device, const float* src, float* host, int64_t count) {
  StagedCopy(device, nullptr, host, src, nullptr, count);
}

void CopyDeviceToDevice(int src_device, const float* src, int dst_device, float* dst,
                        int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (src_device == dst_device) {
    DeviceContext& ctx = DeviceContext::Get(dst_device);
    DISTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.compute_stream()));
    return;
  }
  // Across devices: the source's pending writes must land first, then a
  // peer copy on the destination's stream (CUDA stages it through the host
  // where the devices have no peer path). It completes before returning, so
  // later work on the source's stream cannot overwrite what is being read;
  // the strategies' hot paths move gradients with NCCL, not with this.
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(DeviceContext::Get(src_device).compute_stream()));
  DeviceContext& dst_ctx = DeviceContext::Get(dst_device);
  DISTRAIN_CUDA_CHECK(
      cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, dst_ctx.compute_stream()));
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(dst_ctx.compute_stream()));
}

float* AllocatePinnedFloats(int64_t count) {
  void* block = nullptr;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  const cudaError_t err = cudaMallocHost(&block, bytes);
  DISTRAIN_CHECK(err == cudaSuccess)
      << "cannot lock " << bytes << " bytes of host memory for GPU transfers: "
      << cudaGetErrorString(err);
  return static_cast<float*>(block);
}

void FreePinnedFloats(float* block) {
  if (block != nullptr) (void)cudaFreeHost(block);
}

void CopyDeviceToPinnedAsync(int device, const float* src, float* pinned_dst, int64_t count) {
  if (count <= 0) return;
  DeviceContext& ctx = DeviceContext::Get(device);
  DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(pinned_dst, src, static_cast<size_t>(count) * sizeof(float),
                                      cudaMemcpyDeviceToHost, ctx.compute_stream()));
}

void CopyPinnedToDeviceAsync(int device, const float* pinned_src, float* dst, int64_t count) {
  if (count <= 0) return;
  DeviceContext& ctx = DeviceContext::Get(device);
  DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, static_cast<size_t>(count) * sizeof(float),
                                      cudaMemcpyHostToDevice, ctx.compute_stream()));
}

void FillFloats(int device, float* dst, int64_t count, float value) {
  Fill(device, count, value, dst);
}

void Synchronize(int device) {
  DeviceContext& ctx = DeviceContext::Get(device);
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
  DISTRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
}

}  // namespace distrain::cuda

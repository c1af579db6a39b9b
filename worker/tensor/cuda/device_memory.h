#ifndef DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_MEMORY_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_MEMORY_H_

// Device storage and transfers for Tensor (worker/tensor/tensor.h), as plain
// C++ so that host code never includes CUDA headers. Implemented in
// device_context.cc (a CUDA build only: DISTRAIN_HAVE_CUDA).
//
// Ordering (docs/architecture.md §6a): everything here is queued on the
// device's compute stream, like every op, so a tensor's lifetime on the host
// never races its kernels. Transfers to the host wait for that stream: they
// are the synchronisation points of a step (the loss, metrics, checkpoints).
//
// Thread-safety: every function is safe from any thread; the allocator of
// each device is locked.

#include <cstdint>

namespace distrain::cuda {

// Devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 without a
// driver or GPU — never an error.
int VisibleDeviceCount();

// `count` floats from the device's caching allocator; CHECK-fails naming the
// device and the size when the device is out of memory even after the
// allocator returned its cached blocks.
float* AllocateFloats(int device, int64_t count);
// Returns a block from AllocateFloats (same device and count) to the cache.
void FreeFloats(int device, float* block, int64_t count);

// Copies queued on the destination's compute stream (device to host: the
// source's, then waits). Host memory may be pageable: transfers are staged
// through the device's pinned buffers. Device to device crosses devices by
// peer copy where CUDA allows it.
void CopyHostToDevice(int device, const float* host, float* dst, int64_t count);
void CopyDeviceToHost(int device, const float* src, float* host, int64_t count);
void CopyDeviceToDevice(int src_device, const float* src, int dst_device, float* dst,
                        int64_t count);
void FillFloats(int device, float* dst, int64_t count, float value);

// Page-locked host memory (cudaMallocHost): the copy engine reads and writes
// it directly, so transfers to and from it are queued without a staging pass
// and without waiting. CHECK-fails when the host cannot lock that much.
float* AllocatePinnedFloats(int64_t count);
void FreePinnedFloats(float* block);
// Transfers between device memory and pinned host memory, queued on the
// device's compute stream after everything before them; they return at once.
// Until Synchronize(device) returns, the host must not read `pinned_dst`, nor
// change `pinned_src`.
void CopyDeviceToPinnedAsync(int device, const float* src, float* pinned_dst, int64_t count);
void CopyPinnedToDeviceAsync(int device, const float* pinned_src, float* dst, int64_t count);

// Waits until everything queued on the device's streams has run.
void Synchronize(int device);

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_MEMORY_H_

#include "worker/tensor/cuda/topology.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/tensor/cuda/device_context.h"
#include "worker/tensor/cuda/device_memory.h"

namespace distrain::cuda {
namespace {

constexpr size_t kBytes = size_t{64} << 20;
constexpr int kRepeats = 3;

// Best GB/s over kRepeats of `copy`, queued on `stream` between two events.
template <typename Copy>
double BestGbps(cudaStream_t stream, Copy copy) {
  cudaEvent_t start, stop;
  DISTRAIN_CUDA_CHECK(cudaEventCreate(&start));
  DISTRAIN_CUDA_CHECK(cudaEventCreate(&stop));
  copy();  // warm-up: first touches, peer mappings
  float best_ms = 0;
  for (int i = 0; i < kRepeats; ++i) {
    DISTRAIN_CUDA_CHECK(cudaEventRecord(start, stream));
    copy();
    DISTRAIN_CUDA_CHECK(cudaEventRecord(stop, stream));
    DISTRAIN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DISTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i == 0 || ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms > 0 ? static_cast<double>(kBytes) / (best_ms * 1e-3) / 1e9 : 0.0;
}

}  // namespace

std::string MeasuredTopology::ToString() const {
  if (gpus == 0) return "no GPU visible to this process (CUDA_VISIBLE_DEVICES, driver)";
  std::string out = absl::StrCat(gpus, gpus == 1 ? " GPU" : " GPUs");
  if (host_device_gbps) absl::StrAppend(&out, absl::StrFormat(", host<->GPU %.1f GB/s", *host_device_gbps));
  if (device_device_gbps) {
    absl::StrAppend(&out, absl::StrFormat(", GPU<->GPU %.1f GB/s (%s)", *device_device_gbps,
                                          all_pairs_peer ? "peer" : "some pairs staged via host"));
  }
  return out;
}

MeasuredTopology MeasureTopology() {
  MeasuredTopology t;
  t.gpus = VisibleDeviceCount();
  if (t.gpus == 0) return t;
  void* host = nullptr;
  DISTRAIN_CUDA_CHECK(cudaMallocHost(&host, kBytes));
  std::vector<void*> buffers(t.gpus, nullptr);
  for (int d = 0; d < t.gpus; ++d) {
    DeviceContext::Get(d);
    DISTRAIN_CUDA_CHECK(cudaMalloc(&buffers[d], kBytes));
  }
  // Host <-> device, the slowest GPU.
  for (int d = 0; d < t.gpus; ++d) {
    const cudaStream_t s = DeviceContext::Get(d).compute_stream();
    const double to = BestGbps(s, [&] {
      DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(buffers[d], host, kBytes, cudaMemcpyHostToDevice, s));
    });
    const double from = BestGbps(s, [&] {
      DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, buffers[d], kBytes, cudaMemcpyDeviceToHost, s));
    });
    const double mean = (to + from) / 2;
    t.host_device_gbps = t.host_device_gbps ? std::min(*t.host_device_gbps, mean) : mean;
  }
  // Device <-> device, the slowest pair.
  t.all_pairs_peer = t.gpus > 1;
  for (int a = 0; a < t.gpus; ++a) {
    for (int b = a + 1; b < t.gpus; ++b) {
      int peer = 0;
      DISTRAIN_CUDA_CHECK(cudaDeviceCanAccessPeer(&peer, a, b));
      const cudaStream_t s = DeviceContext::Get(a).compute_stream();
      double gbps = 0;
      if (peer) {
        const cudaError_t enabled = cudaDeviceEnablePeerAccess(b, 0);
        if (enabled == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else DISTRAIN_CUDA_CHECK(enabled);
        gbps = BestGbps(s, [&] {
          DISTRAIN_CUDA_CHECK(cudaMemcpyPeerAsync(buffers[b], b, buffers[a], a, kBytes, s));
        });
      } else {
        t.all_pairs_peer = false;
        gbps = BestGbps(s, [&] {
          DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, buffers[a], kBytes, cudaMemcpyDeviceToHost, s));
          DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(buffers[b], host, kBytes, cudaMemcpyHostToDevice, s));
        });
      }
      t.device_device_gbps = t.device_device_gbps ? std::min(*t.device_device_gbps, gbps) : gbps;
    }
  }
  for (int d = 0; d < t.gpus; ++d) {
    DeviceContext::Get(d);
    cudaFree(buffers[d]);
  }
  cudaFreeHost(host);
  return t;
}

}  // namespace distrain::cuda

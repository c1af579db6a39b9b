#ifndef DISTRAIN_WORKER_TENSOR_CUDA_TOPOLOGY_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_TOPOLOGY_H_

// What spec.strategy: Auto decides on, measured (docs/architecture.md §6a):
// the copy bandwidths between the host and the visible GPUs and between the
// GPUs, the two numbers of the seeds' rule "CentralStorage when CPU<->GPU is
// faster than GPU<->GPU, else Mirrored" (common/auto_strategy.h). Plain C++;
// implemented with the CUDA runtime in topology.cc (CUDA builds only).
//
// How, per figure (best of a few repeats of a 64 MiB copy, timed with CUDA
// events on the device's compute stream, so only the copy is timed):
//   * host <-> device: pinned host memory to and from each GPU, the mean of
//     the two directions, the slowest GPU's figure (every replica's copies
//     must go through its own link);
//   * device <-> device: for every pair, a peer copy where
//     cudaDeviceCanAccessPeer allows it (NVLink or PCIe peer), else staged
//     through pinned host memory (what a copy between them costs then); the
//     slowest pair's figure (an all-reduce is as fast as its slowest link).
// Takes a fraction of a second; called once at start.
//
// Thread-safety: call from one thread; it uses every device's compute stream.

#include <optional>
#include <string>

namespace distrain::cuda {

struct MeasuredTopology {
  int gpus = 0;
  std::optional<double> host_device_gbps;    // none without a GPU
  std::optional<double> device_device_gbps;  // none with fewer than two GPUs
  bool all_pairs_peer = false;               // every pair copies peer to peer
  std::string ToString() const;              // "2 GPUs, host<->GPU 51.2 GB/s, ..."
};

MeasuredTopology MeasureTopology();

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_TOPOLOGY_H_

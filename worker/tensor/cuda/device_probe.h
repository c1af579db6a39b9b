#ifndef DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_

// What the CUDA build can see. Compiled only when CMake found a CUDA toolkit
// and NCCL (DISTRAIN_HAVE_CUDA); this translation unit is the proof that the
// toolchain builds device code and links cudart + NCCL. The CUDA tensor
// kernels and the NCCL collective build on it.

#include <string>

namespace distrain::cuda {

struct DeviceInfo {
  int device_count = 0;         // 0 when no driver/GPU is present
  int nccl_version = 0;         // e.g. 23203 for 2.32.3
  int runtime_version = 0;      // e.g. 13050
  std::string error;            // why device_count is 0, if known
};

DeviceInfo Probe();

// y[i] += alpha * x[i] on device 0 for host vectors (copies in and out).
// Returns false and fills `error` when no GPU is usable.
bool AxpyOnDevice(float alpha, const float* x, float* y, int n, std::string* error);

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_

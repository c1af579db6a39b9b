#ifndef DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_

// What the CUDA build can see. Compiled only when CMake found a CUDA toolkit
// (DISTRAIN_HAVE_CUDA); this translation unit is the proof that the toolchain
// builds device code and links the CUDA runtime (statically). Needs none of
// the libraries loaded at run time (cuda_libraries.h): a CPU image counts
// GPUs too.

#include <string>

namespace distrain::cuda {

struct DeviceInfo {
  int device_count = 0;         // 0 when no driver/GPU is present
  int runtime_version = 0;      // e.g. 13050
  std::string error;            // why device_count is 0, if known
};

DeviceInfo Probe();

// y[i] += alpha * x[i] on device 0 for host vectors (copies in and out).
// Returns false and fills `error` when no GPU is usable.
bool AxpyOnDevice(float alpha, const float* x, float* y, int n, std::string* error);

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_DEVICE_PROBE_H_

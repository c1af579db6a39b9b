#include "worker/tensor/cuda/device_probe.h"

#include <cuda_runtime.h>

namespace distrain::cuda {
namespace {

__global__ void AxpyKernel(float alpha, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += alpha * x[i];
}

}  // namespace

DeviceInfo Probe() {
  DeviceInfo info;
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess) {
    info.device_count = 0;
    info.error = cudaGetErrorString(err);
  }
  return info;
}

bool AxpyOnDevice(float alpha, const float* x, float* y, int n, std::string* error) {
  float* dx = nullptr;
  float* dy = nullptr;
  auto fail = [&](cudaError_t e) {
    *error = cudaGetErrorString(e);
    cudaFree(dx);
    cudaFree(dy);
    return false;
  };
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (cudaError_t e = cudaMalloc(&dx, bytes); e != cudaSuccess) return fail(e);
  if (cudaError_t e = cudaMalloc(&dy, bytes); e != cudaSuccess) return fail(e);
  if (cudaError_t e = cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) return fail(e);
  if (cudaError_t e = cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) return fail(e);
  AxpyKernel<<<(n + 255) / 256, 256>>>(alpha, dx, dy, n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return fail(e);
  if (cudaError_t e = cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) return fail(e);
  cudaFree(dx);
  cudaFree(dy);
  return true;
}

}  // namespace distrain::cuda

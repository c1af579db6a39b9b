// GPU checks: compiled into every build, run only where the CUDA build found
// a GPU; they skip (not pass) everywhere else.
#include <gtest/gtest.h>

#include <vector>

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_probe.h"
#endif

namespace distrain {
namespace {

TEST(CudaProbeTest, AxpyKernelRunsOnTheGpu) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (DISTRAIN_CUDA=OFF or no toolkit found)";
#else
  cuda::DeviceInfo info = cuda::Probe();
  EXPECT_GT(info.runtime_version, 0) << "the CUDA runtime is linked, so it knows its version";
  if (info.device_count == 0) GTEST_SKIP() << "no GPU: " << info.error;
  std::vector<float> x(1000), y(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  std::string error;
  ASSERT_TRUE(cuda::AxpyOnDevice(2.0f, x.data(), y.data(), 1000, &error)) << error;
  for (int i = 0; i < 1000; ++i) ASSERT_FLOAT_EQ(y[i], 1.0f + 2.0f * i) << "at " << i;
#endif
}

}  // namespace
}  // namespace distrain

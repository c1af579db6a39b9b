// The measured topology Auto will decide on: on a machine with GPUs every
// figure is there and plausible for a real link (PCIe 3 x16 moves about 12
// GB/s, NVLink hundreds); without GPUs nothing is invented.
#include <gtest/gtest.h>

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#include "worker/tensor/cuda/topology.h"
#endif

namespace distrain {
namespace {

TEST(TopologyTest, MeasuresEveryLinkOfTheVisibleGpusAndNothingWithoutThem) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const cuda::MeasuredTopology t = cuda::MeasureTopology();
  EXPECT_EQ(t.gpus, cuda::VisibleDeviceCount());
  if (t.gpus == 0) {
    EXPECT_FALSE(t.host_device_gbps.has_value());
    EXPECT_FALSE(t.device_device_gbps.has_value());
    GTEST_SKIP() << "no GPU visible: nothing to measure";
  }
  ASSERT_TRUE(t.host_device_gbps.has_value());
  EXPECT_GT(*t.host_device_gbps, 1.0) << t.ToString();
  EXPECT_LT(*t.host_device_gbps, 2000.0) << t.ToString();
  EXPECT_EQ(t.device_device_gbps.has_value(), t.gpus > 1) << t.ToString();
  if (t.device_device_gbps) {
    EXPECT_GT(*t.device_device_gbps, 1.0) << t.ToString();
  }
#endif
}

}  // namespace
}  // namespace distrain

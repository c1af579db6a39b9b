// The CUDA build opens cuBLAS, cuDNN and NCCL at run time
// (worker/tensor/cuda/cuda_libraries.h). These checks need no GPU: they
// resolve every function the backend calls against the libraries this build
// was configured with, so a library upgrade that drops or renames one fails
// here, in CI, not on the first GPU that runs it.
#include <gtest/gtest.h>

#include "gmock/gmock.h"

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/cuda_libraries.h"
#endif

namespace distrain {
namespace {

using ::testing::ContainsRegex;

TEST(CudaLibrariesTest, EveryFunctionTheBackendCallsResolvesInTheBuildsLibraries) {
#ifndef DISTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (DISTRAIN_CUDA=OFF or no toolkit found)";
#else
  const absl::Status loaded = cuda::LoadCudaLibraries();
  ASSERT_TRUE(loaded.ok()) << loaded;
  // Loading is once per process; asking again gives the same answer.
  EXPECT_TRUE(cuda::LoadCudaLibraries().ok());
  const std::string summary = cuda::CudaLibrariesSummary();
  EXPECT_THAT(summary, ContainsRegex("cuBLAS 13\\.[0-9]+\\.[0-9]+ \\(/[^)]*libcublas"));
  EXPECT_THAT(summary, ContainsRegex("cuDNN 9\\.[0-9]+\\.[0-9]+ \\(/[^)]*libcudnn"));
  EXPECT_THAT(summary, ContainsRegex("NCCL 2\\.[0-9]+\\.[0-9]+ \\(/[^)]*libnccl"));
#endif
}

}  // namespace
}  // namespace distrain

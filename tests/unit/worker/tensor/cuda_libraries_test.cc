// The CUDA build opens cuBLAS, cuDNN and NCCL at run time
// (worker/tensor/cuda/cuda_libraries.h). These checks need no GPU: they
// resolve every function the backend calls against the libraries this build
// was configured with, so a library upgrade that drops or renames one fails
// here, in CI, not on the first GPU that runs it.
#include <gtest/gtest.h>

#include <string>

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

#ifdef DISTRAIN_HAVE_CUDA
// NCCL older than 2.14.3 is refused when the libraries load: a clear error
// naming both versions instead of a teardown that may hang.
TEST(CudaLibrariesTest, NcclOlderThanTheMinimumIsRefusedNamingBothVersions) {
  EXPECT_TRUE(cuda::CheckNcclVersion(cuda::kMinNcclVersion).ok());
  EXPECT_TRUE(cuda::CheckNcclVersion(22807).ok());  // 2.28.7
  const absl::Status old = cuda::CheckNcclVersion(21304);  // 2.13.4
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(old.message()), ContainsRegex("NCCL 2\\.13\\.4 is loaded.*2\\.14\\.3 or newer"));
  EXPECT_THAT(std::string(old.message()), ContainsRegex("CUDA image"));
  // NCCL before 2.9 coded its version in thousands.
  EXPECT_THAT(std::string(cuda::CheckNcclVersion(2804).message()),
              ContainsRegex("NCCL 2\\.8\\.4 is loaded"));
}
#endif

}  // namespace
}  // namespace distrain

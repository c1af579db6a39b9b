// SharedLibrary: how the CUDA backend opens cuBLAS, cuDNN and NCCL at run
// time. Exercised here on the C math library, present on every machine.
#include "worker/tensor/cuda/shared_library.h"

#include <gtest/gtest.h>

#include <cmath>

#include "gmock/gmock.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

TEST(SharedLibraryTest, OpensTheFirstCandidateThatLoadsAndResolvesItsFunctions) {
  auto library = SharedLibrary::Open({"libdistrain-no-such-library.so.7", "libm.so.6"});
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_THAT((*library)->path(), HasSubstr("libm.so.6"));
  auto cosine = (*library)->Symbol("cos");
  ASSERT_TRUE(cosine.ok()) << cosine.status();
  auto* fn = reinterpret_cast<double (*)(double)>(*cosine);
  EXPECT_DOUBLE_EQ(fn(0.0), 1.0);
  EXPECT_DOUBLE_EQ(fn(M_PI), -1.0);
}

TEST(SharedLibraryTest, AMissingLibraryNamesEveryCandidateAndWhy) {
  auto library = SharedLibrary::Open({"libdistrain-absent-a.so.1", "/nonexistent/libabsent-b.so"});
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(library.status().message(), HasSubstr("libdistrain-absent-a.so.1"));
  EXPECT_THAT(library.status().message(), HasSubstr("/nonexistent/libabsent-b.so"));
  // dlerror's reason rides along, so a wrong architecture or a missing
  // dependency of the library is told apart from a missing file.
  EXPECT_THAT(library.status().message(), HasSubstr("cannot open shared object file"));
}

TEST(SharedLibraryTest, AMissingSymbolNamesTheSymbolAndTheFile) {
  auto library = SharedLibrary::Open({"libm.so.6"});
  ASSERT_TRUE(library.ok()) << library.status();
  auto symbol = (*library)->Symbol("cublasSgemm_v2_64");
  ASSERT_FALSE(symbol.ok());
  EXPECT_EQ(symbol.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(symbol.status().message(), HasSubstr("cublasSgemm_v2_64"));
  EXPECT_THAT(symbol.status().message(), HasSubstr("libm.so.6"));
}

}  // namespace
}  // namespace distrain

#include "worker/tensor/cuda/cuda_libraries.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "worker/tensor/cuda/cuda_library_api.h"
#include "worker/tensor/cuda/shared_library.h"

namespace distrain::cuda {
namespace {

// The libraries, their tables, and the outcome of loading them: filled once
// (Loaded()), never freed, so the backend's pointers stay valid until exit.
struct Libraries {
  absl::Status status;
  std::unique_ptr<SharedLibrary> cublas, cudnn, nccl;
  CublasApi cublas_api;
  CudnnApi cudnn_api;
  NcclApi nccl_api;
};


template <typename Api>
absl::Status Resolve(const SharedLibrary& library, const char* name, Api& member) {
  absl::StatusOr<void*> address = library.Symbol(name);
  if (!address.ok()) return address.status();
  member = reinterpret_cast<Api>(*address);
  return absl::OkStatus();
}

// The soname first (LD_LIBRARY_PATH, ld.so.cache: the CUDA image puts the
// libraries on the path), then the file CMake found when this build was
// configured (cmake/DistrainCuda.cmake), so build trees run as they are.
absl::Status OpenLibrary(const char* soname, const char* build_file, const char* what,
                  std::unique_ptr<SharedLibrary>& out) {
  absl::StatusOr<std::unique_ptr<SharedLibrary>> library =
      SharedLibrary::Open({soname, build_file});
  if (!library.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        soname, " (", what, ") is not installed here, so this process cannot train on its GPUs. "
        "Run the worker's CUDA image (localhost/distrain/worker-cuda, built by "
        "scripts/build-images.sh from a CUDA build), not the CPU image, or put the library on "
        "LD_LIBRARY_PATH. ", library.status().message()));
  }
  out = std::move(*library);
  return absl::OkStatus();
}

Libraries Load() {
  Libraries libs;
  auto load = [&]() -> absl::Status {
    if (absl::Status s = OpenLibrary("libcublas.so.13", DISTRAIN_CUBLAS_FILE, "cuBLAS, for matrix products", libs.cublas);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = OpenLibrary("libcudnn.so.9", DISTRAIN_CUDNN_FILE,
                              "cuDNN, for convolution, pooling, batch norm and softmax",
                              libs.cudnn);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = OpenLibrary("libnccl.so.2", DISTRAIN_NCCL_FILE, "NCCL, for all-reduce between GPUs", libs.nccl);
        !s.ok()) {
      return s;
    }
    // Every function of every table; the first that is missing is the error.
    absl::Status resolved;
    auto resolve = [&resolved](const SharedLibrary& library, const char* name, auto& member) {
      if (resolved.ok()) resolved = Resolve(library, name, member);
    };
#define DISTRAIN_CUBLAS_RESOLVE(function) resolve(*libs.cublas, #function, libs.cublas_api.function);
#define DISTRAIN_CUDNN_RESOLVE(function) resolve(*libs.cudnn, #function, libs.cudnn_api.function);
#define DISTRAIN_NCCL_RESOLVE(function) resolve(*libs.nccl, #function, libs.nccl_api.function);
    DISTRAIN_CUBLAS_FUNCTIONS(DISTRAIN_CUBLAS_RESOLVE)
    DISTRAIN_CUDNN_FUNCTIONS(DISTRAIN_CUDNN_RESOLVE)
    DISTRAIN_NCCL_FUNCTIONS(DISTRAIN_NCCL_RESOLVE)
#undef DISTRAIN_CUBLAS_RESOLVE
#undef DISTRAIN_CUDNN_RESOLVE
#undef DISTRAIN_NCCL_RESOLVE
    if (!resolved.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the CUDA libraries here do not match this build: ", resolved.message(),
                       ". Use the worker's CUDA image built with this binary"));
    }
    int nccl_version = 0;
    if (libs.nccl_api.ncclGetVersion(&nccl_version) != ncclSuccess) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ncclGetVersion failed in ", libs.nccl->path(),
          "; use the worker's CUDA image built with this binary"));
    }
    return CheckNcclVersion(nccl_version);
  };
  libs.status = load();
  return libs;
}

const Libraries& Loaded() {
  static const Libraries* const libraries = new Libraries(Load());  // never freed
  return *libraries;
}

const Libraries& LoadedOrDie() {
  const Libraries& libs = Loaded();
  DISTRAIN_CHECK(libs.status.ok()) << "a GPU op ran without its libraries: "
                                   << libs.status.message();
  return libs;
}

}  // namespace

absl::Status CheckNcclVersion(int version) {
  if (version >= kMinNcclVersion) return absl::OkStatus();
  // Before 2.9, NCCL coded its version as major * 1000 + minor * 100 + patch.
  const bool old_code = version < 10000;
  const int major = old_code ? version / 1000 : version / 10000;
  const int minor = old_code ? version / 100 % 10 : version / 100 % 100;
  return absl::FailedPreconditionError(absl::StrFormat(
      "NCCL %d.%d.%d is loaded, and distrain needs NCCL %d.%d.%d or newer (older releases can "
      "hang when one thread tears down the communicators of several GPUs). Use the worker's "
      "CUDA image, or put a newer libnccl.so.2 on LD_LIBRARY_PATH",
      major, minor, version % 100, kMinNcclVersion / 10000, kMinNcclVersion / 100 % 100,
      kMinNcclVersion % 100));
}

absl::Status LoadCudaLibraries() { return Loaded().status; }

std::string CudaLibrariesSummary() {
  const Libraries& libs = Loaded();
  if (!libs.status.ok()) return std::string(libs.status.message());
  int cublas_major = 0, cublas_minor = 0, cublas_patch = 0;
  libs.cublas_api.cublasGetProperty(MAJOR_VERSION, &cublas_major);
  libs.cublas_api.cublasGetProperty(MINOR_VERSION, &cublas_minor);
  libs.cublas_api.cublasGetProperty(PATCH_LEVEL, &cublas_patch);
  const size_t cudnn = libs.cudnn_api.cudnnGetVersion();
  int nccl = 0;
  libs.nccl_api.ncclGetVersion(&nccl);
  return absl::StrFormat("cuBLAS %d.%d.%d (%s), cuDNN %d.%d.%d (%s), NCCL %d.%d.%d (%s)",
                         cublas_major, cublas_minor, cublas_patch, libs.cublas->path(),
                         cudnn / 10000, cudnn / 100 % 100, cudnn % 100, libs.cudnn->path(),
                         nccl / 10000, nccl / 100 % 100, nccl % 100, libs.nccl->path());
}

const CublasApi& Cublas() { return LoadedOrDie().cublas_api; }
const CudnnApi& Cudnn() { return LoadedOrDie().cudnn_api; }
const NcclApi& Nccl() { return LoadedOrDie().nccl_api; }

}  // namespace distrain::cuda

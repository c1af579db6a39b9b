#ifndef DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARIES_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARIES_H_

// The CUDA libraries the backend uses besides the CUDA runtime — cuBLAS,
// cuDNN and NCCL — are opened at run time, not linked (docs/architecture.md
// §6a, "Images"). The runtime (cudart) is linked statically and finds the
// driver the node mounts, so a CUDA build of distrain-worker starts, counts
// GPUs and trains on CPU in an image without any of these libraries (the
// worker's CPU image); the CUDA image adds them. Host-side API without CUDA
// headers; the backend's own files call the libraries through
// cuda_library_api.h. CUDA builds only (DISTRAIN_HAVE_CUDA).
//
// Thread-safety: every function is safe from any thread; the libraries are
// loaded once per process.

#include <string>

#include "absl/status/status.h"

namespace distrain::cuda {

// Loads cuBLAS (libcublas.so.13), cuDNN (libcudnn.so.9) and NCCL
// (libnccl.so.2) and resolves every function the backend calls, the first
// time; later calls return the first call's result. FAILED_PRECONDITION
// naming the missing library or symbol and the fix (the CUDA image, or
// LD_LIBRARY_PATH) when one does not load. Lookup order per library: the
// dynamic linker's search (LD_LIBRARY_PATH, ld.so.cache), then the toolkit
// directory this build was configured with (so build trees run as they are).
absl::Status LoadCudaLibraries();

// One line for --version and the log: each library's version and the file
// it was loaded from, or why it was not.
std::string CudaLibrariesSummary();

// The oldest NCCL the backend runs with, as ncclGetVersion codes it
// (major * 10000 + minor * 100 + patch): 2.14.3, the first release where
// destroying or aborting the communicators of several GPUs from one thread
// blocks only on the last of them (docs/architecture.md §6a, "NCCL and
// device memory"); with an older one, Mirrored's teardown could hang.
inline constexpr int kMinNcclVersion = 21403;
// OK for `version` (ncclGetVersion's code) at or above kMinNcclVersion, else
// FAILED_PRECONDITION naming both versions and the fix. LoadCudaLibraries
// applies it to the NCCL it loaded.
absl::Status CheckNcclVersion(int version);

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARIES_H_

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

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARIES_H_

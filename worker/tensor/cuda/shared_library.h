#ifndef DISTRAIN_WORKER_TENSOR_CUDA_SHARED_LIBRARY_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_SHARED_LIBRARY_H_

// SharedLibrary: a library opened at run time (dlopen) and its symbols
// (dlsym). The CUDA backend loads cuBLAS, cuDNN and NCCL this way
// (cuda_libraries.h) instead of linking them, so one distrain-worker binary
// runs in the CPU image, which does not carry those ~2 GB of libraries, and
// in the CUDA image, which does (docs/architecture.md §6a, "Images").
// Plain C++ with no CUDA headers: its tests run on any machine.
//
// Ownership: owns the handle; the library stays loaded until the object is
// destroyed (the CUDA tables keep theirs for the process's lifetime).
// Thread-safety: Open is reentrant; a SharedLibrary is immutable once opened,
// so Symbol may be called from any thread.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace distrain {

class SharedLibrary {
 public:
  // Opens the first of `candidates` that loads (RTLD_NOW | RTLD_LOCAL: every
  // symbol it needs resolves now, and its own symbols do not leak into later
  // libraries). A candidate without '/' is searched like a link-time
  // dependency (LD_LIBRARY_PATH, the caller's RUNPATH, ld.so.cache); one with
  // '/' is that file. NOT_FOUND with every candidate's dlerror when none loads.
  static absl::StatusOr<std::unique_ptr<SharedLibrary>> Open(
      const std::vector<std::string>& candidates);

  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // The file the dynamic linker loaded (resolved through symlinks and
  // search paths), for logs and --version.
  const std::string& path() const { return path_; }

  // The address of `name`; NOT_FOUND naming the symbol and the file.
  absl::StatusOr<void*> Symbol(const std::string& name) const;

 private:
  SharedLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}

  void* handle_;
  std::string path_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_SHARED_LIBRARY_H_

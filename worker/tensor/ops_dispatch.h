#ifndef DISTRAIN_WORKER_TENSOR_OPS_DISPATCH_H_
#define DISTRAIN_WORKER_TENSOR_OPS_DISPATCH_H_

// Device dispatch shared by the op seam's implementation files (ops.cc,
// ops_window.cc) and the optimizer: which device a call runs on, and the
// guard around calls into the CUDA backend, which exists only in a CUDA
// build. Without one no CUDA tensor can be made (tensor.cc), so the guard's
// failure branch is unreachable unless a caller skipped validation.

#include <initializer_list>

#include "common/check.h"
#include "worker/tensor/tensor.h"

namespace distrain::ops {

// The device every non-null tensor of a call lives on (CHECKs they agree).
inline DeviceId CallDevice(std::initializer_list<const Tensor*> tensors) {
  const DeviceId d = (*tensors.begin())->device_id();
  for (const Tensor* t : tensors) {
    if (t != nullptr) {
      DISTRAIN_CHECK(t->device_id() == d)
          << "tensors of one op on two devices: " << d.ToString() << " and "
          << t->device_id().ToString();
    }
  }
  return d;
}

inline bool OnGpu(DeviceId d) { return d.kind == Device::kCuda; }

}  // namespace distrain::ops

#ifdef DISTRAIN_HAVE_CUDA
#define DISTRAIN_CUDA_ONLY(...) __VA_ARGS__
#else
#define DISTRAIN_CUDA_ONLY(...) \
  DISTRAIN_CHECK(false) << "a GPU tensor reached an op in a CPU-only build of distrain"
#endif

#endif  // DISTRAIN_WORKER_TENSOR_OPS_DISPATCH_H_

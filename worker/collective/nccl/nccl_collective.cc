#include "worker/collective/nccl/nccl_collective.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/tensor/cuda/device_context.h"

namespace distrain {

struct NcclCollective::Comm {
  ncclComm_t comm = nullptr;
  // Recorded on the compute stream (step 1); after an abort, on the
  // communication stream for the compute stream to wait on.
  cudaEvent_t inputs_ready = nullptr;
  bool aborted = false;                // ncclCommAbort ran; destroy must not
};

namespace {

absl::Status NcclError(const char* what, ncclResult_t result) {
  return absl::UnavailableError(
      absl::StrCat("NCCL ", what, ": ", cuda::Nccl().ncclGetErrorString(result),
                   result == ncclRemoteError ? " (a peer failed)" : ""));
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kMean ? ncclAvg : ncclSum; }

}  // namespace

NcclCollective::NcclCollective(std::unique_ptr<Comm> comm, int rank, int size, int device)
    : comm_(std::move(comm)), rank_(rank), size_(size), device_(device) {
  cuda::DeviceContext::Get(device_);
  DISTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&comm_->inputs_ready, cudaEventDisableTiming));
  DISTRAIN_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
}

NcclCollective::~NcclCollective() {
  cuda::DeviceContext& ctx = cuda::DeviceContext::Get(device_);
  if (!comm_->aborted) {
    (void)cudaStreamSynchronize(ctx.comm_stream());
    cuda::Nccl().ncclCommDestroy(comm_->comm);
  }
  cudaEventDestroy(comm_->inputs_ready);
  absl::MutexLock nccl_lock(&ctx.nccl_mutex());  // another collective of the device may run
  cudaFree(barrier_word_);
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCollective>>> NcclCollective::CreateLocalGroup(
    int devices) {
  if (devices < 1) return absl::InvalidArgumentError("NCCL group of no devices");
  std::vector<ncclComm_t> comms(devices);
  std::vector<int> ordinals(devices);
  for (int d = 0; d < devices; ++d) {
    ordinals[d] = d;
    cuda::DeviceContext::Get(d);  // streams and the device's primary context first
  }
  if (ncclResult_t r = cuda::Nccl().ncclCommInitAll(comms.data(), devices, ordinals.data()); r != ncclSuccess) {
    return NcclError("ncclCommInitAll", r);
  }
  std::vector<std::unique_ptr<NcclCollective>> out;
  for (int d = 0; d < devices; ++d) {
    auto comm = std::make_unique<Comm>();
    comm->comm = comms[d];
    out.push_back(std::unique_ptr<NcclCollective>(new NcclCollective(std::move(comm), d, devices, d)));
  }
  return out;
}

absl::StatusOr<std::string> NcclCollective::NewUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = cuda::Nccl().ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclError("ncclGetUniqueId", r);
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::CreateRank(
    const std::string& unique_id, int rank, int size, int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id of ", unique_id.size(),
                                                   " bytes, want ", sizeof(id.internal)));
  }
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  cuda::DeviceContext::Get(device);
  auto comm = std::make_unique<Comm>();
  if (ncclResult_t r = cuda::Nccl().ncclCommInitRank(&comm->comm, size, id, rank); r != ncclSuccess) {
    return NcclError("ncclCommInitRank", r);
  }
  return std::unique_ptr<NcclCollective>(new NcclCollective(std::move(comm), rank, size, device));
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCollective>>> NcclCollective::CreateRanks(
    const std::string& unique_id, int first_rank, int size, int devices) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id of ", unique_id.size(),
                                                   " bytes, want ", sizeof(id.internal)));
  }
  if (devices < 1 || first_rank < 0 || first_rank + devices > size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL ranks ", first_rank, "..",
                                                   first_rank + devices - 1, " of ", size));
  }
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  for (int d = 0; d < devices; ++d) cuda::DeviceContext::Get(d);
  std::vector<ncclComm_t> comms(devices, nullptr);
  const ncclResult_t started = cuda::Nccl().ncclGroupStart();
  if (started != ncclSuccess) return NcclError("ncclGroupStart", started);
  ncclResult_t first_error = ncclSuccess;
  for (int d = 0; d < devices; ++d) {
    DISTRAIN_CUDA_CHECK(cudaSetDevice(d));  // the communicator binds the current device
    const ncclResult_t r =
        cuda::Nccl().ncclCommInitRank(&comms[d], size, id, first_rank + d);
    if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
  }
  const ncclResult_t ended = cuda::Nccl().ncclGroupEnd();
  if (first_error == ncclSuccess) first_error = ended;
  if (first_error != ncclSuccess) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) cuda::Nccl().ncclCommAbort(c);
    }
    return NcclError("ncclCommInitRank", first_error);
  }
  std::vector<std::unique_ptr<NcclCollective>> out;
  for (int d = 0; d < devices; ++d) {
    auto comm = std::make_unique<Comm>();
    comm->comm = comms[d];
    out.push_back(std::unique_ptr<NcclCollective>(
        new NcclCollective(std::move(comm), first_rank + d, size, d)));
  }
  return out;
}

template <typename Enqueue>
absl::Status NcclCollective::Run(const char* what, const CollectiveOptions& options,
                                 int64_t bytes, Enqueue enqueue) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
  }
  cuda::DeviceContext& ctx = cuda::DeviceContext::Get(device_);
  // No cudaFree of this device from here until the communication stream is
  // drained (device_context.h, nccl_mutex()).
  absl::MutexLock nccl_lock(&ctx.nccl_mutex());
  // 1.
  DISTRAIN_CUDA_CHECK(cudaEventRecord(comm_->inputs_ready, ctx.compute_stream()));
  DISTRAIN_CUDA_CHECK(cudaStreamWaitEvent(ctx.comm_stream(), comm_->inputs_ready, 0));
  // 2.
  if (ncclResult_t r = enqueue(ctx.comm_stream()); r != ncclSuccess) return NcclError(what, r);
  // 3.
  const absl::Time deadline = absl::Now() + options.timeout;
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaStreamQuery(ctx.comm_stream());
    if (state == cudaSuccess) break;
    DISTRAIN_CHECK(state == cudaErrorNotReady)
        << "NCCL " << what << " on GPU:" << device_ << ": " << cudaGetErrorString(state);
    ncclResult_t async = ncclSuccess;
    cuda::Nccl().ncclCommGetAsyncError(comm_->comm, &async);
    absl::Status failure;
    if (async != ncclSuccess && async != ncclInProgress) {
      failure = NcclError(what, async);
    } else if (absl::Now() > deadline) {
      failure = absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, " ", options.tag, ": not done after ",
                       absl::FormatDuration(options.timeout), " (a peer stopped)"));
    } else {
      absl::MutexLock lock(&mu_);
      failure = aborted_;
    }
    if (!failure.ok()) {
      // The only way to get a stuck NCCL kernel off the device.
      if (!comm_->aborted) {
        cuda::Nccl().ncclCommAbort(comm_->comm);
        comm_->aborted = true;
      }
      // ncclCommAbort only raises the abort flag when other ranks of the
      // communicator live in this process (the last of them to abort or
      // destroy frees it all), so the kernel may still be on the device,
      // writing the buffers in place. The caller reuses them (and the
      // allocator their blocks) on the compute stream: order that work
      // after the aborted kernel's exit (docs/architecture.md §6a, "NCCL
      // and device memory"). The event's earlier recording is consumed.
      DISTRAIN_CUDA_CHECK(cudaEventRecord(comm_->inputs_ready, ctx.comm_stream()));
      DISTRAIN_CUDA_CHECK(cudaStreamWaitEvent(ctx.compute_stream(), comm_->inputs_ready, 0));
      absl::MutexLock lock(&mu_);
      if (aborted_.ok()) aborted_ = failure;
      return failure;
    }
    // Short operations finish within a few polls; long ones should not burn a core.
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  absl::MutexLock lock(&mu_);
  ++stats_.operations;
  stats_.bytes_sent += bytes;
  stats_.bytes_received += bytes;
  return absl::OkStatus();
}

absl::Status NcclCollective::AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                                       const CollectiveOptions& options) {
  int64_t bytes = 0;
  for (const absl::Span<float>& b : buffers) bytes += static_cast<int64_t>(b.size() * sizeof(float));
  // A ring moves 2 (N-1)/N of the data each way.
  const int64_t moved = size_ > 1 ? bytes * 2 * (size_ - 1) / size_ : 0;
  return Run("all-reduce", options, moved, [&](cudaStream_t stream) {
    ncclResult_t r = cuda::Nccl().ncclGroupStart();
    for (const absl::Span<float>& b : buffers) {
      if (r != ncclSuccess) break;
      if (b.empty()) continue;
      r = cuda::Nccl().ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, NcclOp(op), comm_->comm, stream);
    }
    const ncclResult_t end = cuda::Nccl().ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

absl::Status NcclCollective::Broadcast(absl::Span<float> buffer, int root,
                                       const CollectiveOptions& options) {
  return Run("broadcast", options, static_cast<int64_t>(buffer.size() * sizeof(float)),
             [&](cudaStream_t stream) {
               return buffer.empty() ? ncclSuccess
                                     : cuda::Nccl().ncclBroadcast(buffer.data(), buffer.data(), buffer.size(),
                                                     ncclFloat, root, comm_->comm, stream);
             });
}

absl::Status NcclCollective::AllGather(absl::Span<const float> input, absl::Span<float> output,
                                       const CollectiveOptions& options) {
  if (output.size() != input.size() * static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: output of ", output.size(),
                                                   " floats for ", size_, " x ", input.size()));
  }
  return Run("all-gather", options, static_cast<int64_t>(output.size() * sizeof(float)),
             [&](cudaStream_t stream) {
               return input.empty() ? ncclSuccess
                                    : cuda::Nccl().ncclAllGather(input.data(), output.data(), input.size(),
                                                    ncclFloat, comm_->comm, stream);
             });
}

absl::Status NcclCollective::Barrier(const CollectiveOptions& options) {
  // NCCL has no barrier; an all-reduce of one float completes on no rank
  // before every rank has joined it.
  return Run("barrier", options, sizeof(float), [&](cudaStream_t stream) {
    return cuda::Nccl().ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat, ncclSum, comm_->comm, stream);
  });
}

void NcclCollective::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = reason.ok() ? absl::AbortedError("NCCL collective aborted") : reason;
  }
}

CollectiveStats NcclCollective::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace distrain

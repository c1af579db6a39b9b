#ifndef DISTRAIN_WORKER_COLLECTIVE_NCCL_NCCL_COLLECTIVE_H_
#define DISTRAIN_WORKER_COLLECTIVE_NCCL_NCCL_COLLECTIVE_H_

// The Collective (worker/collective/collective.h) of one GPU, over NCCL: the
// buffers are device memory of that GPU (spans over device pointers), and the
// operations run on the device's communication stream
// (worker/tensor/cuda/device_context.h). CUDA builds only.
//
// Ordering with the compute stream, per operation:
//   1. an event recorded on the compute stream makes the communication
//      stream wait for the kernels that wrote the buffers;
//   2. the operation is queued on the communication stream — every buffer of
//      one call inside one ncclGroupStart/End, so a bucket of several
//      gradients is one fused launch;
//   3. the call waits for the communication stream (polling
//      cudaStreamQuery, so Abort and options.timeout are honoured, and a
//      stuck peer turns into ncclCommAbort rather than a hang), then the
//      compute stream's later kernels see the result.
// MEAN is ncclAvg (NCCL >= 2.10), so every rank gets bit-identical results:
// NCCL's ring and tree reduce in one order and broadcast the result.
//
// Groups: NcclCollective::CreateLocalGroup makes one communicator per visible
// device of this process (ncclCommInitAll: Mirrored's replicas);
// CreateRank / CreateRanks join a group across processes from a unique id
// the caller distributes (MultiWorkerMirrored's rendezvous store).
//
// Ownership: each instance owns its communicator. Thread-safety: the
// Collective contract — one thread drives operations, Abort from any thread.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/collective.h"

namespace distrain {

class NcclCollective : public Collective {
 public:
  // One collective per device 0..devices-1 of this process, ranks in device
  // order.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCollective>>> CreateLocalGroup(
      int devices);
  // ncclGetUniqueId's 128 bytes, for rank 0 to publish.
  static absl::StatusOr<std::string> NewUniqueId();
  // This process's rank `rank` of `size` on local device `device`.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> CreateRank(const std::string& unique_id,
                                                                    int rank, int size,
                                                                    int device);
  // This process's ranks first_rank .. first_rank + devices - 1 of `size`, on
  // its devices 0 .. devices - 1, created in one NCCL group (one thread
  // cannot create them one after another: each creation waits for all
  // ranks). MultiWorkerMirrored's replicas, one per GPU of each worker.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCollective>>> CreateRanks(
      const std::string& unique_id, int first_rank, int size, int devices);
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override;
  using Collective::AllReduce;
  absl::Status Broadcast(absl::Span<float> buffer, int root,
                         const CollectiveOptions& options) override;
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                         const CollectiveOptions& options) override;
  absl::Status Barrier(const CollectiveOptions& options) override;
  void Abort(const absl::Status& reason) override;
  CollectiveStats stats() const override;

 private:
  struct Comm;  // the NCCL communicator (ncclComm_t) and stream events
  NcclCollective(std::unique_ptr<Comm> comm, int rank, int size, int device);

  // Steps 1-3 of the file comment around `enqueue`, which queues the NCCL
  // calls on the communication stream and returns their ncclResult_t.
  template <typename Enqueue>
  absl::Status Run(const char* what, const CollectiveOptions& options, int64_t bytes,
                   Enqueue enqueue);

  std::unique_ptr<Comm> comm_;
  const int rank_;
  const int size_;
  const int device_;
  float* barrier_word_ = nullptr;  // one device float, all-reduced by Barrier
  mutable absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  CollectiveStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_NCCL_NCCL_COLLECTIVE_H_

#ifndef DISTRAIN_WORKER_STRATEGY_HOST_STAGED_COLLECTIVE_H_
#define DISTRAIN_WORKER_STRATEGY_HOST_STAGED_COLLECTIVE_H_

// HostStagedCollective: a Collective over buffers on one device (a GPU
// replica's gradients, its extras) that runs another Collective over host
// memory — MultiWorkerMirrored's TCP ring, or its hierarchical handle — by
// copying through a host buffer (docs/architecture.md §6a, "Placement").
// Per operation:
//   1. copy every buffer of the call into one host buffer (device -> host;
//      the copy waits for the device's compute stream, so it sees the
//      kernels that wrote the gradients);
//   2. run the inner operation on it (the buffers of one call are one
//      logical vector to every Collective, so concatenating them changes
//      nothing);
//   3. copy the result back (host -> device).
// The cost is two PCIe crossings of every gradient per step, on top of the
// network's; implementation: NCCL (MultiWorkerMirrored's NCCL ranks) avoids them. On
// the CPU (device CPU) the copies are memcpys, which is how its tests run.
//
// Ownership: borrows the inner collective (it must outlive this; the
// strategy re-wraps when it re-forms the group); owns the host buffer.
// Thread-safety: as Collective — one thread drives operations, Abort from
// any thread (forwarded).

#include <vector>

#include "worker/collective/collective.h"
#include "worker/tensor/tensor.h"

namespace distrain {

class HostStagedCollective : public Collective {
 public:
  HostStagedCollective(Collective* inner, DeviceId device) : inner_(inner), device_(device) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override;
  using Collective::AllReduce;
  absl::Status Broadcast(absl::Span<float> buffer, int root,
                         const CollectiveOptions& options) override;
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                         const CollectiveOptions& options) override;
  absl::Status Barrier(const CollectiveOptions& options) override {
    return inner_->Barrier(options);
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  CollectiveStats stats() const override { return inner_->stats(); }

 private:
  Collective* const inner_;
  const DeviceId device_;
  std::vector<float> host_;  // the staging buffer, grown to the largest call
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_HOST_STAGED_COLLECTIVE_H_

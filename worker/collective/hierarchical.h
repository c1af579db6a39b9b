#ifndef DISTRAIN_WORKER_COLLECTIVE_HIERARCHICAL_H_
#define DISTRAIN_WORKER_COLLECTIVE_HIERARCHICAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/collective/collective.h"
#include "worker/collective/in_process.h"

namespace distrain {

// HierarchicalCollective: one local replica's view of W workers x L local
// replicas as a single group of size W*L (rank = worker * L + local). Each
// operation is local (in-process, threads) + cross-worker (any Collective
// among the workers, e.g. RingCollective, driven by local replica 0 only):
//   AllReduce: local reduce to replica 0 -> cross all-reduce (SUM) among the
//     replica 0s -> MEAN divides by W*L -> local broadcast. Every local
//     replica receives replica 0's bits, so copies never diverge.
//   Broadcast(root): local broadcast on root's worker -> cross broadcast
//     from root's worker -> local broadcast on the other workers.
//   AllGather: local all-gather into this worker's block of the output ->
//     cross in-place all-gather of the blocks -> local broadcast.
//   Barrier: local barrier -> cross barrier -> local barrier.
// A cross failure on replica 0 aborts the local group with the same status,
// so every local replica reports the cross-worker error (naming the peer).
// Replicas other than 0 wait up to twice options.timeout for replica 0 after
// the local step, because replica 0 itself may spend up to options.timeout
// on the cross step and its error should win.
//
// Ownership: the L members share the local group and the cross collective.
// Thread-safety: as Collective; each member is driven by its own thread.
class HierarchicalCollective : public Collective {
 public:
  // The L members of one worker. `cross` is this worker's member of the
  // cross-worker group (rank = worker index). `local_names` as for
  // InProcessGroup.
  static std::vector<std::unique_ptr<HierarchicalCollective>> CreateLocalGroup(
      std::shared_ptr<Collective> cross, int local_size, std::vector<std::string> local_names = {});

  HierarchicalCollective(std::unique_ptr<InProcessCollective> local,
                         std::shared_ptr<Collective> cross);

  int rank() const override { return cross_->rank() * local_->size() + local_->rank(); }
  int size() const override { return cross_->size() * local_->size(); }
  int local_rank() const { return local_->rank(); }
  int local_size() const { return local_->size(); }

  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override;
  using Collective::AllReduce;
  absl::Status Broadcast(absl::Span<float> buffer, int root,
                         const CollectiveOptions& options) override;
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                         const CollectiveOptions& options) override;
  absl::Status Barrier(const CollectiveOptions& options) override;
  void Abort(const absl::Status& reason) override;
  // Local traffic, plus the cross-worker traffic on local replica 0.
  CollectiveStats stats() const override;

 private:
  // Runs the cross step on replica 0; a failure aborts the local group.
  absl::Status Cross(absl::Status status);
  CollectiveOptions AfterCross(const CollectiveOptions& options) const;
  absl::Status Count(absl::Status status);  // counts completed operations

  std::unique_ptr<InProcessCollective> local_;
  std::shared_ptr<Collective> cross_;
  std::atomic<int64_t> operations_{0};
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_HIERARCHICAL_H_

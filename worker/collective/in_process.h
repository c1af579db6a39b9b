#ifndef DISTRAIN_WORKER_COLLECTIVE_IN_PROCESS_H_
#define DISTRAIN_WORKER_COLLECTIVE_IN_PROCESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/collective.h"

namespace distrain {

// Shared state of N ranks that live as threads of one process (the local
// replicas of MirroredStrategy, or of one worker under
// HierarchicalCollective). Create one with InProcessCollective::CreateGroup.
//
// Protocol of every operation (two rendezvous, no data copies through the
// group):
//   1. Each rank publishes a descriptor of its call (operation, sizes,
//      pointers to its buffers) in its slot and arrives at the rendezvous.
//   2. When all N have arrived, every rank checks that all descriptors agree
//      (InvalidArgument on every rank otherwise), then works on its own share:
//      for AllReduce, rank r owns the element range [total*r/N, total*(r+1)/N)
//      and reduces it across ranks in fixed rank order 0, 1, ..., N-1, then
//      writes that one result into every rank's buffer. Each element is
//      computed exactly once, so all copies are bit-identical (a Mirrored
//      model's replicas never diverge), and the work is spread over N threads.
//   3. Every rank arrives at a second rendezvous before returning, because
//      peers read and write its buffers until then. This one waits without
//      deadline or abort: past step 1 nobody blocks, and returning early
//      would let a caller free a buffer a peer is still writing.
// A rank that does not arrive within options.timeout fails the group: every
// waiting rank returns DeadlineExceeded naming the missing replica(s). Abort
// on any member fails the whole group, operations waiting in step 1 included
// (an operation already past step 1 completes).
//
// Thread-safety: thread-safe; each member is driven by its own thread.
class InProcessGroup {
 public:
  enum class OpKind { kAllReduce, kReduce, kBroadcast, kAllGather, kBarrier };

  // What one rank passed to the current operation (lives on that rank's stack
  // for the duration of the call).
  struct Call {
    OpKind kind = OpKind::kBarrier;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    int64_t elements = 0;  // total elements of buffers (AllReduce/Reduce/Broadcast) or input
    absl::Span<const absl::Span<float>> buffers;
    absl::Span<const float> input;
    absl::Span<float> output;
  };

  // `names[r]` names rank r in errors; default "replica r".
  explicit InProcessGroup(int size, std::vector<std::string> names = {});

  int size() const { return size_; }
  const std::string& name(int rank) const { return names_[rank]; }

  // Step 1's rendezvous: publishes `call` for `rank` and waits for all. On
  // success every rank's call is readable through call(r) until Finish, and
  // every rank must call Finish.
  absl::Status Begin(int rank, const Call* call, absl::Time deadline, const std::string& what);
  // Step 3: waits until every rank is done with the current operation.
  void Finish(int rank);
  const Call& call(int rank) const { return *calls_[rank]; }

  // Fails every in-flight and later operation of every member with `reason`.
  void Abort(const absl::Status& reason);

 private:
  absl::Status Arrive(int rank, absl::Time deadline, const std::string& what);

  const int size_;
  const std::vector<std::string> names_;
  // Written by rank r before it arrives; read by others between the two
  // rendezvous (the mutex hand-off at the rendezvous orders the accesses).
  std::vector<const Call*> calls_;

  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // completed step-1 rendezvous
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finish_generation_ ABSL_GUARDED_BY(mu_) = 0;  // completed step-3 rendezvous
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> arrived_mask_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // first failure; the group is dead after it
};

// One rank's handle on an InProcessGroup. Owns a share of the group.
// Thread-safety: as Collective (one thread per rank; Abort from any thread).
class InProcessCollective : public Collective {
 public:
  // A group of `size` ranks; element r is rank r's member. `names` as for
  // InProcessGroup.
  static std::vector<std::unique_ptr<InProcessCollective>> CreateGroup(
      int size, std::vector<std::string> names = {});

  InProcessCollective(std::shared_ptr<InProcessGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override;
  using Collective::AllReduce;
  // Like AllReduce, but only `root`'s buffers receive the result; the others
  // are left unchanged. (HierarchicalCollective's local step.)
  absl::Status Reduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op, int root,
                      const CollectiveOptions& options);
  absl::Status Broadcast(absl::Span<float> buffer, int root,
                         const CollectiveOptions& options) override;
  // Broadcast of several buffers as one logical vector.
  absl::Status Broadcast(absl::Span<const absl::Span<float>> buffers, int root,
                         const CollectiveOptions& options);
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                         const CollectiveOptions& options) override;
  absl::Status Barrier(const CollectiveOptions& options) override;
  void Abort(const absl::Status& reason) override;
  CollectiveStats stats() const override;

 private:
  absl::Status Reduction(InProcessGroup::OpKind kind, absl::Span<const absl::Span<float>> buffers,
                         ReduceOp op, int root, const CollectiveOptions& options);
  absl::Status Run(const InProcessGroup::Call& call, const CollectiveOptions& options,
                   const char* what, int64_t* bytes_in, int64_t* bytes_out);

  std::shared_ptr<InProcessGroup> group_;
  const int rank_;
  std::atomic<int64_t> operations_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_IN_PROCESS_H_

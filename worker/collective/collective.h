#ifndef DISTRAIN_WORKER_COLLECTIVE_COLLECTIVE_H_
#define DISTRAIN_WORKER_COLLECTIVE_COLLECTIVE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace distrain {

enum class ReduceOp { kSum, kMean };

struct CollectiveOptions {
  absl::Duration timeout = absl::Seconds(60);  // per operation; DeadlineExceeded after
  std::string tag;                             // names the operation in errors and logs
};

// Counters an implementation keeps for metrics (bytes this rank sent and
// received, operations completed). Read with stats(); monotonic.
struct CollectiveStats {
  int64_t operations = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

// A group of `size()` ranks that run collective operations together
// (gloo-like). Every rank calls the same operations in the same order with
// the same sizes. Errors: DeadlineExceeded when a peer does not answer within
// options.timeout, Unavailable when a peer's connection breaks, Aborted after
// Abort(); the message names the peer task ("worker:2 (10.0.0.5:41234)").
// After an error the group is unusable (a later re-rendezvous builds a new one).
//
// Thread-safety: operations are called from one thread at a time per rank;
// Abort may be called from any thread, at any time.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Element-wise reduction of every buffer across ranks, in place. All
  // buffers of one call are reduced as one logical vector (so callers can pass
  // a bucket of several gradients without packing). Sizes may be 0 and need
  // not divide by size(). After an error the buffers hold unspecified values
  // (the algorithms reduce in place, so some elements may be partly reduced):
  // a caller that retries starts again from its own copy.
  virtual absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                                 const CollectiveOptions& options) = 0;
  absl::Status AllReduce(absl::Span<float> buffer, ReduceOp op, const CollectiveOptions& options) {
    return AllReduce(absl::MakeConstSpan(&buffer, 1), op, options);
  }
  // Copies root's buffer into every rank's buffer.
  virtual absl::Status Broadcast(absl::Span<float> buffer, int root,
                                 const CollectiveOptions& options) = 0;
  // output = concatenation of every rank's input, in rank order;
  // output.size() == size() * input.size().
  virtual absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                                 const CollectiveOptions& options) = 0;
  virtual absl::Status Barrier(const CollectiveOptions& options) = 0;

  // Fails every in-flight and later operation with `reason` (the membership
  // watcher calls it when the coordinator reports a dead peer).
  virtual void Abort(const absl::Status& reason) = 0;
  virtual CollectiveStats stats() const = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_COLLECTIVE_H_

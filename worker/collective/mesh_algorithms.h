#ifndef DISTRAIN_WORKER_COLLECTIVE_MESH_ALGORITHMS_H_
#define DISTRAIN_WORKER_COLLECTIVE_MESH_ALGORITHMS_H_

// MeshAlgorithms: RingCollective's latency path (payloads up to
// RingOptions::small_allreduce_bytes on a fully connected Transport), where
// the hop count and, on oversubscribed cores, the number of calls into the
// transport set the time, not bandwidth.
//
// OneHop (Broadcast: the root sends to everyone; AllGather, Barrier and
// small all-reduces of the gather kind: all-to-all in one round, so a rank
// that never arrives is named by every other rank):
//   1. Send the operation header and payload to every receiving peer and
//      receive a header and payload from every sending peer, each peer's
//      bytes straight into its place, all links driven at once; a peer's
//      header is checked (operation.h) as soon as it is complete.
//   2. When no link can progress, wait for those with work left; at the
//      deadline name the peers that sent nothing (or, when all sent, those
//      that did not take our bytes).
//
// DoublingAllReduce (recursive doubling):
//   1. Non-powers of two first fold pairs: of ranks 2i and 2i+1 below
//      2*(N - pof2), the even one hands its vector to the odd one and sits
//      out.
//   2. The remaining pof2 ranks run log2(pof2) pairwise exchanges with the
//      partner whose (virtual) rank differs in one bit, each side adding the
//      partner's vector to its own. Both sides of an exchange add the same
//      two operands (a + b == b + a exactly), so every rank ends
//      bit-identical.
//   3. The odd ranks of step 1 hand the result back to their even partner.
//   Measured at 4 KiB with 4 processes on the 2 cores: 71-83 us against
//   99-121 us for a one-round all-to-all and 220 us for the ring: on
//   oversubscribed cores the syscall count, not the hop count, sets the
//   latency. For the same reason an exchange whose send is done waits in the
//   receive itself (Link::Receive) instead of in Wait + receive, after
//   checking for up to busy_poll whether the answer is already there
//   (RingOptions::busy_poll).
//   A single caller span is worked on in place; several are gathered into
//   one vector first and copied back at the end.
//
// HalvingDoublingAllReduce (Rabenseifner's; medium payloads):
//   1. Fold pairs down to a power of two, as DoublingAllReduce's step 1.
//   2. Recursive halving (a reduce-scatter): at distance pof2/2, then /4 ...
//      1, a rank sends the half of its current segment that the partner
//      keeps and adds the partner's copy of the half it keeps, a
//      slice_bytes piece at a time as the pieces arrive (Exchange's
//      `accumulate`), so after log2(pof2) exchanges it holds one 1/pof2
//      block of the sum.
//   3. It divides its block for MEAN, then recursive doubling (an
//      all-gather) in the reverse order: it sends its reduced segment and
//      receives the partner's, until every rank has the whole vector —
//      bit-identical, since each block was summed by one rank only.
//   4. The folded ranks get the result back, as DoublingAllReduce's step 3.
//   The ring's bytes in 2 log2(pof2) exchanges instead of 2(N - 1) steps:
//   on oversubscribed cores each step costs a wake-up of every rank.
//
// Ownership: owns its scratch; keeps references to the transport and the
// operation. Thread-safety: the operation thread only.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/collective/collective.h"
#include "worker/collective/operation.h"
#include "worker/collective/transport.h"

namespace distrain {

class MeshAlgorithms {
 public:
  // `transport` must be fully connected.
  // `slice_bytes` (RingOptions::chunk_bytes): a reducing exchange adds what
  // arrived in pieces of this size, while the rest is still on its way.
  MeshAlgorithms(Transport& transport, const Operation& op, absl::Duration busy_poll,
                 int64_t slice_bytes);

  // One-hop exchange: `bytes` from `out` (after the header) to every peer,
  // and each peer p's bytes into in[p] (size() pointers); with sender >= 0
  // only that rank sends and the others receive from it.
  absl::Status OneHop(const char* out, char* const* in, int64_t bytes, int sender,
                      absl::Time deadline);

  // Small all-reduce of `buffers` (`elements` floats in all) by recursive
  // doubling.
  absl::Status DoublingAllReduce(absl::Span<const absl::Span<float>> buffers, int64_t elements,
                                 ReduceOp op, absl::Time deadline);
  // Medium all-reduce by recursive halving and doubling.
  absl::Status HalvingDoublingAllReduce(absl::Span<const absl::Span<float>> buffers,
                                        int64_t elements, ReduceOp op, absl::Time deadline);

 private:
  // Steps 1 and 3 of both all-reduces: the largest power of two <= size, the
  // ranks beyond it folded into their odd partners. Fold returns this rank's
  // virtual rank among the pof2, or -1 when it sat out.
  absl::StatusOr<int> Fold(float* work, float* incoming, int64_t elements, absl::Time deadline);
  absl::Status Unfold(float* work, int64_t elements, absl::Time deadline);
  // The real rank of virtual rank `vrank`.
  int RealRank(int vrank) const;
  // The vector an all-reduce works on and `elements` floats of scratch for
  // what partners send: the caller's buffer itself when it is one span
  // (no copy in or out), else work_[0, E) gathered from the spans.
  struct Workspace {
    float* work;
    float* incoming;
    bool gathered;
  };
  Workspace Prepare(absl::Span<const absl::Span<float>> buffers, int64_t elements);
  // Copies work_ back into the spans when Prepare gathered them.
  void Finish(const Workspace& space, absl::Span<const absl::Span<float>> buffers) const;

  // One pairwise step: sends the header + `out_bytes` from `out` to rank
  // `to` and receives a header + `in_bytes` into `in` from rank `from`
  // (either may be -1). With `accumulate`, the received floats are also
  // added into accumulate[0, in_bytes / 4), one slice_bytes_ piece as soon
  // as it is complete: the addition reads bytes the kernel has just written
  // (still in cache) and overlaps the partner's sending of the rest.
  absl::Status Exchange(int to, const char* out, int64_t out_bytes, int from, char* in,
                        int64_t in_bytes, absl::Time deadline, float* accumulate = nullptr);

  Transport& transport_;
  const Operation& op_;
  const absl::Duration busy_poll_;
  const int64_t slice_bytes_;  // whole floats
  // Per-operation state, reused so steady state does not allocate.
  std::vector<float> work_;  // incoming scratch, after the gathered vector when there is one
  std::vector<OpHeader> in_headers_;  // OneHop, per peer
  OpHeader exchange_in_header_{};
  std::vector<int64_t> sent_;  // OneHop, per peer
  std::vector<int64_t> got_;
  std::vector<char> can_send_;  // bools: worth a call now
  std::vector<char> can_receive_;
  std::vector<LinkWait> waits_;
  std::vector<int> wait_peer_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_MESH_ALGORITHMS_H_

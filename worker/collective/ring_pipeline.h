#ifndef DISTRAIN_WORKER_COLLECTIVE_RING_PIPELINE_H_
#define DISTRAIN_WORKER_COLLECTIVE_RING_PIPELINE_H_

// RingPipeline: the ring's general transfer engine, for everything on the
// ring except the bandwidth-path all-reduce (ring_allreduce.h). A plan is a
// list of send units (byte ranges of a ByteVector, out to the right
// neighbour in order) and receive units (byte ranges received in place from
// the left neighbour, in order); a send unit that depends on a receive unit
// goes out byte by byte as soon as those bytes have arrived, so a chain
// forwards while it receives instead of a whole block later.
//
// Protocol of Run:
//   1. Receive into the current receive unit; when a header unit completes,
//      check it (operation.h) before anything else is received.
//   2. Send everything currently allowed (independent units whole,
//      dependent ones up to what arrived), gathered into one call of up to
//      kMaxIoSlices slices.
//   3. Go round again while anything moved or a direction may still
//      progress; otherwise wait on the links that have work (and the
//      transport's abort) until the deadline.
// Plans RingCollective makes:
//   - Broadcast: a pipelined chain root -> root+1 -> ... -> root-1 (each
//     rank but the root receives the data; each but the last forwards it).
//   - AllGather (PlanAllGather): ring all-gather, N-1 steps; at step t rank r
//     sends block (r-t) mod N and receives block (r-t-1) mod N, which it
//     forwards at step t+1.
//   - Barrier without the mesh: all-gather of one-float tokens; small
//     all-reduces without the mesh: all-gather of the whole vectors.
//
// Ownership: keeps pointers to the ByteVectors of the plan (owned by the
// caller, valid until Run returns), and to the transport and operation.
// Thread-safety: the operation thread only.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/collective/operation.h"
#include "worker/collective/transport.h"

namespace distrain {

class RingPipeline {
 public:
  RingPipeline(Transport& transport, const Operation& op);

  // Forgets the previous plan.
  void Clear();
  // The operation's header as the next send / receive unit.
  void AddSendHeader();
  void AddReceiveHeader();
  // `depends_on`: the receive unit (AddReceive's index) whose received bytes
  // bound how far this unit may go; -1 none.
  void AddSend(const ByteVector* vector, int64_t begin, int64_t length, int depends_on);
  int AddReceive(ByteVector* vector, int64_t begin, int64_t length);
  // Plans a ring all-gather of size() blocks of `vector` (block r = rank r's),
  // headers included.
  void PlanAllGather(ByteVector* vector, int64_t block_bytes);

  // Runs the plan to completion (see above); errors name the neighbour.
  absl::Status Run(absl::Time deadline);

 private:
  enum class Mode : uint8_t { kCopy, kHeader };
  struct SendUnit {
    const ByteVector* vector;
    int64_t begin;
    int64_t length;
    int depends_on;
  };
  struct ReceiveUnit {
    ByteVector* vector;
    int64_t begin;
    int64_t length;
    Mode mode;
  };
  int AddReceiveUnit(ByteVector* vector, int64_t begin, int64_t length, Mode mode);

  Transport& transport_;
  const Operation& op_;
  ByteVector header_out_;  // op_.header()
  ByteVector header_in_;   // in_header_
  OpHeader in_header_{};
  std::vector<SendUnit> send_units_;  // reused, so steady state does not allocate
  std::vector<ReceiveUnit> receive_units_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_RING_PIPELINE_H_

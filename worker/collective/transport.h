#ifndef DISTRAIN_WORKER_COLLECTIVE_TRANSPORT_H_
#define DISTRAIN_WORKER_COLLECTIVE_TRANSPORT_H_

// The seam between RingCollective's algorithms (ring_allreduce.h,
// ring_pipeline.h, mesh_algorithms.h) and what carries their bytes
// (tcp_transport.h today; RDMA or a NCCL-net-shaped plugin would be another
// Transport). The shape is gloo's pair / NCCL net's isend-irecv-test: a
// connected group of ranks, one Link per direct connection, and calls that
// move what they can now and say so, plus one wait for readiness.
//
// Why non-blocking "try" calls and a separate Wait instead of blocking
// send/receive: one algorithm thread drives both directions of a ring (and
// every peer of the mesh) at once and reduces one slice while the transport
// moves the next; a blocking call on one link would stall the other. The
// algorithms also skip a call that cannot progress (a short transfer means
// "not now"), because on busy cores a wasted syscall costs as much as a
// small transfer.
//
// Errors are codes, not Statuses: the algorithm knows which operation, which
// step and how far it got, so it words the error (operation.h). A transport
// only reports that a peer closed the stream, that the link broke (with a
// static reason), or that a wait passed its deadline.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace distrain {

// One contiguous piece of a message, in the caller's memory.
struct IoSlice {
  void* data;
  size_t size;
};
// The most slices one call takes.
inline constexpr int kMaxIoSlices = 16;

// What one call on a Link did.
struct IoResult {
  enum Code : uint8_t {
    kMoved,       // `bytes` > 0 moved (maybe fewer than asked)
    kWouldBlock,  // nothing can move now
    kClosed,      // the peer ended its stream (receiving only)
    kBroken,      // the link failed; `reason` says how
    kTimedOut,    // Receive: the deadline passed before anything arrived
  };
  Code code = kWouldBlock;
  int64_t bytes = 0;
  const char* reason = "";  // kBroken: static text ("Connection reset by peer")
};

// A direct connection to one peer: an ordered, reliable byte stream each way.
// Owned by its Transport; valid as long as it. Thread-safety: one thread
// (the one running the operation) calls these.
class Link {
 public:
  virtual ~Link() = default;

  // Move a prefix of the concatenated `slices` (at most kMaxIoSlices), as
  // much as goes without waiting. A transfer shorter than asked means the
  // link cannot take (or has no) more until Transport::Wait reports it ready.
  virtual IoResult TrySend(absl::Span<const IoSlice> slices) = 0;
  virtual IoResult TryReceive(absl::Span<const IoSlice> slices) = 0;

  // Waits in the receive itself until all of `slices` arrived, about
  // `deadline` passed (kTimedOut when nothing came), or Transport::Abort ran.
  // May return early with fewer bytes, or kWouldBlock; callers loop. For the
  // latency path: one call instead of wait + receive.
  virtual IoResult Receive(absl::Span<const IoSlice> slices, absl::Time deadline) = 0;

  // Checks for bytes to receive for up to `budget`, yielding the CPU between
  // checks; true as soon as there are some. Cheaper than sleeping when the
  // peer answers within microseconds (RingOptions::busy_poll).
  virtual bool AwaitReadable(absl::Duration budget) = 0;
};

// One link and direction to wait for (Transport::Wait).
struct LinkWait {
  enum Direction : uint8_t { kSend, kReceive };
  Link* link;
  Direction direction;
  bool ready = false;  // set by Wait: worth another try (or an error to read)
};

struct TransportStats {
  int64_t bytes_sent = 0;  // through Links, so protocol headers count, setup does not
  int64_t bytes_received = 0;
};

// A connected group of size() ranks as seen by rank(): links to the two ring
// neighbours always, to every other rank when fully_connected().
//
// Ownership: owns its links. Thread-safety: one thread runs operations
// (links, Wait); Abort(), aborted() and stats() from any thread.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank r's name for errors, with its address once known
  // ("worker:2 (10.0.0.5:41234)"); also this rank's own.
  virtual const std::string& name(int rank) const = 0;
  // Whether every pair of ranks has a direct link (the mesh), not only ring
  // neighbours.
  virtual bool fully_connected() const = 0;
  // The link this rank sends to `peer` on, and the one it receives from
  // `peer` on (the same link or two). Ring data goes out on
  // SendLink(rank + 1) and comes in on ReceiveLink(rank - 1). Null when there
  // is no direct link to `peer`.
  virtual Link* SendLink(int peer) = 0;
  virtual Link* ReceiveLink(int peer) = 0;

  // Blocks until one of `waits` may progress (its `ready` is set), Abort()
  // ran, or `deadline` passed. OK: look again (also on spurious wake-ups);
  // DeadlineExceeded (no message: the caller words it) when the deadline
  // passed with nothing ready; another error when the wait itself failed
  // ("poll: ...").
  virtual absl::Status Wait(absl::Span<LinkWait> waits, absl::Time deadline) = 0;
  // Wait for one link to receive on and one to send on (either may be null,
  // as may the flags when its link is), setting *receive_ready /
  // *send_ready when Wait reports them; a link whose flag is already set
  // stays set.
  absl::Status WaitFor(Link* receive, Link* send, absl::Time deadline, bool* receive_ready,
                       bool* send_ready) {
    LinkWait waits[2];
    size_t count = 0;
    if (receive != nullptr) waits[count++] = LinkWait{receive, LinkWait::kReceive};
    if (send != nullptr) waits[count++] = LinkWait{send, LinkWait::kSend};
    const absl::Status status = Wait({waits, count}, deadline);
    if (receive != nullptr && waits[0].ready) *receive_ready = true;
    if (send != nullptr && waits[count - 1].ready) *send_ready = true;
    return status;
  }

  // Wakes every Wait and Receive, now and later, and closes the links so
  // that peers waiting on this rank fail fast. Idempotent.
  virtual void Abort() = 0;
  virtual bool aborted() const = 0;
  virtual TransportStats stats() const = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_TRANSPORT_H_

#ifndef DISTRAIN_WORKER_COLLECTIVE_TCP_TRANSPORT_H_
#define DISTRAIN_WORKER_COLLECTIVE_TCP_TRANSPORT_H_

// TcpTransport: the Transport (transport.h) of RingCollective, raw TCP
// sockets between the ranks, bootstrapped and authenticated through a Store.
//
// Raw TCP was chosen by measurement. bench/transport_choice
// (bench_transport_choice: 64 MiB as 1 MiB chunks one way over 127.0.0.1,
// then 4 KiB ping-pongs; the two transports alternate repeat by repeat in
// the same run; release build on the 2-core dev VM shared with other builds,
// load average 5-5.6; four runs, each the median of 5 transfers / 2000 pings):
//                          GB/s (median)   CPU s per GB   4 KiB ping-pong
//   raw TCP socket         1.03 - 3.43     0.33 - 0.50    20 - 65 us
//   gRPC 1.51 bidi stream  0.58 - 1.09     1.25 - 1.45    84 - 137 us
//   raw TCP / gRPC, per run  1.7 - 3.9x    2.9 - 3.8x less  1.7 - 4.7x faster
// gRPC copies each chunk into a protobuf, into gRPC slices and HTTP/2
// frames, and hands it between completion-queue threads. In a ring
// all-reduce every core is already busy moving and reducing bytes, so CPU
// per byte is the bandwidth, and small all-reduces are latency-bound. A raw
// socket moves bytes from the caller's buffer to the kernel and from the
// kernel into the peer's buffer (or a reduction scratch), nothing in
// between, and one thread can multiplex sending, receiving and reducing with
// poll(). gRPC stays the control plane (the coordination service, which is
// also the Store that bootstraps these sockets).
//
// Setup protocol (Create). Every connection is authenticated by the
// challenge-response of ring_handshake.h, keyed with the job's ring key.
//   1. Listen on options.bind_host, ephemeral port; draw a nonce.
//   2. Publish "<key_prefix>/ring/<rank>" = "<advertised_host>:<port> <nonce
//      hex>".
//   3. Read the right neighbour's ((rank+1) % size) address from the Store,
//      connect (retrying names that do not resolve yet and refused
//      connections until the setup deadline) and send a hello
//      {magic, version, group id, from rank, to rank, size, own fresh nonce,
//      MAC over all that and the neighbour's published nonce}. With the mesh
//      (options.mesh) also dial every non-adjacent higher rank.
//   4. Read the other peers' addresses (for messages), then accept until the
//      left neighbour (and, with the mesh, every non-adjacent lower rank) has
//      said hello with our group id and a MAC that verifies under our nonce;
//      anything else (a stray client, a stale rank of an earlier generation,
//      a wrong MAC) is closed. Answer each with an ack {magic, rank, group
//      id, MAC over that, the hello's nonce and ours}.
//   5. Wait for the acks of everyone we dialled and verify their MACs. Ring
//      data flows rightwards: SendLink(right) is the socket we dialled to the
//      right neighbour, ReceiveLink(left) the one the left neighbour dialled.
//      The mesh reuses those two sockets in their idle direction for the
//      neighbours (with two ranks, left == right: one socket each way).
//
// After setup the sockets block, and every call that must not passes
// MSG_DONTWAIT, so that Link::Receive can sleep in recvmsg itself (bounded
// by SO_RCVTIMEO, armed per link and reused while it fits the deadline, so
// successive operations with the same timeout cost no setsockopt). Wait is
// poll() over the links plus an eventfd that Abort() signals; Abort() also
// shuts every socket down (shutdown, not close, is safe while the operation
// thread still uses the descriptors), which ends a blocked recvmsg and
// makes peers blocked on this rank fail fast.
//
// Ownership: owns its listener-accepted and dialled sockets (the listener
// itself only lives through setup); does not keep the Store.
// Thread-safety: as Transport (one operation thread; Abort(), aborted() and
// stats() from any thread). Byte counters have a single writer, the
// operation thread.

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/store.h"
#include "worker/collective/tcp_socket.h"
#include "worker/collective/transport.h"

namespace distrain {

struct TcpTransportOptions {
  // Store keys are "<key_prefix>/ring/<rank>".
  std::string key_prefix = "collective";
  std::string bind_host = "127.0.0.1";
  std::string advertised_host;  // empty = bind_host; required for a wildcard bind_host
  // names[r] names rank r in errors ("worker:2"); empty = "rank r".
  std::vector<std::string> names;
  // In every hello; 0 = RingGroupId(key_prefix, size).
  uint64_t group_id = 0;
  // The MAC key of the handshake; empty: the plaintext opt-out.
  std::string ring_key;
  absl::Duration setup_timeout = absl::Seconds(60);
  // SO_SNDBUF/SO_RCVBUF; 0 leaves the kernel's autotuning.
  int socket_buffer_bytes = 0;
  // Also connect every pair of ranks, not only ring neighbours.
  bool mesh = false;
  // How long Wait keeps looking for a ready link, yielding the CPU between
  // looks, before it sleeps in poll; zero sleeps at once. Why spin at all: a
  // sleeping rank must be woken by the kernel when its peer's bytes land,
  // and on a virtual machine that wake-up is an interrupt to a halted vCPU
  // (an exit to the hypervisor and back) on every slice of a pipelined
  // transfer; a rank that yields instead hands its core straight to whoever
  // shares it (a peer rank, a compute thread) and sees the bytes on the next
  // look. Why stop: a peer that is still computing its gradients may take
  // milliseconds, and a sleeping wait then costs nothing. RingOptions::
  // busy_poll sets it and records what it was measured at.
  absl::Duration busy_poll = absl::ZeroDuration();
};

class TcpTransport final : public Transport {
 public:
  // Runs the setup protocol above; needs 2 <= size, 0 <= rank < size and
  // names empty or one per rank (RingCollective::Create checks them and
  // words the errors). Errors name the peer that did not answer or failed
  // the handshake.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(Store& store, int rank, int size,
                                                              const TcpTransportOptions& options);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name(int rank) const override { return names_[rank]; }
  bool fully_connected() const override { return options_.mesh; }
  Link* SendLink(int peer) override;
  Link* ReceiveLink(int peer) override;
  absl::Status Wait(absl::Span<LinkWait> waits, absl::Time deadline) override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(std::memory_order_relaxed); }
  TransportStats stats() const override;

 private:
  class TcpLink;

  TcpTransport(int rank, int size, const TcpTransportOptions& options);
  absl::Status Setup(Store& store);

  const int rank_;
  const int size_;
  const TcpTransportOptions options_;
  std::vector<std::string> names_;  // with addresses once known

  tcp::Fd abort_fd_;  // eventfd; readable once Abort() ran
  // Per peer: the connection this rank dialled (right neighbour, higher mesh
  // ranks) and the one it accepted (left neighbour, lower mesh ranks); null
  // where there is none. With two ranks the other one is both.
  std::vector<std::unique_ptr<TcpLink>> dialled_;
  std::vector<std::unique_ptr<TcpLink>> accepted_;
  std::vector<TcpLink*> send_link_;     // per peer: dialled, else accepted
  std::vector<TcpLink*> receive_link_;  // per peer: accepted, else dialled
  std::vector<pollfd> poll_;            // Wait's, reused

  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_TCP_TRANSPORT_H_

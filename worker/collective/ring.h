#ifndef DISTRAIN_WORKER_COLLECTIVE_RING_H_
#define DISTRAIN_WORKER_COLLECTIVE_RING_H_

// RingCollective: the collective of MultiWorkerMirrored across processes.
//
// Algorithms over a transport seam (gloo's shape), one file each, every
// protocol written out as numbered steps where it is implemented:
//   transport.h         Link / Transport, all that the algorithms use
//   tcp_transport.h     the TCP transport: raw sockets (chosen over gRPC by
//                       measurement), the setup protocol of Create
//                       ("Setup protocol"), waits and Abort
//   ring_handshake.h    the authenticated hello / ack of that setup
//   operation.h         the header every message starts with, error wording
//   ring_allreduce.h    bandwidth-path all-reduce: the sliced reduce-scatter +
//                       all-gather through a staging ring, and why it cannot
//                       deadlock
//   ring_pipeline.h     the other ring transfers: chain broadcast, ring
//                       all-gather
//   mesh_algorithms.h   latency path: recursive doubling, one-hop exchanges
// This class checks the options, builds the transport and picks a path per
// call:
//   Bandwidth path (payload > small_allreduce_bytes, or no mesh).
//     - AllReduce: SlicedRingAllReduce. Nothing is allocated per operation
//       in steady state.
//     - Broadcast: a pipelined chain root -> root+1 -> ... -> root-1.
//     - AllGather: ring all-gather. Barrier (no mesh): all-gather of tokens.
//   Latency path (payload <= small_allreduce_bytes, mesh on: groups of up to
//   mesh_max_ranks ranks also connect every pair).
//     - AllReduce: recursive doubling, ceil(log2 N) pairwise exchanges.
//     - Broadcast: the root sends to everyone. AllGather and Barrier:
//       all-to-all in one round (so a rank that never arrives is named by
//       every other rank).
//   Without the mesh, small AllReduces ring-all-gather the whole vectors
//   (N-1 hops) and sum them in rank order on every rank.
//   Medium path (small_allreduce_bytes < payload <= halving_doubling_bytes,
//   mesh on, N a power of two >= 4): AllReduce by recursive halving and
//   doubling, 2 log2 N pairwise exchanges of the ring's bytes.
//
// Failures: every wait is bounded by the operation's deadline and woken by
// Abort(). DeadlineExceeded names the peer this rank waited for (on the ring
// a stall propagates, so ranks further away name their own left neighbour;
// the membership watcher knows which process died and should Abort with
// that reason); a closed or reset connection gives Unavailable naming the
// peer; Abort() also shuts the transport's connections down so peers blocked
// on this rank fail fast. After any error the group is unusable.
//
// Ownership: owns its transport, algorithms and buffers; does not keep the
// Store.
// Thread-safety: as Collective (one thread drives operations; Abort() and
// stats() from any thread).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/collective.h"
#include "worker/collective/operation.h"
#include "worker/collective/ring_handshake.h"  // the handshake's API, for tests and fuzzers
#include "worker/collective/store.h"
#include "worker/collective/transport.h"
#include "worker/security/transport_security.h"

namespace distrain {

class MeshAlgorithms;
class RingPipeline;
class SlicedRingAllReduce;

struct RingOptions {
  // Store keys are "<key_prefix>/ring/<rank>"; include the membership
  // generation so a re-rendezvous never reads stale addresses.
  std::string key_prefix = "collective";
  // Where to listen. "0.0.0.0" / "::" listen everywhere and then need
  // advertised_host.
  std::string bind_host = "127.0.0.1";
  // What peers connect to (the pod's DNS name); empty = bind_host.
  std::string advertised_host;
  // peer_names[r] names rank r in errors ("worker:2"); empty = "rank r".
  std::vector<std::string> peer_names;
  // Identifies the group in the hello; 0 = a hash of key_prefix and size.
  uint64_t group_id = 0;
  // The job's ring key (TransportSecurity::ring_key) authenticates every
  // connection; null: plaintext opt-out, the MACs keyed with the empty key.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
  // Deadline for the whole of Create (peers that start late are waited for).
  absl::Duration setup_timeout = absl::Seconds(60);
  // All-reduce slice (rounded down to whole floats; at least 64 bytes) and
  // the most one receive asks for; the staging ring holds four slices.
  // Defaults measured (64 MiB, N = 4 processes on loopback, CPU per byte
  // sent, interleaved runs): 128 KiB slices (512 KiB stage) 0.26-0.33 ns,
  // 96 KiB 0.27-0.29, 160 KiB 0.25-0.26, 256 KiB 0.34-0.43, 512 KiB
  // 0.49-0.50 (the stage no longer stays in L2 beside the socket buffers),
  // 64 KiB 0.31-0.33; a stage of 8 slices instead of 4: 0.27-0.44.
  // Socket buffers with 128 KiB slices: 1 MiB 0.26-0.28, 2 MiB 0.26-0.34,
  // kernel autotuning 0.27-0.33, 512 KiB 0.26-0.36, 256 KiB 0.42-0.52.
  // (Those on a Zen 4 with AVX-512 and 1 MiB of L2.) On a Zen 3 EPYC with
  // AVX2 and 512 KiB of L2 (bench/allreduce_busbw.py --distrain-args
  // --chunk-bytes, two interleaved rounds, load ~2), busbw at 64 MiB for
  // N = 3 and 4: 128 KiB 0.44-0.50 and 0.36-0.37 GB/s, 64 KiB 0.32-0.37 and
  // 0.28-0.33, 32 KiB 0.25-0.38 and 0.25-0.26. So a slice derived from the
  // L2 size (a stage of half the L2 would mean 64 KiB here) loses on the
  // smaller cache, and 128 KiB is the best measured on both kinds: the
  // socket copies, not the stage's cache residency, set the optimum there.
  int64_t chunk_bytes = 128 << 10;
  // Slices in the all-reduce's staging ring (at least 2: the deadlock
  // argument in ring_allreduce.h needs room beyond one slice). Deeper rings give ranks
  // that share cores more slack before a descheduled neighbour stalls them,
  // at the price of a stage that may fall out of L2.
  int stage_slices = 4;
  // SO_SNDBUF/SO_RCVBUF; 0 leaves the kernel's autotuning.
  int socket_buffer_bytes = 1 << 20;
  // Payloads up to this many bytes take the latency path (mesh when
  // available, else ring all-gather) instead of the bandwidth path. Measured
  // crossover (2 and 4 processes): recursive doubling wins at 64 KiB (32 vs
  // 55-64 us, 133 vs 251-299 us), the ring at 128 KiB and above.
  int64_t small_allreduce_bytes = 64 << 10;
  // Payloads above small_allreduce_bytes and up to this many bytes take
  // recursive halving and doubling (MeshAlgorithms::HalvingDoublingAllReduce)
  // instead of the ring, in groups of a power of two >= 4 ranks with a mesh;
  // 0 disables it. Measured with 4 processes on the 2-core Zen 5 VM
  // (bench/allreduce_busbw.py --distrain-args --halving-doubling-bytes,
  // alternating rounds): 184-200 against 254-290 us at 256 KiB, 273-277
  // against 403-500 us at 512 KiB; at 1 MiB the ring, 652 against 739 us
  // (medians of 12 alternating process groups, both polling busy_poll),
  // and from 2 MiB on. 2 log2(N) wake-ups of every rank instead of 2(N - 1)
  // pay while the segments are small, the ring's chunked pipeline once they
  // are not. With 2 ranks both make one exchange each way and the ring
  // pipelines it; 3 ranks would pay a fold.
  int64_t halving_doubling_bytes = 512 << 10;
  // Groups of up to this many ranks also open a direct connection between
  // every pair of ranks, for one-hop small operations; 0 disables the mesh.
  int mesh_max_ranks = 16;
  // How long a rank waiting for a peer keeps polling, yielding the CPU
  // between polls, before it sleeps (every wait of every algorithm:
  // TcpTransportOptions::busy_poll says why); zero sleeps at once. The
  // small all-reduce's exchanges poll the same way before they sleep in
  // the receive itself. Measured on the 2-core Zen 5 VM, alternating
  // process groups, for 0 / 50 / 200 / 1000 us: 64 MiB with 4 processes
  // 60.3 / 52.9 / 46.6 / 46.7 ms; 1 MiB with 3 processes 575 / 512 / 468 /
  // 469 us; 4 KiB with 4 processes level (38-41 us from 50 us on); 2
  // processes unchanged (a core each: nobody to hand the core to). The
  // spin only has to outlast the gap between two slices of a transfer when
  // the sender shares its core; beyond that a peer is still computing, and
  // a sleeping wait costs nothing. MultiWorkerMirrored training of the MLP
  // (bench/training_scaling.py's job) with 1 ms against 50 us: 2 workers
  // 16070 against 15059 examples/s, 4 workers on the 2 cores 10179 against
  // 10071 (medians of 3 and 5 runs). At 4 KiB, polling 50 us against
  // sleeping at once: 2 processes 9.5-10 against 17-21 us, 3 processes
  // 22-30 against 61-80 us. Yielding matters: a pure spin on oversubscribed
  // cores steals the time the peer needs (4 processes at 4 KiB: 82 us).
  absl::Duration busy_poll = absl::Microseconds(200);
};

class RingCollective : public Collective {
 public:
  // Checks the options and runs the transport's setup protocol
  // (tcp_transport.h). size == 1 opens no sockets.
  static absl::StatusOr<std::unique_ptr<RingCollective>> Create(Store& store, int rank, int size,
                                                                const RingOptions& options);
  ~RingCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override;
  using Collective::AllReduce;
  absl::Status Broadcast(absl::Span<float> buffer, int root,
                         const CollectiveOptions& options) override;
  // `input` may alias output's block for this rank (in-place all-gather).
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output,
                         const CollectiveOptions& options) override;
  absl::Status Barrier(const CollectiveOptions& options) override;
  void Abort(const absl::Status& reason) override;
  CollectiveStats stats() const override;

  // "worker:2 (10.0.0.5:41234)"-style names of the two neighbours.
  const std::string& left_peer() const { return left_name_; }
  const std::string& right_peer() const { return right_name_; }

 private:
  RingCollective(int rank, int size, const RingOptions& options);
  // Connects the transport (tcp_transport.h, "Setup protocol") and builds
  // the algorithms over it.
  absl::Status Setup(Store& store);

  // Starts an operation: fails fast when the group is dead, and prepares the
  // header every link carries.
  absl::Status BeginOp(OpKind kind, ReduceOp op, int root, int64_t payload_bytes);
  // Ends an operation that ran: counts it when it succeeded, else records
  // the failure (see Fail).
  absl::Status Finish(absl::Status status);
  absl::Status Fail(absl::Status status);  // records the first failure
  // Small all-reduce by gathering every rank's vector (one hop on the mesh,
  // else around the ring) and summing in rank order.
  absl::Status GatherAllReduce(absl::Span<const absl::Span<float>> buffers, int64_t elements,
                               ReduceOp op, absl::Time deadline);

  const int rank_;
  const int size_;
  const RingOptions options_;
  std::string left_name_;
  std::string right_name_;

  Operation op_;
  std::unique_ptr<Transport> transport_;  // null when size == 1
  std::unique_ptr<SlicedRingAllReduce> ring_all_reduce_;
  std::unique_ptr<RingPipeline> pipeline_;
  std::unique_ptr<MeshAlgorithms> mesh_;  // null without the mesh

  // Per-operation state, reused (capacity kept) so steady state does not allocate.
  ByteVector data_;
  ByteVector gather_view_;
  std::vector<float> gather_;
  std::vector<float> barrier_blocks_;
  std::vector<char*> mesh_in_;  // where each peer's bytes land in a one-hop exchange
  absl::Status failed_;         // owned by the operation thread

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);

  std::atomic<int64_t> operations_{0};
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_RING_H_

#ifndef DISTRAIN_WORKER_COLLECTIVE_RING_H_
#define DISTRAIN_WORKER_COLLECTIVE_RING_H_

// RingCollective: the collective of MultiWorkerMirrored across processes.
//
// Transport: raw TCP sockets, chosen by measurement. bench/transport_choice
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
// Setup protocol (Create). Every connection is authenticated by an HMAC-
// SHA256 challenge-response keyed with the job's ring key (the raw sockets
// carry no TLS; docs/security.md): the challenge is the acceptor's nonce,
// published through the Store (which is itself mutual TLS), the response
// the dialler's MAC over its hello and that nonce; the ack answers with a
// MAC over the dialler's fresh nonce. A stranger without the key cannot
// produce either; a hello recorded from an earlier setup carries a MAC over
// an older nonce and is refused; another job's key gives another MAC.
//   1. Listen on options.bind_host, ephemeral port; draw a nonce.
//   2. Publish "<key_prefix>/ring/<rank>" = "<advertised_host>:<port> <nonce
//      hex>".
//   3. Read the right neighbour's ((rank+1) % size) address from the Store,
//      connect (retrying names that do not resolve yet and refused
//      connections until the setup deadline) and send a hello
//      {magic, version, group id, from rank, to rank, size, own fresh nonce,
//      MAC over all that and the neighbour's published nonce}. With the mesh
//      (size <= mesh_max_ranks) also dial every non-adjacent higher rank.
//   4. Read the other peers' addresses (for messages), then accept until the
//      left neighbour (and, with the mesh, every non-adjacent lower rank) has
//      said hello with our group id and a MAC that verifies under our nonce;
//      anything else (a stray client, a stale rank of an earlier generation,
//      a wrong MAC) is closed. Answer each with an ack {magic, rank, group
//      id, MAC over that, the hello's nonce and ours}.
//   5. Wait for the acks of everyone we dialled and verify their MACs. Ring
//      data flows rightwards:
//      we send on the socket we dialled to the right neighbour and receive on
//      the one the left neighbour dialled. The mesh reuses those two sockets
//      in their idle direction for the neighbours.
//
// Operations. Every message starts with a 24-byte header {magic, kind, op,
// sequence number, root, payload bytes}, checked by the receiver, so ranks
// that call different collectives fail with InvalidArgument naming the peer
// instead of reducing garbage. Two paths:
//   Bandwidth path (payload > small_allreduce_bytes, or no mesh). One thread
//   drives both sockets with non-blocking calls and poll(), so reducing one
//   slice overlaps the kernel moving the next; a syscall is only issued when
//   poll() says it can progress. Nothing is allocated per operation in
//   steady state.
//     - AllReduce: reduce-scatter then all-gather, 2(N-1) steps over N
//       segments of the logical vector (segment g = elements
//       [E*g/N, E*(g+1)/N)). At step t rank r sends segment (r-t) mod N and
//       receives segment (r-t-1) mod N; steps < N-1 reduce (the last of them
//       also divides for MEAN), later steps copy. Each element's final value
//       is computed by one rank and copied, so every rank ends bit-identical.
//       The steps are interleaved slice by slice (slice = chunk_bytes of a
//       segment): the wire carries round k = (slice k of step 0, of step 1,
//       ..., of step 2N-3), so what arrives for step t goes out again as step
//       t+1 one slice later, not one segment later. Incoming bytes land in a
//       staging ring of RingOptions::stage_slices slices that stays in cache; the
//       reduction adds the caller's own values into the stage (the caller's
//       vector is only read there), the stage is what is forwarded, and final
//       values (the last reduction, then every all-gather step) are written to
//       the caller's vector once, with non-temporal stores. So each element of
//       the vector is read once and written once per operation (about four
//       memory passes, counting reads for ownership, when reducing and
//       receiving in place), and the kernel's copies work on cached pages.
//       Measured at 64 MiB, N = 4 on the 2-core VM (rank 0's CPU seconds per
//       byte sent, interleaved runs): 0.38-0.46 ns reducing in place through a scratch
//       chunk with segment-sized steps (the previous engine, any chunk size);
//       0.26-0.33 ns sliced through the stage, about what the cache-resident
//       loopback streams of L_agg cost (0.26-0.28). No deadlock: the stage only
//       holds bytes that can go right as soon as the right neighbour takes
//       them, a unit received at step t leaves as step t+1 one unit later,
//       and with more than one slice of stage a rank always has room for the
//       left neighbour's next unit once it has sent its previous one.
//     Broadcast and AllGather run a second engine over a list of send units
//     (byte ranges of the data) and receive units (byte ranges received in
//     place); a send unit that depends on a receive unit goes out byte by
//     byte as soon as those bytes have arrived.
//     - Broadcast: a pipelined chain root -> root+1 -> ... -> root-1.
//     - AllGather: ring all-gather. Barrier (no mesh): all-gather of tokens.
//   Latency path (payload <= small_allreduce_bytes, mesh on): direct links.
//     - AllReduce: recursive doubling, ceil(log2 N) pairwise exchanges (non-
//       powers of two fold pairs first); both sides of an exchange add the
//       same two operands, so every rank ends bit-identical. Measured at 4 KiB
//       with 4 processes on the 2 cores: 71-83 us against 99-121 us for a
//       one-round all-to-all and 220 us for the ring: on oversubscribed
//       cores the syscall count, not the hop count, sets the latency. For
//       the same reason an exchange whose send is done blocks in recvmsg
//       (bounded by SO_RCVTIMEO) instead of poll() + recvmsg().
//     - Broadcast: the root sends to everyone. AllGather and Barrier:
//       all-to-all in one round (so a rank that never arrives is named by
//       every other rank).
//   Without the mesh, small AllReduces ring-all-gather the whole vectors
//   (N-1 hops) and sum them in rank order on every rank.
//
// Failures: every wait polls with the operation's deadline and an eventfd
// that Abort() signals (the blocking receive above is bounded by
// SO_RCVTIMEO and woken by Abort()'s shutdown()). DeadlineExceeded names the
// peer this rank waited for (on the ring a stall propagates, so ranks
// further away name their own left neighbour; the membership watcher knows
// which process died and should Abort with that reason); a closed or reset
// connection gives Unavailable naming the peer; Abort() also shuts every
// socket down so peers blocked on this rank fail fast. After any error the
// group is unusable.
//
// Ownership: owns its sockets and buffers; does not keep the Store.
// Thread-safety: as Collective (one thread drives operations; Abort() and
// stats() from any thread).

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/collective.h"
#include "worker/collective/store.h"
#include "worker/collective/tcp_socket.h"
#include "worker/security/transport_security.h"

namespace distrain {

// The connection handshake of Setup steps 2-5, as free functions so that
// tests/fuzz/ring_handshake_fuzz.cc and the hostile-client tests can feed
// them any bytes; RingCollective::Setup uses exactly these.
inline constexpr size_t kRingNonceBytes = 16;
inline constexpr size_t kRingHelloBytes = 80;
inline constexpr size_t kRingAckBytes = 48;
// 16 random bytes.
std::string NewRingNonce();
// The group id of RingOptions::group_id 0: a hash of the key prefix (which
// holds the membership generation) and the size. Not a secret.
uint64_t RingGroupId(const std::string& key_prefix, int size);
// The hello `from_rank` sends when it dials `to_rank`, whose listener
// published `acceptor_nonce`; `nonce` is the dialler's own, fresh per
// connection.
std::string MakeRingHello(uint64_t group_id, int from_rank, int to_rank, int size,
                          std::string_view key, std::string_view nonce,
                          std::string_view acceptor_nonce);
// The acceptor's answer to a hello carrying `hello_nonce`.
std::string MakeRingAck(uint64_t group_id, int rank, std::string_view key,
                        std::string_view hello_nonce, std::string_view own_nonce);
// A hello as it arrives at `to_rank` (whose listener published `own_nonce`):
// the sender's rank when it is of this protocol version, for `group_id`,
// addressed to `to_rank` of a group of `size`, from a rank in [0, size)
// other than `to_rank`, and its MAC verifies under `key` and `own_nonce`;
// the dialler's nonce goes to *hello_nonce (may be null). InvalidArgument
// saying what differs, PermissionDenied for a wrong MAC (another job's key,
// a forged hello, or a replay from an earlier setup, whose acceptor nonce
// differs).
absl::StatusOr<int> ParseRingHello(std::string_view bytes, uint64_t group_id, int to_rank,
                                   int size, std::string_view key, std::string_view own_nonce,
                                   std::string* hello_nonce);
// The ack from `peer` that this rank dialled with a hello carrying
// `hello_nonce`: OK when it is `peer`'s for `group_id` and its MAC verifies
// (so `peer` holds the key and answered this very hello).
absl::Status ParseRingAck(std::string_view bytes, uint64_t group_id, int peer,
                          std::string_view key, std::string_view hello_nonce,
                          std::string_view peer_nonce);
// A rank's store value, "<host:port> <32 hex digits>": where it listens and
// the nonce its listener expects in every hello of this setup.
struct RingAddress {
  tcp::HostPort address;
  std::string nonce;  // kRingNonceBytes raw bytes
};
absl::StatusOr<RingAddress> ParseRingAddress(std::string_view value);

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
  int64_t chunk_bytes = 128 << 10;
  // Slices in the all-reduce's staging ring (at least 2: the deadlock
  // argument above needs room beyond one slice). Deeper rings give ranks
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
  // Groups of up to this many ranks also open a direct connection between
  // every pair of ranks, for one-hop small operations; 0 disables the mesh.
  int mesh_max_ranks = 16;
  // How long a rank waiting for a small-all-reduce message polls, yielding
  // the CPU between polls, before it sleeps in recvmsg. Measured at 4 KiB
  // on the 2-core VM: 2 processes 9.5-10 us against 17-21 us sleeping at
  // once; 3 processes 22-30 us against 61-80 us; 4 processes 37-43 us
  // against 45-58 us. Yielding matters: a pure spin on oversubscribed cores
  // steals the time the peer needs (4 processes: 82 us). Zero disables.
  absl::Duration busy_poll = absl::Microseconds(50);
};

class RingCollective : public Collective {
 public:
  // Runs the setup protocol above. size == 1 opens no sockets.
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
  enum class Kind : uint8_t { kAllReduce = 1, kBroadcast, kAllGather, kBarrier };
  enum class Mode : uint8_t { kCopy, kHeader };

  // A logical byte vector made of contiguous regions (the caller's buffers,
  // or one of our own).
  class ByteVector {
   public:
    void Clear();
    void Add(void* data, int64_t bytes);
    int64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
    // The contiguous run at `position`, at most `max` bytes long.
    char* Piece(int64_t position, int64_t max, int64_t* length) const;

   private:
    std::vector<char*> bases_;
    std::vector<int64_t> ends_;  // cumulative
  };
  struct SendUnit {
    const ByteVector* vector;
    int64_t begin;
    int64_t length;
    int depends_on;  // receive unit whose processed bytes bound this one; -1 none
  };
  struct RecvUnit {
    ByteVector* vector;
    int64_t begin;
    int64_t length;
    Mode mode;
  };
  struct Header {
    uint32_t magic;
    uint8_t kind;
    uint8_t op;
    uint16_t reserved;
    uint32_t sequence;
    int32_t root;
    int64_t payload_bytes;
  };
  static_assert(sizeof(Header) == 24);

  RingCollective(int rank, int size, const RingOptions& options);
  absl::Status Setup(Store& store);

  // Starts an operation: fails fast when the group is dead, and prepares the
  // header both links carry.
  absl::Status BeginOp(Kind kind, ReduceOp op, int root, int64_t payload_bytes);
  // Runs send_units_/recv_units_ to completion (the engine).
  absl::Status Transfer(absl::Time deadline);
  absl::Status Fail(absl::Status status);  // records the first failure
  absl::Status CheckHeader(const Header& in, const std::string& peer) const;
  // Names the current operation in errors ("all-reduce 'grads' #12"); built
  // only on the error path so steady state does not allocate.
  std::string What() const;
  // The two ways a peer's socket ends mid-operation, worded alike by every
  // transfer loop; `progress` says how far the operation got.
  absl::Status PeerClosed(const std::string& peer, const std::string& progress) const;
  absl::Status PeerBroke(const char* direction, const std::string& peer, int err,
                         const std::string& progress) const;
  // A ring transfer that passed its deadline, blamed on the left neighbour
  // (it sends nothing) or the right one (it takes nothing).
  absl::Status RingTimedOut(bool waiting_for_left, const std::string& progress) const;
  void AddSend(const ByteVector* v, int64_t begin, int64_t length, int depends_on);
  int AddRecv(ByteVector* v, int64_t begin, int64_t length, Mode mode);

  // The bandwidth-path all-reduce of data_ (its own engine, see above).
  absl::Status RingAllReduce(ReduceOp op, absl::Time deadline);
  absl::Status GatherAllReduce(absl::Span<const absl::Span<float>> buffers, int64_t elements,
                               ReduceOp op, absl::Time deadline);
  // Plans a ring all-gather of size() blocks of `vector` (block r = rank r's).
  void PlanAllGather(ByteVector* vector, int64_t block_bytes);
  // One-hop exchange over the mesh: `bytes` from `out` (after the header)
  // to every peer, and each peer p's bytes into mesh_in_[p]; with sender >= 0
  // only that rank sends and the others receive from it.
  absl::Status MeshTransfer(absl::Time deadline, const char* out, int64_t bytes, int sender);
  // One pairwise step over the mesh: sends the header + `out_bytes` from
  // `out` to rank `to` and receives a header + `in_bytes` into `in` from rank
  // `from` (either may be -1).
  absl::Status Exchange(int to, const char* out, int64_t out_bytes, int from, char* in,
                        int64_t in_bytes, absl::Time deadline);
  // Sets SO_RCVTIMEO on the link from `peer` so a blocking receive ends
  // near `deadline`; false once the deadline has passed.
  bool ArmReceiveTimeout(int peer, absl::Time deadline);
  // Small all-reduce over the mesh by recursive doubling (log2 N steps).
  absl::Status DoublingAllReduce(absl::Span<const absl::Span<float>> buffers, int64_t elements,
                                 ReduceOp op, absl::Time deadline);

  const int rank_;
  const int size_;
  const RingOptions options_;
  std::vector<std::string> names_;  // peer name per rank, with address once known
  std::string left_name_;
  std::string right_name_;

  tcp::Fd send_fd_;   // to the right neighbour
  tcp::Fd recv_fd_;   // from the left neighbour
  tcp::Fd abort_fd_;  // eventfd; readable once Abort() ran
  // Mesh (see mesh_max_ranks): links to non-adjacent ranks, and the
  // descriptor to send to / receive from each peer (ring links included).
  bool mesh_ = false;
  std::vector<tcp::Fd> mesh_fds_;
  std::vector<int> mesh_send_fd_;
  std::vector<int> mesh_recv_fd_;
  std::vector<absl::Duration> mesh_receive_timeout_;  // SO_RCVTIMEO armed per link

  // Per-operation state, reused (capacity kept) so steady state does not allocate.
  ByteVector data_;
  ByteVector header_out_;
  ByteVector header_in_;
  ByteVector gather_view_;
  std::vector<float> gather_;
  std::vector<float> barrier_blocks_;
  // The all-reduce's staging ring: stage_slices slices of slice_bytes_.
  std::unique_ptr<float[]> stage_;
  int64_t slice_bytes_ = 0;
  int64_t stage_bytes_ = 0;
  std::vector<int64_t> segment_begin_;  // bytes, per segment of the current all-reduce
  std::vector<int64_t> segment_bytes_;
  std::vector<SendUnit> send_units_;
  std::vector<RecvUnit> recv_units_;
  Header out_header_{};
  Header in_header_{};
  std::vector<Header> mesh_in_headers_;
  Header exchange_in_header_{};
  std::vector<char*> mesh_in_;
  std::vector<int64_t> mesh_sent_;
  std::vector<int64_t> mesh_got_;
  std::vector<char> mesh_can_send_;  // bools: worth a syscall now
  std::vector<char> mesh_can_recv_;
  std::vector<pollfd> mesh_poll_;
  std::vector<int> mesh_poll_peer_;
  uint32_t sequence_ = 0;
  const char* op_name_ = "";             // current operation, for What()
  const std::string* op_tag_ = nullptr;  // its options.tag (valid during the call)
  absl::Status failed_;  // owned by the operation thread

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);

  std::atomic<int64_t> operations_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_RING_H_

#ifndef DISTRAIN_WORKER_COLLECTIVE_RING_HANDSHAKE_H_
#define DISTRAIN_WORKER_COLLECTIVE_RING_HANDSHAKE_H_

// The messages that authenticate every connection of the TCP transport
// (tcp_transport.h, setup steps 2-5), as free functions so that
// tests/fuzz/ring_handshake_fuzz.cc and the hostile-client tests can feed
// them any bytes; TcpTransport's setup uses exactly these.
//
// An HMAC-SHA256 challenge-response keyed with the job's ring key (the raw
// sockets carry no TLS; docs/security.md): the challenge is the acceptor's
// nonce, published with its address through the Store (which is itself
// mutual TLS), the response the dialler's MAC over its hello and that nonce;
// the ack answers with a MAC over the dialler's fresh nonce. A stranger
// without the key cannot produce either; a hello recorded from an earlier
// setup carries a MAC over an older nonce and is refused; another job's key
// gives another MAC. An empty key (the plaintext opt-out) still gives
// well-defined MACs, which then only tell current connections from stale
// ones.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/collective/tcp_socket.h"

namespace distrain {

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

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_RING_HANDSHAKE_H_

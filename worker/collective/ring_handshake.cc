#include "worker/collective/ring_handshake.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace distrain {
namespace {

constexpr uint32_t kHelloMagic = 0x47525444;   // "DTRG"
constexpr uint32_t kAckMagic = 0x41525444;     // "DTRA"
// 2: all-reduce slices interleave steps; 3: HMAC handshake.
constexpr uint32_t kProtocolVersion = 3;

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t group_id;
  int32_t from_rank;
  int32_t to_rank;
  int32_t size;
  int32_t reserved;
  uint8_t nonce[kRingNonceBytes];  // the dialler's, fresh per connection
  uint8_t mac[32];  // HMAC(key, "distrain ring hello" | bytes before mac | acceptor's nonce)
};
static_assert(sizeof(Hello) == kRingHelloBytes);

struct Ack {
  uint32_t magic;
  int32_t rank;
  uint64_t group_id;
  uint8_t mac[32];  // HMAC(key, "distrain ring ack" | bytes before mac | hello nonce | own nonce)
};
static_assert(sizeof(Ack) == kRingAckBytes);

// HMAC-SHA256 of `label` followed by `parts`, keyed with the job's ring key.
void RingMac(std::string_view key, std::string_view label,
             std::initializer_list<std::string_view> parts, uint8_t out[32]) {
  std::string message(label);
  for (std::string_view part : parts) message.append(part);
  unsigned int n = 32;
  // An empty key (plaintext opt-out) still gives a well-defined MAC: the
  // handshake then only tells stale connections from current ones.
  static const unsigned char kNoKey = 0;
  const void* key_bytes = key.empty() ? static_cast<const void*>(&kNoKey) : key.data();
  HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &n);
}

std::string_view Bytes(const void* p, size_t n) {
  return std::string_view(static_cast<const char*>(p), n);
}

uint64_t Fnv1a(const std::string& text, int size) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (unsigned char c : text) mix(c);
  for (int i = 0; i < 4; ++i) mix(static_cast<unsigned char>(size >> (8 * i)));
  return h == 0 ? 1 : h;
}

}  // namespace

uint64_t RingGroupId(const std::string& key_prefix, int size) { return Fnv1a(key_prefix, size); }

std::string NewRingNonce() {
  std::string nonce(kRingNonceBytes, '\0');
  // RAND_bytes only fails when the OS has no entropy to give; the nonce is
  // then the clock, which still differs between handshakes.
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), kRingNonceBytes) != 1) {
    const int64_t now = absl::GetCurrentTimeNanos();
    std::memcpy(nonce.data(), &now, sizeof(now));
  }
  return nonce;
}

std::string MakeRingHello(uint64_t group_id, int from_rank, int to_rank, int size,
                          std::string_view key, std::string_view nonce,
                          std::string_view acceptor_nonce) {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kProtocolVersion;
  h.group_id = group_id;
  h.from_rank = from_rank;
  h.to_rank = to_rank;
  h.size = size;
  std::memcpy(h.nonce, nonce.data(), std::min<size_t>(nonce.size(), kRingNonceBytes));
  RingMac(key, "distrain ring hello", {Bytes(&h, offsetof(Hello, mac)), acceptor_nonce}, h.mac);
  return std::string(Bytes(&h, sizeof(h)));
}

std::string MakeRingAck(uint64_t group_id, int rank, std::string_view key,
                        std::string_view hello_nonce, std::string_view own_nonce) {
  Ack a{};
  a.magic = kAckMagic;
  a.rank = rank;
  a.group_id = group_id;
  RingMac(key, "distrain ring ack", {Bytes(&a, offsetof(Ack, mac)), hello_nonce, own_nonce},
          a.mac);
  return std::string(Bytes(&a, sizeof(a)));
}

absl::StatusOr<int> ParseRingHello(std::string_view bytes, uint64_t group_id, int to_rank,
                                   int size, std::string_view key, std::string_view own_nonce,
                                   std::string* hello_nonce) {
  Hello h;
  if (bytes.size() != sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring hello: ", bytes.size(), " bytes, not ", sizeof(h)));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));  // the bytes need not be aligned
  if (h.magic != kHelloMagic || h.version != kProtocolVersion) {
    return absl::InvalidArgumentError("ring hello: not a hello of this protocol version");
  }
  if (h.group_id != group_id || h.to_rank != to_rank || h.size != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring hello: for group ", h.group_id, " rank ", h.to_rank, " of ", h.size,
        ", this is group ", group_id, " rank ", to_rank, " of ", size));
  }
  if (h.from_rank < 0 || h.from_rank >= size || h.from_rank == to_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring hello: from rank ", h.from_rank, " of a group of ", size));
  }
  uint8_t expected[32];
  RingMac(key, "distrain ring hello", {Bytes(&h, offsetof(Hello, mac)), own_nonce}, expected);
  if (CRYPTO_memcmp(expected, h.mac, sizeof(expected)) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "ring hello from rank ", h.from_rank,
        ": its MAC is wrong (not this job's key, or a replay of an earlier handshake)"));
  }
  if (hello_nonce != nullptr) hello_nonce->assign(Bytes(h.nonce, sizeof(h.nonce)));
  return h.from_rank;
}

absl::Status ParseRingAck(std::string_view bytes, uint64_t group_id, int peer,
                          std::string_view key, std::string_view hello_nonce,
                          std::string_view peer_nonce) {
  Ack a;
  if (bytes.size() != sizeof(a)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring ack: ", bytes.size(), " bytes, not ", sizeof(a)));
  }
  std::memcpy(&a, bytes.data(), sizeof(a));
  if (a.magic != kAckMagic || a.rank != peer || a.group_id != group_id) {
    return absl::InvalidArgumentError(absl::StrCat("ring ack: not rank ", peer, "'s for group ",
                                                   group_id));
  }
  uint8_t expected[32];
  RingMac(key, "distrain ring ack", {Bytes(&a, offsetof(Ack, mac)), hello_nonce, peer_nonce},
          expected);
  if (CRYPTO_memcmp(expected, a.mac, sizeof(expected)) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "ring ack from rank ", peer, ": its MAC is wrong (not this job's key, or a replay)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RingAddress> ParseRingAddress(std::string_view value) {
  const size_t space = value.rfind(' ');
  const std::string_view hex =
      space == std::string_view::npos ? std::string_view() : value.substr(space + 1);
  if (hex.size() != 2 * kRingNonceBytes ||
      !std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring address \"", absl::string_view(value.data(), value.size()),
        "\" is not \"<host:port> <", 2 * kRingNonceBytes,
        " hex digits>\" (a peer of another distrain version?)"));
  }
  absl::StatusOr<tcp::HostPort> address =
      tcp::ParseHostPort(absl::string_view(value.data(), space));
  if (!address.ok()) return address.status();
  return RingAddress{*std::move(address),
                     absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()))};
}

}  // namespace distrain

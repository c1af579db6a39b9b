#include "worker/collective/ring.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/net.h"
#include "worker/collective/reduce_kernel.h"

namespace distrain {
namespace {

constexpr uint32_t kHelloMagic = 0x47525444;   // "DTRG"
constexpr uint32_t kAckMagic = 0x41525444;     // "DTRA"
constexpr uint32_t kHeaderMagic = 0x48435244;  // "DRCH"
// 2: all-reduce slices interleave steps; 3: HMAC handshake.
constexpr uint32_t kProtocolVersion = 3;
constexpr int kMaxIov = 16;
constexpr int64_t kHeaderBytes = 24;
// All-reduce vectors above this size get their results with non-temporal
// stores (reduce_kernel.h StreamCopy); smaller ones with plain stores.
constexpr int64_t kStreamResultsAboveBytes = 8 << 20;
constexpr size_t kMaxPendingConnections = 32;

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

int Mod(int a, int n) { return ((a % n) + n) % n; }

const char* KindName(uint8_t kind) {
  switch (kind) {
    case 1:
      return "all-reduce";
    case 2:
      return "broadcast";
    case 3:
      return "all-gather";
    case 4:
      return "barrier";
  }
  return "unknown operation";
}

void SetBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

std::string RingKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/ring/", rank);
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
        "ring address \"", absl::string_view(value.data(), value.size()), "\" is not \"<host:port> <", 2 * kRingNonceBytes,
        " hex digits>\" (a peer of another distrain version?)"));
  }
  absl::StatusOr<tcp::HostPort> address = tcp::ParseHostPort(absl::string_view(value.data(), space));
  if (!address.ok()) return address.status();
  return RingAddress{*std::move(address), absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()))};
}

// ---- ByteVector ------------------------------------------------------------

void RingCollective::ByteVector::Clear() {
  bases_.clear();
  ends_.clear();
}

void RingCollective::ByteVector::Add(void* data, int64_t bytes) {
  if (bytes <= 0) return;
  bases_.push_back(static_cast<char*>(data));
  ends_.push_back(size() + bytes);
}

char* RingCollective::ByteVector::Piece(int64_t position, int64_t max, int64_t* length) const {
  // Few regions (a bucket of gradients): upper_bound is cheap and simple.
  size_t i = std::upper_bound(ends_.begin(), ends_.end(), position) - ends_.begin();
  DISTRAIN_CHECK_LT(i, ends_.size()) << "position " << position;
  int64_t start = i == 0 ? 0 : ends_[i - 1];
  *length = std::min(max, ends_[i] - position);
  return bases_[i] + (position - start);
}

// ---- setup -----------------------------------------------------------------

RingCollective::RingCollective(int rank, int size, const RingOptions& options)
    : rank_(rank), size_(size), options_(options) {
  for (int r = 0; r < size; ++r) {
    names_.push_back(options.peer_names.empty() ? absl::StrCat("rank ", r)
                                                : options.peer_names[r]);
  }
  // Whole floats per slice; reads may still end inside a float (they are
  // capped at chunk_bytes, which need not be a multiple of 4).
  slice_bytes_ = std::max<int64_t>(64, options.chunk_bytes) & ~int64_t{3};
  stage_bytes_ = std::max(2, options.stage_slices) * slice_bytes_;
  stage_ = std::make_unique<float[]>(stage_bytes_ / 4);
  segment_begin_.assign(size, 0);
  segment_bytes_.assign(size, 0);
  header_out_.Add(&out_header_, sizeof(Header));
  header_in_.Add(&in_header_, sizeof(Header));
  barrier_blocks_.assign(size, 0.0f);
  mesh_ = size >= 2 && size <= options.mesh_max_ranks;
  mesh_in_headers_.resize(size);
  mesh_in_.assign(size, nullptr);
  mesh_sent_.assign(size, 0);
  mesh_got_.assign(size, 0);
  mesh_can_send_.assign(size, 0);
  mesh_can_recv_.assign(size, 0);
}

RingCollective::~RingCollective() = default;

absl::StatusOr<std::unique_ptr<RingCollective>> RingCollective::Create(Store& store, int rank,
                                                                       int size,
                                                                       const RingOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring rank ", rank, " / size ", size, " is invalid; need 0 <= rank < size"));
  }
  if (!options.peer_names.empty() && static_cast<int>(options.peer_names.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("RingOptions.peer_names has ",
                                                   options.peer_names.size(),
                                                   " names; it needs one per rank (", size, ")"));
  }
  if (options.advertised_host.empty() && IsWildcardHost(options.bind_host) && size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RingOptions.bind_host '", options.bind_host,
        "' listens on every interface; set advertised_host to the name peers should dial"));
  }
  std::unique_ptr<RingCollective> ring(new RingCollective(rank, size, options));
  if (size > 1) {
    if (absl::Status s = ring->Setup(store); !s.ok()) return s;
  }
  return ring;
}

absl::Status RingCollective::Setup(Store& store) {
  const absl::Time deadline = absl::Now() + options_.setup_timeout;
  const uint64_t group_id =
      options_.group_id != 0 ? options_.group_id : RingGroupId(options_.key_prefix, size_);
  const int right = (rank_ + 1) % size_;
  const int left = Mod(rank_ - 1, size_);
  const std::string self = names_[rank_];

  abort_fd_ = tcp::Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!abort_fd_.valid()) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }

  // 1-2. Listen and publish.
  int port = 0;
  absl::StatusOr<tcp::Fd> listener =
      tcp::Listen(options_.bind_host, 0, options_.socket_buffer_bytes, &port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat(self, ": ", listener.status().message()));
  }
  const std::string advertised =
      options_.advertised_host.empty() ? options_.bind_host : options_.advertised_host;
  const std::string my_address = tcp::FormatHostPort(advertised, port);
  names_[rank_] = absl::StrCat(self, " (", my_address, ")");
  const std::string mac_key = options_.security != nullptr ? options_.security->ring_key() : "";
  const std::string my_nonce = NewRingNonce();
  if (absl::Status s = store.Set(RingKey(options_.key_prefix, rank_),
                                 absl::StrCat(my_address, " ", absl::BytesToHexString(my_nonce)));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(self, " could not publish its ring address: ",
                                               s.message()));
  }

  std::vector<bool> named(size_, false);
  std::vector<std::string> peer_nonce(size_);   // what each peer's listener expects
  std::vector<std::string> hello_nonce(size_);  // what we sent in each hello
  auto lookup = [&](int peer) -> absl::StatusOr<tcp::HostPort> {
    const std::string key = RingKey(options_.key_prefix, peer);
    absl::StatusOr<std::string> value =
        store.Get(key, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!value.ok()) {
      if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(absl::StrCat(
            names_[peer], " did not publish its ring address (store key '", key, "') within ",
            absl::FormatDuration(options_.setup_timeout), " of ", self,
            " starting: it has not started, has crashed, or uses another key prefix"));
      }
      return absl::Status(value.status().code(),
                          absl::StrCat("reading the ring address of ", names_[peer],
                                       " (store key '", key, "'): ", value.status().message()));
    }
    absl::StatusOr<RingAddress> address = ParseRingAddress(*value);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("store key '", key, "' of ", names_[peer],
                                                     ": ", address.status().message()));
    }
    if (!named[peer]) {
      names_[peer] = absl::StrCat(
          names_[peer], " (", tcp::FormatHostPort(address->address.host, address->address.port),
          ")");
    }
    named[peer] = true;
    peer_nonce[peer] = address->nonce;
    return address->address;
  };

  // 3. Connect to the right neighbour (and, for the mesh, to the higher
  // non-adjacent ranks) and say hello.
  std::vector<int> outbound = {right};
  std::vector<int> inbound = {left};
  if (mesh_) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || p == left || p == right) continue;
      (p > rank_ ? outbound : inbound).push_back(p);
    }
  }
  mesh_fds_.resize(size_);
  for (int peer : outbound) {
    absl::StatusOr<tcp::HostPort> address = lookup(peer);
    if (!address.ok()) return address.status();
    absl::StatusOr<tcp::Fd> fd = tcp::Connect(*address, options_.socket_buffer_bytes, deadline,
                                              abort_fd_.get(), names_[peer]);
    if (!fd.ok()) return fd.status();
    hello_nonce[peer] = NewRingNonce();
    const std::string hello =
        MakeRingHello(group_id, rank_, peer, size_, mac_key, hello_nonce[peer], peer_nonce[peer]);
    if (absl::Status s =
            tcp::SendAll(fd->get(), hello.data(), hello.size(), deadline, -1, names_[peer]);
        !s.ok()) {
      return s;
    }
    if (peer == right) {
      send_fd_ = std::move(*fd);
    } else {
      mesh_fds_[peer] = std::move(*fd);
    }
  }

  // 4. Accept the left neighbour (and the lower mesh ranks); reject anything else.
  for (int peer : inbound) {
    absl::StatusOr<tcp::HostPort> address = lookup(peer);
    if (!address.ok()) return address.status();
  }
  struct Pending {
    tcp::Fd fd;
    Hello hello{};
    size_t received = 0;
  };
  std::vector<Pending> pending;
  std::vector<int> missing = inbound;
  while (!missing.empty()) {
    std::vector<pollfd> fds;
    fds.push_back({listener->get(), POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    int n = poll(fds.data(), fds.size(), tcp::PollTimeoutMs(deadline));
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (n == 0 && absl::Now() >= deadline) {
      std::string who;
      for (int peer : missing) absl::StrAppend(&who, who.empty() ? "" : ", ", names_[peer]);
      return absl::DeadlineExceededError(absl::StrCat(
          who, " did not connect to ", names_[rank_], " within ",
          absl::FormatDuration(options_.setup_timeout),
          " (its address was published, so it started but is stuck or cannot reach this host)"));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      ssize_t got = recv(p.fd.get(), reinterpret_cast<char*>(&p.hello) + p.received,
                         sizeof(Hello) - p.received, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (got <= 0) {
        p.fd.Close();  // stray client went away
        continue;
      }
      p.received += static_cast<size_t>(got);
      if (p.received < sizeof(Hello)) continue;
      std::string their_nonce;
      absl::StatusOr<int> from = ParseRingHello(Bytes(&p.hello, sizeof(Hello)), group_id, rank_,
                                                size_, mac_key, my_nonce, &their_nonce);
      auto expected = from.ok() ? std::find(missing.begin(), missing.end(), *from) : missing.end();
      if (expected == missing.end()) {
        p.fd.Close();  // a stray or stale connection, not a peer we expect
        continue;
      }
      const int peer = *from;
      missing.erase(expected);
      tcp::Fd fd = std::move(p.fd);
      if (absl::Status s = tcp::ConfigureStream(fd.get(), options_.socket_buffer_bytes); !s.ok()) {
        return s;
      }
      const std::string ack = MakeRingAck(group_id, rank_, mac_key, their_nonce, my_nonce);
      if (absl::Status s =
              tcp::SendAll(fd.get(), ack.data(), ack.size(), deadline, -1, names_[peer]);
          !s.ok()) {
        return s;
      }
      if (peer == left) {
        recv_fd_ = std::move(fd);
      } else {
        mesh_fds_[peer] = std::move(fd);
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return !p.fd.valid(); }),
                  pending.end());
    if (fds[0].revents != 0) {
      while (true) {
        int fd = accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (pending.size() >= kMaxPendingConnections) pending.erase(pending.begin());
        pending.push_back(Pending{tcp::Fd(fd)});
      }
    }
  }

  // 5. Every peer we dialled accepted us.
  for (int peer : outbound) {
    const int fd = peer == right ? send_fd_.get() : mesh_fds_[peer].get();
    Ack ack{};
    if (absl::Status s = tcp::RecvAll(fd, &ack, sizeof(ack), deadline, -1, names_[peer]);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("waiting for ", names_[peer],
                                                 " to accept the connection: ", s.message()));
    }
    if (absl::Status s = ParseRingAck(Bytes(&ack, sizeof(ack)), group_id, peer, mac_key,
                                      hello_nonce[peer], peer_nonce[peer]);
        !s.ok()) {
      return absl::Status(
          s.code() == absl::StatusCode::kPermissionDenied ? s.code()
                                                          : absl::StatusCode::kUnavailable,
          absl::StrCat(names_[peer], " answered the hello with a bad acknowledgement (",
                       s.message(), "; another program on that port?)"));
    }
  }
  // The mesh reuses the ring links for neighbours: in their idle direction
  // when N >= 3, and in the ring's own directions when N == 2 (left == right).
  mesh_send_fd_.assign(size_, -1);
  mesh_recv_fd_.assign(size_, -1);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (size_ == 2) {
      mesh_send_fd_[p] = send_fd_.get();
      mesh_recv_fd_[p] = recv_fd_.get();
    } else {
      const int fd =
          p == right ? send_fd_.get() : p == left ? recv_fd_.get() : mesh_fds_[p].get();
      mesh_send_fd_[p] = fd;
      mesh_recv_fd_[p] = fd;
    }
  }
  // From here on the sockets block, and every call that must not passes
  // MSG_DONTWAIT: only Exchange's last receive blocks (see there).
  for (int fd : {send_fd_.get(), recv_fd_.get()}) SetBlocking(fd);
  for (const tcp::Fd& fd : mesh_fds_) {
    if (fd.valid()) SetBlocking(fd.get());
  }
  mesh_receive_timeout_.assign(size_, absl::ZeroDuration());
  left_name_ = names_[left];
  right_name_ = names_[right];
  return absl::OkStatus();
}

// ---- failure handling ------------------------------------------------------

void RingCollective::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason.ok() ? absl::AbortedError("ring collective aborted") : reason;
    aborted_.store(true);
  }
  if (abort_fd_.valid()) {
    uint64_t one = 1;
    (void)!write(abort_fd_.get(), &one, sizeof(one));
  }
  // Neighbours blocked on us fail now instead of at their deadline. shutdown
  // (not close) is safe while the operation thread still uses the descriptors.
  if (send_fd_.valid()) shutdown(send_fd_.get(), SHUT_RDWR);
  if (recv_fd_.valid()) shutdown(recv_fd_.get(), SHUT_RDWR);
  for (const tcp::Fd& fd : mesh_fds_) {
    if (fd.valid()) shutdown(fd.get(), SHUT_RDWR);
  }
}

absl::Status RingCollective::Fail(absl::Status status) {
  if (aborted_.load()) {
    absl::MutexLock lock(&abort_mu_);
    status = abort_reason_;
  }
  if (failed_.ok()) failed_ = status;
  return status;
}

CollectiveStats RingCollective::stats() const {
  CollectiveStats s;
  s.operations = operations_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  return s;
}

// ---- the engine ------------------------------------------------------------

std::string RingCollective::What() const {
  return op_tag_ == nullptr || op_tag_->empty()
             ? absl::StrCat(op_name_, " #", sequence_)
             : absl::StrCat(op_name_, " '", *op_tag_, "' #", sequence_);
}

absl::Status RingCollective::PeerClosed(const std::string& peer,
                                        const std::string& progress) const {
  return absl::UnavailableError(absl::StrCat(
      What(), ": ", peer, " closed the connection (", progress,
      "); that process exited or failed (possibly because of an earlier peer failure)"));
}

absl::Status RingCollective::PeerBroke(const char* direction, const std::string& peer, int err,
                                       const std::string& progress) const {
  return absl::UnavailableError(absl::StrCat(What(), ": connection ", direction, " ", peer,
                                             " broke: ", std::strerror(err), " (", progress, ")"));
}

absl::Status RingCollective::RingTimedOut(bool waiting_for_left,
                                          const std::string& progress) const {
  const std::string waiting = waiting_for_left
                                  ? absl::StrCat("waiting for ", left_name_, " to send")
                                  : absl::StrCat("waiting for ", right_name_, " to receive");
  return absl::DeadlineExceededError(absl::StrCat(
      What(), " on ", names_[rank_], " timed out ", waiting, " (", progress,
      "); the peer stopped, is stuck, or issued a different collective (a stall anywhere in "
      "the ring reaches every rank through its left neighbour)"));
}

absl::Status RingCollective::BeginOp(Kind kind, ReduceOp op, int root, int64_t payload_bytes) {
  if (aborted_.load()) return Fail(absl::OkStatus());
  if (!failed_.ok()) {
    return absl::Status(failed_.code(), absl::StrCat("the ring group failed earlier and cannot be "
                                                     "used until a new rendezvous: ",
                                                     failed_.message()));
  }
  ++sequence_;
  out_header_ = Header{kHeaderMagic,
                       static_cast<uint8_t>(kind),
                       static_cast<uint8_t>(op),
                       0,
                       sequence_,
                       root,
                       payload_bytes};
  send_units_.clear();
  recv_units_.clear();
  return absl::OkStatus();
}

void RingCollective::AddSend(const ByteVector* v, int64_t begin, int64_t length, int depends_on) {
  send_units_.push_back(SendUnit{v, begin, length, depends_on});
}

int RingCollective::AddRecv(ByteVector* v, int64_t begin, int64_t length, Mode mode) {
  recv_units_.push_back(RecvUnit{v, begin, length, mode});
  return static_cast<int>(recv_units_.size()) - 1;
}

absl::Status RingCollective::CheckHeader(const Header& in, const std::string& peer) const {
  const Header& out = out_header_;
  if (in.magic != kHeaderMagic) {
    return absl::DataLossError(absl::StrCat(What(), ": ", peer,
                                            " sent bytes that are not a collective header; the "
                                            "group lost sync"));
  }
  if (in.kind != out.kind || in.op != out.op || in.sequence != out.sequence ||
      in.root != out.root || in.payload_bytes != out.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        What(), ": ", peer, " runs ", KindName(in.kind), " #", in.sequence, " of ",
        in.payload_bytes, " bytes (op ", static_cast<int>(in.op), ", root ", in.root,
        ") but this rank runs ", KindName(out.kind), " #", out.sequence, " of ",
        out.payload_bytes, " bytes (op ", static_cast<int>(out.op), ", root ", out.root,
        "); every rank must issue the same collectives in the same order with the same sizes"));
  }
  return absl::OkStatus();
}

absl::Status RingCollective::Transfer(absl::Time deadline) {
  const int num_send = static_cast<int>(send_units_.size());
  const int num_recv = static_cast<int>(recv_units_.size());
  int s = 0, v = 0;                       // current units
  int64_t sent = 0, got = 0;              // bytes done in them
  int64_t total_sent = 0, total_received = 0;
  const int send_fd = send_fd_.get();
  const int recv_fd = recv_fd_.get();
  iovec iov[kMaxIov];
  // Worth a syscall: optimistic at first, then as poll() reports.
  bool recv_ready = true;
  bool send_ready = true;
  int64_t moved = 0;  // bytes moved before this pass

  auto account = [&] {
    bytes_sent_.fetch_add(total_sent, std::memory_order_relaxed);
    bytes_received_.fetch_add(total_received, std::memory_order_relaxed);
  };
  auto progress_text = [&] {
    int64_t want_in = 0, want_out = 0;
    for (const RecvUnit& u : recv_units_) want_in += u.length;
    for (const SendUnit& u : send_units_) want_out += u.length;
    return absl::StrCat("received ", total_received, " of ", want_in, " bytes from ", left_name_,
                        ", sent ", total_sent, " of ", want_out, " bytes to ", right_name_);
  };
  // How far send unit u may go: a dependent unit trails its receive unit.
  auto allowed = [&](int u) -> int64_t {
    const SendUnit& unit = send_units_[u];
    if (unit.depends_on < v) return unit.length;  // includes depends_on == -1
    return unit.depends_on == v ? got : 0;
  };

  while (true) {
    while (v < num_recv && got == recv_units_[v].length) {
      if (recv_units_[v].mode == Mode::kHeader) {
        if (absl::Status h = CheckHeader(in_header_, left_name_); !h.ok()) {
          account();
          return Fail(h);
        }
      }
      ++v;
      got = 0;
    }
    while (s < num_send && sent == send_units_[s].length) {
      ++s;
      sent = 0;
    }
    if (s == num_send && v == num_recv) break;
    if (aborted_.load(std::memory_order_relaxed)) {
      account();
      return Fail(absl::OkStatus());
    }
    // Receive straight into place.
    if (v < num_recv && recv_ready) {
      const RecvUnit& unit = recv_units_[v];
      int64_t requested;
      char* p = unit.vector->Piece(unit.begin + got, unit.length - got, &requested);
      const ssize_t n = recv(recv_fd, p, requested, MSG_DONTWAIT);
      if (n > 0) {
        got += n;
        total_received += n;
        recv_ready = n == requested;  // a short read drained the socket
      } else if (n == 0) {
        account();
        return Fail(PeerClosed(left_name_, progress_text()));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        recv_ready = false;
      } else if (errno != EINTR) {
        const int err = errno;
        account();
        return Fail(PeerBroke("from", left_name_, err, progress_text()));
      }
    }

    // Send: everything currently allowed, gathered into one sendmsg.
    if (s < num_send && allowed(s) > sent && send_ready) {
      int count = 0;
      int64_t requested = 0;
      int u = s;
      int64_t offset = sent;
      while (u < num_send && count < kMaxIov) {
        const int64_t limit = allowed(u);
        if (offset < limit) {
          int64_t length = 0;
          char* p = const_cast<char*>(
              send_units_[u].vector->Piece(send_units_[u].begin + offset, limit - offset, &length));
          iov[count++] = iovec{p, static_cast<size_t>(length)};
          offset += length;
          requested += length;
        }
        if (offset == send_units_[u].length) {
          ++u;
          offset = 0;
        } else if (offset == limit) {
          break;
        }
      }
      {
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = count;
        ssize_t n = sendmsg(send_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          total_sent += n;
          send_ready = n == requested;  // a short write filled the socket buffer
          int64_t left = n;
          while (left > 0) {
            const int64_t step = std::min(left, send_units_[s].length - sent);
            sent += step;
            left -= step;
            if (sent == send_units_[s].length) {
              ++s;
              sent = 0;
            }
          }
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          send_ready = false;
        } else if (n < 0 && errno != EINTR) {
          const int err = errno;
          account();
          return Fail(PeerBroke("to", right_name_, err, progress_text()));
        }
      }
    }
    // Another pass after progress, or unless both directions would only
    // return EAGAIN (a syscall that cannot progress costs as much as a small
    // transfer).
    const bool can_send_more = s < num_send && allowed(s) > sent && send_ready;
    if (total_sent + total_received != moved || (v < num_recv && recv_ready) || can_send_more) {
      moved = total_sent + total_received;
      continue;
    }

    pollfd fds[3];
    int nfds = 0;
    int recv_slot = -1, send_slot = -1;
    if (v < num_recv) {
      recv_slot = nfds;
      fds[nfds++] = pollfd{recv_fd, POLLIN, 0};
    }
    if (s < num_send && allowed(s) > sent) {
      send_slot = nfds;
      fds[nfds++] = pollfd{send_fd, POLLOUT, 0};
    }
    fds[nfds++] = pollfd{abort_fd_.get(), POLLIN, 0};
    int n = poll(fds, nfds, tcp::PollTimeoutMs(deadline));
    if (recv_slot >= 0 && fds[recv_slot].revents != 0) recv_ready = true;
    if (send_slot >= 0 && fds[send_slot].revents != 0) send_ready = true;
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      account();
      return Fail(absl::InternalError(absl::StrCat(What(), ": poll: ", std::strerror(err))));
    }
    if (n == 0 && absl::Now() >= deadline) {
      account();
      return Fail(RingTimedOut(v < num_recv, progress_text()));
    }
  }
  account();
  operations_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---- the mesh: one hop for small operations ------------------------------

absl::Status RingCollective::MeshTransfer(absl::Time deadline, const char* out, int64_t bytes,
                                          int sender) {
  const int64_t total = static_cast<int64_t>(sizeof(Header)) + bytes;
  int64_t total_sent = 0, total_received = 0;
  auto account = [&] {
    bytes_sent_.fetch_add(total_sent, std::memory_order_relaxed);
    bytes_received_.fetch_add(total_received, std::memory_order_relaxed);
  };
  // Two-piece (header, payload) stream at `offset`; returns the iovec count.
  auto pieces = [&](char* header, char* payload, int64_t offset, iovec* iov) {
    int count = 0;
    if (offset < static_cast<int64_t>(sizeof(Header))) {
      iov[count++] = iovec{header + offset, sizeof(Header) - static_cast<size_t>(offset)};
      offset = sizeof(Header);
    }
    if (bytes > 0) {
      const int64_t at = offset - static_cast<int64_t>(sizeof(Header));
      iov[count++] = iovec{payload + at, static_cast<size_t>(bytes - at)};
    }
    return count;
  };
  const bool sending = sender < 0 || sender == rank_;
  for (int p = 0; p < size_; ++p) {
    const bool receiving = p != rank_ && (sender < 0 || sender == p);
    mesh_sent_[p] = p != rank_ && sending ? 0 : total;
    mesh_got_[p] = receiving ? 0 : total;
    // Optimistic first pass; afterwards only what poll() reports ready, so
    // no syscall is spent on an EAGAIN (small operations are syscall-bound).
    mesh_can_send_[p] = true;
    mesh_can_recv_[p] = true;
  }
  while (true) {
    if (aborted_.load(std::memory_order_relaxed)) {
      account();
      return Fail(absl::OkStatus());
    }
    bool done = true;
    bool more = false;  // something may still progress without waiting
    for (int p = 0; p < size_; ++p) {
      if (mesh_sent_[p] < total && mesh_can_send_[p]) {
        iovec iov[2];
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = pieces(reinterpret_cast<char*>(&out_header_), const_cast<char*>(out),
                                mesh_sent_[p], iov);
        ssize_t n = sendmsg(mesh_send_fd_[p], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          mesh_sent_[p] += n;
          total_sent += n;
          mesh_can_send_[p] = mesh_sent_[p] == total;  // short write: buffer full
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          mesh_can_send_[p] = false;
        } else if (n < 0 && errno != EINTR) {
          const int err = errno;
          account();
          return Fail(PeerBroke("to", names_[p], err, "while sending"));
        }
      }
      if (mesh_got_[p] < total && mesh_can_recv_[p]) {
        iovec iov[2];
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = pieces(reinterpret_cast<char*>(&mesh_in_headers_[p]), mesh_in_[p],
                                mesh_got_[p], iov);
        const int64_t wanted = total - mesh_got_[p];
        ssize_t n = recvmsg(mesh_recv_fd_[p], &msg, MSG_DONTWAIT);
        if (n > 0) {
          const bool had_header = mesh_got_[p] >= static_cast<int64_t>(sizeof(Header));
          mesh_got_[p] += n;
          total_received += n;
          mesh_can_recv_[p] = n == wanted;  // short read: drained for now
          if (!had_header && mesh_got_[p] >= static_cast<int64_t>(sizeof(Header))) {
            if (absl::Status h = CheckHeader(mesh_in_headers_[p], names_[p]); !h.ok()) {
              account();
              return Fail(h);
            }
          }
        } else if (n == 0) {
          account();
          return Fail(PeerClosed(
              names_[p], absl::StrCat("received ", mesh_got_[p], " of ", total, " bytes from it")));
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          mesh_can_recv_[p] = false;
        } else if (errno != EINTR) {
          const int err = errno;
          account();
          return Fail(PeerBroke("from", names_[p], err, "while receiving"));
        }
      }
      const bool send_left = mesh_sent_[p] < total;
      const bool recv_left = mesh_got_[p] < total;
      done = done && !send_left && !recv_left;
      more = more || (send_left && mesh_can_send_[p]) || (recv_left && mesh_can_recv_[p]);
    }
    if (done) break;
    if (more) continue;

    mesh_poll_.clear();
    mesh_poll_peer_.clear();
    for (int p = 0; p < size_; ++p) {
      if (mesh_sent_[p] < total) {
        mesh_poll_.push_back(pollfd{mesh_send_fd_[p], POLLOUT, 0});
        mesh_poll_peer_.push_back(p);
      }
      if (mesh_got_[p] < total) {
        mesh_poll_.push_back(pollfd{mesh_recv_fd_[p], POLLIN, 0});
        mesh_poll_peer_.push_back(p);
      }
    }
    mesh_poll_.push_back(pollfd{abort_fd_.get(), POLLIN, 0});
    int n = poll(mesh_poll_.data(), mesh_poll_.size(), tcp::PollTimeoutMs(deadline));
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      account();
      return Fail(absl::InternalError(absl::StrCat(What(), ": poll: ", std::strerror(err))));
    }
    for (size_t i = 0; i + 1 < mesh_poll_.size(); ++i) {
      if (mesh_poll_[i].revents == 0) continue;  // errors and hangups show up on the next try
      const int p = mesh_poll_peer_[i];
      if (mesh_poll_[i].events == POLLOUT) {
        mesh_can_send_[p] = true;
      } else {
        mesh_can_recv_[p] = true;
      }
    }
    if (n == 0 && absl::Now() >= deadline) {
      // Direct links: the peers we still miss data from are the ones stuck.
      std::string silent, not_reading;
      for (int p = 0; p < size_; ++p) {
        if (mesh_got_[p] < total) absl::StrAppend(&silent, silent.empty() ? "" : ", ", names_[p]);
        if (mesh_sent_[p] < total) {
          absl::StrAppend(&not_reading, not_reading.empty() ? "" : ", ", names_[p]);
        }
      }
      account();
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          What(), " on ", names_[rank_], " timed out waiting for ",
          silent.empty() ? absl::StrCat(not_reading, " to receive")
                         : absl::StrCat(silent, " to send"),
          "; the peer stopped, is stuck, or issued a different collective")));
    }
  }
  account();
  operations_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool RingCollective::ArmReceiveTimeout(int peer, absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return false;
  // Reuse the armed value while it neither overshoots the deadline by more
  // than a tenth nor wakes us before half of the wait: successive operations
  // with the same timeout then cost no setsockopt. An early wake-up re-arms.
  const absl::Duration armed = mesh_receive_timeout_[peer];
  if (armed > absl::ZeroDuration() && armed <= left + left / 10 + absl::Milliseconds(1) &&
      armed * 2 >= left) {
    return true;
  }
  const int64_t us = std::max<int64_t>(1, absl::ToInt64Microseconds(left));
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  setsockopt(mesh_recv_fd_[peer], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  mesh_receive_timeout_[peer] = absl::Microseconds(us);
  return true;
}

absl::Status RingCollective::Exchange(int to, const char* out, int64_t out_bytes, int from,
                                      char* in, int64_t in_bytes, absl::Time deadline) {
  const int64_t out_total = to >= 0 ? kHeaderBytes + out_bytes : 0;
  const int64_t in_total = from >= 0 ? kHeaderBytes + in_bytes : 0;
  int64_t sent = 0, got = 0;
  bool send_ready = true;
  bool recv_ready = false;  // poll first: it returns at once when the data is there
  bool spun = false;
  auto account = [&] {
    bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
    bytes_received_.fetch_add(got, std::memory_order_relaxed);
  };
  auto timeout_error = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        What(), " on ", names_[rank_], " timed out waiting for ",
        got < in_total
            ? absl::StrCat(names_[from], " to send (received ", got, " of ", in_total, " bytes)")
            : absl::StrCat(names_[to], " to receive"),
        "; the peer stopped, is stuck, or issued a different collective"));
  };
  auto pieces = [](char* header, char* payload, int64_t payload_bytes, int64_t offset,
                   iovec* iov) {
    int count = 0;
    if (offset < kHeaderBytes) {
      iov[count++] = iovec{header + offset, static_cast<size_t>(kHeaderBytes - offset)};
      offset = kHeaderBytes;
    }
    if (payload_bytes > 0) {
      const int64_t at = offset - kHeaderBytes;
      iov[count++] = iovec{payload + at, static_cast<size_t>(payload_bytes - at)};
    }
    return count;
  };
  while (sent < out_total || got < in_total) {
    if (aborted_.load(std::memory_order_relaxed)) {
      account();
      return Fail(absl::OkStatus());
    }
    if (sent < out_total && send_ready) {
      iovec iov[2];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = pieces(reinterpret_cast<char*>(&out_header_), const_cast<char*>(out),
                              out_bytes, sent, iov);
      const int64_t wanted = out_total - sent;
      ssize_t n = sendmsg(mesh_send_fd_[to], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += n;
        send_ready = n == wanted;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        send_ready = false;
      } else if (n < 0 && errno != EINTR) {
        const int err = errno;
        account();
        return Fail(PeerBroke("to", names_[to], err, "while sending"));
      }
    }
    // When only the receive is left, block in recvmsg itself: one syscall
    // instead of poll + recvmsg, which is most of a small step's cost on busy
    // cores. SO_RCVTIMEO bounds the wait; Abort()'s shutdown() ends it.
    // Poll briefly before sleeping, yielding the CPU in between: a sleeping
    // receiver adds a wake-up to every step (see RingOptions::busy_poll).
    if (sent == out_total && got < in_total && !recv_ready &&
        options_.busy_poll > absl::ZeroDuration() && !spun) {
      spun = true;
      const absl::Time until = absl::Now() + options_.busy_poll;
      pollfd p{mesh_recv_fd_[from], POLLIN, 0};
      while (absl::Now() < until) {
        if (poll(&p, 1, 0) > 0) {
          recv_ready = true;
          break;
        }
        sched_yield();
      }
    }
    const bool block = sent == out_total && got < in_total && !recv_ready;
    if (got < in_total && (recv_ready || block)) {
      if (block && !ArmReceiveTimeout(from, deadline)) {
        account();
        return Fail(timeout_error());
      }
      iovec iov[2];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen =
          pieces(reinterpret_cast<char*>(&exchange_in_header_), in, in_bytes, got, iov);
      const int64_t wanted = in_total - got;
      ssize_t n = recvmsg(mesh_recv_fd_[from], &msg, block ? MSG_WAITALL : MSG_DONTWAIT);
      if (n > 0) {
        const bool had_header = got >= kHeaderBytes;
        got += n;
        recv_ready = n == wanted;
        if (!had_header && got >= kHeaderBytes) {
          if (absl::Status h = CheckHeader(exchange_in_header_, names_[from]); !h.ok()) {
            account();
            return Fail(h);
          }
        }
      } else if (n == 0) {
        account();
        return Fail(PeerClosed(names_[from],
                               absl::StrCat("received ", got, " of ", in_total, " bytes from it")));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        recv_ready = false;
        if (block && absl::Now() >= deadline) {
          account();
          return Fail(timeout_error());
        }
      } else if (errno != EINTR) {
        const int err = errno;
        account();
        return Fail(PeerBroke("from", names_[from], err, "while receiving"));
      }
    }
    if (sent == out_total && got == in_total) break;
    if ((sent < out_total && send_ready) || (got < in_total && recv_ready)) continue;

    pollfd fds[3];
    int nfds = 0, send_slot = -1, recv_slot = -1;
    if (sent < out_total) {
      send_slot = nfds;
      fds[nfds++] = pollfd{mesh_send_fd_[to], POLLOUT, 0};
    }
    if (got < in_total) {
      recv_slot = nfds;
      fds[nfds++] = pollfd{mesh_recv_fd_[from], POLLIN, 0};
    }
    fds[nfds++] = pollfd{abort_fd_.get(), POLLIN, 0};
    int n = poll(fds, nfds, tcp::PollTimeoutMs(deadline));
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      account();
      return Fail(absl::InternalError(absl::StrCat(What(), ": poll: ", std::strerror(err))));
    }
    if (send_slot >= 0 && fds[send_slot].revents != 0) send_ready = true;
    if (recv_slot >= 0 && fds[recv_slot].revents != 0) recv_ready = true;
    if (n == 0 && absl::Now() >= deadline) {
      account();
      return Fail(timeout_error());
    }
  }
  account();
  return absl::OkStatus();
}

absl::Status RingCollective::DoublingAllReduce(absl::Span<const absl::Span<float>> buffers,
                                               int64_t elements, ReduceOp op, absl::Time deadline) {
  // work = gather_[0, E), incoming = gather_[E, 2E).
  gather_.resize(static_cast<size_t>(elements) * 2);
  float* work = gather_.data();
  float* incoming = gather_.data() + elements;
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  {
    float* p = work;
    for (const absl::Span<float>& b : buffers) {
      if (!b.empty()) std::memcpy(p, b.data(), b.size() * sizeof(float));
      p += b.size();
    }
  }
  char* const out = reinterpret_cast<char*>(work);
  char* const in = reinterpret_cast<char*>(incoming);
  // Non-powers of two fold the first 2*rest ranks in pairs (the even rank
  // hands its vector to the odd one and sits out), run the doubling on a
  // power of two, and hand the result back. Every combination adds the same
  // two operands on both sides (a + b == b + a exactly), so every rank ends
  // with identical bits.
  int pof2 = 1;
  while (pof2 * 2 <= size_) pof2 *= 2;
  const int rest = size_ - pof2;
  int vrank;
  if (rank_ < 2 * rest) {
    if (rank_ % 2 == 0) {
      if (absl::Status s = Exchange(rank_ + 1, out, bytes, -1, nullptr, 0, deadline);
          !s.ok()) {
        return s;
      }
      vrank = -1;
    } else {
      if (absl::Status s = Exchange(-1, nullptr, 0, rank_ - 1, in, bytes, deadline);
          !s.ok()) {
        return s;
      }
      collective_internal::AddInto(work, incoming, static_cast<size_t>(elements));
      vrank = rank_ / 2;
    }
  } else {
    vrank = rank_ - rest;
  }
  if (vrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int vpartner = vrank ^ mask;
      const int partner = vpartner < rest ? vpartner * 2 + 1 : vpartner + rest;
      if (absl::Status s = Exchange(partner, out, bytes, partner, in, bytes, deadline);
          !s.ok()) {
        return s;
      }
      collective_internal::AddInto(work, incoming, static_cast<size_t>(elements));
    }
  }
  if (rank_ < 2 * rest) {
    absl::Status s = rank_ % 2 == 1
                         ? Exchange(rank_ - 1, out, bytes, -1, nullptr, 0, deadline)
                         : Exchange(-1, nullptr, 0, rank_ + 1, out, bytes, deadline);
    if (!s.ok()) return s;
  }
  if (op == ReduceOp::kMean) {
    collective_internal::DivideInPlace(work, static_cast<size_t>(elements),
                                       static_cast<float>(size_));
  }
  const float* p = work;
  for (const absl::Span<float>& b : buffers) {
    if (!b.empty()) std::memcpy(b.data(), p, b.size() * sizeof(float));
    p += b.size();
  }
  operations_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---- operations ------------------------------------------------------------

void RingCollective::PlanAllGather(ByteVector* vector, int64_t block_bytes) {
  AddSend(&header_out_, 0, sizeof(Header), -1);
  AddRecv(&header_in_, 0, sizeof(Header), Mode::kHeader);
  int previous = -1;
  for (int t = 0; t < size_ - 1; ++t) {
    AddSend(vector, Mod(rank_ - t, size_) * block_bytes, block_bytes, previous);
    previous = AddRecv(vector, Mod(rank_ - t - 1, size_) * block_bytes, block_bytes, Mode::kCopy);
  }
}

absl::Status RingCollective::RingAllReduce(ReduceOp op, absl::Time deadline) {
  const int n = size_;
  const int steps = 2 * (n - 1);
  const int64_t elements = data_.size() / static_cast<int64_t>(sizeof(float));
  const int64_t slice = slice_bytes_;
  const int64_t stage_bytes = stage_bytes_;
  const int64_t read_limit = std::max<int64_t>(64, options_.chunk_bytes);
  char* const stage = reinterpret_cast<char*>(stage_.get());
  int64_t longest = 0;
  for (int g = 0; g < n; ++g) {
    const int64_t lo = elements * g / n;
    const int64_t hi = elements * (g + 1) / n;
    segment_begin_[g] = lo * static_cast<int64_t>(sizeof(float));
    segment_bytes_[g] = (hi - lo) * static_cast<int64_t>(sizeof(float));
    longest = std::max(longest, segment_bytes_[g]);
  }
  const int64_t rounds = (longest + slice - 1) / slice;
  // Unit (round k, step t): slice k of the segment that step t carries.
  auto in_segment = [&](int t) { return Mod(rank_ - t - 1, n); };
  auto out_segment = [&](int t) { return Mod(rank_ - t, n); };
  auto unit_bytes = [&](int64_t k, int g) {
    return std::clamp<int64_t>(segment_bytes_[g] - k * slice, 0, slice);
  };
  int64_t in_total = 0, out_total = 0;
  for (int t = 0; t < steps; ++t) {
    in_total += segment_bytes_[in_segment(t)];
    out_total += segment_bytes_[out_segment(t)];
  }

  // A position in one of the two streams: unit (round, step), bytes into the
  // unit, and bytes into the stream's payload.
  struct Cursor {
    int64_t round = 0;
    int step = 0;
    int64_t offset = 0;
    int64_t position = 0;
  };
  // Moves `c` past finished and empty units; with `skip_last`, also past the
  // incoming last-step units, which are consumed here and never forwarded.
  auto settle = [&](Cursor& c, bool incoming, bool skip_last) {
    while (c.round < rounds) {
      const int64_t length =
          unit_bytes(c.round, incoming ? in_segment(c.step) : out_segment(c.step));
      const bool skip = skip_last && c.step == steps - 1;
      if (c.offset < length && !skip) return;
      if (skip) c.position += length - c.offset;
      c.offset = 0;
      if (++c.step == steps) {
        c.step = 0;
        ++c.round;
      }
    }
  };
  Cursor processed;  // incoming: received, reduced or copied into place
  Cursor forwarded;  // incoming: sent on (skips the last step's units)
  Cursor out;        // outgoing
  settle(processed, true, false);
  settle(forwarded, true, true);
  settle(out, false, false);
  int64_t received = 0;  // incoming payload bytes in the stage
  int64_t header_in = 0, header_out = 0;
  int64_t total_sent = 0, total_received = 0;
  const float divisor = static_cast<float>(n);
  const bool mean = op == ReduceOp::kMean;
  // Results go around the cache only when the vector is larger than a cache
  // could keep: a smaller one is still cached when the caller (an optimizer)
  // reads it next, and non-temporal stores would send it to memory first.
  const bool stream_results = data_.size() > kStreamResultsAboveBytes;

  // Reduces or copies the received whole floats up to `limit` (see the class
  // comment): the stage keeps the value to forward, the caller's vector gets
  // its own contribution read and, from the last reduction on, the result.
  auto process = [&](int64_t limit) {
    while (processed.round < rounds && processed.position < limit) {
      const int t = processed.step;
      const int g = in_segment(t);
      const int64_t at = processed.position % stage_bytes;
      const int64_t want = std::min({unit_bytes(processed.round, g) - processed.offset,
                                     limit - processed.position, stage_bytes - at});
      int64_t length = 0;
      float* own = reinterpret_cast<float*>(
          data_.Piece(segment_begin_[g] + processed.round * slice + processed.offset, want,
                      &length));
      float* staged = reinterpret_cast<float*>(stage + at);
      const size_t count = static_cast<size_t>(length) / sizeof(float);
      if (t < n - 1) {
        if (t == n - 2 && mean) {
          collective_internal::AddIntoAndDivide(staged, own, count, divisor);
        } else {
          collective_internal::AddInto(staged, own, count);
        }
      }
      if (t >= n - 2) {
        if (stream_results) {
          collective_internal::StreamCopy(own, staged, count);
        } else {
          std::memcpy(own, staged, count * sizeof(float));
        }
      }
      processed.offset += length;
      processed.position += length;
      settle(processed, true, false);
    }
  };
  // Walks the outgoing stream from (o, f) over at most `budget` bytes that
  // can go now: step 0 from the caller's vector, later steps from the stage
  // once processed. Records the pieces when `iov` is set (up to kMaxIov).
  auto walk_send = [&](Cursor& o, Cursor& f, int64_t budget, iovec* iov, int* count) {
    int64_t walked = 0;
    while (o.round < rounds && budget > 0 && (iov == nullptr || *count < kMaxIov)) {
      const int g = out_segment(o.step);
      int64_t take = std::min(unit_bytes(o.round, g) - o.offset, budget);
      char* p;
      if (o.step == 0) {
        p = data_.Piece(segment_begin_[g] + o.round * slice + o.offset, take, &take);
      } else {
        const int64_t at = f.position % stage_bytes;
        take = std::min({take, processed.position - f.position, stage_bytes - at});
        if (take <= 0) break;
        p = stage + at;
        f.offset += take;
        f.position += take;
        settle(f, true, true);
      }
      if (iov != nullptr) iov[(*count)++] = iovec{p, static_cast<size_t>(take)};
      o.offset += take;
      o.position += take;
      walked += take;
      budget -= take;
      settle(o, false, false);
    }
    return walked;
  };
  // The stage holds incoming bytes until they are processed and, unless
  // consumed by the last step, forwarded.
  auto room = [&] {
    const int64_t released = std::min(processed.position, forwarded.position);
    return std::min({released + stage_bytes - received, in_total - received, read_limit});
  };
  auto account = [&] {
    bytes_sent_.fetch_add(total_sent, std::memory_order_relaxed);
    bytes_received_.fetch_add(total_received, std::memory_order_relaxed);
  };
  auto progress_text = [&] {
    return absl::StrCat("received ", total_received, " of ", kHeaderBytes + in_total,
                        " bytes from ", left_name_, ", sent ", total_sent, " of ",
                        kHeaderBytes + out_total, " bytes to ", right_name_);
  };
  const int send_fd = send_fd_.get();
  const int recv_fd = recv_fd_.get();
  char* const header_in_bytes = reinterpret_cast<char*>(&in_header_);
  char* const header_out_bytes = reinterpret_cast<char*>(&out_header_);
  iovec iov[kMaxIov];
  bool recv_ready = true;  // worth a syscall: optimistic at first, then as poll() says
  bool send_ready = true;
  auto receive_left = [&] { return header_in < kHeaderBytes || received < in_total; };
  auto send_left = [&] { return header_out < kHeaderBytes || out.round < rounds; };
  auto can_send = [&] {
    return header_out < kHeaderBytes ||
           (out.round < rounds && (out.step == 0 || processed.position > forwarded.position));
  };

  while (receive_left() || processed.round < rounds || send_left()) {
    if (aborted_.load(std::memory_order_relaxed)) {
      account();
      return Fail(absl::OkStatus());
    }
    bool progressed = false;
    if (receive_left() && recv_ready && (header_in < kHeaderBytes || room() > 0)) {
      int count = 0;
      int64_t requested = 0;
      if (header_in < kHeaderBytes) {
        iov[count++] =
            iovec{header_in_bytes + header_in, static_cast<size_t>(kHeaderBytes - header_in)};
        requested += kHeaderBytes - header_in;
      }
      const int64_t want = std::max<int64_t>(0, room());
      const int64_t at = received % stage_bytes;
      const int64_t first = std::min(want, stage_bytes - at);
      if (first > 0) iov[count++] = iovec{stage + at, static_cast<size_t>(first)};
      if (want > first) iov[count++] = iovec{stage, static_cast<size_t>(want - first)};
      requested += want;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      const ssize_t got = recvmsg(recv_fd, &msg, MSG_DONTWAIT);
      if (got > 0) {
        total_received += got;
        recv_ready = got == requested;  // a short read drained the socket
        progressed = true;
        int64_t left = got;
        if (header_in < kHeaderBytes) {
          const int64_t h = std::min(left, kHeaderBytes - header_in);
          header_in += h;
          left -= h;
          if (header_in == kHeaderBytes) {
            if (absl::Status s = CheckHeader(in_header_, left_name_); !s.ok()) {
              account();
              return Fail(s);
            }
          }
        }
        received += left;
        process(received & ~int64_t{3});
      } else if (got == 0) {
        account();
        return Fail(PeerClosed(left_name_, progress_text()));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        recv_ready = false;
      } else if (errno != EINTR) {
        const int err = errno;
        account();
        return Fail(PeerBroke("from", left_name_, err, progress_text()));
      }
    }
    if (send_ready && can_send()) {
      int count = 0;
      int64_t requested = 0;
      if (header_out < kHeaderBytes) {
        iov[count++] =
            iovec{header_out_bytes + header_out, static_cast<size_t>(kHeaderBytes - header_out)};
        requested += kHeaderBytes - header_out;
      }
      Cursor o = out, f = forwarded;
      requested += walk_send(o, f, out_total, iov, &count);
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      const ssize_t sent = sendmsg(send_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        total_sent += sent;
        send_ready = sent == requested;  // a short write filled the socket buffer
        progressed = true;
        int64_t left = sent;
        if (header_out < kHeaderBytes) {
          const int64_t h = std::min(left, kHeaderBytes - header_out);
          header_out += h;
          left -= h;
        }
        walk_send(out, forwarded, left, nullptr, nullptr);
      } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        send_ready = false;
      } else if (sent < 0 && errno != EINTR) {
        const int err = errno;
        account();
        return Fail(PeerBroke("to", right_name_, err, progress_text()));
      }
    }
    if (progressed) continue;

    pollfd fds[3];
    int nfds = 0;
    int recv_slot = -1, send_slot = -1;
    if (receive_left() && (header_in < kHeaderBytes || room() > 0)) {
      recv_slot = nfds;
      fds[nfds++] = pollfd{recv_fd, POLLIN, 0};
    }
    if (can_send()) {
      send_slot = nfds;
      fds[nfds++] = pollfd{send_fd, POLLOUT, 0};
    }
    fds[nfds++] = pollfd{abort_fd_.get(), POLLIN, 0};
    const int ready = poll(fds, nfds, tcp::PollTimeoutMs(deadline));
    if (ready < 0 && errno != EINTR) {
      const int err = errno;
      account();
      return Fail(absl::InternalError(absl::StrCat(What(), ": poll: ", std::strerror(err))));
    }
    if (recv_slot >= 0 && fds[recv_slot].revents != 0) recv_ready = true;
    if (send_slot >= 0 && fds[send_slot].revents != 0) send_ready = true;
    if (ready == 0 && absl::Now() >= deadline) {
      account();
      // With the stage full this rank can only go on once the right
      // neighbour takes bytes, whatever the left one does.
      return Fail(RingTimedOut(recv_slot >= 0, progress_text()));
    }
  }
  account();
  operations_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status RingCollective::GatherAllReduce(absl::Span<const absl::Span<float>> buffers,
                                             int64_t elements, ReduceOp op, absl::Time deadline) {
  gather_.resize(static_cast<size_t>(elements) * size_);
  float* mine = gather_.data() + elements * rank_;
  for (const absl::Span<float>& b : buffers) {
    if (!b.empty()) std::memcpy(mine, b.data(), b.size() * sizeof(float));
    mine += b.size();
  }
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  absl::Status status;
  if (mesh_) {
    for (int p = 0; p < size_; ++p) {
      mesh_in_[p] = reinterpret_cast<char*>(gather_.data() + p * elements);
    }
    status = MeshTransfer(deadline, mesh_in_[rank_], bytes, -1);
  } else {
    gather_view_.Clear();
    gather_view_.Add(gather_.data(), static_cast<int64_t>(gather_.size() * sizeof(float)));
    PlanAllGather(&gather_view_, bytes);
    status = Transfer(deadline);
  }
  if (!status.ok()) return status;
  // Rank order 0..N-1 on every rank: identical bits everywhere.
  int64_t offset = 0;
  for (const absl::Span<float>& b : buffers) {
    const size_t n = b.size();
    if (n == 0) continue;
    std::memcpy(b.data(), gather_.data() + offset, n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      collective_internal::AddInto(b.data(), gather_.data() + r * elements + offset, n);
    }
    if (op == ReduceOp::kMean) {
      collective_internal::DivideInPlace(b.data(), n, static_cast<float>(size_));
    }
    offset += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RingCollective::AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                                       const CollectiveOptions& options) {
  int64_t elements = 0;
  for (const auto& b : buffers) elements += static_cast<int64_t>(b.size());
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  if (absl::Status s = BeginOp(Kind::kAllReduce, op, 0, bytes); !s.ok()) return s;
  if (size_ == 1) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();  // the mean of one value is itself
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  op_name_ = "all-reduce";
  op_tag_ = &options.tag;
  if (bytes <= options_.small_allreduce_bytes) {
    return mesh_ ? DoublingAllReduce(buffers, elements, op, deadline)
                 : GatherAllReduce(buffers, elements, op, deadline);
  }
  data_.Clear();
  for (const auto& b : buffers) data_.Add(b.data(), static_cast<int64_t>(b.size() * sizeof(float)));
  return RingAllReduce(op, deadline);
}

absl::Status RingCollective::Broadcast(absl::Span<float> buffer, int root,
                                       const CollectiveOptions& options) {
  if (root < 0 || root >= size_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside the ring of ", size_, " ranks")));
  }
  const int64_t bytes = static_cast<int64_t>(buffer.size() * sizeof(float));
  if (absl::Status s = BeginOp(Kind::kBroadcast, ReduceOp::kSum, root, bytes); !s.ok()) return s;
  if (size_ == 1) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  op_name_ = "broadcast";
  op_tag_ = &options.tag;
  if (mesh_ && bytes <= options_.small_allreduce_bytes) {
    mesh_in_[root] = reinterpret_cast<char*>(buffer.data());
    return MeshTransfer(deadline, reinterpret_cast<const char*>(buffer.data()), bytes, root);
  }
  data_.Clear();
  data_.Add(buffer.data(), bytes);
  const int distance = Mod(rank_ - root, size_);
  int received = -1;
  if (distance > 0) {
    AddRecv(&header_in_, 0, sizeof(Header), Mode::kHeader);
    received = AddRecv(&data_, 0, bytes, Mode::kCopy);
  }
  if (distance < size_ - 1) {
    AddSend(&header_out_, 0, sizeof(Header), -1);
    AddSend(&data_, 0, bytes, received);
  }
  return Transfer(deadline);
}

absl::Status RingCollective::AllGather(absl::Span<const float> input, absl::Span<float> output,
                                       const CollectiveOptions& options) {
  if (output.size() != input.size() * size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "all-gather output holds ", output.size(), " elements; it must hold size() * input = ",
        size_, " * ", input.size())));
  }
  const int64_t bytes = static_cast<int64_t>(input.size() * sizeof(float));
  if (absl::Status s = BeginOp(Kind::kAllGather, ReduceOp::kSum, 0, bytes); !s.ok()) return s;
  float* mine = output.data() + input.size() * rank_;
  if (!input.empty() && mine != input.data()) {
    std::memmove(mine, input.data(), static_cast<size_t>(bytes));
  }
  if (size_ == 1) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  op_name_ = "all-gather";
  op_tag_ = &options.tag;
  if (mesh_ && bytes <= options_.small_allreduce_bytes) {
    for (int p = 0; p < size_; ++p) {
      mesh_in_[p] = reinterpret_cast<char*>(output.data() + input.size() * p);
    }
    return MeshTransfer(deadline, reinterpret_cast<const char*>(mine), bytes, -1);
  }
  data_.Clear();
  data_.Add(output.data(), static_cast<int64_t>(output.size() * sizeof(float)));
  PlanAllGather(&data_, bytes);
  return Transfer(deadline);
}

absl::Status RingCollective::Barrier(const CollectiveOptions& options) {
  if (absl::Status s = BeginOp(Kind::kBarrier, ReduceOp::kSum, 0, 0); !s.ok()) return s;
  if (size_ == 1) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  op_name_ = "barrier";
  op_tag_ = &options.tag;
  // All-to-all rather than a log-step dissemination: a rank that never
  // arrives is then named by every other rank, not just by its successor.
  if (mesh_) return MeshTransfer(deadline, nullptr, 0, -1);
  gather_view_.Clear();
  gather_view_.Add(barrier_blocks_.data(), static_cast<int64_t>(size_ * sizeof(float)));
  PlanAllGather(&gather_view_, sizeof(float));
  return Transfer(deadline);
}

}  // namespace distrain

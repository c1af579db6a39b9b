#include "worker/collective/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/collective/ring_handshake.h"

namespace distrain {
namespace {

constexpr size_t kMaxPendingConnections = 32;

int Mod(int a, int n) { return ((a % n) + n) % n; }

void SetBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

std::string RingKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/ring/", rank);
}

std::string_view Bytes(const void* p, size_t n) {
  return std::string_view(static_cast<const char*>(p), n);
}

// The counters have one writer (the operation thread): a plain load and
// store keep the hot path free of locked instructions.
void Count(std::atomic<int64_t>& counter, int64_t bytes) {
  counter.store(counter.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
}

}  // namespace

// ---- links -----------------------------------------------------------------

class TcpTransport::TcpLink final : public Link {
 public:
  TcpLink(tcp::Fd fd, TcpTransport& transport) : fd_(std::move(fd)), transport_(transport) {}

  int fd() const { return fd_.get(); }
  void Shutdown() const { shutdown(fd_.get(), SHUT_RDWR); }

  IoResult TrySend(absl::Span<const IoSlice> slices) override {
    iovec iov[kMaxIoSlices];
    msghdr msg = Message(slices, iov);
    while (true) {
      const ssize_t n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        Count(transport_.bytes_sent_, n);
        return IoResult{IoResult::kMoved, n};
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) return IoResult{};
      return IoResult{IoResult::kBroken, 0, std::strerror(errno)};
    }
  }

  IoResult TryReceive(absl::Span<const IoSlice> slices) override {
    return ReceiveWith(slices, MSG_DONTWAIT, absl::InfiniteFuture());
  }

  IoResult Receive(absl::Span<const IoSlice> slices, absl::Time deadline) override {
    if (!ArmReceiveTimeout(deadline)) return IoResult{IoResult::kTimedOut};
    return ReceiveWith(slices, MSG_WAITALL, deadline);
  }

  bool AwaitReadable(absl::Duration budget) override {
    pollfd p{fd_.get(), POLLIN, 0};
    return tcp::PollYielding(&p, 1, absl::Now() + budget) > 0;
  }

 private:
  static msghdr Message(absl::Span<const IoSlice> slices, iovec* iov) {
    DISTRAIN_CHECK_LE(slices.size(), static_cast<size_t>(kMaxIoSlices));
    for (size_t i = 0; i < slices.size(); ++i) iov[i] = iovec{slices[i].data, slices[i].size};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = slices.size();
    return msg;
  }

  // `deadline` only matters for a blocking receive (flags without
  // MSG_DONTWAIT): its SO_RCVTIMEO ending early is kWouldBlock.
  IoResult ReceiveWith(absl::Span<const IoSlice> slices, int flags, absl::Time deadline) {
    iovec iov[kMaxIoSlices];
    msghdr msg = Message(slices, iov);
    while (true) {
      const ssize_t n = recvmsg(fd_.get(), &msg, flags);
      if (n > 0) {
        Count(transport_.bytes_received_, n);
        return IoResult{IoResult::kMoved, n};
      }
      if (n == 0) return IoResult{IoResult::kClosed};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return IoResult{absl::Now() >= deadline ? IoResult::kTimedOut : IoResult::kWouldBlock};
      }
      return IoResult{IoResult::kBroken, 0, std::strerror(errno)};
    }
  }

  // Sets SO_RCVTIMEO so a blocking receive ends near `deadline`; false once
  // the deadline has passed.
  bool ArmReceiveTimeout(absl::Time deadline) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // Reuse the armed value while it neither overshoots the deadline by more
    // than a tenth nor wakes us before half of the wait: successive operations
    // with the same timeout then cost no setsockopt. An early wake-up re-arms.
    const absl::Duration armed = receive_timeout_;
    if (armed > absl::ZeroDuration() && armed <= left + left / 10 + absl::Milliseconds(1) &&
        armed * 2 >= left) {
      return true;
    }
    const int64_t us = std::max<int64_t>(1, absl::ToInt64Microseconds(left));
    timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    receive_timeout_ = absl::Microseconds(us);
    return true;
  }

  tcp::Fd fd_;
  TcpTransport& transport_;
  absl::Duration receive_timeout_ = absl::ZeroDuration();  // SO_RCVTIMEO armed
};

// ---- setup -----------------------------------------------------------------

TcpTransport::TcpTransport(int rank, int size, const TcpTransportOptions& options)
    : rank_(rank), size_(size), options_(options) {
  for (int r = 0; r < size; ++r) {
    names_.push_back(options.names.empty() ? absl::StrCat("rank ", r) : options.names[r]);
  }
  dialled_.resize(size);
  accepted_.resize(size);
  send_link_.assign(size, nullptr);
  receive_link_.assign(size, nullptr);
}

TcpTransport::~TcpTransport() = default;

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(
    Store& store, int rank, int size, const TcpTransportOptions& options) {
  DISTRAIN_CHECK(size >= 2 && rank >= 0 && rank < size) << "rank " << rank << " of " << size;
  DISTRAIN_CHECK(options.names.empty() || static_cast<int>(options.names.size()) == size);
  std::unique_ptr<TcpTransport> transport(new TcpTransport(rank, size, options));
  if (absl::Status s = transport->Setup(store); !s.ok()) return s;
  return transport;
}

absl::Status TcpTransport::Setup(Store& store) {
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
  const std::string& mac_key = options_.ring_key;
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
  if (options_.mesh) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || p == left || p == right) continue;
      (p > rank_ ? outbound : inbound).push_back(p);
    }
  }
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
    dialled_[peer] = std::make_unique<TcpLink>(*std::move(fd), *this);
  }

  // 4. Accept the left neighbour (and the lower mesh ranks); reject anything else.
  for (int peer : inbound) {
    absl::StatusOr<tcp::HostPort> address = lookup(peer);
    if (!address.ok()) return address.status();
  }
  struct Pending {
    tcp::Fd fd;
    char hello[kRingHelloBytes] = {};
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
      ssize_t got = recv(p.fd.get(), p.hello + p.received, kRingHelloBytes - p.received,
                         MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (got <= 0) {
        p.fd.Close();  // stray client went away
        continue;
      }
      p.received += static_cast<size_t>(got);
      if (p.received < kRingHelloBytes) continue;
      std::string their_nonce;
      absl::StatusOr<int> from = ParseRingHello(Bytes(p.hello, kRingHelloBytes), group_id, rank_,
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
      accepted_[peer] = std::make_unique<TcpLink>(std::move(fd), *this);
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
    char ack[kRingAckBytes];
    if (absl::Status s =
            tcp::RecvAll(dialled_[peer]->fd(), ack, sizeof(ack), deadline, -1, names_[peer]);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("waiting for ", names_[peer],
                                                 " to accept the connection: ", s.message()));
    }
    if (absl::Status s = ParseRingAck(Bytes(ack, sizeof(ack)), group_id, peer, mac_key,
                                      hello_nonce[peer], peer_nonce[peer]);
        !s.ok()) {
      return absl::Status(
          s.code() == absl::StatusCode::kPermissionDenied ? s.code()
                                                          : absl::StatusCode::kUnavailable,
          absl::StrCat(names_[peer], " answered the hello with a bad acknowledgement (",
                       s.message(), "; another program on that port?)"));
    }
  }
  // Each connection carries both directions: a neighbour's link serves the
  // ring one way and the mesh the other, except with two ranks, where the
  // ring already has a socket each way.
  for (int p = 0; p < size_; ++p) {
    send_link_[p] = dialled_[p] != nullptr ? dialled_[p].get() : accepted_[p].get();
    receive_link_[p] = accepted_[p] != nullptr ? accepted_[p].get() : dialled_[p].get();
  }
  // From here on the sockets block, and every call that must not passes
  // MSG_DONTWAIT: only TcpLink::Receive blocks.
  for (const auto* links : {&dialled_, &accepted_}) {
    for (const std::unique_ptr<TcpLink>& link : *links) {
      if (link != nullptr) SetBlocking(link->fd());
    }
  }
  return absl::OkStatus();
}

// ---- operation-time calls ----------------------------------------------------

Link* TcpTransport::SendLink(int peer) { return send_link_[peer]; }

Link* TcpTransport::ReceiveLink(int peer) { return receive_link_[peer]; }

absl::Status TcpTransport::Wait(absl::Span<LinkWait> waits, absl::Time deadline) {
  poll_.clear();
  for (const LinkWait& w : waits) {
    // Only this transport's links reach here (they come from SendLink and
    // ReceiveLink).
    const int fd = static_cast<const TcpLink*>(w.link)->fd();
    const short events = w.direction == LinkWait::kSend ? POLLOUT : POLLIN;
    poll_.push_back(pollfd{fd, events, 0});
  }
  poll_.push_back(pollfd{abort_fd_.get(), POLLIN, 0});
  // Look without sleeping first, yielding the CPU between looks, for up to
  // busy_poll (tcp_transport.h says why); then sleep in poll.
  int n = 0;
  if (options_.busy_poll > absl::ZeroDuration()) {
    n = tcp::PollYielding(poll_.data(), poll_.size(),
                          std::min(deadline, absl::Now() + options_.busy_poll));
  }
  if (n == 0) n = poll(poll_.data(), poll_.size(), tcp::PollTimeoutMs(deadline));
  if (n < 0) {
    if (errno == EINTR) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  }
  // Errors and hang-ups count as ready: the next try reports them.
  for (size_t i = 0; i < waits.size(); ++i) waits[i].ready = poll_[i].revents != 0;
  if (n == 0 && absl::Now() >= deadline) return absl::DeadlineExceededError("");
  return absl::OkStatus();
}

void TcpTransport::Abort() {
  if (aborted_.exchange(true)) return;
  if (abort_fd_.valid()) {
    uint64_t one = 1;
    (void)!write(abort_fd_.get(), &one, sizeof(one));
  }
  for (const auto* links : {&dialled_, &accepted_}) {
    for (const std::unique_ptr<TcpLink>& link : *links) {
      if (link != nullptr) link->Shutdown();
    }
  }
}

TransportStats TcpTransport::stats() const {
  TransportStats s;
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace distrain

#include "worker/collective/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace distrain::tcp {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};

bool AbortRequested(int abort_fd) {
  if (abort_fd < 0) return false;
  pollfd p{abort_fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Waits until `fd` is ready for `events`; false with *status set otherwise.
bool WaitFor(int fd, short events, absl::Time deadline, int abort_fd, const std::string& peer,
             const char* doing, absl::Status* status) {
  while (true) {
    pollfd fds[2] = {{fd, events, 0}, {abort_fd, POLLIN, 0}};
    int n = poll(fds, abort_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      *status = absl::InternalError(absl::StrCat("poll failed while ", doing, " ", peer, ": ",
                                                 ErrnoText(errno)));
      return false;
    }
    if (abort_fd >= 0 && (fds[1].revents & POLLIN)) {
      *status = absl::AbortedError(absl::StrCat("aborted while ", doing, " ", peer));
      return false;
    }
    if (fds[0].revents != 0) return true;
    if (absl::Now() >= deadline) {
      *status = absl::DeadlineExceededError(absl::StrCat("timed out ", doing, " ", peer));
      return false;
    }
  }
}

// "10.244.0.7" / "fd00::7": the address a name resolved to, for messages.
std::string FormatSockaddr(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.Release();
  }
  return *this;
}

void Fd::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  HostPort out;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", text, "' is not of the form [ipv6]:port"));
    }
    out.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", text, "' is not of the form host:port"));
    }
    out.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_text, &out.port) || out.port <= 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", text, "' has an invalid port '", port_text, "'"));
  }
  return out;
}

std::string FormatHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Round up so a wait never ends a hair before the deadline and spins.
  int64_t ms = absl::ToInt64Milliseconds(left + absl::Milliseconds(1) - absl::Nanoseconds(1));
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

int PollYielding(pollfd* fds, size_t count, absl::Time until) {
  int n;
  while ((n = poll(fds, count, 0)) == 0 && absl::Now() < until) sched_yield();
  return n;
}

absl::Status ConfigureStream(int fd, int buffer_bytes) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return absl::InternalError(absl::StrCat("setsockopt(TCP_NODELAY): ", ErrnoText(errno)));
  }
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("fcntl(O_NONBLOCK): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> Listen(const std::string& host, int port, int buffer_bytes, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &raw);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve listen address '", host,
                                                   "': ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, AddrInfoDeleter> list(raw);
  std::string last_error = "no addresses";
  for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = ErrnoText(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (buffer_bytes > 0) {
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
      setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
    }
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd.get(), 64) != 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    int flags = fcntl(fd.get(), F_GETFL, 0);
    fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    *bound_port = addr.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return fd;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", FormatHostPort(host, port), ": ", last_error));
}

absl::StatusOr<Fd> Connect(const HostPort& address, int buffer_bytes, absl::Time deadline,
                           int abort_fd, const std::string& peer) {
  absl::Duration backoff = absl::Milliseconds(10);
  // One SYN may go where nobody answers and nothing refuses: a name that still
  // resolves to a replaced pod's address (DNS lags the pod behind it by
  // seconds), whose neighbour entry drops the packets silently. Each attempt
  // therefore waits a bounded time, then the name is resolved again; the bound
  // grows so a slow but live path still connects.
  absl::Duration attempt_timeout = absl::Seconds(2);
  std::string last_error;
  const std::string service = std::to_string(address.port);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* raw = nullptr;
    int rc = getaddrinfo(address.host.c_str(), service.c_str(), &hints, &raw);
    std::unique_ptr<addrinfo, AddrInfoDeleter> list(raw);
    if (rc != 0) {
      last_error = absl::StrCat("cannot resolve '", address.host, "': ", gai_strerror(rc));
    }
    for (addrinfo* ai = rc == 0 ? list.get() : nullptr; ai != nullptr; ai = ai->ai_next) {
      Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        last_error = ErrnoText(errno);
        continue;
      }
      if (absl::Status s = ConfigureStream(fd.get(), buffer_bytes); !s.ok()) return s;
      if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        last_error = ErrnoText(errno);
        continue;
      }
      absl::Status wait;
      const absl::Time attempt_deadline = std::min(deadline, absl::Now() + attempt_timeout);
      if (!WaitFor(fd.get(), POLLOUT, attempt_deadline, abort_fd, peer, "connecting to", &wait)) {
        if (wait.code() != absl::StatusCode::kDeadlineExceeded) return wait;
        last_error = absl::StrCat("no answer from ", FormatSockaddr(ai->ai_addr), " within ",
                                  absl::FormatDuration(attempt_timeout));
        attempt_timeout = std::min(attempt_timeout * 2, absl::Seconds(16));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) return fd;
      last_error = ErrnoText(err);
    }
    if (AbortRequested(abort_fd)) {
      return absl::AbortedError(absl::StrCat("aborted while connecting to ", peer));
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "could not connect to ", peer, " before the deadline (last error: ", last_error,
          "); check that the process runs and that its address is reachable"));
    }
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(std::min(backoff, deadline - now)));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline, int abort_fd,
                     const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status status;
      if (!WaitFor(fd, POLLOUT, deadline, abort_fd, peer, "sending to", &status)) return status;
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("connection to ", peer, " broke while sending: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline, int abort_fd,
                     const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat(peer, " closed the connection"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status status;
      if (!WaitFor(fd, POLLIN, deadline, abort_fd, peer, "waiting for data from", &status)) {
        return status;
      }
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("connection from ", peer, " broke while receiving: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace distrain::tcp

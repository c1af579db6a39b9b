#ifndef DISTRAIN_WORKER_COLLECTIVE_TCP_SOCKET_H_
#define DISTRAIN_WORKER_COLLECTIVE_TCP_SOCKET_H_

// Small POSIX TCP helpers for the ring collective: an owning descriptor,
// host:port parsing, listen/connect with deadlines, and exact-length
// send/receive that wait with poll() so every blocking point honours a
// deadline and an abort descriptor. Sockets are non-blocking throughout;
// sends use MSG_NOSIGNAL so a closed peer never raises SIGPIPE.
//
// Thread-safety: functions are thread-safe; a Fd is owned by one thread.

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace distrain::tcp {

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port", "[v6addr]:port". InvalidArgument naming the text otherwise.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);
// Inverse of ParseHostPort (brackets IPv6 literals).
std::string FormatHostPort(absl::string_view host, int port);

// Listens on host:port (port 0 picks an ephemeral one; *bound_port receives
// it). `buffer_bytes` > 0 sets SO_SNDBUF/SO_RCVBUF, inherited by accepted
// sockets.
absl::StatusOr<Fd> Listen(const std::string& host, int port, int buffer_bytes, int* bound_port);

// Connects to `address`, retrying unresolvable names, refused connections and
// attempts nobody answers (each bounded, 2 s doubling to 16 s, then the name
// is resolved again) with backoff until `deadline` (DNS of freshly started or
// replaced pods lags).
// DeadlineExceeded / Unavailable messages name `peer`. `abort_fd` (or -1)
// becoming readable stops the wait with Aborted.
absl::StatusOr<Fd> Connect(const HostPort& address, int buffer_bytes, absl::Time deadline,
                           int abort_fd, const std::string& peer);

// TCP_NODELAY + O_NONBLOCK (+ buffer sizes when > 0).
absl::Status ConfigureStream(int fd, int buffer_bytes);

// Sends/receives exactly `size` bytes before `deadline`. DeadlineExceeded,
// Unavailable (closed/reset) and Aborted (abort_fd readable) name `peer`.
absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline, int abort_fd,
                     const std::string& peer);
absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline, int abort_fd,
                     const std::string& peer);

// Milliseconds for poll() until `deadline`, rounded up, capped, >= 0.
int PollTimeoutMs(absl::Time deadline);

// poll() without sleeping, yielding the CPU between looks, until one of `fds`
// is ready or `until` passes; returns poll's last result (0: nothing ready).
// The spin before a sleeping wait (TcpTransportOptions::busy_poll says why).
int PollYielding(pollfd* fds, size_t count, absl::Time until);

}  // namespace distrain::tcp

#endif  // DISTRAIN_WORKER_COLLECTIVE_TCP_SOCKET_H_

#include "operator/metrics_scraper.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace distrain {
namespace {

enum class Phase { kConnecting, kSending, kReading };

struct Connection {
  size_t index = 0;  // into targets / results
  int fd = -1;
  Phase phase = Phase::kConnecting;
  absl::Time start;
  absl::Time deadline;
  std::string request;
  size_t sent = 0;
  std::string buffer;  // the response so far, never longer than the limit
  size_t header_end = std::string::npos;  // offset of the body once the headers are in
  std::optional<size_t> content_length;
  bool chunked = false;
  int status_code = 0;
  std::optional<absl::Status> outcome;  // set when the target has ended
};

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// Parses the status line and headers once "\r\n\r\n" has arrived.
absl::Status ParseHeaders(Connection* c, size_t limit) {
  const size_t end = c->buffer.find("\r\n\r\n");
  if (end == std::string::npos) return absl::OkStatus();  // not yet
  c->header_end = end + 4;
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(c->buffer).substr(0, end), "\r\n");
  // "HTTP/1.1 200 OK"
  const absl::string_view status_line = lines.empty() ? "" : lines[0];
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") ||
      !absl::SimpleAtoi(parts[1], &c->status_code)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not an HTTP response: \"", absl::CEscape(status_line.substr(0, 40)), "\""));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (name == "content-length") {
      size_t length = 0;
      if (!absl::SimpleAtoi(value, &length)) {
        return absl::InvalidArgumentError(absl::StrCat("bad Content-Length \"",
                                                       absl::CEscape(value.substr(0, 20)), "\""));
      }
      c->content_length = length;
    } else if (name == "transfer-encoding") {
      c->chunked = absl::StrContains(absl::AsciiStrToLower(value), "chunked");
    }
  }
  if (c->content_length && !c->chunked && *c->content_length > limit - c->header_end) {
    // Refused before reading it: the point is not to receive it.
    return absl::ResourceExhaustedError(
        absl::StrCat("Content-Length ", *c->content_length, " exceeds the limit of ", limit,
                     " bytes per response"));
  }
  return absl::OkStatus();
}

bool Complete(const Connection& c) {
  return c.header_end != std::string::npos && c.content_length && !c.chunked &&
         c.buffer.size() >= c.header_end + *c.content_length;
}

// RFC 9112 §7.1 chunked body, read whole; trailers ignored.
absl::StatusOr<std::string> Dechunk(absl::string_view in) {
  std::string out;
  while (true) {
    const size_t eol = in.find("\r\n");
    if (eol == absl::string_view::npos) return absl::InvalidArgumentError("truncated chunk size");
    absl::string_view size_text = in.substr(0, eol);
    size_text = size_text.substr(0, size_text.find(';'));  // chunk extensions
    size_t size = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &size)) {
      return absl::InvalidArgumentError("bad chunk size");
    }
    in.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (in.size() < size + 2) return absl::InvalidArgumentError("truncated chunk");
    out.append(in.data(), size);
    in.remove_prefix(size + 2);
  }
}

// Starts the connect of target `index`; an outcome at once when it cannot.
Connection Start(const ScrapeTarget& target, size_t index, const ScrapeOptions& options) {
  Connection c;
  c.index = index;
  c.start = absl::Now();
  c.deadline = c.start + options.timeout;
  std::string host = target.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  sockaddr_storage address{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  const bool ipv6 = host.find(':') != std::string::npos;
  if (!ipv6 && inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(target.port));
    length = sizeof(*v4);
  } else if (ipv6 && inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(target.port));
    length = sizeof(*v6);
  } else {
    c.outcome = absl::InvalidArgumentError(
        absl::StrCat("\"", target.host, "\" is not a numeric IP address"));
    return c;
  }
  if (target.port <= 0 || target.port > 65535) {
    c.outcome = absl::InvalidArgumentError(absl::StrCat("port ", target.port, " out of range"));
    return c;
  }
  c.request = absl::StrCat("GET ", target.path, " HTTP/1.1\r\nHost: ", ipv6 ? "[" : "", host,
                           ipv6 ? "]" : "", ":", target.port,
                           "\r\nUser-Agent: distrain-operator\r\nAccept: text/plain\r\n"
                           "Connection: close\r\n\r\n");
  c.fd = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c.fd < 0) {
    c.outcome = absl::UnavailableError(Errno("socket"));
    return c;
  }
  if (connect(c.fd, reinterpret_cast<sockaddr*>(&address), length) == 0) {
    c.phase = Phase::kSending;
  } else if (errno != EINPROGRESS) {
    c.outcome = absl::UnavailableError(Errno("connect"));
  }
  return c;
}

void Send(Connection* c) {
  while (c->sent < c->request.size()) {
    const ssize_t n =
        send(c->fd, c->request.data() + c->sent, c->request.size() - c->sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      c->outcome = absl::UnavailableError(Errno("send"));
      return;
    }
    c->sent += static_cast<size_t>(n);
  }
  c->phase = Phase::kReading;
}

void Read(Connection* c, size_t limit) {
  char chunk[16384];
  while (!c->outcome) {
    const size_t room = limit - c->buffer.size();
    if (room == 0) {
      // Full: the response fits only if the server has nothing more to say.
      char probe;
      const ssize_t n = recv(c->fd, &probe, 1, MSG_PEEK);
      if (n == 0) break;  // end of stream: handled below as a complete read
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      c->outcome = n > 0 ? absl::ResourceExhaustedError(absl::StrCat(
                               "the response exceeds the limit of ", limit, " bytes"))
                         : absl::UnavailableError(Errno("recv"));
      return;
    }
    const ssize_t n = recv(c->fd, chunk, std::min(room, sizeof(chunk)), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      c->outcome = absl::UnavailableError(Errno("recv"));
      return;
    }
    if (n == 0) break;
    c->buffer.append(chunk, static_cast<size_t>(n));
    if (c->header_end == std::string::npos) {
      if (absl::Status s = ParseHeaders(c, limit); !s.ok()) {
        c->outcome = std::move(s);
        return;
      }
    }
    if (Complete(*c)) {
      c->outcome = absl::OkStatus();
      return;
    }
  }
  if (c->outcome) return;
  // End of stream.
  if (c->header_end == std::string::npos) {
    c->outcome = absl::UnavailableError(
        absl::StrCat("connection closed after ", c->buffer.size(), " bytes, before the headers ended"));
  } else if (c->content_length && !c->chunked &&
             c->buffer.size() < c->header_end + *c->content_length) {
    c->outcome = absl::UnavailableError(absl::StrCat(
        "connection closed after ", c->buffer.size() - c->header_end, " of ", *c->content_length,
        " body bytes"));
  } else {
    c->outcome = absl::OkStatus();
  }
}

// The result of an ended connection.
ScrapeResult Finish(Connection* c, absl::Time now) {
  ScrapeResult r;
  r.bytes_read = c->buffer.size();
  r.elapsed = now - c->start;
  r.status = *c->outcome;
  if (r.status.ok() && c->status_code != 200) {
    r.status = absl::FailedPreconditionError(absl::StrCat("HTTP ", c->status_code));
  }
  if (r.status.ok()) {
    absl::string_view body = absl::string_view(c->buffer).substr(c->header_end);
    if (c->content_length && !c->chunked) body = body.substr(0, *c->content_length);
    if (c->chunked) {
      absl::StatusOr<std::string> decoded = Dechunk(body);
      if (decoded.ok()) {
        r.body = std::move(*decoded);
      } else {
        r.status = decoded.status();
      }
    } else {
      r.body = std::string(body);
    }
  }
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  return r;
}

}  // namespace

std::vector<ScrapeResult> ScrapeAll(const std::vector<ScrapeTarget>& targets,
                                    const ScrapeOptions& options, std::stop_token stop) {
  std::vector<ScrapeResult> results(targets.size());
  const size_t limit = std::max<size_t>(options.max_response_bytes, 64);
  const size_t max_in_flight = static_cast<size_t>(std::max(1, options.max_in_flight));
  std::vector<Connection> active;
  size_t next = 0;
  std::vector<pollfd> fds;
  while (true) {
    while (!stop.stop_requested() && active.size() < max_in_flight && next < targets.size()) {
      Connection c = Start(targets[next], next, options);
      ++next;
      if (c.outcome) {
        results[c.index] = Finish(&c, absl::Now());
      } else {
        if (c.phase == Phase::kSending) Send(&c);
        active.push_back(std::move(c));
      }
    }
    if (stop.stop_requested()) {
      for (Connection& c : active) {
        c.outcome = absl::CancelledError("the operator is stopping");
        results[c.index] = Finish(&c, absl::Now());
      }
      for (; next < targets.size(); ++next) {
        results[next].status = absl::CancelledError("the operator is stopping");
      }
      break;
    }
    if (active.empty()) break;

    absl::Time now = absl::Now();
    absl::Duration wait = absl::Milliseconds(100);  // also how soon `stop` is noticed
    fds.clear();
    for (const Connection& c : active) {
      wait = std::min(wait, std::max(absl::ZeroDuration(), c.deadline - now));
      const short events = c.outcome ? 0 : c.phase == Phase::kReading ? POLLIN : POLLOUT;
      fds.push_back({c.fd, events, 0});
    }
    const int ready = poll(fds.data(), fds.size(),
                           static_cast<int>(absl::ToInt64Milliseconds(wait + absl::Microseconds(999))));
    if (ready < 0 && errno != EINTR) {
      for (Connection& c : active) c.outcome = absl::InternalError(Errno("poll"));
    }
    now = absl::Now();
    for (size_t i = 0; i < active.size(); ++i) {
      Connection& c = active[i];
      if (!c.outcome && fds[i].revents != 0) {
        if (c.phase == Phase::kConnecting) {
          int error = 0;
          socklen_t len = sizeof(error);
          getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len);
          if (error != 0) {
            c.outcome = absl::UnavailableError(absl::StrCat("connect: ", std::strerror(error)));
          } else {
            c.phase = Phase::kSending;
          }
        }
        if (!c.outcome && c.phase == Phase::kSending) Send(&c);
        else if (!c.outcome && c.phase == Phase::kReading) Read(&c, limit);
      }
      if (!c.outcome && now >= c.deadline) {
        c.outcome = absl::DeadlineExceededError(absl::StrCat(
            "no complete response within ", absl::FormatDuration(options.timeout), " (",
            c.buffer.size(), " bytes received)"));
      }
      if (c.outcome) results[c.index] = Finish(&c, now);
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [](const Connection& c) { return c.fd < 0; }),
                 active.end());
  }
  return results;
}

}  // namespace distrain

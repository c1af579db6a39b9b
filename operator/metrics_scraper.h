#ifndef DISTRAIN_OPERATOR_METRICS_SCRAPER_H_
#define DISTRAIN_OPERATOR_METRICS_SCRAPER_H_

// ScrapeAll: fetches many plain-HTTP endpoints (the training pods' /metrics)
// at once from one thread, each bounded in bytes and in time, so that one
// endpoint that never answers, answers slowly or streams without end costs the
// others nothing (docs/architecture.md §10).
//
// Why not cpprestsdk's http_client (what the progress reporter used): it reads
// a body whole before handing it over, with no size limit, and one blocking
// request per job made N slow jobs delay every job's status by N timeouts.
// The endpoints are the operator's tenants' processes, so every byte they send
// is untrusted input.
//
// Protocol, for one call:
//   1. Up to `max_in_flight` targets at a time get a non-blocking TCP connect
//      to host:port (a numeric IPv4 or IPv6 address: pod IPs; no DNS lookup, so
//      nothing can block outside the deadline). A finished target frees its
//      slot for the next one.
//   2. Each target has its own deadline, `timeout` after its connect started.
//      One poll() over every open socket drives all of them: send
//      "GET <path> HTTP/1.1" with "Connection: close", then read.
//   3. A target ends: done when the server has sent Content-Length bytes of
//      body (or closed the connection, without a Content-Length); failed at
//      its deadline, on a refused or reset connection, on a status line that
//      is not HTTP, or when the response (status line, headers and body
//      together) would exceed `max_response_bytes` — a Content-Length over
//      the limit fails at once, before the body is read. A chunked body is
//      decoded after it was read whole (within the same limit).
//   4. The call returns when every target has ended: at the latest the last
//      connect's start + `timeout`, or soon after `stop` is requested.
// Memory: at most max_in_flight * max_response_bytes of response buffers.
//
// Thread-safety: a pure function of its arguments (apart from the network);
// calls on different threads are independent.

#include <cstddef>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace distrain {

struct ScrapeTarget {
  std::string host;  // numeric IPv4 or IPv6 address
  int port = 0;
  std::string path = "/metrics";
};

struct ScrapeOptions {
  // The largest response read, headers included. A distrain chief's page is
  // 3-10 KiB (OneDevice 3.3 KiB, a ParameterServer worker with its RPC
  // histograms 9.7 KiB, measured with `distrain run`); 256 KiB leaves room
  // for a user image's own metrics while bounding what a hostile one can make
  // the operator hold.
  size_t max_response_bytes = 256 * 1024;
  // Per target, from the start of its connect to its last byte.
  absl::Duration timeout = absl::Seconds(2);
  // Connections open at once (file descriptors and buffers).
  int max_in_flight = 32;
};

struct ScrapeResult {
  // OK with the body of a 200 answer; otherwise why not (kDeadlineExceeded,
  // kResourceExhausted for an oversized response, kUnavailable for a
  // connection problem, kFailedPrecondition for a non-200 status,
  // kInvalidArgument for an unparseable response).
  absl::Status status;
  std::string body;
  // Bytes received from the socket for this target: never more than
  // max_response_bytes.
  size_t bytes_read = 0;
  absl::Duration elapsed;
};

// One result per target, in the order of `targets`.
std::vector<ScrapeResult> ScrapeAll(const std::vector<ScrapeTarget>& targets,
                                    const ScrapeOptions& options, std::stop_token stop = {});

}  // namespace distrain

#endif  // DISTRAIN_OPERATOR_METRICS_SCRAPER_H_

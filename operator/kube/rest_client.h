#ifndef DISTRAIN_OPERATOR_KUBE_REST_CLIENT_H_
#define DISTRAIN_OPERATOR_KUBE_REST_CLIENT_H_

// RestClient: the production Client (client.h) over HTTPS, on cpprestsdk.
//
//   auto config = LoadRestConfig({.kubeconfig_path = flag});      // kubeconfig.h
//   auto client = RestClient::Create(*config, {.qps = 50, .burst = 100});
//   auto pod = (*client)->Request("GET", ResourcePath(PodsResource(), "ns", "p"));
//
// Transport:
//   * TLS verifies the server against RestConfig::ca_pem only (the system store
//     is not consulted when a CA is given), including the host name or IP
//     address of the server URL against the certificate's subjectAltName;
//     TLS >= 1.2. Client certificates come from RestConfig (PEM in memory).
//   * The bearer token file (a rotating ServiceAccount token) is re-read when
//     the last read is older than token_refresh_interval; a failed re-read
//     keeps the last good token.
//   * Request(): paced by a TokenBucketRateLimiter (qps/burst); retried per
//     client.h's contract with exponential backoff and jitter
//     (initial_backoff * 2^attempt, capped at max_backoff, each sleep a random
//     point in [d/2, d]); a Retry-After answer sleeps at least that long.
//     `timeout` is cpprestsdk's: the longest time without progress (connect,
//     TLS, send, each received chunk), not a total deadline.
//   * Watch(): one connection per call, not paced. Its idle timeout is the
//     URL's timeoutSeconds + 30 s (or watch_idle_timeout without one), so a
//     silently dead server is noticed. The stream is parsed incrementally by
//     WatchStreamParser; a stop request closes the connection at once.
// Metrics (when options.registry is set), one sample per HTTP attempt:
//   rest_client_requests_total{code,method}     code is the HTTP status or "<error>";
//   rest_client_request_duration_seconds{verb}  verb is the method, WATCH for watches
//                                               (time until the response headers).
//
// Ownership: owns its HTTP clients and the rate limiter; shares the registry.
// Thread-safety: all methods may be called from many threads at once.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "operator/kube/client.h"
#include "operator/kube/clock.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/rate_limiter.h"

namespace prometheus {
class Registry;
}

namespace distrain::kube {

struct RestClientOptions {
  double qps = 20;   // <= 0: unlimited
  int burst = 30;
  std::chrono::milliseconds timeout{30000};
  int max_retries = 6;  // retries after the first attempt
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{4000};
  std::chrono::seconds max_retry_after{30};  // a longer Retry-After is capped
  std::chrono::milliseconds watch_idle_timeout{std::chrono::minutes(10)};
  std::chrono::milliseconds token_refresh_interval{std::chrono::minutes(1)};
  std::string user_agent = "distrain-operator";
  std::shared_ptr<prometheus::Registry> registry;                 // optional
  const Clock* clock = nullptr;  // limiter, backoff sleeps, token refresh; null: Clock::Real()
};

class RestClient final : public Client {
 public:
  // Fails (kInvalidArgument, naming RestConfig::source) when the CA, client
  // certificate or key cannot be loaded, or the server URL is malformed. Does
  // not contact the server.
  static absl::StatusOr<std::unique_ptr<RestClient>> Create(const RestConfig& config,
                                                            RestClientOptions options = {});
  ~RestClient() override;
  RestClient(const RestClient&) = delete;
  RestClient& operator=(const RestClient&) = delete;

  absl::StatusOr<ApiResponse> Request(std::string_view method, std::string_view path_and_query,
                                      const nlohmann::json* body = nullptr,
                                      std::string_view content_type = "application/json") override;
  // Skips parsing a 2xx body (client.h).
  absl::StatusOr<ApiResponse> RequestStatusOnly(std::string_view method,
                                                std::string_view path_and_query,
                                                const nlohmann::json* body = nullptr,
                                                std::string_view content_type =
                                                    "application/json") override;
  // One attempt on cpprestsdk's pool, paced like Request (the caller waits
  // for a token); `done` runs on the pool. An answer the attempt does not
  // settle (a retryable code, or a transport error that Request would retry)
  // continues on a thread of its own through RequestStatusOnly's retries.
  void RequestStatusOnlyAsync(std::string method, std::string path_and_query,
                              const nlohmann::json* body, StatusOnlyCallback done) override;
  absl::Status Watch(std::string_view path_and_query,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     std::stop_token stop) override;
  std::string server() const override;

  // GETs path_and_query and hands the response body to on_data as it arrives,
  // for answers that are not JSON or never end (pods/<pod>/log?follow=true).
  // Not paced or retried, like Watch; the same idle timeout as Watch. Returns
  // the answer: for a non-2xx one its body (parsed as Request's) without
  // calling on_data; for a 2xx one a null body, once the server ends the
  // stream, on_data returns false or `stop` is requested. Transport failures
  // are kUnavailable naming the URL. (Added for kubectl-dtj logs.)
  absl::StatusOr<ApiResponse> Stream(std::string_view path_and_query,
                                     const std::function<bool(std::string_view)>& on_data,
                                     std::stop_token stop);

  // The namespace of the kubeconfig context (or the pod's, in-cluster).
  const std::string& default_namespace() const;

 private:
  struct Impl;
  absl::StatusOr<ApiResponse> Send(std::string_view method, std::string_view path_and_query,
                                   const nlohmann::json* body, std::string_view content_type,
                                   bool parse_success_body);
  explicit RestClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits a watch response body (newline-delimited JSON, one
// {"type": ..., "object": ...} per line) into WatchEvents, however the bytes
// are chunked. Not thread-safe; one per stream.
class WatchStreamParser {
 public:
  // Lines longer than this are an error rather than unbounded memory.
  static constexpr size_t kMaxLineBytes = 64u << 20;

  // Consumes `bytes`, calling on_event for every complete event in order.
  // Returns kDataLoss naming the stream offset when a line is not a watch
  // event. When on_event returns false, stops and returns OK with stopped()
  // true; later bytes are ignored.
  absl::Status Feed(std::string_view bytes, const std::function<bool(const WatchEvent&)>& on_event);
  // At end of stream: an unterminated non-blank last line is delivered if it
  // is a complete event, else it is an error (a truncated stream).
  absl::Status Finish(const std::function<bool(const WatchEvent&)>& on_event);
  bool stopped() const { return stopped_; }
  int64_t events() const { return events_; }

 private:
  absl::Status Deliver(std::string_view line, const std::function<bool(const WatchEvent&)>& on_event);

  std::string pending_;
  int64_t offset_ = 0;  // stream offset of pending_[0]
  int64_t events_ = 0;
  bool stopped_ = false;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_REST_CLIENT_H_

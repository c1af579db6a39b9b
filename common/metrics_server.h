#ifndef DISTRAIN_COMMON_METRICS_SERVER_H_
#define DISTRAIN_COMMON_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace web::http::experimental::listener {
class http_listener;
}

namespace distrain {

// HTTP endpoint for Prometheus and probes, on one port (DISTRAIN_METRICS_PORT
// in workers, :8080 in the operator):
//   GET /metrics  Prometheus text format 0.0.4 of the registry;
//   GET /healthz  200 "ok" while `healthy()` is OK, else 503 with its message
//                 (one line: why, for `kubectl describe pod`'s probe events);
//   GET /readyz   200 "ok" while `ready()` is OK (default: healthy()), else 503.
// prometheus-cpp provides the metric types and the text serializer; the
// listener is cpprestsdk's (prometheus-cpp's own exposer cannot serve
// /healthz beside /metrics).
//
// Owns the listener; shares the registry with whoever records metrics.
// Thread-safe: requests are served on cpprestsdk's thread pool while the
// owner keeps updating metrics (prometheus-cpp metrics are thread-safe).
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
      std::function<bool()> healthy = [] { return true; }, std::function<bool()> ready = nullptr);
  // The same with checks that say why not ("" readiness: the health check).
  using Check = std::function<absl::Status()>;
  static absl::StatusOr<std::unique_ptr<MetricsServer>> StartWithChecks(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
      Check healthy, Check ready = nullptr);
  ~MetricsServer();  // stops listening; in-flight requests finish first

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;
  std::shared_ptr<prometheus::Registry> registry_;
  Check healthy_;
  Check ready_;
  int port_ = 0;
};

}  // namespace distrain

#endif  // DISTRAIN_COMMON_METRICS_SERVER_H_

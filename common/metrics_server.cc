#include "common/metrics_server.h"

#include <cpprest/http_listener.h>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace distrain {

using web::http::http_request;
using web::http::methods;
using web::http::status_codes;
using web::http::experimental::listener::http_listener;

namespace {

MetricsServer::Check FromBool(std::function<bool()> f, const char* what) {
  if (!f) return nullptr;
  return [f = std::move(f), what]() {
    return f() ? absl::OkStatus() : absl::UnavailableError(what);
  };
}

// A reason on one line: probes and `kubectl describe` show the body's start.
std::string OneLine(absl::string_view message) {
  std::string out(message.substr(0, message.find('\n')));
  if (out.empty()) out = "unhealthy";
  return out + "\n";
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    std::function<bool()> healthy, std::function<bool()> ready) {
  return StartWithChecks(host, port, std::move(registry), FromBool(std::move(healthy), "unhealthy"),
                         FromBool(std::move(ready), "not ready"));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::StartWithChecks(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    Check healthy, Check ready) {
  if (!healthy) healthy = [] { return absl::OkStatus(); };
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port: must be in 1..65535, got ", port,
                     "; set DISTRAIN_METRICS_PORT to a free port"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  server->healthy_ = std::move(healthy);
  server->ready_ = ready ? std::move(ready) : server->healthy_;
  server->port_ = port;
  try {
    server->listener_ = std::make_unique<http_listener>(
        utility::conversions::to_string_t(absl::StrCat("http://", host, ":", port, "/")));
    MetricsServer* self = server.get();
    server->listener_->support(methods::GET, [self](http_request request) {
      const std::string path = utility::conversions::to_utf8string(request.relative_uri().path());
      if (path == "/metrics" || path == "/metrics/") {
        prometheus::TextSerializer serializer;
        request.reply(status_codes::OK, serializer.Serialize(self->registry_->Collect()),
                      "text/plain; version=0.0.4; charset=utf-8");
      } else if (path == "/healthz" || path == "/readyz") {
        const absl::Status s = path == "/healthz" ? self->healthy_() : self->ready_();
        if (s.ok()) {
          request.reply(status_codes::OK, "ok\n", "text/plain");
        } else {
          request.reply(status_codes::ServiceUnavailable, OneLine(s.message()), "text/plain");
        }
      } else {
        request.reply(status_codes::NotFound, "try /metrics or /healthz\n", "text/plain");
      }
    });
    server->listener_->open().wait();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics server: cannot listen on ", host, ":", port,
                                               ": ", e.what(),
                                               "; is the port in use? set DISTRAIN_METRICS_PORT"));
  }
  return server;
}

MetricsServer::~MetricsServer() {
  if (listener_ != nullptr) {
    try {
      listener_->close().wait();
    } catch (const std::exception&) {
      // Shutting down anyway; nothing useful to do with a close error.
    }
  }
}

}  // namespace distrain

#ifndef DISTRAIN_OPERATOR_KUBE_CLIENT_H_
#define DISTRAIN_OPERATOR_KUBE_CLIENT_H_

// The seam between the operator and the Kubernetes API server.
//
// Client is what every other piece of operator/ talks to (informers, the work
// queue's reconciler, leader election, events). RestClient (rest_client.h) is
// the production implementation over HTTPS; tests of the higher layers run it
// against the real control plane of scripts/control-plane.sh. There is no fake
// API server anywhere in the project: a unit test that needs a Client without a
// server uses a scripted double of this interface, not a hand-written server.
//
// Contract:
//   * Any HTTP answer, success or error, is an ApiResponse: the caller decides
//     what a 404 or a 409 means. Only transport failures that survived the
//     client's retries (connection refused, TLS failure, timeout) are a non-OK
//     absl::Status (kUnavailable / kDeadlineExceeded), with the URL in the message.
//   * 429 and 5xx answers are retried by the client with backoff (honouring
//     Retry-After) before they are returned; idempotent or not, a request is only
//     retried when the server cannot have acted on it (429, 503 from the
//     apiserver's max-in-flight filter, connection refused before sending) or
//     the method is GET/PUT/DELETE.
//   * Requests are paced by the client's QPS/burst limiter. Watch streams are not.
//
// Thread-safety: implementations are safe to call from many threads at once.

#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace distrain::kube {

struct ApiResponse {
  int status_code = 0;   // the HTTP status
  nlohmann::json body;   // parsed JSON; on errors usually a metav1.Status; null if empty
  bool ok() const { return status_code >= 200 && status_code < 300; }
  bool not_found() const { return status_code == 404; }
  bool conflict() const { return status_code == 409; }  // AlreadyExists or a stale resourceVersion
  bool gone() const { return status_code == 410; }      // "too old resource version"
  // body.message when the body is a metav1.Status, else a short description.
  std::string message() const;
};

// One watch event: type is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR;
// object is the object (for ERROR, a metav1.Status — code 410 means relist).
struct WatchEvent {
  std::string type;
  nlohmann::json object;
};

class Client {
 public:
  virtual ~Client() = default;

  // method: GET, POST, PUT, PATCH, DELETE. path_and_query starts with "/api" or
  // "/apis" and is already URL-encoded. body may be null (no body).
  // content_type matters for PATCH ("application/merge-patch+json",
  // "application/strategic-merge-patch+json", "application/apply-patch+yaml").
  virtual absl::StatusOr<ApiResponse> Request(std::string_view method,
                                              std::string_view path_and_query,
                                              const nlohmann::json* body = nullptr,
                                              std::string_view content_type = "application/json") = 0;

  // Request for callers that use only the status code of a successful answer
  // (creating children, deleting, writing status): an implementation may
  // leave `body` null on a 2xx answer instead of parsing it — a created pod
  // comes back whole, and the informer parses it again from the watch anyway.
  // Error answers are parsed as by Request, so message() still explains them.
  virtual absl::StatusOr<ApiResponse> RequestStatusOnly(
      std::string_view method, std::string_view path_and_query,
      const nlohmann::json* body = nullptr, std::string_view content_type = "application/json") {
    return Request(method, path_and_query, body, content_type);
  }

  // RequestStatusOnly without blocking the caller: `done` gets the answer,
  // once, on some other thread (never on the calling one). `body` is
  // serialised before this returns, so the caller may drop it. For callers
  // that keep many requests in flight (creating a large job's children)
  // without a blocked thread per request. This default runs the blocking
  // call on a thread of its own per request; RestClient overrides it.
  using StatusOnlyCallback = std::function<void(absl::StatusOr<ApiResponse>)>;
  virtual void RequestStatusOnlyAsync(std::string method, std::string path_and_query,
                                      const nlohmann::json* body, StatusOnlyCallback done) {
    std::optional<nlohmann::json> copy;
    if (body != nullptr) copy = *body;
    std::thread([this, method = std::move(method), path = std::move(path_and_query),
                 copy = std::move(copy), done = std::move(done)] {
      done(RequestStatusOnly(method, path, copy ? &*copy : nullptr));
    }).detach();
  }

  // Opens a watch (path_and_query must contain watch=1 or be a watch URL) and
  // calls on_event for every event, in order, on the calling thread. Returns OK
  // when the server ends the stream (timeoutSeconds elapsed) or on_event
  // returns false or `stop` is requested (promptly: within about a second);
  // a non-OK status when the stream could not be opened or broke. A non-2xx
  // answer to the watch request itself (e.g. 410) is reported as an ERROR event
  // carrying the server's metav1.Status, then OK is returned.
  virtual absl::Status Watch(std::string_view path_and_query,
                             const std::function<bool(const WatchEvent&)>& on_event,
                             std::stop_token stop) = 0;

  // The server's base URL, for messages ("https://127.0.0.1:6443").
  virtual std::string server() const = 0;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_CLIENT_H_

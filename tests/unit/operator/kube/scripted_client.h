#ifndef DISTRAIN_TESTS_UNIT_OPERATOR_KUBE_SCRIPTED_CLIENT_H_
#define DISTRAIN_TESTS_UNIT_OPERATOR_KUBE_SCRIPTED_CLIENT_H_

// ScriptedClient: a scripted double of kube::Client for unit tests of the
// layers above it (work queue users, leader election, events, informers, the
// reconciler's apply). It is not an API server: it knows nothing of objects,
// it answers each request with the next step the test wrote down, in order,
// and records every call so the test can check what was sent.
//
//   ScriptedClient client;
//   client.Expect("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
//                 ScriptedClient::Status(404, "NotFound", "leases \"l\" not found"));
//   client.Expect("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
//                 [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(201, c.body); });
//   ... run the code under test ...
//   client.ExpectAllConsumed();
//   EXPECT_EQ(client.calls()[1].body["spec"]["holderIdentity"], "me");
//
// Matching: a step matches when the method is equal and the path is equal
// (or, for a step path ending in '*', starts with the part before it). A
// request that does not match the next step, or comes after the script ran
// out with no fallback, is a test failure (ADD_FAILURE) and is answered 500,
// so the code under test sees a server error rather than hanging.
// SetFallback answers every request once the script is used up (for loops
// that poll an unknown number of times).
//
// Watch(): answered by ExpectWatch steps, in order, matched by path the same
// way: the step's events are delivered, then its final status is returned.
// An unscripted watch blocks until `stop` is requested and returns OK, like a
// quiet server.
//
// Thread-safety: all methods may be called from any thread (the code under
// test usually calls from its own threads).

#include <cstddef>
#include <deque>
#include <functional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"

namespace distrain::kube::testing {

class ScriptedClient : public Client {
 public:
  struct Call {
    std::string method;
    std::string path;
    nlohmann::json body;  // null when the request had none
    std::string content_type;
  };
  using Handler = std::function<absl::StatusOr<ApiResponse>(const Call&)>;

  ScriptedClient() = default;
  ~ScriptedClient() override = default;

  // An answer with this status code and body.
  static ApiResponse Reply(int code, nlohmann::json body = nullptr) {
    ApiResponse r;
    r.status_code = code;
    r.body = std::move(body);
    return r;
  }
  // An error answer carrying a metav1.Status, as the API server sends it.
  static ApiResponse Status(int code, std::string reason, std::string message) {
    return Reply(code, nlohmann::json{{"kind", "Status"},
                                      {"apiVersion", "v1"},
                                      {"status", "Failure"},
                                      {"reason", std::move(reason)},
                                      {"message", std::move(message)},
                                      {"code", code}});
  }

  // The next request must be `method path`; it gets `reply`.
  ScriptedClient& Expect(std::string method, std::string path, absl::StatusOr<ApiResponse> reply) {
    return Expect(std::move(method), std::move(path),
                  [reply = std::move(reply)](const Call&) { return reply; });
  }
  // The next request must be `method path`; `handler` computes the answer
  // (e.g. echoes the body with a new resourceVersion).
  ScriptedClient& Expect(std::string method, std::string path, Handler handler) {
    absl::MutexLock lock(&mu_);
    steps_.push_back({std::move(method), std::move(path), std::move(handler)});
    return *this;
  }
  // Answers requests once the script is used up.
  void SetFallback(Handler handler) {
    absl::MutexLock lock(&mu_);
    fallback_ = std::move(handler);
  }

  // The next Watch must be on `path`: it delivers `events`, then returns `end`.
  ScriptedClient& ExpectWatch(std::string path, std::vector<WatchEvent> events,
                              absl::Status end = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    watches_.push_back({std::move(path), std::move(events), std::move(end)});
    return *this;
  }

  absl::StatusOr<ApiResponse> Request(std::string_view method, std::string_view path_and_query,
                                      const nlohmann::json* body,
                                      std::string_view content_type) override {
    Call call{std::string(method), std::string(path_and_query),
              body != nullptr ? *body : nlohmann::json(nullptr), std::string(content_type)};
    Handler handler;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(call);
      if (!steps_.empty()) {
        Step step = std::move(steps_.front());
        steps_.pop_front();
        if (step.method != call.method || !Matches(step.path, call.path)) {
          ADD_FAILURE() << "ScriptedClient: got " << call.method << " " << call.path
                        << ", the script expected " << step.method << " " << step.path;
          return Status(500, "InternalError", "unexpected request " + call.method + " " + call.path);
        }
        handler = std::move(step.handler);
      } else if (fallback_) {
        handler = fallback_;
      } else {
        ADD_FAILURE() << "ScriptedClient: got " << call.method << " " << call.path
                      << " after the script ran out";
        return Status(500, "InternalError", "unscripted request " + call.method + " " + call.path);
      }
    }
    return handler(call);
  }

  absl::Status Watch(std::string_view path_and_query,
                     const std::function<bool(const WatchEvent&)>& on_event,
                     std::stop_token stop) override {
    WatchStep step;
    bool scripted = false;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(Call{"WATCH", std::string(path_and_query), nullptr, ""});
      if (!watches_.empty()) {
        step = std::move(watches_.front());
        watches_.pop_front();
        scripted = true;
      }
    }
    if (scripted) {
      if (!Matches(step.path, path_and_query)) {
        ADD_FAILURE() << "ScriptedClient: watch on " << path_and_query << ", the script expected "
                      << step.path;
        return absl::UnavailableError("unexpected watch");
      }
      for (const WatchEvent& e : step.events) {
        if (stop.stop_requested() || !on_event(e)) return absl::OkStatus();
      }
      return step.end;
    }
    // A quiet server: nothing happens until the caller gives up.
    absl::Mutex mu;
    bool stopped = false;
    std::stop_callback on_stop(stop, [&] {
      absl::MutexLock lock(&mu);
      stopped = true;
    });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&stopped));
    return absl::OkStatus();
  }

  std::string server() const override { return "https://scripted.invalid"; }

  // Every request so far (watches as method "WATCH"), in order.
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  size_t num_calls() const {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }
  // Waits (real time) until at least n calls were made; false on timeout.
  bool WaitForCalls(size_t n, absl::Duration timeout = absl::Seconds(5)) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Steps not yet used.
  size_t remaining() const {
    absl::MutexLock lock(&mu_);
    return steps_.size() + watches_.size();
  }
  // A test failure for every step the code under test never reached.
  void ExpectAllConsumed() const {
    absl::MutexLock lock(&mu_);
    for (const Step& s : steps_) ADD_FAILURE() << "ScriptedClient: never called: " << s.method << " " << s.path;
    for (const WatchStep& w : watches_) ADD_FAILURE() << "ScriptedClient: never watched: " << w.path;
  }

 private:
  struct Step {
    std::string method;
    std::string path;
    Handler handler;
  };
  struct WatchStep {
    std::string path;
    std::vector<WatchEvent> events;
    absl::Status end;
  };

  static bool Matches(std::string_view pattern, std::string_view path) {
    if (!pattern.empty() && pattern.back() == '*') {
      pattern.remove_suffix(1);
      return path.substr(0, pattern.size()) == pattern;
    }
    return pattern == path;
  }

  mutable absl::Mutex mu_;
  std::deque<Step> steps_ ABSL_GUARDED_BY(mu_);
  std::deque<WatchStep> watches_ ABSL_GUARDED_BY(mu_);
  Handler fallback_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain::kube::testing

#endif  // DISTRAIN_TESTS_UNIT_OPERATOR_KUBE_SCRIPTED_CLIENT_H_

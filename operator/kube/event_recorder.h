#ifndef DISTRAIN_OPERATOR_KUBE_EVENT_RECORDER_H_
#define DISTRAIN_OPERATOR_KUBE_EVENT_RECORDER_H_

// EventRecorder: records events.k8s.io/v1 Events about objects ("Created pod
// j-worker-0", "Restarting all workers: worker 2 exited 137"), what
// `kubectl get events` and `kubectl describe` show.
//
//   recorder.Event(job_json, EventType::kWarning, "BackoffLimitExceeded", "Fail",
//                  "job has failed 4 times (backoffLimit 3)");
//
// Protocol (client-go's tools/events, simplified):
//   1. Event() builds the Event at once — regarding = {apiVersion, kind, name,
//      namespace, uid, resourceVersion} of the object, eventTime now (MicroTime),
//      reportingController/Instance from the options — and puts it on a bounded
//      queue; it never waits for the API server. A full queue drops the event
//      with a warning (dropped() counts them): events are advisory, and a
//      reconcile must never block on them.
//   2. One sender thread POSTs it to /apis/events.k8s.io/v1/namespaces/<ns>/events
//      (ns: the object's, "default" for cluster-scoped objects) named
//      "<object name>.<hex unique>".
//   3. An event equal to one sent within series_window — same regarding object
//      (resourceVersion aside), type, reason, action, note and controller — is
//      not created again: the existing Event's series {count, lastObservedTime}
//      is PATCHed (merge patch). Repeats still queued behind it are folded
//      into one PATCH. If the Event is gone (404, its TTL passed) a new one is
//      created.
//   4. Failures are logged and forgotten; they are never fatal.
//
// Ownership: borrows the client and clock (they must outlive the recorder);
// owns the sender thread, joined by the destructor. Thread-safety: Event,
// Flush and dropped may be called from any thread.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"
#include "operator/kube/clock.h"

namespace distrain::kube {

enum class EventType { kNormal, kWarning };

struct EventRecorderOptions {
  std::string reporting_controller = "distrain.io/operator";
  std::string reporting_instance;  // empty: $POD_NAME, else the host name
  size_t queue_capacity = 1000;
  // How long after its last occurrence an event can still grow a series
  // (client-go's 6 minutes).
  absl::Duration series_window = absl::Minutes(6);
  const Clock* clock = Clock::Real();
};

// metav1.MicroTime: "2026-11-22T05:09:33.123456Z" (UTC, microseconds).
std::string FormatMicroTime(absl::Time t);

// The object reference an Event's `regarding` carries, from an object's JSON:
// apiVersion, kind, name, namespace, uid, resourceVersion (fields the object
// lacks are left out).
nlohmann::json ObjectReference(const nlohmann::json& object);

class EventRecorder {
 public:
  // Limits of the events.k8s.io/v1 validation; longer values are truncated.
  static constexpr size_t kMaxNoteBytes = 1024;
  static constexpr size_t kMaxShortFieldBytes = 128;  // reason, action, controller, instance

  explicit EventRecorder(Client* client, EventRecorderOptions options = {});
  // Stops the sender after the request in flight; events still queued are
  // dropped (Flush first to deliver them).
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an event about `object` (its JSON as the API returns it). An
  // object without metadata.name is refused with an error log.
  void Event(const nlohmann::json& object, EventType type, std::string_view reason,
             std::string_view action, std::string_view note);

  // Waits until everything queued so far was sent (or failed); false when
  // `timeout` (real time) passed first.
  bool Flush(absl::Duration timeout);

  int64_t dropped() const;
  const std::string& reporting_instance() const { return options_.reporting_instance; }

 private:
  struct Pending {
    std::string key;      // what makes two events "the same"
    nlohmann::json event;  // the Event to create
    absl::Time observed;
  };
  struct Sent {
    std::string namespace_name;
    std::string name;
    int64_t count = 1;
    absl::Time last_observed;
  };

  void SendLoop();
  void Send(Pending item, bool more_of_key_queued);
  void Create(const Pending& item);

  Client* const client_;
  EventRecorderOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> queued_per_key_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // an item is out of the queue, in flight
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_unique_ ABSL_GUARDED_BY(mu_) = 0;

  // Sender thread only.
  absl::flat_hash_map<std::string, Sent> sent_;
  absl::Time last_sweep_;

  std::thread sender_;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_EVENT_RECORDER_H_

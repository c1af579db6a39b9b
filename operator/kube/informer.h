#ifndef DISTRAIN_OPERATOR_KUBE_INFORMER_H_
#define DISTRAIN_OPERATOR_KUBE_INFORMER_H_

// Informer: a local, always-current copy of one resource type (optionally one
// namespace and a label/field selector), kept by LIST + WATCH the way
// client-go's reflector does:
//
//   1. LIST in pages (limit=page_size, continue=...), from the latest state
//      (a consistent read). A continue token that expired (410) restarts the
//      LIST without pagination. The cache is replaced by the result; handlers
//      see the difference: on_add for new keys, on_update for keys whose
//      resourceVersion changed, on_delete for keys that vanished.
//   2. WATCH from the LIST's resourceVersion with allowWatchBookmarks=true and
//      a random timeoutSeconds in [min_watch_timeout, 2 * min_watch_timeout).
//      Every event (and every BOOKMARK) advances the tracked resourceVersion.
//   3. The watch ends: normally (timeout) -> watch again from the tracked
//      resourceVersion; 410 Gone (an ERROR event, or the watch's HTTP answer,
//      which RestClient turns into one) -> back to 1 at once; any other error
//      or a broken connection -> wait with exponential backoff and jitter
//      (initial_backoff * 2^n, capped at max_backoff; reset by a watch that
//      delivered events or ended normally), then watch again from the tracked
//      resourceVersion (a resourceVersion that expired meanwhile gets 410 -> 1).
//      A failed LIST backs off the same way.
//
// Cache: key "namespace/name" (or "name" for cluster-scoped objects) -> the
// object JSON, with indexes: AddIndex(name, fn) maps an object to the values
// it is filed under; ByIndex(name, value) returns the objects filed there.
// AddLabelIndex(label) is the common case (value = that label's value).
// Cached objects lack metadata.managedFields (nobody reads it; it is often
// the bulk of an object). LIST items are completed with the list's apiVersion and kind so cached
// objects look the same whichever way they arrived.
//
// Handlers run on the informer's thread, one at a time, in event order, after
// the cache has been updated (a handler that reads the cache sees the event
// applied). They must be quick (enqueue a key) and must not call Stop().
// HasSynced() turns true once the first LIST has been applied and its
// on_add calls have returned.
//
// Metrics (when options.registry is set), label resource=<plural>:
//   distrain_informer_lists_total, distrain_informer_relists_after_gone_total,
//   distrain_informer_watch_errors_total, distrain_informer_watch_events_total{type}.
//
// Ownership: borrows the Client (must outlive the informer); owns its thread
// and cache. Thread-safety: the cache accessors, HasSynced, WaitForSync and
// stats are safe from any thread; AddIndex/AddHandlers must be called before
// Start; Start and Stop from the owning thread. The destructor stops.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"
#include "operator/kube/clock.h"
#include "operator/kube/paths.h"

namespace prometheus {
class Registry;
}

namespace distrain::kube {

struct InformerOptions {
  Resource resource;
  std::string namespace_name;  // "": all namespaces (and cluster-scoped resources)
  std::string label_selector{};
  std::string field_selector{};
  std::shared_ptr<prometheus::Registry> registry;  // optional
  int64_t page_size = 500;
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{30000};
  std::chrono::seconds min_watch_timeout{300};
  const Clock* clock = nullptr;  // backoff sleeps; null: Clock::Real()
};

struct ResourceEventHandlers {
  std::function<void(const nlohmann::json& object)> on_add;
  std::function<void(const nlohmann::json& old_object, const nlohmann::json& new_object)> on_update;
  std::function<void(const nlohmann::json& last_known)> on_delete;
};

class Informer {
 public:
  // The values an object is filed under in one index (none: not indexed).
  using IndexFunc = std::function<std::vector<std::string>(const nlohmann::json& object)>;

  struct Stats {
    int64_t lists = 0;                // completed LISTs (the first one included)
    int64_t relists_after_gone = 0;   // LISTs caused by 410 Gone
    int64_t watches = 0;              // watch requests made
    int64_t watch_errors = 0;         // watches that failed or broke (not 410)
    int64_t events = 0;               // ADDED/MODIFIED/DELETED applied
  };

  Informer(Client* client, InformerOptions options);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Before Start().
  void AddIndex(const std::string& name, IndexFunc fn);
  void AddLabelIndex(const std::string& label_key);  // index named after the label key
  void AddHandlers(ResourceEventHandlers handlers);

  void Start();
  // Ends the watch promptly and joins the thread. An in-flight LIST request
  // finishes first (bounded by the client's timeout). Idempotent.
  void Stop();

  bool HasSynced() const;
  // Waits (real time) until HasSynced(); false on timeout.
  bool WaitForSync(absl::Duration timeout) const;

  // A cached object. Never modified once cached (an update replaces the
  // pointer), so holders may read it without a lock and keep it.
  using ObjectPtr = std::shared_ptr<const nlohmann::json>;

  // Cache reads: copies, so callers may keep them.
  std::optional<nlohmann::json> Get(std::string_view key) const;
  std::optional<nlohmann::json> Get(std::string_view namespace_name, std::string_view name) const {
    return Get(ObjectKey(namespace_name, name));
  }
  std::vector<nlohmann::json> List() const;
  std::vector<std::string> Keys() const;  // sorted
  // Objects filed under `value` in index `index_name` (which must have been added).
  std::vector<nlohmann::json> ByIndex(const std::string& index_name, const std::string& value) const;
  // The same without copying: the cached objects themselves (a reconcile of
  // a 500-pod job reads them on every pod event; copies cost more than the
  // reconcile).
  std::vector<ObjectPtr> ByIndexShared(const std::string& index_name,
                                       const std::string& value) const;
  size_t size() const;

  // The resourceVersion the next watch would start from.
  std::string LastResourceVersion() const;
  Stats stats() const;

 private:
  enum class WatchEnd { kTimedOut, kGone, kError, kStopped };
  struct Metrics;

  void Run(std::stop_token stop);
  absl::Status ListAndReplace(std::stop_token stop);
  WatchEnd WatchOnce(std::stop_token stop, bool* delivered);
  void Apply(const WatchEvent& event);
  void Replace(std::vector<ObjectPtr> objects, std::string resource_version);
  void IndexLocked(const std::string& key, const ObjectPtr& object, bool add)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ListPath(const std::string& continue_token, bool paginate) const;
  std::string WatchPath(const std::string& resource_version) const;

  Client* const client_;
  const InformerOptions options_;
  const Clock* const clock_;
  std::map<std::string, IndexFunc> index_funcs_;  // fixed after Start
  std::vector<ResourceEventHandlers> handlers_;    // fixed after Start
  std::unique_ptr<Metrics> metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, ObjectPtr> objects_ ABSL_GUARDED_BY(mu_);
  // index name -> value -> keys
  std::map<std::string, std::map<std::string, std::set<std::string>>> indexes_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  std::jthread thread_;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_INFORMER_H_

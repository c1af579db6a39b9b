#ifndef DISTRAIN_OPERATOR_KUBE_WORKQUEUE_H_
#define DISTRAIN_OPERATOR_KUBE_WORKQUEUE_H_

// WorkQueue: the rate-limited work queue between the informers and the
// reconcile workers, keyed "namespace/name", with client-go's semantics
// (k8s.io/client-go/util/workqueue: Type + delaying + rate limiting):
//
//   1. Add(key) puts a key in the queue unless it is already waiting there
//      (keys are deduplicated: ten updates of one job before a worker is free
//      mean one reconcile).
//   2. Get() hands the oldest waiting key to one worker and marks it
//      processing. A key that is processing is never handed to a second worker:
//      if it is added again meanwhile it is only marked dirty, and Done(key)
//      puts it back in the queue, so the latest state is reconciled again.
//   3. AddAfter(key, d) adds the key once `d` has passed (by the clock); a key
//      already waiting to be added keeps the earlier of its two times.
//   4. AddRateLimited(key) = AddAfter(key, When(key)), where When is the larger
//      of a per-key exponential backoff (base_delay * 2^failures, capped at
//      max_delay; 5 ms .. 1000 s) and an overall token bucket (qps, burst;
//      10, 100) — client-go's DefaultControllerRateLimiter. Forget(key) ends
//      the key's backoff (call it after a successful reconcile);
//      NumRequeues(key) is its failure count.
//   5. ShutDown() wakes every blocked Get(); Get() still hands out keys that
//      are waiting, then returns nullopt. Adds after ShutDown are ignored.
//
// Metrics (when a registry is given), with label name=<queue name>:
//   workqueue_depth, workqueue_adds_total, workqueue_retries_total,
//   workqueue_queue_duration_seconds, workqueue_work_duration_seconds.
//
// Ownership: the queue owns its keys; the clock and registry are shared and
// must outlive it. Thread-safety: every method may be called from any thread.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "operator/kube/clock.h"

namespace prometheus {
class Registry;
class Gauge;
class Counter;
class Histogram;
}  // namespace prometheus

namespace distrain::kube {

struct WorkQueueOptions {
  std::string name = "distributedtrainingjob";  // the metrics' name label
  absl::Duration base_delay = absl::Milliseconds(5);
  absl::Duration max_delay = absl::Seconds(1000);
  double qps = 10;  // overall token bucket shared by every key
  int burst = 100;
  const Clock* clock = Clock::Real();
  std::shared_ptr<prometheus::Registry> registry;  // optional
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();  // shuts down; blocked Get() calls must have returned first
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Add(const std::string& key);
  void AddAfter(const std::string& key, absl::Duration delay);
  void AddRateLimited(const std::string& key);

  // Blocks until a key is ready; nullopt once shut down and empty.
  std::optional<std::string> Get();
  // Like Get() but gives up at `deadline` (by the queue's clock).
  std::optional<std::string> GetWithDeadline(absl::Time deadline);
  // Ends the processing of a key handed out by Get().
  void Done(const std::string& key);

  void Forget(const std::string& key);
  int NumRequeues(const std::string& key) const;
  // The delay AddRateLimited would use now, consuming a token and a failure
  // (exposed for tests and for callers that log the backoff).
  absl::Duration When(const std::string& key);

  void ShutDown();
  bool ShuttingDown() const;
  // Keys ready to be handed out (not those waiting for AddAfter, not those
  // processing).
  size_t Len();

 private:
  struct Waiting {
    absl::Time ready_at;
    uint64_t seq;  // FIFO among equal ready times
    std::string key;
    bool operator>(const Waiting& o) const {
      return ready_at != o.ready_at ? ready_at > o.ready_at : seq > o.seq;
    }
  };

  void AddLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves keys whose AddAfter time has come into the queue.
  void PromoteReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration WhenLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetDepthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkQueueOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> processing_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> added_at_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> started_at_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  // AddAfter: a min-heap by ready time; waiting_ready_at_ has each key's
  // current ready time so a later AddAfter of the same key can only move it
  // earlier (stale heap entries are skipped when popped).
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<>> waiting_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> waiting_ready_at_ ABSL_GUARDED_BY(mu_);
  uint64_t waiting_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped whenever the waiting set changes, so a Get sleeping until the old
  // earliest time wakes to recompute its deadline.
  uint64_t waiting_generation_ ABSL_GUARDED_BY(mu_) = 0;

  // Rate limiter state.
  absl::flat_hash_map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
  double tokens_ ABSL_GUARDED_BY(mu_);  // may go negative: reservations ahead
  absl::Time tokens_at_ ABSL_GUARDED_BY(mu_);

  prometheus::Gauge* depth_ = nullptr;
  prometheus::Counter* adds_ = nullptr;
  prometheus::Counter* retries_ = nullptr;
  prometheus::Histogram* queue_duration_ = nullptr;
  prometheus::Histogram* work_duration_ = nullptr;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_WORKQUEUE_H_

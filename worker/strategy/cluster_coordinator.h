#ifndef DISTRAIN_WORKER_STRATEGY_CLUSTER_COORDINATOR_H_
#define DISTRAIN_WORKER_STRATEGY_CLUSTER_COORDINATOR_H_

// ClusterCoordinator: the chief's scheduler of step closures for the
// ParameterServer strategy, with TensorFlow ClusterCoordinator semantics
// (tf.distribute.experimental.coordinator.ClusterCoordinator):
//
//   1. Start(first_closure_id) starts one scheduler thread per worker. A
//      worker that is not admitted is probed (WorkerTransport::Prepare) with
//      exponential backoff (probe_initial_backoff .. probe_max_backoff) until
//      it answers; then it is admitted (a restarted worker is re-admitted the
//      same way, and distrain_ps_workers_admitted_total counts every time).
//   2. Schedule() queues the next closure (ids are consecutive) and returns
//      once fewer than max_outstanding closures are scheduled but not yet
//      completed, so the queue never grows without bound.
//   3. Each admitted worker's thread takes the oldest queued closure and runs
//      it (RunStep): one closure in flight per worker.
//   4. A closure whose worker is lost (transport error) is put back at the
//      head of the queue with attempt + 1 and runs on the next free worker:
//      at-least-once, so its gradient may have been applied twice.
//      distrain_ps_closures_retried_total counts these. The lost worker goes
//      back to step 1.
//   5. A fatal outcome (a ps failed, or Prepare says the worker's job config
//      differs) stops scheduling: every waiting call returns that error, the
//      transport is cancelled so in-flight closures end promptly, and nothing
//      more runs. The first fatal error is the one reported.
//   6. Join() waits until every scheduled closure has completed (or a fatal
//      error). A closure counts as completed exactly once, when its first
//      successful attempt answers, so completed() == scheduled() after Join.
//   7. Stop() cancels the transport and joins the threads; FinishWorkers()
//      (after a successful Join) tells every admitted worker the job is done.
//   Dynamic membership (ParameterServer's worker set, ps_membership.h):
//   8. The workers of the transport (TF_CONFIG's) are members from Start.
//      AddWorker(w) makes any worker index a member, before or after Start:
//      a worker a scale added gets a scheduler thread of its own and is
//      probed and admitted as in step 1 (at once: a probe sleeping in its
//      backoff wakes). Calling it for a member again (a restarted or
//      reconnected process) only wakes its probe.
//   9. RemoveWorker(w) ends its membership: no closure starts on it any
//      more; a closure it is running finishes and counts, or, if the worker
//      is lost meanwhile, is re-queued as in step 4. Unlike a member that
//      was lost, a removed worker is not probed: its thread waits until
//      AddWorker makes it a member again. Indexes never shrink the tables.
//  10. With max_outstanding 0 the bound of step 2 follows the members:
//      twice their number (at least 2).
//
// Ownership: borrows the transport (it must outlive the coordinator) and the
// optional registry. Thread-safety: all public methods are thread-safe; the
// trainer's thread calls Schedule/Join/TakeCompleted while the scheduler
// threads run closures.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace distrain {

// Loss statistics of one closure, as the worker reports them.
struct ClosureResult {
  double loss = 0;  // batch mean
  int64_t correct = 0;
  int64_t examples = 0;
  int64_t max_staleness = 0;
  int stale_retries = 0;
};

// What running one closure on one worker came to.
struct ClosureOutcome {
  enum class Kind {
    kDone,        // result is valid
    kWorkerLost,  // the worker failed or vanished; re-queue the closure
    kFatal,       // the job cannot go on (a ps failed); stop
  };
  Kind kind = Kind::kDone;
  absl::Status status;  // why, for kWorkerLost and kFatal
  ClosureResult result;
};

// The coordinator's view of the workers. Implemented over gRPC by
// GrpcWorkerTransport and by in-memory fakes in tests. Calls for different
// workers come from different threads concurrently; calls for one worker
// never overlap (except Cancel, which may come from any thread).
class WorkerTransport {
 public:
  virtual ~WorkerTransport() = default;
  virtual int num_workers() const = 0;
  virtual std::string WorkerName(int worker) const = 0;  // "worker:1 (host:port)"
  // Makes the worker ready to run closures; returns its incarnation (changes
  // when the process restarted). UNAVAILABLE / DEADLINE_EXCEEDED: not (yet)
  // reachable, probe again later; FAILED_PRECONDITION / INVALID_ARGUMENT:
  // the worker can never run this job's closures (fatal).
  virtual absl::StatusOr<std::string> Prepare(int worker) = 0;
  virtual ClosureOutcome RunStep(int worker, int64_t closure_id, int attempt) = 0;
  // Best effort; the job is over.
  virtual void Finish(int worker) = 0;
  // Makes blocked and later Prepare/RunStep calls return promptly with an
  // error. Idempotent.
  virtual void Cancel() = 0;
};

struct ClusterCoordinatorOptions {
  // 0: twice the number of member workers (each worker finds its next
  // closure queued the moment it answers; step 10).
  int max_outstanding = 0;
  absl::Duration probe_initial_backoff = absl::Milliseconds(50);
  absl::Duration probe_max_backoff = absl::Seconds(2);
  // A warning is logged when no worker has been admitted for this long while
  // closures wait (TensorFlow waits for workers indefinitely; so do we).
  absl::Duration no_worker_warning = absl::Seconds(30);
  // Optional; families (all counters/gauges unlabelled unless noted):
  //   distrain_ps_closures_scheduled_total  counter
  //   distrain_ps_closures_completed_total  counter
  //   distrain_ps_closures_retried_total    counter   re-queued after a lost worker
  //   distrain_ps_workers_admitted_total    counter   admissions, re-admissions included
  //   distrain_ps_workers_active            gauge     workers admitted now
  //   distrain_ps_closure_seconds           histogram wall time of one closure attempt
  //   distrain_ps_closure_staleness         histogram max staleness of each closure's push
  //   distrain_ps_worker_closures_completed_total{worker="worker:<i>"}
  //                                         counter   closures completed by each worker
  //   distrain_ps_workers_members           gauge     workers in the membership now
  prometheus::Registry* registry = nullptr;
};

// Totals of closures completed since the previous TakeCompleted().
struct CompletedClosures {
  int64_t closures = 0;
  double loss_sum = 0;  // sum of loss * examples
  int64_t correct = 0;
  int64_t examples = 0;
  int64_t max_staleness = 0;
  int64_t stale_retries = 0;  // pushes rejected by the staleness bound and redone
};

class ClusterCoordinator {
 public:
  ClusterCoordinator(WorkerTransport* transport, ClusterCoordinatorOptions options = {});
  ~ClusterCoordinator();  // Stop()
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  // Step 1. The first closure scheduled gets `first_closure_id` (the step the
  // job resumes at). Call once.
  void Start(int64_t first_closure_id = 0);
  // Step 2; returns the fatal error once there is one.
  absl::Status Schedule();
  // Step 6.
  absl::Status Join();
  // For a stop: no queued closure starts any more; waits for the ones in
  // flight (a lost one is not re-run) and drops the rest. Returns how many
  // were dropped; completed() is then the exact count of applied closures.
  absl::StatusOr<int64_t> Drain();
  CompletedClosures TakeCompleted();
  // Step 7.
  void FinishWorkers();
  void Stop();
  // Steps 8 and 9; `reason` goes to the log. Thread-safe; never call them
  // from a transport call.
  void AddWorker(int worker);
  void RemoveWorker(int worker, const std::string& reason);

  int64_t scheduled() const;
  int64_t completed() const;
  int64_t retried() const;
  int64_t admissions() const;
  int active_workers() const;
  int members() const;
  // Closures each worker index has completed (index -> count; every index
  // ever a member, 0 included).
  std::vector<int64_t> completed_by_worker() const;
  absl::Status fatal_error() const;

 private:
  struct Closure {
    int64_t id = 0;
    int attempt = 0;
  };
  struct Metrics;
  // One worker index.
  struct Slot {
    bool member = false;    // probed and scheduled onto (step 9: false)
    bool admitted = false;  // Prepare answered; closures run on it
    bool has_thread = false;
    bool ever_admitted = false;
    uint64_t wake = 0;      // bumped by AddWorker: a sleeping probe probes again
    std::string incarnation;
    int64_t completed = 0;
    prometheus::Counter* completed_metric = nullptr;
  };

  void WorkerLoop(int worker);
  // Slot `worker`, created (not a member) if missing.
  Slot& SlotLocked(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts WorkerLoop(worker) unless stopping or it has one; threads_mu_ held.
  void SpawnLocked(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(threads_mu_);
  void SetFatal(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t outstanding() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return next_id_ - first_id_ - completed_;
  }
  int MembersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int AdmittedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MaxOutstandingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return max_outstanding_ > 0 ? max_outstanding_ : 2 * std::max(1, MembersLocked());
  }

  WorkerTransport* const transport_;
  const ClusterCoordinatorOptions options_;
  const int max_outstanding_;
  std::unique_ptr<Metrics> metrics_;  // null without a registry

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // FinishWorkers was called
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  std::deque<Closure> queue_ ABSL_GUARDED_BY(mu_);
  int64_t first_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retried_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t admissions_ ABSL_GUARDED_BY(mu_) = 0;
  // A deque: slots keep their address while AddWorker appends.
  std::deque<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::Time last_admitted_ ABSL_GUARDED_BY(mu_);
  CompletedClosures pending_ ABSL_GUARDED_BY(mu_);

  // Lock order: threads_mu_, then mu_.
  absl::Mutex threads_mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(threads_mu_);
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_CLUSTER_COORDINATOR_H_

#ifndef DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_
#define DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_

// ProgressReporter: fills status.progress ({step, totalSteps,
// examplesPerSecond, loss, accuracy}) of running jobs from their chief's Prometheus
// endpoint, so `kubectl get dtj` shows the step and the job's status says how
// far training got (docs/architecture.md §3: "reported by the chief"). The worker never
// talks to the API server; the operator reads the same /metrics Prometheus
// scrapes.
//
// Protocol, every `interval`:
//   1. For every job the operator watches whose Running condition is True,
//      find its master pod (label distrain.io/job-role=master: the chief, or
//      worker 0 without one) with phase Running and a status.podIP.
//   2. GET http://<podIP>:<DISTRAIN_METRICS_PORT of its main container>/metrics
//      of all those pods at once (metrics_scraper.h ScrapeAll): each with its
//      own deadline (Options::scrape.timeout) and a bound on the bytes read
//      (scrape.max_response_bytes), at most scrape.max_in_flight open at a
//      time. The endpoints are tenants' processes: one that streams without
//      end, answers slowly or never costs only its own job's update, and a
//      round lasts about one timeout however many jobs are slow (the old
//      one-at-a-time scrape took N timeouts for N slow jobs). Read
//      distrain_step (else distrain_steps_total, which restarts at 0 when a
//      process resumes), distrain_total_steps,
//      distrain_job_examples_per_second (else distrain_examples_per_second,
//      which a MultiWorkerMirrored chief reports for its own 1/W share),
//      distrain_loss, (once the chief has evaluated) distrain_eval_accuracy
//      and distrain_progress_deadline_seconds from each body; with
//      spec.strategy Auto also distrain_auto_strategy_info{strategy,reason},
//      what the master chose on the devices it found and the bandwidths it
//      measured, which the operator could not know when it planned the pods.
//   3. When the step moved, progress.lastStepTime = now: the clock of the
//      Stalled condition (controller/stall.h), which the reconcile judges; a
//      master that answers no scrape (hung, stopped) leaves it where it was.
//      When they differ from status.progress, merge-patch /status with the new
//      progress (and status.strategy when the master reported its Auto choice
//      and it differs, marked decidedBy: worker, which the reconciler then
//      keeps) only (the reconciler owns every other status field; a
//      concurrent reconcile that wrote an older status gets a 409 and retries
//      with this one), with the job's resourceVersion from step 1 as a
//      precondition, so a job that finished while its scrape was in flight
//      keeps the final figures the reconcile wrote. The patches go out after
//      the scrapes have ended, so no API request is waited for while a
//      scrape's deadline runs.
//   4. Finished jobs are not touched: the reconcile that marks a job
//      Succeeded writes the chief's final step, loss and accuracy from its
//      termination message (controller/final_progress.h).
// A pod that does not answer (or answers too much) is skipped until the next
// round; nothing is invented: fields the scrape did not see are left as they
// were. Memory: at most max_in_flight * max_response_bytes of response
// buffers (8 MiB with the defaults), whatever the jobs send.
//
// Ownership: borrows the client and the listing functions (they must outlive
// it); owns its thread. Thread-safety: Start/Stop from one thread; ReportOnce
// only while not started (tests).

#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"
#include "operator/metrics_scraper.h"

namespace distrain {

// The distrain_* samples of one Prometheus text exposition that progress
// uses; nullopt for those absent. Pure; exposed for tests.
struct ScrapedProgress {
  std::optional<double> step, total_steps, examples_per_second, loss, accuracy;
  std::optional<double> progress_deadline;  // distrain_progress_deadline_seconds
  // distrain_auto_strategy_info's labels: both set, or neither.
  std::optional<std::string> auto_strategy, auto_reason;
};
ScrapedProgress ParseProgressMetrics(const std::string& exposition);

// {"step": ..., ...} merged over `current` (a job's status.progress). When
// the step moved (a counter above 0 that differs from current's step: a
// restarted process counts from 0 again, and 0 means it has completed none),
// lastStepTime becomes `now`; progressDeadlineSeconds is the scraped deadline
// (controller/stall.h reads both).
nlohmann::json MergeProgress(const nlohmann::json& current, const ScrapedProgress& scraped,
                             absl::Time now = absl::Now());

// status.strategy after the scrape: {"name", "reason", "decidedBy": "worker"}
// from the master's Auto choice, else `current` as it was.
nlohmann::json MergeStrategy(const nlohmann::json& current, const ScrapedProgress& scraped);

struct ProgressReporterOptions {
  absl::Duration interval = absl::Seconds(5);
  ScrapeOptions scrape;
};

class ProgressReporter {
 public:
  struct Sources {
    std::function<std::vector<nlohmann::json>()> jobs;  // every watched job
    std::function<std::vector<nlohmann::json>(const std::string& ns, const std::string& job)> pods;
  };
  using Options = ProgressReporterOptions;
  // What one round did (for tests and logs).
  struct RoundStats {
    int scraped = 0;            // master pods asked
    int failed = 0;             // of those, how many gave no usable answer
    int patched = 0;            // status.progress writes
    size_t max_bytes_read = 0;  // the most bytes read from one pod
    absl::Duration longest_scrape;
  };
  ProgressReporter(kube::Client* client, Sources sources, Options options = {});
  ~ProgressReporter();  // stops

  void Start();
  void Stop();
  // One round of steps 1-4 (for tests and Start's loop).
  RoundStats ReportOnce(std::stop_token stop = {});

 private:
  kube::Client* client_;
  Sources sources_;
  Options options_;
  std::jthread thread_;
};

}  // namespace distrain

#endif  // DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_

#ifndef DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_
#define DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_

// ProgressReporter: fills status.progress ({step, totalSteps,
// examplesPerSecond, loss}) of running jobs from their chief's Prometheus
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
//      with a short timeout; read distrain_steps_total, distrain_total_steps,
//      distrain_examples_per_second and distrain_loss.
//   3. When they differ from status.progress, merge-patch /status with the new
//      progress only (the reconciler owns every other status field; a
//      concurrent reconcile that wrote an older status gets a 409 and retries
//      with this one).
//   4. A Succeeded job's progress.step is set to totalSteps: a job succeeds
//      only when training ran every step, which a short job may do between
//      two scrapes.
// A pod that does not answer is skipped until the next round; nothing is
// invented: fields the scrape did not see are left as they were.
//
// Ownership: borrows the client and the listing functions (they must outlive
// it); owns its thread. Thread-safety: Start/Stop from one thread.

#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"

namespace distrain {

// The distrain_* samples of one Prometheus text exposition that progress
// uses; nullopt for those absent. Pure; exposed for tests.
struct ScrapedProgress {
  std::optional<double> step, total_steps, examples_per_second, loss;
};
ScrapedProgress ParseProgressMetrics(const std::string& exposition);

// {"step": ..., ...} merged over `current` (a job's status.progress).
nlohmann::json MergeProgress(const nlohmann::json& current, const ScrapedProgress& scraped);

class ProgressReporter {
 public:
  struct Sources {
    std::function<std::vector<nlohmann::json>()> jobs;  // every watched job
    std::function<std::vector<nlohmann::json>(const std::string& ns, const std::string& job)> pods;
  };
  ProgressReporter(kube::Client* client, Sources sources, absl::Duration interval = absl::Seconds(5));
  ~ProgressReporter();  // stops

  void Start();
  void Stop();
  // One round of steps 1-3 (for tests and Start's loop).
  void ReportOnce();

 private:
  kube::Client* client_;
  Sources sources_;
  absl::Duration interval_;
  std::jthread thread_;
};

}  // namespace distrain

#endif  // DISTRAIN_OPERATOR_PROGRESS_REPORTER_H_

#include "worker/strategy/cluster_coordinator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  // 250 us .. ~8 s, doubling: a tiny model on loopback to a large one across hosts.
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 2.5e-4; b.size() < 16; s *= 2) b.push_back(s);
  return b;
}

prometheus::Histogram::BucketBoundaries StalenessBuckets() {
  return {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
}

}  // namespace

struct ClusterCoordinator::Metrics {
  explicit Metrics(prometheus::Registry& r)
      : scheduled(prometheus::BuildCounter()
                      .Name("distrain_ps_closures_scheduled_total")
                      .Help("Step closures the coordinator scheduled onto workers")
                      .Register(r)
                      .Add({})),
        completed(prometheus::BuildCounter()
                      .Name("distrain_ps_closures_completed_total")
                      .Help("Step closures completed (each counted once, retries included)")
                      .Register(r)
                      .Add({})),
        retried(prometheus::BuildCounter()
                    .Name("distrain_ps_closures_retried_total")
                    .Help("Step closures re-queued onto another worker after their worker was lost")
                    .Register(r)
                    .Add({})),
        admitted(prometheus::BuildCounter()
                     .Name("distrain_ps_workers_admitted_total")
                     .Help("Worker admissions by the coordinator, re-admissions after a restart included")
                     .Register(r)
                     .Add({})),
        active(prometheus::BuildGauge()
                   .Name("distrain_ps_workers_active")
                   .Help("Workers the coordinator currently schedules closures onto")
                   .Register(r)
                   .Add({})),
        closure_seconds(prometheus::BuildHistogram()
                            .Name("distrain_ps_closure_seconds")
                            .Help("Wall time of one closure attempt (pull, compute, push) seen by the coordinator")
                            .Register(r)
                            .Add({}, SecondsBuckets())),
        staleness(prometheus::BuildHistogram()
                      .Name("distrain_ps_closure_staleness")
                      .Help("Largest staleness (ps updates between pull and push) of each closure's push")
                      .Register(r)
                      .Add({}, StalenessBuckets())) {}
  prometheus::Counter& scheduled;
  prometheus::Counter& completed;
  prometheus::Counter& retried;
  prometheus::Counter& admitted;
  prometheus::Gauge& active;
  prometheus::Histogram& closure_seconds;
  prometheus::Histogram& staleness;
};

ClusterCoordinator::ClusterCoordinator(WorkerTransport* transport, ClusterCoordinatorOptions options)
    : transport_(transport),
      options_(options),
      max_outstanding_(options.max_outstanding > 0 ? options.max_outstanding
                                                   : 2 * std::max(1, transport->num_workers())) {
  DISTRAIN_CHECK(transport_ != nullptr);
  if (options_.registry != nullptr) metrics_ = std::make_unique<Metrics>(*options_.registry);
}

ClusterCoordinator::~ClusterCoordinator() { Stop(); }

void ClusterCoordinator::Start(int64_t first_closure_id) {
  {
    absl::MutexLock lock(&mu_);
    DISTRAIN_CHECK(!started_) << "ClusterCoordinator::Start called twice";
    started_ = true;
    first_id_ = next_id_ = first_closure_id;
    admitted_.assign(transport_->num_workers(), false);
    incarnations_.assign(transport_->num_workers(), "");
    last_admitted_ = absl::Now();
  }
  for (int w = 0; w < transport_->num_workers(); ++w) {
    threads_.emplace_back([this, w] { WorkerLoop(w); });
  }
}

void ClusterCoordinator::SetFatal(absl::Status status) {
  if (!fatal_.ok()) return;
  fatal_ = std::move(status);
  spdlog::error("coordinator: stopping: {}", fatal_.message());
}

absl::Status ClusterCoordinator::Schedule() {
  absl::MutexLock lock(&mu_);
  DISTRAIN_CHECK(started_) << "Schedule before Start";
  if (!fatal_.ok()) return fatal_;
  queue_.push_back(Closure{next_id_++, 0});
  if (metrics_) metrics_->scheduled.Increment();
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !fatal_.ok() || stopping_ || outstanding() < max_outstanding_;
  };
  mu_.Await(absl::Condition(&room));
  return fatal_;
}

absl::Status ClusterCoordinator::Join() {
  absl::MutexLock lock(&mu_);
  if (!started_) return absl::OkStatus();
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !fatal_.ok() || stopping_ || outstanding() == 0;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&done), options_.no_worker_warning)) {
    int active = 0;
    for (bool a : admitted_) active += a;
    spdlog::warn("coordinator: waiting for {} closure(s); {} of {} worker(s) admitted",
                 outstanding(), active, admitted_.size());
  }
  if (!fatal_.ok()) return fatal_;
  if (stopping_ && outstanding() > 0) {
    return absl::CancelledError(absl::StrCat("coordinator stopped with ", outstanding(),
                                             " closure(s) not completed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ClusterCoordinator::Drain() {
  absl::MutexLock lock(&mu_);
  if (!started_) return 0;
  draining_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !fatal_.ok() || stopping_ || in_flight_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
  if (!fatal_.ok()) return fatal_;
  const int64_t dropped = static_cast<int64_t>(queue_.size());
  queue_.clear();
  return dropped;
}

CompletedClosures ClusterCoordinator::TakeCompleted() {
  absl::MutexLock lock(&mu_);
  CompletedClosures out = pending_;
  pending_ = CompletedClosures();
  return out;
}

void ClusterCoordinator::WorkerLoop(int worker) {
  const std::string name = transport_->WorkerName(worker);
  absl::Duration backoff = options_.probe_initial_backoff;
  bool ever_admitted = false;
  while (true) {
    // 1. Admission.
    bool admitted;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || !fatal_.ok()) return;
      admitted = admitted_[worker];
    }
    if (!admitted) {
      absl::StatusOr<std::string> incarnation = transport_->Prepare(worker);
      absl::MutexLock lock(&mu_);
      if (stopping_ || !fatal_.ok()) return;
      if (!incarnation.ok()) {
        const absl::StatusCode code = incarnation.status().code();
        if (code == absl::StatusCode::kFailedPrecondition ||
            code == absl::StatusCode::kInvalidArgument) {
          SetFatal(absl::Status(code, absl::StrCat(name, " cannot run this job's closures: ",
                                                   incarnation.status().message())));
          return;
        }
        spdlog::debug("coordinator: {} not ready: {}", name, incarnation.status().message());
        // Interruptible sleep: Stop() and a fatal error end it at once.
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !fatal_.ok(); };
        mu_.AwaitWithTimeout(absl::Condition(&wake), backoff);
        backoff = std::min(backoff * 2, options_.probe_max_backoff);
        if (absl::Now() - last_admitted_ > options_.no_worker_warning &&
            std::none_of(admitted_.begin(), admitted_.end(), [](bool a) { return a; })) {
          spdlog::warn("coordinator: no worker admitted for {}; {} closure(s) waiting",
                       absl::FormatDuration(absl::Now() - last_admitted_), outstanding());
          last_admitted_ = absl::Now();
        }
        continue;
      }
      backoff = options_.probe_initial_backoff;
      admitted_[worker] = true;
      ++admissions_;
      last_admitted_ = absl::Now();
      const bool restarted = !incarnations_[worker].empty() && incarnations_[worker] != *incarnation;
      incarnations_[worker] = *incarnation;
      if (metrics_) {
        metrics_->admitted.Increment();
        metrics_->active.Increment();
      }
      if (!ever_admitted) {
        spdlog::info("coordinator: {} admitted", name);
      } else {
        spdlog::info("coordinator: {} rejoined{}; scheduling closures onto it again", name,
                     restarted ? " (restarted process)" : "");
      }
      ever_admitted = true;
    }

    // 3. The oldest queued closure.
    Closure closure;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !fatal_.ok() || (!draining_ && !queue_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_ || !fatal_.ok()) return;
      closure = queue_.front();
      queue_.pop_front();
      ++in_flight_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    ClosureOutcome outcome = transport_->RunStep(worker, closure.id, closure.attempt);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    bool fatal;
    {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    switch (outcome.kind) {
      case ClosureOutcome::Kind::kDone: {
        ++completed_;
        pending_.closures += 1;
        pending_.loss_sum += outcome.result.loss * static_cast<double>(outcome.result.examples);
        pending_.correct += outcome.result.correct;
        pending_.examples += outcome.result.examples;
        pending_.max_staleness = std::max(pending_.max_staleness, outcome.result.max_staleness);
        pending_.stale_retries += outcome.result.stale_retries;
        if (metrics_) {
          metrics_->completed.Increment();
          metrics_->closure_seconds.Observe(seconds);
          metrics_->staleness.Observe(static_cast<double>(outcome.result.max_staleness));
        }
        break;
      }
      case ClosureOutcome::Kind::kWorkerLost: {
        // Stop() or a fatal error cancelled the call; the worker is fine.
        if (stopping_ || !fatal_.ok()) return;
        // 4. At-least-once: the next free worker runs it again.
        queue_.push_front(Closure{closure.id, closure.attempt + 1});
        ++retried_;
        admitted_[worker] = false;
        if (metrics_) {
          metrics_->retried.Increment();
          metrics_->active.Decrement();
        }
        spdlog::warn("coordinator: {} lost ({}); closure {} re-queued (attempt {}), {} closure(s) "
                     "retried so far; probing the worker until it comes back",
                     name, outcome.status.message(), closure.id, closure.attempt + 2, retried_);
        break;
      }
      case ClosureOutcome::Kind::kFatal:
        SetFatal(outcome.status);
        break;
    }
    fatal = !fatal_.ok();
    }
    if (fatal) {
      // 5. Make every other in-flight closure return now.
      transport_->Cancel();
      return;
    }
  }
}

void ClusterCoordinator::FinishWorkers() {
  std::vector<int> workers;
  {
    absl::MutexLock lock(&mu_);
    for (size_t w = 0; w < admitted_.size(); ++w) {
      if (admitted_[w]) workers.push_back(static_cast<int>(w));
    }
  }
  for (int w : workers) transport_->Finish(w);
}

void ClusterCoordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  transport_->Cancel();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

int64_t ClusterCoordinator::scheduled() const {
  absl::MutexLock lock(&mu_);
  return next_id_ - first_id_;
}
int64_t ClusterCoordinator::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}
int64_t ClusterCoordinator::retried() const {
  absl::MutexLock lock(&mu_);
  return retried_;
}
int64_t ClusterCoordinator::admissions() const {
  absl::MutexLock lock(&mu_);
  return admissions_;
}
int ClusterCoordinator::active_workers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count(admitted_.begin(), admitted_.end(), true));
}
absl::Status ClusterCoordinator::fatal_error() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

}  // namespace distrain

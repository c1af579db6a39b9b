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
                      .Add({}, StalenessBuckets())),
        per_worker(prometheus::BuildCounter()
                       .Name("distrain_ps_worker_closures_completed_total")
                       .Help("Step closures completed by each worker (label worker=\"worker:<index>\")")
                       .Register(r)),
        members(prometheus::BuildGauge()
                    .Name("distrain_ps_workers_members")
                    .Help("Workers in the coordinator's membership now (TF_CONFIG's, joined, "
                          "minus those that left)")
                    .Register(r)
                    .Add({})) {}
  prometheus::Counter& scheduled;
  prometheus::Counter& completed;
  prometheus::Counter& retried;
  prometheus::Counter& admitted;
  prometheus::Gauge& active;
  prometheus::Histogram& closure_seconds;
  prometheus::Histogram& staleness;
  prometheus::Family<prometheus::Counter>& per_worker;
  prometheus::Gauge& members;
};

ClusterCoordinator::ClusterCoordinator(WorkerTransport* transport, ClusterCoordinatorOptions options)
    : transport_(transport),
      options_(options),
      max_outstanding_(std::max(0, options.max_outstanding)) {
  DISTRAIN_CHECK(transport_ != nullptr);
  if (options_.registry != nullptr) metrics_ = std::make_unique<Metrics>(*options_.registry);
}

ClusterCoordinator::~ClusterCoordinator() { Stop(); }

void ClusterCoordinator::Start(int64_t first_closure_id) {
  absl::MutexLock threads_lock(&threads_mu_);
  std::vector<int> members;
  {
    absl::MutexLock lock(&mu_);
    DISTRAIN_CHECK(!started_) << "ClusterCoordinator::Start called twice";
    started_ = true;
    first_id_ = next_id_ = first_closure_id;
    // Step 8: TF_CONFIG's workers are members from the start.
    for (int w = 0; w < transport_->num_workers(); ++w) {
      Slot& slot = SlotLocked(w);
      if (!slot.member && metrics_) metrics_->members.Increment();
      slot.member = true;
    }
    for (int w = 0; w < static_cast<int>(slots_.size()); ++w) {
      if (slots_[w].member) members.push_back(w);
    }
    last_admitted_ = absl::Now();
  }
  for (int w : members) SpawnLocked(w);
}

ClusterCoordinator::Slot& ClusterCoordinator::SlotLocked(int worker) {
  DISTRAIN_CHECK(worker >= 0) << "worker index " << worker;
  while (static_cast<int>(slots_.size()) <= worker) {
    slots_.emplace_back();
    if (metrics_) {
      slots_.back().completed_metric = &metrics_->per_worker.Add(
          {{"worker", absl::StrCat("worker:", slots_.size() - 1)}});
    }
  }
  return slots_[worker];
}

void ClusterCoordinator::SpawnLocked(int worker) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || !started_) return;
    Slot& slot = SlotLocked(worker);
    if (slot.has_thread) return;
    slot.has_thread = true;
  }
  threads_.emplace_back([this, worker] { WorkerLoop(worker); });
}

void ClusterCoordinator::AddWorker(int worker) {
  absl::MutexLock threads_lock(&threads_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    Slot& slot = SlotLocked(worker);
    if (!slot.member) {
      if (metrics_) metrics_->members.Increment();
      spdlog::info("coordinator: {} joined the worker set; probing it", transport_->WorkerName(worker));
    }
    slot.member = true;
    ++slot.wake;
  }
  SpawnLocked(worker);
}

void ClusterCoordinator::RemoveWorker(int worker, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || worker < 0 || worker >= static_cast<int>(slots_.size())) return;
  Slot& slot = slots_[worker];
  if (!slot.member) return;
  slot.member = false;
  ++slot.wake;
  if (metrics_) metrics_->members.Decrement();
  // After FinishWorkers every worker leaves: that is the end of the job, not news.
  spdlog::log(finished_ ? spdlog::level::debug : spdlog::level::info,
              "coordinator: {} is out of the worker set ({}); no more closures go to it, and it "
              "is not waited for",
              transport_->WorkerName(worker), reason);
}

int ClusterCoordinator::MembersLocked() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.member;
  return n;
}

int ClusterCoordinator::AdmittedLocked() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.admitted;
  return n;
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
    return !fatal_.ok() || stopping_ || outstanding() < MaxOutstandingLocked();
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
    spdlog::warn("coordinator: waiting for {} closure(s); {} of {} member worker(s) admitted",
                 outstanding(), AdmittedLocked(), MembersLocked());
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
  absl::Duration backoff = options_.probe_initial_backoff;
  while (true) {
    // 1. Admission (8, 9: only while a member).
    bool admitted;
    uint64_t wake;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || !fatal_.ok()) return;
      Slot& slot = slots_[worker];
      if (!slot.member) {
        if (slot.admitted) {
          slot.admitted = false;
          if (metrics_) metrics_->active.Decrement();
        }
        auto back = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !fatal_.ok() || slot.member;
        };
        mu_.Await(absl::Condition(&back));
        backoff = options_.probe_initial_backoff;
        continue;
      }
      admitted = slot.admitted;
      wake = slot.wake;
    }
    if (!admitted) {
      absl::StatusOr<std::string> incarnation = transport_->Prepare(worker);
      const std::string name = transport_->WorkerName(worker);
      absl::MutexLock lock(&mu_);
      if (stopping_ || !fatal_.ok()) return;
      Slot& slot = slots_[worker];
      if (!slot.member) continue;  // it left while we probed
      if (!incarnation.ok()) {
        const absl::StatusCode code = incarnation.status().code();
        if (code == absl::StatusCode::kFailedPrecondition ||
            code == absl::StatusCode::kInvalidArgument) {
          SetFatal(absl::Status(code, absl::StrCat(name, " cannot run this job's closures: ",
                                                   incarnation.status().message())));
          return;
        }
        spdlog::debug("coordinator: {} not ready: {}", name, incarnation.status().message());
        // Interruptible sleep: Stop(), a fatal error and a membership change
        // (step 8: a join wakes the probe) end it at once.
        auto wake_up = [this, &slot, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !fatal_.ok() || slot.wake != wake;
        };
        if (mu_.AwaitWithTimeout(absl::Condition(&wake_up), backoff)) {
          backoff = options_.probe_initial_backoff;
        } else {
          backoff = std::min(backoff * 2, options_.probe_max_backoff);
        }
        if (absl::Now() - last_admitted_ > options_.no_worker_warning && AdmittedLocked() == 0) {
          spdlog::warn("coordinator: no worker admitted for {}; {} closure(s) waiting",
                       absl::FormatDuration(absl::Now() - last_admitted_), outstanding());
          last_admitted_ = absl::Now();
        }
        continue;
      }
      backoff = options_.probe_initial_backoff;
      slot.admitted = true;
      ++admissions_;
      last_admitted_ = absl::Now();
      const bool restarted = !slot.incarnation.empty() && slot.incarnation != *incarnation;
      slot.incarnation = *incarnation;
      if (metrics_) {
        metrics_->admitted.Increment();
        metrics_->active.Increment();
      }
      if (!slot.ever_admitted) {
        spdlog::info("coordinator: {} admitted", name);
      } else {
        spdlog::info("coordinator: {} rejoined{}; scheduling closures onto it again", name,
                     restarted ? " (restarted process)" : "");
      }
      slot.ever_admitted = true;
    }

    // 3. The oldest queued closure.
    Closure closure;
    {
      absl::MutexLock lock(&mu_);
      Slot& slot = slots_[worker];
      auto ready = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !fatal_.ok() || !slot.member || (!draining_ && !queue_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_ || !fatal_.ok()) return;
      if (!slot.member) continue;  // 9: out of the set; back to the top
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
    Slot& slot = slots_[worker];
    --in_flight_;
    switch (outcome.kind) {
      case ClosureOutcome::Kind::kDone: {
        ++completed_;
        ++slot.completed;
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
          slot.completed_metric->Increment();
        }
        break;
      }
      case ClosureOutcome::Kind::kWorkerLost: {
        // Stop() or a fatal error cancelled the call; the worker is fine.
        if (stopping_ || !fatal_.ok()) return;
        // 4. At-least-once: the next free worker runs it again.
        queue_.push_front(Closure{closure.id, closure.attempt + 1});
        ++retried_;
        slot.admitted = false;
        if (metrics_) {
          metrics_->retried.Increment();
          metrics_->active.Decrement();
        }
        spdlog::warn("coordinator: {} lost ({}); closure {} re-queued (attempt {}), {} closure(s) "
                     "retried so far; {}",
                     transport_->WorkerName(worker), outcome.status.message(), closure.id,
                     closure.attempt + 2, retried_,
                     slot.member ? "probing the worker until it comes back"
                                 : "it left the worker set, so it is not probed");
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
    finished_ = true;
    for (size_t w = 0; w < slots_.size(); ++w) {
      if (slots_[w].admitted) workers.push_back(static_cast<int>(w));
    }
  }
  for (int w : workers) transport_->Finish(w);
}

void ClusterCoordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  transport_->Cancel();
  absl::MutexLock threads_lock(&threads_mu_);
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
  return AdmittedLocked();
}
int ClusterCoordinator::members() const {
  absl::MutexLock lock(&mu_);
  return MembersLocked();
}
std::vector<int64_t> ClusterCoordinator::completed_by_worker() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (const Slot& s : slots_) out.push_back(s.completed);
  return out;
}
absl::Status ClusterCoordinator::fatal_error() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

}  // namespace distrain

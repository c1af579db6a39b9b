#include "operator/kube/workqueue.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace distrain::kube {
namespace {

// controller-runtime's buckets: 10 ns .. 1000 s, a decade apart.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-8; v <= 1e3 * 1.0001; v *= 10) b.push_back(v);
  return b;
}

}  // namespace

WorkQueue::WorkQueue(WorkQueueOptions options)
    : options_(std::move(options)), clock_(options_.clock) {
  DISTRAIN_CHECK(clock_ != nullptr);
  DISTRAIN_CHECK_GE(options_.burst, 0);
  tokens_ = options_.burst;
  tokens_at_ = clock_->Now();
  if (options_.registry) {
    prometheus::Registry& r = *options_.registry;
    const prometheus::Labels labels = {{"name", options_.name}};
    depth_ = &prometheus::BuildGauge()
                  .Name("workqueue_depth")
                  .Help("Current depth of the work queue")
                  .Register(r)
                  .Add(labels);
    adds_ = &prometheus::BuildCounter()
                 .Name("workqueue_adds_total")
                 .Help("Total number of adds handled by the work queue")
                 .Register(r)
                 .Add(labels);
    retries_ = &prometheus::BuildCounter()
                    .Name("workqueue_retries_total")
                    .Help("Total number of rate-limited retries handled by the work queue")
                    .Register(r)
                    .Add(labels);
    queue_duration_ = &prometheus::BuildHistogram()
                           .Name("workqueue_queue_duration_seconds")
                           .Help("How long in seconds a key stays in the work queue before it is "
                                 "handed to a worker")
                           .Register(r)
                           .Add(labels, DurationBuckets());
    work_duration_ = &prometheus::BuildHistogram()
                          .Name("workqueue_work_duration_seconds")
                          .Help("How long in seconds processing a key from the work queue takes")
                          .Register(r)
                          .Add(labels, DurationBuckets());
  }
}

WorkQueue::~WorkQueue() { ShutDown(); }

void WorkQueue::SetDepthLocked() {
  if (depth_ != nullptr) depth_->Set(static_cast<double>(queue_.size()));
}

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_) return;
  if (!dirty_.insert(key).second) return;  // already waiting: deduplicated
  if (adds_ != nullptr) adds_->Increment();
  added_at_.try_emplace(key, clock_->Now());
  // Processing now: Done() puts it back, so no second worker gets it.
  if (processing_.contains(key)) return;
  queue_.push_back(key);
  SetDepthLocked();
}

void WorkQueue::PromoteReadyLocked() {
  const absl::Time now = clock_->Now();
  while (!waiting_.empty() && waiting_.top().ready_at <= now) {
    Waiting w = waiting_.top();
    waiting_.pop();
    auto it = waiting_ready_at_.find(w.key);
    // A stale entry: the key was moved earlier and already promoted or re-queued.
    if (it == waiting_ready_at_.end() || it->second != w.ready_at) continue;
    waiting_ready_at_.erase(it);
    ++waiting_generation_;
    AddLocked(w.key);
  }
}

void WorkQueue::Add(const std::string& key) {
  absl::MutexLock lock(&mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  if (delay <= absl::ZeroDuration()) {
    AddLocked(key);
    return;
  }
  const absl::Time ready_at = clock_->Now() + delay;
  auto [it, inserted] = waiting_ready_at_.try_emplace(key, ready_at);
  if (!inserted) {
    if (it->second <= ready_at) return;  // keep the earlier time
    it->second = ready_at;
  }
  waiting_.push(Waiting{ready_at, waiting_seq_++, key});
  ++waiting_generation_;
}

absl::Duration WorkQueue::WhenLocked(const std::string& key) {
  // Per-key exponential backoff.
  const int failures = failures_[key]++;
  const double backoff_s =
      absl::ToDoubleSeconds(options_.base_delay) * std::pow(2.0, static_cast<double>(failures));
  const absl::Duration backoff = backoff_s >= absl::ToDoubleSeconds(options_.max_delay)
                                     ? options_.max_delay
                                     : absl::Seconds(backoff_s);
  // Overall token bucket, golang.org/x/time/rate's Reserve(): tokens refill at
  // qps up to burst; taking one from an empty bucket books a future token.
  absl::Duration bucket = absl::ZeroDuration();
  if (options_.qps > 0) {
    const absl::Time now = clock_->Now();
    if (now > tokens_at_) {
      tokens_ = std::min<double>(options_.burst,
                                 tokens_ + absl::ToDoubleSeconds(now - tokens_at_) * options_.qps);
      tokens_at_ = now;
    }
    tokens_ -= 1;
    if (tokens_ < 0) bucket = absl::Seconds(-tokens_ / options_.qps);
  }
  return std::max(backoff, bucket);
}

absl::Duration WorkQueue::When(const std::string& key) {
  absl::MutexLock lock(&mu_);
  return WhenLocked(key);
}

void WorkQueue::AddRateLimited(const std::string& key) {
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    delay = WhenLocked(key);
    if (retries_ != nullptr) retries_->Increment();
  }
  AddAfter(key, delay);
}

void WorkQueue::Forget(const std::string& key) {
  absl::MutexLock lock(&mu_);
  failures_.erase(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::optional<std::string> WorkQueue::Get() { return GetWithDeadline(absl::InfiniteFuture()); }

std::optional<std::string> WorkQueue::GetWithDeadline(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    PromoteReadyLocked();
    if (!queue_.empty() || shutting_down_) break;
    absl::Time wake = deadline;
    if (!waiting_.empty()) wake = std::min(wake, waiting_.top().ready_at);
    if (clock_->Now() >= deadline) return std::nullopt;
    const uint64_t generation = waiting_generation_;
    auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || shutting_down_ || waiting_generation_ != generation;
    };
    clock_->AwaitWithDeadline(mu_, absl::Condition(&changed), wake);
  }
  if (queue_.empty()) return std::nullopt;  // shut down and drained
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  SetDepthLocked();
  processing_.insert(key);
  dirty_.erase(key);
  const absl::Time now = clock_->Now();
  if (auto it = added_at_.find(key); it != added_at_.end()) {
    if (queue_duration_ != nullptr) queue_duration_->Observe(absl::ToDoubleSeconds(now - it->second));
    added_at_.erase(it);
  }
  started_at_[key] = now;
  return key;
}

void WorkQueue::Done(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (processing_.erase(key) == 0) return;
  if (auto it = started_at_.find(key); it != started_at_.end()) {
    if (work_duration_ != nullptr) {
      work_duration_->Observe(absl::ToDoubleSeconds(clock_->Now() - it->second));
    }
    started_at_.erase(it);
  }
  if (dirty_.contains(key)) {
    queue_.push_back(key);
    SetDepthLocked();
  }
}

void WorkQueue::ShutDown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

bool WorkQueue::ShuttingDown() const {
  absl::MutexLock lock(&mu_);
  return shutting_down_;
}

size_t WorkQueue::Len() {
  absl::MutexLock lock(&mu_);
  PromoteReadyLocked();  // the queue as of now, as a Get would see it
  return queue_.size();
}

}  // namespace distrain::kube

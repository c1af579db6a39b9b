#include "operator/kube/rate_limiter.h"

#include <algorithm>

namespace distrain::kube {

bool SleepOn(const Clock* clock, absl::Duration d, std::stop_token stop) {
  if (stop.stop_requested()) return false;
  if (d <= absl::ZeroDuration()) return true;
  absl::Mutex mu;
  bool stopped = false;
  const absl::Time deadline = clock->Now() + d;
  // Taking `mu` in the callback makes absl::Mutex re-evaluate the condition.
  std::stop_callback on_stop(stop, [&] {
    absl::MutexLock lock(&mu);
    stopped = true;
  });
  absl::MutexLock lock(&mu);
  clock->AwaitWithDeadline(mu, absl::Condition(&stopped), deadline);
  return !stopped;
}

TokenBucketRateLimiter::TokenBucketRateLimiter(double qps, int burst, const Clock* clock)
    : qps_(qps), burst_(std::max(burst, 1)), clock_(clock) {
  absl::MutexLock lock(&mu_);
  tokens_ = burst_;
  last_ = clock_->Now();
}

void TokenBucketRateLimiter::AdvanceLocked(absl::Time now) {
  if (now <= last_) return;
  tokens_ = std::min(static_cast<double>(burst_),
                     tokens_ + absl::ToDoubleSeconds(now - last_) * qps_);
  last_ = now;
}

bool TokenBucketRateLimiter::TryAccept() {
  if (qps_ <= 0) return true;
  absl::MutexLock lock(&mu_);
  AdvanceLocked(clock_->Now());
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

absl::Duration TokenBucketRateLimiter::Reserve() {
  if (qps_ <= 0) return absl::ZeroDuration();
  absl::MutexLock lock(&mu_);
  AdvanceLocked(clock_->Now());
  tokens_ -= 1.0;
  if (tokens_ >= 0) return absl::ZeroDuration();
  // The deficit refills at qps_: that is when this reservation's token exists.
  return absl::Seconds(-tokens_ / qps_);
}

bool TokenBucketRateLimiter::Wait(std::stop_token stop) {
  absl::Duration wait = Reserve();
  if (wait == absl::ZeroDuration()) return !stop.stop_requested();
  if (SleepOn(clock_, wait, stop)) return true;
  absl::MutexLock lock(&mu_);
  tokens_ = std::min(static_cast<double>(burst_), tokens_ + 1.0);  // give the reservation back
  return false;
}

}  // namespace distrain::kube

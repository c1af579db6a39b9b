#ifndef DISTRAIN_OPERATOR_KUBE_RATE_LIMITER_H_
#define DISTRAIN_OPERATOR_KUBE_RATE_LIMITER_H_

// TokenBucketRateLimiter: client-side QPS/burst pacing of API requests, the
// token bucket of client-go's flowcontrol: the bucket holds up to `burst`
// tokens, refills at `qps` tokens per second, and every request takes one.
// Callers that find it empty reserve a future token (the bucket goes negative),
// so waiters are served in the order they arrived and never starve.
//
// Time comes from an injected Clock (clock.h), so tests move it by hand.
//
// Ownership: the clock is borrowed and must outlive the limiter.
// Thread-safe: many threads may call Wait/TryAccept/Reserve at once.

#include <stop_token>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "operator/kube/clock.h"

namespace distrain::kube {

class TokenBucketRateLimiter {
 public:
  // qps <= 0 disables limiting (every call passes at once). burst < 1 is taken as 1.
  TokenBucketRateLimiter(double qps, int burst, const Clock* clock = Clock::Real());

  // Takes a token if one is available now; never waits.
  bool TryAccept();

  // Reserves a token and returns how long the caller must wait before using it
  // (zero when one was available).
  absl::Duration Reserve();

  // Takes a token, waiting (on the clock) until it is due. Returns false, and
  // gives the reservation back, when `stop` is requested first.
  bool Wait(std::stop_token stop = {});

  double qps() const { return qps_; }
  int burst() const { return burst_; }

 private:
  // Refills tokens_ for the time elapsed since last_.
  void AdvanceLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double qps_;
  const int burst_;
  const Clock* const clock_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);  // may go negative: reserved future tokens
  absl::Time last_ ABSL_GUARDED_BY(mu_);
};

// Sleeps `d` on `clock`, waking early when `stop` is requested; false when stopped.
bool SleepOn(const Clock* clock, absl::Duration d, std::stop_token stop = {});

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_RATE_LIMITER_H_

#ifndef DISTRAIN_OPERATOR_KUBE_CLOCK_H_
#define DISTRAIN_OPERATOR_KUBE_CLOCK_H_

// An injectable clock for the operator's timing machinery (work queue backoff,
// expectations TTL, lease expiry, event series), so tests can move time
// without sleeping (docs/architecture.md §9).
//
// Clock::Real() is the wall clock; FakeClock only moves when told to.
// Every wait goes through AwaitWithDeadline so that a FakeClock can end it:
// the real clock hands the deadline to absl::Mutex, the fake one re-checks the
// condition and its own time every millisecond (only tests pay for that).
//
// Thread-safety: both implementations are safe to use from many threads.
// Clock::Real() is a process-wide singleton that is never destroyed.

#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace distrain::kube {

class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;

  // With `mu` held: waits until `cond` holds or Now() >= deadline, releasing
  // `mu` while waiting. Returns with `mu` held and the value of `cond`.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                                 absl::Time deadline) const = 0;

  // The wall clock.
  static const Clock* Real();
};

class FakeClock : public Clock {
 public:
  // Starts at a fixed, arbitrary instant so test output is reproducible.
  FakeClock() : FakeClock(absl::FromUnixSeconds(1'800'000'000)) {}
  explicit FakeClock(absl::Time start) : now_ns_(absl::ToUnixNanos(start)) {}

  absl::Time Now() const override { return absl::FromUnixNanos(now_ns_.load()); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) const override;

  void Advance(absl::Duration d) { now_ns_.fetch_add(absl::ToInt64Nanoseconds(d)); }
  void Set(absl::Time t) { now_ns_.store(absl::ToUnixNanos(t)); }

 private:
  // Atomic rather than mutex-guarded: conditions evaluated under a waiter's
  // mutex read it, and a lock here would order against every such mutex.
  std::atomic<int64_t> now_ns_;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_CLOCK_H_

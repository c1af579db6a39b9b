#include "operator/kube/clock.h"

namespace distrain::kube {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) const override {
    return mu.AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock* const kClock = new RealClock();
  return kClock;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  // Fake time moves outside `mu`, so absl::Mutex cannot know when to re-check
  // the deadline: poll it. A millisecond keeps tests fast and cheap.
  while (!cond.Eval()) {
    if (Now() >= deadline) return false;
    mu.AwaitWithTimeout(cond, absl::Milliseconds(1));
  }
  return true;
}

}  // namespace distrain::kube

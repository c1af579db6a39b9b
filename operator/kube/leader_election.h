#ifndef DISTRAIN_OPERATOR_KUBE_LEADER_ELECTION_H_
#define DISTRAIN_OPERATOR_KUBE_LEADER_ELECTION_H_

// LeaderElector: leader election on a coordination.k8s.io/v1 Lease, client-go's
// protocol (k8s.io/client-go/tools/leaderelection), so that of several
// operator replicas exactly one reconciles.
//
// One attempt (TryAcquireOrRenew):
//   1. Fast path: while leading and our last renewal is still within the lease
//      duration, PUT the renewed spec on the lease object we last wrote (its
//      resourceVersion makes it optimistic); on any failure (409: somebody
//      else wrote) fall through to the slow path.
//   2. GET the lease. 404: create it holding it ourselves (transitions 0).
//   3. If the lease's spec differs from what we observed last, remember it
//      and the time we saw it: expiry is judged by *our* clock, as
//      observed_time + leaseDurationSeconds, never by the holder's renewTime,
//      so clock skew between replicas cannot steal a lease.
//   4. Held by someone else and not expired by (3): give up this attempt.
//   5. PUT the lease (with the resourceVersion just read) naming us holder,
//      renewTime now; acquireTime and leaseTransitions kept when renewing,
//      acquireTime = now and leaseTransitions + 1 when taking over. 409 means
//      another candidate won the race: give up this attempt.
//
// Run(stop):
//   a. Acquire: an attempt every retry_period (jittered up to +20%) until one
//      succeeds or `stop` is requested.
//   b. Leading: leader_election_master_status{name}=1; on_started_leading runs
//      on its own thread with a stop_token that is requested when leadership
//      ends.
//   c. Renew: an attempt every retry_period; when no attempt succeeded within
//      renew_deadline of the last success — including an attempt still stuck
//      in the client — leadership is lost. An attempt runs on a helper thread
//      so that a hung API call cannot stretch the renew deadline.
//   d. End (lost or stopped): the status metric goes to 0, on_started_leading's
//      token is requested, on_stopped_leading runs, and — on a clean stop while
//      still holding the lease and when release_on_cancel — the lease is
//      released (holderIdentity cleared, leaseDurationSeconds 1) so a successor
//      need not wait for it to expire. Run joins the callback thread last.
// Unlike client-go, on_stopped_leading only runs if this elector led.
//
// Ownership: borrows the client and clock (they must outlive the elector);
// shares the metrics registry. Thread-safety: Run is called once, from one
// thread; IsLeader/GetLeader/identity may be called from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"
#include "operator/kube/clock.h"

namespace prometheus {
class Registry;
class Gauge;
}  // namespace prometheus

namespace distrain::kube {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  std::string identity{};  // empty: DefaultLeaderIdentity()
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
  bool release_on_cancel = true;
  const Clock* clock = Clock::Real();
  std::shared_ptr<prometheus::Registry> registry;  // optional: leader_election_master_status

  // Runs on its own thread once the lease is held; must return soon after
  // its token is requested (leadership lost or Run stopped).
  std::function<void(std::stop_token)> on_started_leading;
  // Runs on Run's thread when leadership ends (the operator exits here).
  std::function<void()> on_stopped_leading;
  // Runs whenever the observed holder changes (also to ourselves), on the
  // thread of the attempt; it must not call back into the elector.
  std::function<void(const std::string& identity)> on_new_leader;
};

// "<hostname>_<random uuid>": unique per process, readable in the Lease.
std::string DefaultLeaderIdentity();

class LeaderElector {
 public:
  // Fails with kInvalidArgument naming the field when the config is unusable:
  // empty lease name/namespace, non-positive durations, lease_duration <=
  // renew_deadline, or renew_deadline <= 1.2 * retry_period (client-go's
  // rules, so a renewal always gets more than one try).
  static absl::StatusOr<std::unique_ptr<LeaderElector>> Create(Client* client,
                                                               LeaderElectionConfig config);
  ~LeaderElector();  // joins a renewal attempt still running
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Blocks through acquire, lead, renew; returns when leadership is lost or
  // `stop` is requested. Call once.
  void Run(std::stop_token stop);

  // One attempt (steps 1-5 above); true when we hold the lease afterwards.
  // Exposed for tests; Run is the normal entry point.
  bool TryAcquireOrRenew();
  // Gives the lease up if we hold it; true when released (or not ours).
  bool Release();

  // True between acquiring and losing (or releasing) the lease.
  bool IsLeader() const;
  // The holder we last observed ("" when none).
  std::string GetLeader() const;
  const std::string& identity() const { return config_.identity; }
  const LeaderElectionConfig& config() const { return config_; }

 private:
  LeaderElector(Client* client, LeaderElectionConfig config);

  std::string LeasePath() const;
  // A Lease spec naming us holder at `now`.
  nlohmann::json NewSpec(absl::Time now, const nlohmann::json& acquire_time,
                         int64_t transitions) const;
  void SetObservedLocked(const nlohmann::json& lease, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs TryAcquireOrRenew on a helper thread; false if it failed or had not
  // finished by `deadline`.
  bool AttemptBefore(absl::Time deadline, std::stop_token stop);
  void SetLeading(bool leading);

  Client* const client_;
  const LeaderElectionConfig config_;
  const Clock* const clock_;
  prometheus::Gauge* master_status_ = nullptr;

  // Serializes attempts and release (the helper thread and Run's thread).
  absl::Mutex attempt_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  nlohmann::json lease_ ABSL_GUARDED_BY(mu_);          // last lease read or written (with its RV)
  nlohmann::json observed_spec_ ABSL_GUARDED_BY(mu_);  // its spec
  absl::Time observed_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string observed_holder_ ABSL_GUARDED_BY(mu_);
  bool leading_ ABSL_GUARDED_BY(mu_) = false;

  // Attempts that outlived their deadline; joined when Run ends.
  std::vector<std::thread> stragglers_;
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_LEADER_ELECTION_H_

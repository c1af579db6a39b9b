#ifndef DISTRAIN_WORKER_COORDINATION_COORDINATION_CLIENT_H_
#define DISTRAIN_WORKER_COORDINATION_COORDINATION_CLIENT_H_

// CoordinationClient: one task's connection to the CoordinationService (the
// protocol is written out in coordination_service.h). Call order:
//   Connect(deadline) -> Join(deadline) -> StartWatching(callback)
//   -> Set/Get/Barrier as needed -> Leave() on a clean finish -> destroy.
// Destroying the client without Leave cancels its membership stream, which
// the coordinator reports to every other task as a failure of this one —
// exactly what a crash looks like, so error paths need nothing special.
//
// It is also the cross-process Store (worker/collective/store.h) that
// bootstraps collectives.
//
// Ownership: owns its gRPC channel and the watcher thread; the destructor
// cancels the stream and joins the thread. Thread-safety: every method is
// thread-safe; StartWatching once per client. The failure callback runs on the
// watcher thread: it must return promptly and must not destroy the client or
// call StopWatching (typically it aborts the collective and records the error).
// Whatever the callback refers to must outlive the client, or at least its
// StopWatching: until that returns the watcher may call it at any moment (a
// peer's client destroyed first is reported as that peer failing). Destroy
// or StopWatching the client first, then what the callback uses; the other
// order is a use-after-free that surfaces as heap corruption elsewhere, e.g.
// gRPC aborting with "Mutex corrupt" while it destroys a channel.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "distrain/v1/coordination.grpc.pb.h"
#include "worker/collective/store.h"
#include "worker/coordination/grpc_keepalive.h"
#include "worker/security/transport_security.h"

namespace distrain {

// What Join returns.
struct Membership {
  int64_t generation = 0;
  std::vector<TaskId> members;  // in rank order (unranked tasks, if any, last)
  int rank = -1;                // this task's rank; -1 for unranked tasks (ps)
};

struct CoordinationClientOptions {
  // Connect and Join retry with exponential backoff and ±20% jitter.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Longest single Ping attempt inside Connect (a host that drops SYNs).
  absl::Duration connect_attempt_timeout = absl::Seconds(5);
  // Deadline of calls that do not wait (Set, Leave).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // gRPC deadlines of waiting calls are the wait plus this, so the server's
  // own answer (which names the missing tasks or key) arrives first.
  absl::Duration rpc_slack = absl::Seconds(3);
  // A restarted process may reach the coordinator before it noticed that the
  // previous incarnation died (its stream still open: a host that vanished
  // is found by keepalive). Join retries that refusal for this long before
  // reporting two live processes for one task.
  absl::Duration live_predecessor_grace = absl::Seconds(30);
  // Unique per process start; empty: "<pid>-<unix nanos>-<random>".
  std::string incarnation;
  KeepaliveOptions keepalive;
  // Names tasks in messages, e.g. "worker:2 (10.0.0.5:2222)"; default
  // TaskId::ToString.
  std::function<std::string(const TaskId&)> describe;
  // Mutual TLS as this task towards the coordinator (which must present the
  // coordinator's certificate); null: plaintext.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
};

class CoordinationClient : public Store {
 public:
  using FailureCallback = std::function<void(const absl::Status&)>;

  // `coordinator_address` is host:port of `coordinator` from TF_CONFIG.
  CoordinationClient(std::string coordinator_address, TaskId coordinator, TaskId self,
                     CoordinationClientOptions options = {});
  ~CoordinationClient() override;  // StopWatching(); no Leave
  CoordinationClient(const CoordinationClient&) = delete;
  CoordinationClient& operator=(const CoordinationClient&) = delete;

  // Probes the coordinator with Ping, retrying (new channel, fresh DNS
  // lookup) with backoff until it answers or `deadline` passes:
  //   DEADLINE_EXCEEDED "could not reach the coordinator chief:0 at
  //   job-chief-0.job:2222 within 5m: <last error>".
  // FAILED_PRECONDITION if the service there coordinates another task.
  absl::Status Connect(absl::Time deadline);

  // Joins and waits for every member (protocol step 2); retries transient
  // transport errors until `deadline`. Requires Connect.
  absl::StatusOr<Membership> Join(absl::Time deadline);

  // Store. Get: DEADLINE_EXCEEDED naming the key after `timeout`.
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

  // Returns when every member that has not left reached barrier `name`.
  absl::Status Barrier(const std::string& name, absl::Duration timeout);

  // Opens the membership stream and returns once the coordinator confirmed it
  // (so a failure from then on cannot be missed), or the stream's error.
  // Later, `on_failure` is called at most once, on the watcher thread, with
  // UNAVAILABLE naming the failed peer(s) and the coordinator's reason, or
  // naming the coordinator and its address when the coordinator becomes
  // unreachable. Nothing is reported after Leave or StopWatching.
  absl::Status StartWatching(FailureCallback on_failure,
                             absl::Duration open_timeout = absl::Seconds(10));

  // Clean finish (protocol step 6): the closing stream is then not a failure.
  // `departing`: this task leaves a group that trains on without it (step E).
  absl::Status Leave(bool departing = false);

  // Cancels the membership stream (without Leave: the coordinator reports
  // this task failed) and joins the watcher thread. Idempotent.
  void StopWatching();

  const TaskId& self() const { return self_; }
  const std::string& incarnation() const { return incarnation_; }
  const std::string& coordinator_address() const { return address_; }
  // Latest generation seen (Join or the membership stream); 0 before Join.
  int64_t generation() const;

  // In-place recovery (worker/strategy/multi_worker_mirrored.h). The latest
  // generation at which every member was admitted: the Join's, then each
  // membership update that names no failed task (the service sends those
  // only when it re-admits, i.e. when the group is whole again). 0 before Join.
  int64_t whole_generation() const;
  // Blocks until the group is whole at a generation above `after`, and
  // returns that generation. UNAVAILABLE when the membership stream ends (the
  // coordinator is gone: nobody can re-admit anyone), DEADLINE_EXCEEDED at
  // `deadline`, CANCELLED once `cancelled` (polled) returns true.
  // The membership of that generation comes with it (elastic: the member
  // set may have changed, and this task's rank with it).
  absl::StatusOr<Membership> WaitForWholeGroup(int64_t after, absl::Time deadline,
                                               const std::function<bool()>& cancelled);
  // The member set of the latest whole generation (the Join's, then the
  // updates'). A change of it after Join (an elastic resize) is reported to
  // the failure callback like a failure, with ABORTED naming the change.
  Membership whole_membership() const;
  // Re-arms the failure callback after a recovery that formed generation
  // `generation`: failures reported from now on reach the callback again.
  // Returns the failure a membership update after `generation` already
  // reported while the callback was spent (the caller handles it, since the
  // callback will not be called for it), else OK.
  absl::Status RearmFailureReport(int64_t generation);
  // Whether the membership stream has ended (the coordinator closed it or is
  // unreachable; or this task left).
  bool membership_stream_ended() const;

 private:
  std::shared_ptr<v1::Coordination::Stub> stub() const;
  absl::Status FromGrpc(int code, const std::string& message, const std::string& what) const;
  std::string Describe(const TaskId& task) const;
  void WatchLoop(std::shared_ptr<v1::Coordination::Stub> stub, grpc::ClientContext* context);

  const std::string address_;
  const TaskId coordinator_;
  const TaskId self_;
  const CoordinationClientOptions options_;
  const std::string incarnation_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::shared_ptr<v1::Coordination::Stub> stub_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Watcher state.
  FailureCallback on_failure_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientContext> watch_context_ ABSL_GUARDED_BY(mu_);
  std::thread watch_thread_;  // started/joined under watch_start_mu_
  absl::Mutex watch_start_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool watch_started_ ABSL_GUARDED_BY(watch_start_mu_) = false;
  bool watch_confirmed_ ABSL_GUARDED_BY(mu_) = false;  // first update received
  bool watch_ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status watch_end_status_ ABSL_GUARDED_BY(mu_);
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // on_failure_ called (or muted)
  int64_t whole_generation_ ABSL_GUARDED_BY(mu_) = 0;
  Membership whole_membership_ ABSL_GUARDED_BY(mu_);

  // The newest failure update and its generation (reported or not).
  int64_t last_failure_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_COORDINATION_CLIENT_H_

#ifndef DISTRAIN_WORKER_COORDINATION_RENDEZVOUS_H_
#define DISTRAIN_WORKER_COORDINATION_RENDEZVOUS_H_

// Rendezvous: what a multi-process strategy holds for the life of a training
// run. On the coordinator task (chief:0, or worker:0 when there is no chief)
// it hosts the CoordinationService; on every task it connects a
// CoordinationClient, joins, and opens the membership stream.
//
// Steps of Start (see coordination_service.h for the wire protocol):
//  1. Check that this task and the coordinator are among the members and that
//     every member has a TF_CONFIG address.
//  2. Coordinator only: listen on its TF_CONFIG port (CoordinatorListenAddress)
//     before anything else, so the other tasks' probes find it.
//  3. Connect (retrying until the deadline: DNS may lag pod start) and Join:
//     waits up to join_timeout for every member (a late worker is waited for).
//     The coordinator talks to its own service over loopback.
//  4. Open the membership stream at once (so no peer failure after Join can
//     go unnoticed); StartWatching only registers the callback, and a failure
//     reported before that is delivered to it immediately.
// Shutdown(timeout), on a clean finish:
//  5. Leave (this task's stream ending is then not a failure).
//  6. Coordinator only: wait (bounded) until every member has left or failed,
//     so no task loses the service during its last calls; then stop serving.
// AwaitRegroup(failed_generation, ...), in-place recovery after a peer failed:
//  R1. Wait (bounded) until the coordinator re-admitted replacements for every
//      failed member, i.e. the group is whole at a generation above the
//      failure's (CoordinationClient::WaitForWholeGroup). Fails at once when
//      the coordinator itself is gone. With an elastic membership the whole
//      group may be another set (a resize): it becomes this rendezvous'
//      membership, with this task's new rank.
//  R2. Clear the recorded failure and re-arm the failure callback, so the
//      next failure is reported again. If another member was lost after that
//      re-admission (its report spent), go back to R1 for a newer whole group.
// Destroying a Rendezvous without Shutdown is the error path: the stream is
// cancelled without Leave and the peers are told this task failed (and, on
// the coordinator, the service stops, which every peer reports).
//
// Ownership: owns the client and (on the coordinator) the service.
// Thread-safety: all methods are thread-safe; Shutdown once, from one thread.
// The failure callback runs on the watcher thread (or on the caller's thread
// in StartWatching); it must return promptly and must not destroy the
// Rendezvous, and what it refers to must outlive the Rendezvous (or its
// Shutdown): until then a peer's failure may call it at any moment.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "worker/collective/store.h"
#include "worker/coordination/coordination_client.h"
#include "worker/coordination/coordination_service.h"

namespace distrain {

struct RendezvousOptions {
  // Connect + Join together: how long a late task is waited for.
  absl::Duration join_timeout = absl::Minutes(5);
  // Tasks that join and are watched but have no rank (ps tasks).
  std::vector<TaskId> unranked;
  // Service knobs (coordinator only); `coordinator` and `unranked` are filled in.
  CoordinationServiceOptions service;
  // Client knobs; `describe` is filled in ("worker:2 (host:port)").
  CoordinationClientOptions client;
};

class Rendezvous {
 public:
  using FailureCallback = CoordinationClient::FailureCallback;

  // `cluster` is this task's TF_CONFIG; `members` the ranked tasks in rank
  // order (MultiWorkerMirrored: chief, then workers — see
  // ClusterSpec::TaskForTrainingRank). Errors: INVALID_ARGUMENT for a member
  // set that does not fit the cluster, UNAVAILABLE when the coordinator
  // cannot listen, DEADLINE_EXCEEDED naming the coordinator or the tasks that
  // did not join within join_timeout. The default options are
  // RendezvousOptions(), not {}: see CoordinationService::Start (GCC 12).
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Start(
      const ClusterSpec& cluster, std::vector<TaskId> members,
      RendezvousOptions options = RendezvousOptions());
  ~Rendezvous();  // without Shutdown: reported to the peers as a failure of this task
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Of the current group: the Join's, then the latest AwaitRegroup's (with an
  // elastic membership the set, and this task's rank, may change there).
  int rank() const;  // -1 for unranked tasks
  int size() const;  // number of ranked members
  // Ranked members in rank order, then unranked ones.
  std::vector<TaskId> members() const;
  const TaskId& task() const { return task_; }
  bool is_coordinator() const { return service_ != nullptr; }
  // Membership generation: the Join's, then the latest the stream reported.
  int64_t generation() const { return client_->generation(); }

  // Cross-process key-value store for bootstrapping collectives.
  Store& store() { return *client_; }
  CoordinationClient& client() { return *client_; }
  absl::Status Barrier(const std::string& name, absl::Duration timeout) {
    return client_->Barrier(name, timeout);
  }

  // Registers the callback for a peer (or coordinator) failure; called at
  // most once, with UNAVAILABLE naming the peer and its address. A failure
  // reported before this call is delivered at once, on this thread.
  void StartWatching(FailureCallback on_failure);
  // OK, or the first failure the membership stream reported (since the last
  // AwaitRegroup).
  absl::Status health() const;
  // Steps R1-R2: returns the generation of the re-formed group. `cancelled`
  // is polled (a stop request ends the wait with CANCELLED).
  absl::StatusOr<int64_t> AwaitRegroup(int64_t failed_generation, absl::Time deadline,
                                       const std::function<bool()>& cancelled);
  // The membership stream ended: the coordinator is gone (or this task left).
  bool coordinator_lost() const { return client_->membership_stream_ended(); }

  // "worker:2 (10.0.0.5:2222)", for error messages. CHECKs the range.
  std::string peer_name(int rank) const;
  std::string TaskName(const TaskId& task) const;

  // Steps 5-6. DEADLINE_EXCEEDED (coordinator) naming the tasks that did not
  // leave within `timeout`; the service stops either way. `departing`: this
  // task leaves a group that trains on without it (elastic membership).
  absl::Status Shutdown(absl::Duration timeout, bool departing = false);

 private:
  Rendezvous(const ClusterSpec& cluster, int num_unranked);
  void OnStreamFailure(const absl::Status& status);

  const ClusterSpec cluster_;
  const TaskId task_;
  const int num_unranked_;
  std::unique_ptr<CoordinationService> service_;  // coordinator only
  std::unique_ptr<CoordinationClient> client_;

  mutable absl::Mutex mu_;
  FailureCallback on_failure_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_RENDEZVOUS_H_

#ifndef DISTRAIN_WORKER_COORDINATION_COORDINATION_SERVICE_H_
#define DISTRAIN_WORKER_COORDINATION_COORDINATION_SERVICE_H_

// CoordinationService: the rendezvous every multi-process strategy uses. The
// coordinator task (chief:0, or worker:0 when there is no chief) hosts it
// in-process on the port of its TF_CONFIG address; every task, the
// coordinator included, talks to it through CoordinationClient
// (proto/distrain/v1/coordination.proto).
//
// Protocol (who does what, in order):
//  1. The coordinator's process starts the service before it joins. Every task
//     creates a client and probes with Ping until it answers, retrying with
//     backoff until a deadline (Kubernetes DNS names may not resolve yet).
//  2. Join(task, incarnation, timeout): the task must be one of the expected
//     members and names its process start (incarnation). It waits until every
//     expected task has joined; the last arrival admits them all and each Join
//     returns (generation, members in rank order, its rank). If the timeout
//     passes first the answer is DEADLINE_EXCEEDED naming the tasks that never
//     joined, and the caller is withdrawn (a retry, or a restarted process,
//     can join again); the same when the caller's call is cancelled.
//  3. Every admitted task opens WatchMembership at once and keeps it open for
//     the life of its process. The first message is a snapshot (generation,
//     tasks failed so far); then one message per membership change.
//  4. A watch stream that ends without Leave (cancelled: the process died or
//     was killed, its connection closed, or keepalive found the host gone)
//     marks the task failed, bumps the generation and sends every other
//     watcher an update naming it ("worker:2 lost: its coordination stream
//     closed ..."). Blocked handlers notice a vanished caller within
//     `cancel_poll`, so the update leaves well under a second after the
//     process dies on loopback.
//  5. KeyValueSet / KeyValueGet bootstrap the collectives (ring addresses,
//     NCCL id): Get waits up to its timeout for the key. Barrier(name) returns
//     once every expected task that has not left arrived at the same barrier
//     the same number of times (names are reusable); it fails with ABORTED if
//     a member fails meanwhile and DEADLINE_EXCEEDED naming the tasks that did
//     not arrive.
//  6. A task that finishes calls Leave: it no longer counts for barriers and
//     the server ends its watch stream with OK (not a failure). The
//     coordinator's process calls WaitForAllToLeave (bounded) before
//     Shutdown, so the server outlives every member's last call.
//  7. Restarts: a Join with a new incarnation replaces a task that failed or
//     left, or whose previous incarnation was admitted but never opened its
//     watch stream (it is presumed dead and reported failed first). When every
//     expected task is joined again the rejoined are admitted and the
//     generation bumps. While the previous incarnation is still live (its Join
//     is waiting or its watch stream is open) the new one is refused with
//     FAILED_PRECONDITION: two processes claim the same task. A re-admission
//     is sent to watchers as an update of its own that names no failed task:
//     the group is whole again at that generation. In-place recovery
//     (worker/strategy/multi_worker_mirrored.h) is built on this: survivors
//     keep their streams open and wait for that update.
//  E. Elastic membership (CoordinationServiceOptions::elastic; MultiWorker-
//     Mirrored with spec.elasticPolicy): the ranked member set may change
//     while the job runs. After every Join, failure and departing Leave:
//     E1. The proposed set is every ranked member still joined (or finished)
//         plus every candidate task asking to join (before the first
//         admission only the initial members count).
//     E2. When it differs from the current set (or someone is joining), the
//         coordinator is in it and `allowed_size` accepts its size, it
//         becomes the member set: joiners are admitted, failed or departed
//         members are dropped, ranks are re-numbered densely in candidate
//         order, the generation bumps, and every watcher gets an update
//         naming no failed task that lists the new members. Otherwise
//         nothing changes (a failed member is waited for, as in step 7; a
//         joiner waits in Join).
//     So a lost worker shrinks the group at once when the smaller size is
//     allowed, and its replacement (or a scale-up's new worker) grows it
//     back. Without `elastic` the only allowed set is the initial one:
//     E1-E2 are then exactly step 7.
//     A departing Leave (LeaveRequest.departing) counts as a failure for
//     the others (it ends the member's share of the group) but is named as
//     a departure.
//  8. Shutdown wakes every blocked handler; they answer UNAVAILABLE and watch
//     streams end, so the server stops promptly even with streams open.
//
// Generations: 1 when the first Join round completes; +1 per failure; +1 per
// completed re-admission.
//
// Hostile input (unknown task, empty or foreign incarnation, negative
// timeouts, oversized keys/values) is answered with INVALID_ARGUMENT or
// FAILED_PRECONDITION and a message naming the field; what requests can make
// the service hold (keys, store bytes, barrier names, blocked handlers) is
// bounded by CoordinationServiceOptions and answered RESOURCE_EXHAUSTED
// beyond; the server keeps serving.
//
// Ownership: the object owns the gRPC server and all state; destroy it (or
// call Shutdown) to stop serving. Thread-safety: all public methods are
// thread-safe; handlers run on gRPC's threads and share state under one mutex.

#include <cstdint>
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
#include "worker/coordination/grpc_keepalive.h"
#include "worker/security/transport_security.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace distrain {

struct CoordinationServiceOptions {
  // The task hosting the service; Ping reports it so clients can check they
  // reached the coordinator they expected.
  TaskId coordinator{"worker", 0};
  // Tasks that join and are watched like members but have no training rank
  // (rank -1 in JoinResponse; ps tasks of ParameterServer). They follow the
  // ranked members in JoinResponse.members.
  std::vector<TaskId> unranked;
  // Upper bound on any wait a request asks for (Join, KeyValueGet, Barrier).
  absl::Duration max_wait = absl::Hours(24);
  // Blocked handlers check this often whether their caller is gone.
  absl::Duration cancel_poll = absl::Milliseconds(50);
  // Bounds on what requests may make the service hold. Beyond one a request
  // is refused before anything is stored: INVALID_ARGUMENT for a size no
  // request may have, RESOURCE_EXHAUSTED for a budget the state would
  // exceed, the message naming the field, the value and the limit.
  // Sized from what the strategies store: per membership generation one
  // ring address per rank ("mwms/g<gen>/ring/<rank>", ~25-byte values) and
  // the chief's initial-state manifest (one line per variable: KiBs, a
  // large model's well under 1 MiB); at most a few barrier names per
  // generation; and per task at most one blocked call of each kind (Join,
  // KeyValueGet, Barrier). A 1,000-task job restarting 15 times stays well
  // inside every default.
  int64_t max_key_bytes = 4096;            // keys and barrier names
  int64_t max_value_bytes = 4 << 20;       // one value
  int64_t max_store_bytes = 64LL << 20;    // all keys + values together
  int64_t max_keys = 16384;                // distinct keys in the store
  int64_t max_barriers = 1024;             // distinct barrier names
  // Handlers blocked at once in Join, KeyValueGet or Barrier (each holds a
  // gRPC thread). 0: 4 per task of the cluster + 16.
  int64_t max_waiters = 0;
  KeepaliveOptions keepalive;
  // Mutual TLS with the job's certificates; null: plaintext. With TLS,
  // Join / WatchMembership / Barrier / Leave are accepted only from the
  // task they name, the key-value store only from members, and a key only
  // from the task that first set it (PERMISSION_DENIED otherwise).
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
  // Step E. `candidates`: every ranked task that may ever be a member, in
  // rank order (chief, then worker:0..max-1); it must contain the initial
  // members. `allowed_size(n)`: whether n ranked members may train together
  // (the elastic bounds and the global batch's divisibility).
  // Null: not elastic. (Shared and const: options are copied by value, and
  // the policy never changes once a service starts.)
  struct Elastic {
    std::vector<TaskId> candidates;
    std::function<bool(int)> allowed_size;
  };
  std::shared_ptr<const Elastic> elastic;
};

class CoordinationService {
 public:
  // Starts serving on `listen_address` ("0.0.0.0:2222", "127.0.0.3:2222";
  // port 0 picks a free port, see port()). `members` are the ranked tasks in
  // rank order (for MultiWorkerMirrored: chief, then workers; with
  // options.elastic, the initial members). Fails with
  // INVALID_ARGUMENT for an empty or duplicated member set and UNAVAILABLE
  // when the address cannot be bound.
  //
  // The default options are value-initialised, not `= {}`: GCC 12 expands a
  // braced aggregate's member initialisers at each call, and on the path where
  // a later one throws (ProcessTransportSecurity()) it warns that the
  // already-built `coordinator` may be destroyed uninitialised
  // (-Wmaybe-uninitialized, a false positive). Callers passing the defaults
  // write CoordinationServiceOptions() for the same reason.
  static absl::StatusOr<std::unique_ptr<CoordinationService>> Start(
      const std::string& listen_address, std::vector<TaskId> members,
      CoordinationServiceOptions options = CoordinationServiceOptions());

  ~CoordinationService();  // Shutdown()
  CoordinationService(const CoordinationService&) = delete;
  CoordinationService& operator=(const CoordinationService&) = delete;

  int port() const { return port_; }
  int64_t generation() const;

  // Step 6: blocks until every admitted or joining task has left or failed,
  // or `timeout` passes (DEADLINE_EXCEEDED naming who is still there).
  absl::Status WaitForAllToLeave(absl::Duration timeout);

  // Step 8: wakes blocked handlers, ends watch streams, stops the server.
  // Idempotent; returns within about a second.
  void Shutdown();

  // A channel to this service inside the process, without a socket: for
  // tests that drive its handlers directly (tests/fuzz/coordination_fuzz.cc).
  std::shared_ptr<grpc::Channel> InProcessChannel();

 private:
  class Impl;
  CoordinationService(std::unique_ptr<Impl> impl, std::unique_ptr<grpc::Server> server, int port);

  std::unique_ptr<Impl> impl_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// The address the coordinator listens on for its TF_CONFIG address
// "host:port": "0.0.0.0:port" (every interface: the TF_CONFIG name resolves
// to the pod IP), except for loopback hosts (127.x.y.z, localhost), which are
// bound exactly so that local runs can give each task its own 127.0.0.x.
// INVALID_ARGUMENT when the address has no valid port.
absl::StatusOr<std::string> CoordinatorListenAddress(const std::string& tf_address);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_COORDINATION_SERVICE_H_

#ifndef DISTRAIN_WORKER_STRATEGY_PS_MEMBERSHIP_H_
#define DISTRAIN_WORKER_STRATEGY_PS_MEMBERSHIP_H_

// The ParameterServer chief's dynamic worker set
// (proto/distrain/v1/ps_membership.proto): how the chief learns about
// workers a scale added, which the TF_CONFIG it read at start does not list,
// and about workers that left or died, so that it neither waits for nor
// probes them forever.
//
//   PsMembershipServer  served by the chief (the coordinator) on the port of
//                       its TF_CONFIG address, next to nothing else (the PS
//                       chief hosts no CoordinationService).
//   PsMembershipClient  held by every ParameterServer `worker` task.
//
// Protocol (who does what, in order):
//  1. The chief starts the server once its ClusterCoordinator exists
//     (ParameterServerStrategy::CreateVariables). The workers of its
//     TF_CONFIG are members from the start and are probed with Prepare as
//     before (cluster_coordinator.h step 1), joined or not: TensorFlow's
//     TF_CONFIG contract holds for them unchanged.
//  2. Every worker task, once it serves PsWorker, starts a client: Join
//     (worker_index, incarnation = its PsWorker incarnation, address = its
//     own TF_CONFIG address) to the chief's TF_CONFIG address, retried with
//     backoff (100 ms .. 2 s) while the chief is not up. With mutual TLS the
//     caller's certificate must be worker:<worker_index>'s (any index the job
//     CA issued, within TF_CONFIG or beyond it: the operator issues
//     certificates for the tasks a scale adds); the request's fields are
//     checked first (index in [0, max_workers), incarnation 1..128 printable
//     bytes, address host:port), INVALID_ARGUMENT naming the field and the
//     fix otherwise, and nothing is changed.
//  3. The server records the member, bumps the generation and tells the
//     chief (on_change: kJoined with the address and incarnation); the
//     chief points its transport at the address and the coordinator probes
//     the worker (Prepare) and admits it: closures run on it within the
//     probe backoff. The first stream message confirms (generation, number
//     of members); the worker holds the stream open for the life of its
//     process.
//  4. A Join for a worker index that already has a member replaces it: the
//     old stream ends with ABORTED, and its client does not join again. A different incarnation (the process was
//     restarted, its pod replaced) is reported as kFailed for the old one
//     ("replaced by a new process"), then kJoined; the same incarnation (a
//     reconnect after a broken connection) only as kJoined again.
//  5. Leave(worker_index, incarnation), sent by a worker that stops cleanly
//     (SIGTERM, e.g. a scaled-down pod): the member is removed, reported as
//     kLeft, and its stream ends with OK. The worker first stops taking
//     closures (RunStep answers UNAVAILABLE: the coordinator re-queues it),
//     lets the one in flight finish and answer, then exits. A Leave naming
//     another incarnation than the member's, or no member, changes nothing
//     (OK: it is idempotent).
//  6. A stream that ends otherwise (the process died, its connection broke,
//     keepalive found its host gone: 2 s + 2 s) removes the member, reported
//     as kFailed with the reason. The coordinator re-queues the closure that
//     worker was running (at-least-once, cluster_coordinator.h step 4) and,
//     unlike a TF_CONFIG worker that never joined, does not probe it again:
//     it comes back only by joining (step 3), which a restarted process does.
//  7. A worker's stream that ends with UNAVAILABLE (the chief stopped or
//     restarted) makes the client join again with backoff, so a restarted
//     chief learns every live worker, scaled ones included, at once.
//  8. Shutdown (the chief is done): streams end with UNAVAILABLE, no more
//     changes are reported.
//
// Generations: 0 before any change; +1 per join, leave or failure.
//
// Ownership: the server owns its gRPC server and state; on_change is called
// with the server's lock held, in the order of the changes, so what it calls
// must never call back into the server (the coordinator does not). The
// client owns its channel and its stream thread. Thread-safety: every public
// method of both is thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/coordination/grpc_keepalive.h"
#include "worker/security/transport_security.h"

namespace grpc {
class Channel;
class ClientContext;
class Server;
}  // namespace grpc

namespace distrain {

// One change of the set, as on_change reports it.
struct PsMembershipChange {
  enum class Kind { kJoined, kLeft, kFailed };
  Kind kind = Kind::kJoined;
  int worker = 0;
  std::string address;      // kJoined: where the worker serves PsWorker
  std::string incarnation;
  std::string reason;       // kLeft / kFailed, for logs
  int64_t generation = 0;   // after the change
};

struct PsMembershipServerOptions {
  // Worker indexes accepted: [0, max_workers). The operator's identity
  // Secret holds certificates for about 1,100 tasks, so a larger job cannot
  // exist; the bound keeps a plaintext job's chief from holding a stream per
  // arbitrary index.
  int max_workers = 4096;
  // Blocked stream handlers check this often whether their worker is gone.
  absl::Duration cancel_poll = absl::Milliseconds(50);
  KeepaliveOptions keepalive;
  // Mutual TLS: Join and Leave only from worker:<worker_index> itself.
  // Null: plaintext.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
  // Called for every change, in order, with the server's lock held.
  std::function<void(const PsMembershipChange&)> on_change;
};

// PsJoinRequest.address: "host:port" with a DNS name, an IPv4 address or a
// bracketed IPv6 address as host and a port in 1..65535. The error names the
// field, the value (cut to 64 bytes) and the fix.
absl::Status ValidatePsWorkerAddress(const std::string& address);

class PsMembershipServer {
 public:
  // Serves on `listen_address` (CoordinatorListenAddress of the chief's
  // TF_CONFIG address; "127.0.0.1:0" picks a free port, see port()).
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<PsMembershipServer>> Start(
      const std::string& listen_address, PsMembershipServerOptions options);
  ~PsMembershipServer();  // Shutdown()
  PsMembershipServer(const PsMembershipServer&) = delete;
  PsMembershipServer& operator=(const PsMembershipServer&) = delete;

  int port() const { return port_; }
  int64_t generation() const;
  // Worker index -> address of the current members.
  std::map<int, std::string> members() const;
  // Step 8. Idempotent; returns within about a second.
  void Shutdown();

 private:
  class Impl;
  PsMembershipServer(std::unique_ptr<Impl> impl, std::unique_ptr<grpc::Server> server, int port);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

struct PsMembershipClientOptions {
  std::string chief_address;  // the chief's TF_CONFIG address
  int worker_index = 0;
  std::string incarnation;    // the worker's PsWorker incarnation
  std::string address;        // the worker's own TF_CONFIG address
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  absl::Duration rpc_timeout = absl::Seconds(5);  // Leave
  KeepaliveOptions keepalive;
  // Mutual TLS as worker:<worker_index>, expecting chief:0's certificate.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
};

class PsMembershipClient {
 public:
  explicit PsMembershipClient(PsMembershipClientOptions options);
  ~PsMembershipClient();  // Stop()
  PsMembershipClient(const PsMembershipClient&) = delete;
  PsMembershipClient& operator=(const PsMembershipClient&) = delete;

  // Steps 2, 3 and 7 on a thread of its own. Call once.
  void Start();
  // Step 5: no more rejoins; Leave, then the stream ends. Best effort (the
  // chief may be gone): the error is returned for the log.
  absl::Status Leave();
  // Ends the stream without Leave (to the chief: a failure, unless Leave
  // came first) and joins the thread. Idempotent.
  void Stop();

  // Whether the stream is open and confirmed now; how many times it was.
  bool joined() const { return joined_.load(); }
  int64_t joins() const { return joins_.load(); }
  // A Join the chief refused for good (INVALID_ARGUMENT,
  // PERMISSION_DENIED, UNAUTHENTICATED; ABORTED: a newer process of this
  // task replaced this one, step 4): the client stops retrying. OK else.
  absl::Status refused() const;

 private:
  void Loop();

  const PsMembershipClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> joined_{false};
  std::atomic<int64_t> joins_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_PS_MEMBERSHIP_H_

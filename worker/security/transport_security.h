#ifndef DISTRAIN_WORKER_SECURITY_TRANSPORT_SECURITY_H_
#define DISTRAIN_WORKER_SECURITY_TRANSPORT_SECURITY_H_

// TransportSecurity: this process's side of job authentication
// (docs/security.md). It holds the task's credentials (common/job_identity.h)
// and turns them into what gRPC and the ring need:
//   - servers: TLS with the task's certificate, client certificates required
//     and verified against the job CA only (not the system store);
//   - clients: TLS with the task's certificate as client certificate,
//     trusting only the job CA, and expecting the dialled task's name
//     (TaskServerName) in the server's certificate, so a stream to ps:1 is
//     really to ps:1, whatever the Service name resolves to;
//   - servers' handlers: the calling task, from the verified certificate
//     (CallerTask / CheckCaller), for the role checks of each service;
//   - the ring: the job's 256-bit key for its HMAC handshake
//     (worker/collective/ring.h).
// A null TransportSecurity means plaintext: no TLS, no caller identities,
// the ring's MACs keyed with the empty key. Only the explicit opt-out
// (spec.security.transport: Plaintext) and in-process tests run so.
//
// The process's own security is installed once by the worker's main (before
// any strategy starts) and read by the default member initialisers of the
// option structs of every server and client, so strategies need no
// plumbing; tests that run several tasks in one process set the option
// fields per task instead.
//
// Immutable after creation; thread-safe. The process-wide slot is set
// before threads start and read-only afterwards.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/cluster_spec.h"
#include "common/job_identity.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerContext;
class ServerCredentials;
class Status;
}  // namespace grpc

namespace distrain {

class TransportSecurity {
 public:
  explicit TransportSecurity(LoadedCredentials credentials);

  const TaskId& self() const { return credentials_.task; }
  // 32 raw bytes.
  const std::string& ring_key() const { return credentials_.ring_key; }
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

 private:
  const LoadedCredentials credentials_;
};

// Server credentials: TLS as above, or insecure for null.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TransportSecurity* security);
// Channel credentials to dial `server`, adding the expected server name to
// `args` (TLS), or insecure for null.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TransportSecurity* security,
                                                                const TaskId& server,
                                                                grpc::ChannelArguments* args);

// The task whose verified client certificate carries this call; nullopt on
// a plaintext or in-process channel.
std::optional<TaskId> CallerTask(const grpc::ServerContext& ctx);

// A handler's role check. With `security` null (plaintext) everything
// passes: there is no identity to check. Otherwise the caller's certificate
// must name a task `allowed` accepts; else PERMISSION_DENIED naming the
// caller, the method and `who_may` ("only the chief"), or UNAUTHENTICATED
// when the call carries no certificate (an in-process channel).
grpc::Status CheckCaller(const TransportSecurity* security, const grpc::ServerContext& ctx,
                         std::string_view method, const std::function<bool(const TaskId&)>& allowed,
                         std::string_view who_may);
// The common case: the caller must be `task` itself (Join/Leave/Watch as
// yourself).
grpc::Status CheckCallerIs(const TransportSecurity* security, const grpc::ServerContext& ctx,
                           std::string_view method, const TaskId& task);

// The process's credentials (null: plaintext, the default until main sets it).
void SetProcessTransportSecurity(std::shared_ptr<const TransportSecurity> security);
std::shared_ptr<const TransportSecurity> ProcessTransportSecurity();

}  // namespace distrain

#endif  // DISTRAIN_WORKER_SECURITY_TRANSPORT_SECURITY_H_

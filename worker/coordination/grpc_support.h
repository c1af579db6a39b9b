#ifndef DISTRAIN_WORKER_COORDINATION_GRPC_SUPPORT_H_
#define DISTRAIN_WORKER_COORDINATION_GRPC_SUPPORT_H_

// What every gRPC server and client of a job shares: status conversion
// between absl (the code's) and gRPC (the wire's), and the channel arguments
// of a job's channels. Credentials are worker/security/transport_security.h,
// keepalive worker/coordination/grpc_keepalive.h.
//
// Stateless functions; thread-safe.

#include "absl/status/status.h"

namespace grpc {
class ChannelArguments;
class Status;
}  // namespace grpc

namespace distrain {

// The codes are the same numbers in both (both follow google.rpc.Code).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Reconnect and re-resolve quickly: a peer pod's DNS name may appear a few
// seconds after this process starts, and a restarted peer is back within a
// second or two; gRPC's defaults (20 s connect backoff floor, growing to
// 120 s, 30 s between resolutions) would stretch either to minutes. Backoff
// 100 ms .. 1 s, DNS re-resolution at most every 500 ms, and a subchannel
// pool of the channel's own, so that channels of one process (tests run
// several tasks in one) never share a connection.
void ApplyJobChannelArgs(grpc::ChannelArguments* args);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_GRPC_SUPPORT_H_

#ifndef DISTRAIN_WORKER_COORDINATION_GRPC_KEEPALIVE_H_
#define DISTRAIN_WORKER_COORDINATION_GRPC_KEEPALIVE_H_

// HTTP/2 keepalive settings for distrain's gRPC servers and channels.
//
// Why: a process that dies closes its sockets and the peer learns at once, but
// a host that vanishes (node lost, network partition) sends no FIN/RST, and an
// idle HTTP/2 connection would look healthy for the kernel's ~2 h TCP
// keepalive. Pinging every `time` and giving up after `timeout` without an
// ack bounds detection to about time + timeout. Both sides must agree: the
// server must accept pings that often (or it answers GOAWAY
// "too_many_pings"), so the server side sets its minimum accepted ping
// interval below the client's `time` and disables ping strikes.
//
// Stateless functions; thread-safe.

#include "absl/time/time.h"

namespace grpc {
class ChannelArguments;
class ServerBuilder;
}  // namespace grpc

namespace distrain {

struct KeepaliveOptions {
  absl::Duration time = absl::Seconds(2);     // ping after this long without reads
  absl::Duration timeout = absl::Seconds(2);  // connection is dead if no ack by then
};

// Client side: keepalive pings (also without active calls), and reconnect
// backoff bounded to 100 ms .. 2 s so a coordinator that comes up late is
// found quickly.
void ApplyKeepalive(const KeepaliveOptions& options, grpc::ChannelArguments* args);
// Server side: the same pings towards clients, and acceptance of the
// clients' pings at the configured rate.
void ApplyKeepalive(const KeepaliveOptions& options, grpc::ServerBuilder* builder);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_GRPC_KEEPALIVE_H_

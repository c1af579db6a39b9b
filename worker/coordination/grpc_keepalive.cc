#include "worker/coordination/grpc_keepalive.h"

#include <algorithm>

#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace distrain {
namespace {

int Ms(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, 1 << 30));
}

}  // namespace

void ApplyKeepalive(const KeepaliveOptions& options, grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(options.time));
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(options.timeout));
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // unlimited
  args->SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args->SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args->SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
}

void ApplyKeepalive(const KeepaliveOptions& options, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(options.time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(options.timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Accept client pings up to twice as often as our own clients send them.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              std::max(1, Ms(options.time) / 2));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // never GOAWAY for pings
}

}  // namespace distrain

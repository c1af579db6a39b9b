#ifndef DISTRAIN_TESTS_FUZZ_GRPC_RAW_H_
#define DISTRAIN_TESTS_FUZZ_GRPC_RAW_H_

// What the fuzz targets that drive a real gRPC service in-process share:
// sending fuzz bytes as a request body without a proto (so the server's own
// parsing sees them), and silencing the logs every refused request writes.
// Header-only; stateless.

#include <memory>
#include <string_view>

#include "google/protobuf/stubs/logging.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "spdlog/spdlog.h"

namespace distrain::fuzz {

inline grpc::ByteBuffer RawBytes(std::string_view bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// A unary call of `path` ("/distrain.v1.Service/Method") with `bytes` as the
// request; the status and response are of no interest (the target checks
// the server survives and stays consistent).
inline void RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const char* path,
                         grpc::ClientContext* ctx, std::string_view bytes) {
  const grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::NORMAL_RPC, channel);
  grpc::ByteBuffer response;
  (void)grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, ctx, RawBytes(bytes), &response);
}

// For LLVMFuzzerInitialize: the handlers log every refused request, and
// protobuf every string that is not UTF-8.
inline void SilenceServiceLogs() {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);
}

}  // namespace distrain::fuzz

#endif  // DISTRAIN_TESTS_FUZZ_GRPC_RAW_H_

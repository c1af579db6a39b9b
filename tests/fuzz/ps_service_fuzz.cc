// Fuzz target: a parameter server's request handling (worker/ps/ps_service.h
// PsService), everything a ps task accepts from whoever reaches its port:
// CreateVariables (the request's bytes parsed as protobuf and handed to the
// handler), and Initialize, Push, Pull, Save, Restore with raw message bytes
// through gRPC's in-process channel (no socket), so the upload assembly,
// the limits (PsLimits) and apply run exactly as for a remote client.
//
// Input (fuzz_input.h): an operation byte, then messages.
//   op % 6 == 0  CreateVariables on a fresh ps (the request is the rest)
//             1  Initialize, one stream message per input message
//             2  Push, likewise
//             3  Pull, the request is the first message
//             4  Save, 5 Restore (requests as messages; this ps has no
//                checkpoint directory, so they must refuse cleanly)
// Initialize/Push/Pull go to one ps per fuzzing process that hosts a fixed
// set of shards, declared and initialised at start-up (below): a trainable
// kernel [4, 3] and bias [3], one shard of a kernel split in two [2..4, 3],
// and a non-trainable moving mean [3]. Their values change from input to
// input; nothing else does. Corpus: tests/fuzz/corpus/ps_service/ (streams
// as PsClient sends them, from make_seeds.cc).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "distrain/v1/parameter_server.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/grpc_raw.h"
#include "tests/fuzz/ps_messages.h"
#include "worker/ps/ps_service.h"

namespace {

using distrain::v1::CreateVariablesRequest;

// The shards every seed refers to (make_seeds.cc writes the same).
CreateVariablesRequest HostedShards() {
  CreateVariablesRequest request;
  auto add = [&request](const char* variable, int shard, int num_shards,
                        std::initializer_list<int64_t> full_shape, int64_t begin, int64_t end,
                        bool trainable) {
    distrain::v1::ShardSpec* s = request.add_shards();
    s->set_variable(variable);
    s->set_shard(shard);
    s->set_num_shards(num_shards);
    for (int64_t d : full_shape) s->add_full_shape(d);
    s->set_row_begin(begin);
    s->set_row_end(end);
    s->set_non_trainable(!trainable);
  };
  add("dense/kernel", 0, 1, {4, 3}, 0, 4, true);
  add("dense/bias", 0, 1, {3}, 0, 3, true);
  add("dense_1/kernel", 1, 2, {4, 3}, 2, 4, true);
  add("batch_normalization/moving_mean", 0, 1, {3}, 0, 3, false);
  return request;
}

distrain::PsServiceOptions Options() {
  distrain::PsServiceOptions options;
  options.chunk_bytes = 16;  // several chunks per shard in Pull
  // Small budgets: what a fuzzed CreateVariables may declare stays cheap.
  options.limits.max_hosted_bytes = 1 << 20;
  options.limits.max_staging_bytes = 1 << 20;
  return options;
}

struct Server {
  std::unique_ptr<distrain::PsService> service;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

Server& Shared() {
  static Server* s = [] {
    auto* s = new Server;
    absl::StatusOr<std::unique_ptr<distrain::PsService>> service =
        distrain::PsService::Create(Options());
    if (!service.ok()) abort();
    s->service = std::move(*service);
    grpc::ServerBuilder builder;
    builder.RegisterService(s->service.get());
    builder.SetMaxReceiveMessageSize(
        static_cast<int>(s->service->options().limits.max_message_bytes));
    s->server = builder.BuildAndStart();
    if (s->server == nullptr) abort();
    s->channel = s->server->InProcessChannel(grpc::ChannelArguments());
    grpc::ServerContext ctx;
    const CreateVariablesRequest request = HostedShards();
    distrain::v1::CreateVariablesResponse response;
    if (!s->service->CreateVariables(&ctx, &request, &response).ok()) abort();
    return s;
  }();
  return *s;
}

void Upload(const char* path, distrain::fuzz::FuzzInput& in);

// Values for the hosted shards, once, so that Push and Pull find them initialised.
void InitializeShared() {
  static const bool done = [] {
    std::string stream;
    for (const std::string& m : distrain::fuzz::UploadStream(true, -1, 4, 0.5f)) {
      stream += distrain::fuzz::EncodeMessage(m);
    }
    distrain::fuzz::FuzzInput in(reinterpret_cast<const uint8_t*>(stream.data()), stream.size());
    Upload("/distrain.v1.ParameterServer/Initialize", in);
    return true;
  }();
  (void)done;
}

void Upload(const char* path, distrain::fuzz::FuzzInput& in) {
  Server& s = Shared();
  const grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::CLIENT_STREAMING,
                                         s.channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(s.channel.get(), method, &ctx,
                                                                   &response));
  for (int i = 0; !in.empty() && i < 64; ++i) {
    if (!writer->Write(distrain::fuzz::RawBytes(in.Message()))) break;  // the ps answered early
  }
  writer->WritesDone();
  (void)writer->Finish();
}

void Pull(distrain::fuzz::FuzzInput& in) {
  Server& s = Shared();
  const grpc::internal::RpcMethod method("/distrain.v1.ParameterServer/Pull",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, s.channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(s.channel.get(), method, &ctx,
                                                                   distrain::fuzz::RawBytes(in.Message())));
  grpc::ByteBuffer message;
  distrain::ps_wire::Frame frame;
  while (reader->Read(&message)) {
    if (!frame.Parse(message).ok()) abort();  // the ps must send what its own client reads
  }
  (void)reader->Finish();
}

void Unary(const char* path, std::string_view bytes) {
  Server& s = Shared();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  distrain::fuzz::RawUnaryCall(s.channel, path, &ctx, bytes);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  distrain::fuzz::SilenceServiceLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  InitializeShared();
  distrain::fuzz::FuzzInput in(data, size);
  switch (in.Byte() % 6) {
    case 0: {
      absl::StatusOr<std::unique_ptr<distrain::PsService>> ps =
          distrain::PsService::Create(Options());
      if (!ps.ok()) abort();
      CreateVariablesRequest request;
      const std::string_view rest = in.Rest();
      if (!request.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) return 0;
      grpc::ServerContext ctx;
      distrain::v1::CreateVariablesResponse response;
      (void)(*ps)->CreateVariables(&ctx, &request, &response);
      // Declaring the same shards again must be idempotent or refused, never crash.
      (void)(*ps)->CreateVariables(&ctx, &request, &response);
      break;
    }
    case 1: Upload("/distrain.v1.ParameterServer/Initialize", in); break;
    case 2: Upload("/distrain.v1.ParameterServer/Push", in); break;
    case 3: Pull(in); break;
    case 4: Unary("/distrain.v1.ParameterServer/Save", in.Message()); break;
    case 5: Unary("/distrain.v1.ParameterServer/Restore", in.Message()); break;
  }
  return 0;
}

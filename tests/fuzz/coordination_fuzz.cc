// Fuzz target: the coordination service's request handling
// (worker/coordination/coordination_service.h), what every task — or
// anything that reaches the coordinator's port — sends it: Join,
// WatchMembership, KeyValueSet/Get, Barrier, Leave, Ping. Each input gets a
// fresh service (members worker:0, worker:1; unranked ps:0) and drives its
// handlers through gRPC's in-process channel (no socket), request bytes
// exactly as they arrive from the network.
// Input (fuzz_input.h): up to 12 calls, each an operation byte (% 7: Join,
// WatchMembership, KeyValueSet, KeyValueGet, Barrier, Leave, Ping) and a
// message, the request. Join, WatchMembership and Barrier block until
// others arrive, so they run on their own threads, as tasks would; every
// wait is capped at 20 ms by the service's max_wait, so an input finishes
// quickly. Small budgets (16 keys, 4 KiB of store, 8 barriers, 6 waiters)
// put the RESOURCE_EXHAUSTED paths within reach. Corpus:
// tests/fuzz/corpus/coordination/ (a rendezvous as the strategies run it,
// from make_seeds.cc).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distrain/v1/coordination.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/grpc_raw.h"
#include "worker/coordination/coordination_service.h"

namespace {

constexpr const char* kMethods[] = {
    "/distrain.v1.Coordination/Join",        "/distrain.v1.Coordination/WatchMembership",
    "/distrain.v1.Coordination/KeyValueSet", "/distrain.v1.Coordination/KeyValueGet",
    "/distrain.v1.Coordination/Barrier",     "/distrain.v1.Coordination/Leave",
    "/distrain.v1.Coordination/Ping"};

void Call(const std::shared_ptr<grpc::Channel>& channel, int op, const std::string& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  if (op == 1) {  // server streaming: read what comes until the stream ends or the deadline
    const grpc::internal::RpcMethod method(kMethods[op],
                                           grpc::internal::RpcMethod::SERVER_STREAMING, channel);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method,
                                                                     &ctx, distrain::fuzz::RawBytes(request)));
    grpc::ByteBuffer update;
    for (int i = 0; i < 4 && reader->Read(&update); ++i) {
    }
    ctx.TryCancel();  // the watcher goes away, as a dying task's stream does
    (void)reader->Finish();
    return;
  }
  distrain::fuzz::RawUnaryCall(channel, kMethods[op], &ctx, request);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  distrain::fuzz::SilenceServiceLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  distrain::CoordinationServiceOptions options;
  options.coordinator = {"worker", 0};
  options.unranked = {{"ps", 0}};
  options.max_wait = absl::Milliseconds(20);
  options.cancel_poll = absl::Milliseconds(2);
  options.max_key_bytes = 256;
  options.max_value_bytes = 1024;
  options.max_store_bytes = 4096;
  options.max_keys = 16;
  options.max_barriers = 8;
  options.max_waiters = 6;
  absl::StatusOr<std::unique_ptr<distrain::CoordinationService>> service =
      distrain::CoordinationService::Start("127.0.0.1:0", {{"worker", 0}, {"worker", 1}}, options);
  if (!service.ok()) abort();
  std::shared_ptr<grpc::Channel> channel = (*service)->InProcessChannel();
  distrain::fuzz::FuzzInput in(data, size);
  std::vector<std::thread> blocked;
  for (int call = 0; call < 12 && !in.empty(); ++call) {
    const int op = in.Byte() % 7;
    std::string request(in.Message());
    if (op == 0 || op == 1 || op == 4) {
      blocked.emplace_back(Call, channel, op, std::move(request));
    } else {
      Call(channel, op, request);
    }
  }
  for (std::thread& t : blocked) t.join();
  (*service)->Shutdown();
  return 0;
}

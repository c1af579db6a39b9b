// Fuzz target: a ParameterServer worker's PsWorker service
// (worker/strategy/ps_worker.h PsWorkerService), what the chief's
// coordinator — or anything that reaches the worker's port — sends it:
// Prepare, RunStep and Finish, each request parsed from the input as
// protobuf and handed to the handler in-process, one fresh worker per input.
// Input (fuzz_input.h): up to 8 calls, each an operation byte (% 3:
// Prepare, RunStep, Finish) and a message, the request. The worker is
// worker:0 of a job with one ps at 127.0.0.1:1 (nothing listens on ports 1-4: a
// Prepare that passes every check fails connecting, after 50 ms) and the
// examples/parameter-server.yaml model on 64 synthetic features.
// Corpus: tests/fuzz/corpus/ps_worker/ (the coordinator's requests, from
// make_seeds.cc).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cluster_spec.h"
#include "common/job_config.h"
#include "distrain/v1/ps_worker.pb.h"
#include "grpcpp/server_context.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/grpc_raw.h"
#include "worker/strategy/ps_worker.h"

namespace {

constexpr char kJob[] = R"(apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata:
  name: fuzz
spec:
  strategy: ParameterServer
  replicaSpecs:
    Chief:
      replicas: 1
    Worker:
      replicas: 2
    PS:
      replicas: 1
  training:
    model:
      hiddenUnits: [128]
    dataset:
      type: synthetic
      numExamples: 256
      numFeatures: 64
      numClasses: 10
    globalBatchSize: 64
    steps: 10
)";

const distrain::PsWorkerOptions& Options() {
  static const distrain::PsWorkerOptions* options = [] {
    auto* o = new distrain::PsWorkerOptions;
    absl::StatusOr<distrain::JobConfig> config = distrain::ParseJobYaml(kJob);
    if (!config.ok()) abort();
    o->config = *config;
    absl::StatusOr<distrain::ClusterSpec> cluster = distrain::ClusterSpec::Create(
        {{"chief", {"127.0.0.1:2"}}, {"worker", {"127.0.0.1:3", "127.0.0.1:4"}},
         {"ps", {"127.0.0.1:1"}}},
        {"worker", 0});
    if (!cluster.ok()) abort();
    o->cluster = *cluster;
    // The default limits: Prepare builds the model only for the shape of
    // this worker's own examples (64 features here), so the dimensions a
    // request names cannot make it allocate (the old regression
    // regression-prepare-allocates-before-fingerprint asked for 6.5 GB).
    o->ps_connect_timeout = absl::Milliseconds(50);
    o->ps_rpc_timeout = absl::Milliseconds(50);
    return o;
  }();
  return *options;
}

template <typename Request>
bool Parse(std::string_view bytes, Request* request) {
  return request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  distrain::fuzz::SilenceServiceLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  distrain::fuzz::FuzzInput in(data, size);
  distrain::PsWorkerService worker(Options());
  for (int call = 0; call < 8 && !in.empty(); ++call) {
    const uint8_t op = in.Byte() % 3;
    const std::string_view bytes = in.Message();
    grpc::ServerContext ctx;
    if (op == 0) {
      distrain::v1::PrepareRequest request;
      distrain::v1::PrepareResponse response;
      if (Parse(bytes, &request)) (void)worker.Prepare(&ctx, &request, &response);
    } else if (op == 1) {
      distrain::v1::RunStepRequest request;
      distrain::v1::RunStepResponse response;
      if (Parse(bytes, &request)) (void)worker.RunStep(&ctx, &request, &response);
    } else {
      distrain::v1::FinishRequest request;
      distrain::v1::FinishResponse response;
      if (Parse(bytes, &request)) (void)worker.Finish(&ctx, &request, &response);
    }
  }
  return 0;
}

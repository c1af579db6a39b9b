#ifndef DISTRAIN_WORKER_STRATEGY_PS_WORKER_H_
#define DISTRAIN_WORKER_STRATEGY_PS_WORKER_H_

// The non-chief roles of a ParameterServer job (see parameter_server.h) and
// the chief's client of the PsWorker protocol (proto/distrain/v1/ps_worker.proto):
//
//   RunParameterServerTask  a `ps` task: serves PsService on its TF_CONFIG
//                           address until stopped (SIGTERM/SIGINT), then exits 0.
//   RunPsWorkerTask         a `worker` task: serves PsWorkerService on its
//                           TF_CONFIG address and joins the chief's worker
//                           set (ps_membership.h) until the coordinator says
//                           Finish (exit 0) or the process is stopped
//                           (SIGTERM: it leaves the set, finishes the
//                           closure in flight, exits 143).
//   GrpcWorkerTransport     the coordinator's WorkerTransport over gRPC.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/job_config.h"
#include "distrain/v1/ps_worker.grpc.pb.h"
#include "prometheus/registry.h"
#include "worker/data/batcher.h"
#include "worker/model/model.h"
#include "worker/ps/ps_client.h"
#include "worker/security/transport_security.h"
#include "worker/strategy/cluster_coordinator.h"
#include "worker/strategy/parameter_server.h"

namespace grpc {
class ClientContext;
class Server;
}  // namespace grpc

namespace distrain {

// Bounds on what the PsWorker service takes from the network (the
// coordinator's requests); beyond one a request is INVALID_ARGUMENT naming
// the field, the value and the limit, before the worker builds anything.
// Sized from the inputs distrain trains on: MNIST examples are [28, 28, 1]
// (784 features), an ImageNet-sized image [224, 224, 3] is 150,528, and
// classification heads have at most tens of thousands of classes.
struct PsWorkerLimits {
  // One gRPC message: every PsWorker request is a few hundred bytes.
  int64_t max_message_bytes = 64 << 10;
  int64_t max_example_rank = 8;            // PrepareRequest.example_shape dimensions
  int64_t max_features = int64_t{1} << 24;  // PrepareRequest.num_features (16 M floats)
  int64_t max_classes = int64_t{1} << 20;   // PrepareRequest.num_classes
  int64_t max_fingerprint_bytes = 256;      // PrepareRequest.plan_fingerprint
};

struct PsWorkerOptions {
  JobConfig config;
  ClusterSpec cluster;  // this task must be worker:<index>
  // Each RPC to a ps; a hung ps fails the closure instead of hanging it.
  absl::Duration ps_rpc_timeout = absl::Seconds(60);
  // Prepare waits this long for every ps to answer.
  absl::Duration ps_connect_timeout = absl::Seconds(20);
  prometheus::Registry* registry = nullptr;  // optional: ps client metrics
  PsWorkerLimits limits;
  // Mutual TLS: the service answers only the chief's certificate, and the
  // worker's ps client dials as this task. Null: plaintext.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
};

// gRPC PsWorker service of one worker task.
//
// Prepare builds (once; later calls with the same model are no-ops) the model
// from the coordinator's dimensions, checks the ShardingPlan fingerprint,
// connects a PsClient and opens this worker's data shard: shard <index> of
// <#workers>, batches of globalBatchSize, prefetched. RunStep pulls every
// variable into the model, computes gradients on the next batch and pushes
// them with the versions pulled. Non-trainable variables (BatchNormalization's
// moving statistics, which the forward pass moves) are pulled with the
// others and pushed as deltas, value after the step - value pulled, which
// the ps adds to whatever it holds by then (TensorFlow's assign_moving_average
// on a ps variable). When staleness is unbounded this is
// pipelined by layer: a helper thread pulls the layers in forward order while
// the forward pass computes the layers already pulled, and each layer's
// gradients are pushed while backward continues below it, a Dense kernel's as
// its factors (input^T d(output): at 32 examples a 1024x1024 kernel's
// gradient is 16x smaller that way, and the ps forms it; RunStepResponse's
// pull_seconds is then the time forward waited for parameters, push_seconds
// what was left of the pushes after backward). With
// spec.training.maxStaleness set everything happens all at once (a
// push the ps rejects for staleness is redone from a fresh pull on the same
// batch, up to kMaxStaleRetries times; the deltas follow in a second push
// once the gradients were taken, so a redone closure updates the moving
// statistics once). Only
// one RunStep runs at a time (a call arriving while one runs waits).
// Thread-safety: handlers run on gRPC threads; state is under mu_.
class PsWorkerService final : public distrain::v1::PsWorker::Service {
 public:
  static constexpr int kMaxStaleRetries = 1000;

  explicit PsWorkerService(PsWorkerOptions options);
  ~PsWorkerService() override;

  grpc::Status Prepare(grpc::ServerContext* ctx, const distrain::v1::PrepareRequest* request,
                       distrain::v1::PrepareResponse* response) override;
  grpc::Status RunStep(grpc::ServerContext* ctx, const distrain::v1::RunStepRequest* request,
                       distrain::v1::RunStepResponse* response) override;
  grpc::Status Finish(grpc::ServerContext* ctx, const distrain::v1::FinishRequest* request,
                      distrain::v1::FinishResponse* response) override;

  // Set once Finish was called; the task then exits.
  bool finished() const { return finished_.load(); }
  // A stopping worker (SIGTERM; ps_membership.h step 5): from now on
  // Prepare and RunStep answer UNAVAILABLE ("leaving"), which the
  // coordinator treats as a lost worker (the closure is re-queued).
  void BeginLeaving() { leaving_.store(true); }
  // Returns once no closure is running here (the one in flight has answered
  // or will as soon as gRPC sends it).
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
  }
  const std::string& incarnation() const { return incarnation_; }
  const PsWorkerOptions& options() const { return options_; }

 private:
  grpc::Status CheckChief(const grpc::ServerContext& ctx, std::string_view method) const;
  grpc::Status Leaving() const;
  absl::Status PrepareLocked(const distrain::v1::PrepareRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One closure on `batch`; errors are the ps's. Unbounded staleness: each
  // layer's forward starts once its parameters have arrived, while the rest
  // of the pull streams; one push after backward, kernels as factors. With a
  // bound: pull, compute, one all-or-nothing push, redone from a fresh pull
  // when rejected.
  StepContext StepContextOf(const distrain::v1::RunStepRequest& request) const;
  absl::Status RunStepOverlapped(const Batch& batch, const StepContext& step,
                                 distrain::v1::RunStepResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RunStepBounded(const Batch& batch, const StepContext& step,
                              distrain::v1::RunStepResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A non-trainable variable of the model (BatchNormalization's moving
  // statistics): pulled with the parameters, moved by the forward pass,
  // pushed as delta = value after the step - value pulled.
  struct StateVariable {
    Parameter* variable;  // in model_
    Tensor pulled;        // the value as pulled, before the forward pass moved it
    Tensor delta;         // what is pushed
  };
  // v.pulled = the variable's current (just pulled) value.
  static void SnapshotPulledState(StateVariable& v);
  // Forms every state variable's delta and appends it to `pushes`.
  void AppendStateDeltas(std::vector<TensorRef>* pushes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PsWorkerOptions options_;
  const int worker_index_;
  const int num_workers_;
  const std::string incarnation_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> leaving_{false};

  absl::Mutex mu_;
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  int num_features_ ABSL_GUARDED_BY(mu_) = 0;
  int num_classes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string fingerprint_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Model> model_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PsClient> ps_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<BatchSource> batches_ ABSL_GUARDED_BY(mu_);
  // Into model_: every variable of the plan, trainable and not, in forward order.
  std::vector<MutableTensorRef> values_ ABSL_GUARDED_BY(mu_);
  std::vector<TensorRef> grads_ ABSL_GUARDED_BY(mu_);          // into model_
  std::vector<std::vector<TensorRef>> layer_grads_ ABSL_GUARDED_BY(mu_);  // grads_ by layer
  std::vector<int> layer_shards_ ABSL_GUARDED_BY(mu_);  // ps shards of each layer's variables
  std::map<std::string, int> variable_layer_ ABSL_GUARDED_BY(mu_);  // variable -> layer
  std::vector<StateVariable> state_ ABSL_GUARDED_BY(mu_);  // model_->state_variables() order
  std::vector<std::vector<int>> layer_state_ ABSL_GUARDED_BY(mu_);  // state_ indices by layer
  int64_t steps_run_ ABSL_GUARDED_BY(mu_) = 0;
  double pull_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // totals over steps_run_, for the final log
  double compute_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double push_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

// Client side: one channel per worker task, TF_CONFIG's from the start and
// more as workers join the chief's worker set (SetWorkerAddress).
// Classification of RunStep: a transport error (or a worker that answers an
// error) is kWorkerLost; an answer with ps_error set is kFatal, unless its
// code says the ps is fine (it never does today: every ps error is fatal).
// Thread-safety: see WorkerTransport.
class GrpcWorkerTransport : public WorkerTransport {
 public:
  struct Options {
    ModelDims dims;
    std::string plan_fingerprint;
    absl::Duration step_timeout = absl::Seconds(60);      // one RunStep
    absl::Duration prepare_timeout = absl::Seconds(30);   // one Prepare
    // Mutual TLS as the chief; worker i must present worker:i's
    // certificate. Null: plaintext.
    std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
  };
  GrpcWorkerTransport(std::vector<std::string> worker_addresses, Options options);
  ~GrpcWorkerTransport() override;

  // TF_CONFIG's workers (the coordinator's members at Start).
  int num_workers() const override { return initial_workers_; }
  // Where worker `worker` serves (a worker that joined the chief's worker
  // set, ps_membership.h): a new channel when the address is new or
  // different, else nothing. Calls already under way keep their channel.
  void SetWorkerAddress(int worker, const std::string& address);
  std::string WorkerName(int worker) const override;
  absl::StatusOr<std::string> Prepare(int worker) override;
  ClosureOutcome RunStep(int worker, int64_t closure_id, int attempt) override;
  void Finish(int worker) override;
  void Cancel() override;

 private:
  // Registers ctx so Cancel can reach it; false when already cancelled.
  bool Track(grpc::ClientContext* ctx);
  void Untrack(grpc::ClientContext* ctx);
  // The worker's stub; null when no address is known for it.
  std::shared_ptr<distrain::v1::PsWorker::Stub> Stub(int worker) const;

  const int initial_workers_;
  const Options options_;

  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // "" where unknown
  std::vector<std::shared_ptr<distrain::v1::PsWorker::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

// Serves `service` on `address` ("127.0.0.1:0": a free port, written to
// *port) with its limits' message bound; null when it cannot listen. The
// caller owns both and shuts the server down before destroying the service.
std::unique_ptr<grpc::Server> StartPsWorkerServer(const std::string& address,
                                                  PsWorkerService& service, int* port);

// The role entry points used by worker/main.cc; return the process exit code
// (common/exit_codes.h). `stop` is set by SIGTERM/SIGINT. The ps task's
// checkpoint directory is PsCheckpointRoot(config.training.checkpoint.dir):
// main.cc resolves that field from the task's own flags and environment.
int RunParameterServerTask(const JobConfig& config, const ClusterSpec& cluster,
                           prometheus::Registry* registry, const std::atomic<bool>& stop);
int RunPsWorkerTask(const JobConfig& config, const ClusterSpec& cluster,
                    prometheus::Registry* registry, const std::atomic<bool>& stop);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_PS_WORKER_H_

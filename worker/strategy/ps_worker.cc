#include "worker/strategy/ps_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "spdlog/spdlog.h"
#include "worker/coordination/coordination_service.h"
#include "worker/data/dataset.h"
#include "worker/ps/ps_service.h"
#include "worker/strategy/ps_membership.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string NewIncarnation() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x", rd(), rd());
}

// Sleeps in short slices until `stop` or `done()`.
template <typename Done>
void WaitUntil(const std::atomic<bool>& stop, Done done) {
  while (!stop.load() && !done()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

// ---------------------------------------------------------------------------
// PsWorkerService

namespace {

// PrepareRequest's sizes against the limits, before anything is built from
// them. Dimensions are checked one by one against max_features, so their
// product never overflows.
absl::Status CheckPrepareSizes(const v1::PrepareRequest& request,
                               const std::vector<int64_t>& example_shape,
                               const PsWorkerLimits& limits) {
  if (request.num_features() > limits.max_features) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prepare: num_features is ", request.num_features(), "; the limit is ",
                     limits.max_features, " (PsWorkerLimits::max_features)"));
  }
  if (request.num_classes() > limits.max_classes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prepare: num_classes is ", request.num_classes(), "; the limit is ",
                     limits.max_classes, " (PsWorkerLimits::max_classes)"));
  }
  if (static_cast<int64_t>(request.plan_fingerprint().size()) > limits.max_fingerprint_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prepare: plan_fingerprint is ", request.plan_fingerprint().size(),
        " bytes; the limit is ", limits.max_fingerprint_bytes,
        " (PsWorkerLimits::max_fingerprint_bytes)"));
  }
  if (static_cast<int64_t>(example_shape.size()) > limits.max_example_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prepare: example_shape has ", example_shape.size(), " dimensions; the limit is ",
        limits.max_example_rank, " (PsWorkerLimits::max_example_rank)"));
  }
  int64_t product = 1;
  for (size_t d = 0; d < example_shape.size(); ++d) {
    if (example_shape[d] < 1 || example_shape[d] > limits.max_features / product) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Prepare: example_shape [", absl::StrJoin(example_shape, ", "), "]: dimension ", d,
          " is ", example_shape[d], "; every dimension must be >= 1 and the product at most ",
          limits.max_features, " (PsWorkerLimits::max_features)"));
    }
    product *= example_shape[d];
  }
  if (product != request.num_features()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prepare: example_shape [", absl::StrJoin(example_shape, ", "), "] does not hold ",
        request.num_features(), " features"));
  }
  return absl::OkStatus();
}

}  // namespace

PsWorkerService::PsWorkerService(PsWorkerOptions options)
    : options_(std::move(options)),
      worker_index_(options_.cluster.task().index),
      num_workers_(options_.cluster.num_tasks("worker")),
      incarnation_(NewIncarnation()) {}

PsWorkerService::~PsWorkerService() = default;

grpc::Status PsWorkerService::Leaving() const {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("worker:", worker_index_,
                                   " is stopping and has left the worker set; it takes no more "
                                   "closures"));
}

grpc::Status PsWorkerService::CheckChief(const grpc::ServerContext& ctx,
                                         std::string_view method) const {
  return CheckCaller(
      options_.security.get(), ctx, method,
      [](const TaskId& caller) { return caller.type == "chief"; }, "only the chief");
}

absl::Status PsWorkerService::PrepareLocked(const v1::PrepareRequest& request) {
  if (request.worker_index() != worker_index_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this process is worker:", worker_index_, " but the coordinator expects worker:",
        request.worker_index(), " at this address; every task must get the same TF_CONFIG cluster"));
  }
  if (prepared_) {
    if (request.num_features() == num_features_ && request.num_classes() == num_classes_ &&
        request.plan_fingerprint() == fingerprint_) {
      // A new coordinator (the chief restarted, maybe with restarted ps
      // tasks): make sure every ps channel is connected again before
      // closures arrive, rather than failing the first one on a channel
      // still backing off from the old ps's death.
      return ps_->WaitForReady();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker already trains a model with ", num_features_, " features and ", num_classes_,
        " classes (plan ", fingerprint_, "); the coordinator asks for ", request.num_features(),
        " and ", request.num_classes(), " (plan ", request.plan_fingerprint(),
        "); restart the worker with the job's current configuration"));
  }
  if (request.num_features() <= 0 || request.num_classes() <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prepare: num_features must be > 0 and num_classes > 1, got ",
                     request.num_features(), " and ", request.num_classes()));
  }
  std::vector<int64_t> example_shape(request.example_shape().begin(),
                                     request.example_shape().end());
  if (example_shape.empty()) example_shape = {request.num_features()};
  if (absl::Status s = CheckPrepareSizes(request, example_shape, options_.limits); !s.ok()) {
    return s;
  }
  const TrainingConfig& tc = options_.config.training;
  // This worker's own data first: the model is built only for the shape its
  // examples have, so a request's dimensions (within the limits above, still
  // gigabytes of parameters) never allocate anything this job cannot train.
  auto input = OpenTrainingInput(tc.dataset, tc.seed, worker_index_, num_workers_);
  if (!input.ok()) return input.status();
  if (input->dataset->example_shape() != example_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker's examples have shape [", absl::StrJoin(input->dataset->example_shape(), ", "),
        "] but the chief's model takes [", absl::StrJoin(example_shape, ", "), "]"));
  }
  auto model = Model::Create(tc.model, example_shape, request.num_classes(), tc.seed);
  if (!model.ok()) return model.status();
  const int num_ps = options_.cluster.num_tasks("ps");
  auto plan = PsShardingPlan(**model, num_ps);
  if (!plan.ok()) return plan.status();
  if (plan->Fingerprint() != request.plan_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the variables this worker derives from its job config (plan ", plan->Fingerprint(),
        ") differ from the chief's (plan ", request.plan_fingerprint(),
        "); every task must get the same DISTRAIN_JOB_CONFIG"));
  }
  PsClientOptions client_options;
  client_options.rpc_timeout = options_.ps_rpc_timeout;
  client_options.connect_timeout = options_.ps_connect_timeout;
  client_options.registry = options_.registry;
  client_options.security = options_.security;
  auto ps = PsClient::Create(options_.cluster.addresses("ps"), *plan, client_options);
  if (!ps.ok()) return ps.status();
  if (absl::Status s = (*ps)->WaitForReady(); !s.ok()) return s;

  std::shared_ptr<const Dataset> data = std::move(input->dataset);
  std::unique_ptr<BatchSource> batches = std::make_unique<ShardedBatcher>(
      data, input->effective_policy, worker_index_, num_workers_, tc.global_batch_size, tc.seed,
      tc.dataset.shuffle, /*start_step=*/0);
  if (tc.dataset.prefetch_batches > 0) {
    batches = std::make_unique<PrefetchingBatchSource>(std::move(batches), tc.dataset.prefetch_batches);
  }

  model_ = std::move(*model);
  ps_ = std::move(*ps);
  batches_ = std::move(batches);
  values_.clear();
  grads_.clear();
  layer_grads_.clear();
  layer_shards_.clear();
  variable_layer_.clear();
  state_.clear();
  layer_state_.clear();
  const std::vector<std::vector<Parameter*>> by_layer = model_->parameters_by_layer();
  // The layer of each state variable, for the overlapped pull: the layer
  // whose parameters share its "<layer name>/" prefix (a BatchNormalization's
  // moving statistics and its gamma, beta). One without such a layer is
  // awaited before the first layer's forward: slower to start, never wrong.
  std::map<std::string, int> layer_of_prefix;
  auto prefix = [](const std::string& name) { return name.substr(0, name.rfind('/') + 1); };
  for (int layer = 0; layer < static_cast<int>(by_layer.size()); ++layer) {
    for (Parameter* p : by_layer[layer]) layer_of_prefix.emplace(prefix(p->name), layer);
  }
  layer_state_.resize(by_layer.size());
  for (Parameter* p : model_->state_variables()) {
    auto it = layer_of_prefix.find(prefix(p->name));
    const int layer = it == layer_of_prefix.end() || it->first.empty() ? 0 : it->second;
    layer_state_[layer].push_back(static_cast<int>(state_.size()));
    state_.push_back(StateVariable{p, Tensor(p->value.shape()), Tensor(p->value.shape())});
  }
  for (int layer = 0; layer < static_cast<int>(by_layer.size()); ++layer) {
    layer_grads_.emplace_back();
    layer_shards_.push_back(0);
    auto add_to_layer = [&](Parameter* p) {
      // Pulls stream in values_ order: forward order, so layer i's variables
      // arrive before layer i + 1's.
      values_.push_back(MutableTensorRef{p->name, &p->value});
      layer_shards_.back() += static_cast<int>(ps_->plan().Find(p->name)->shards.size());
      variable_layer_[p->name] = layer;
    };
    for (Parameter* p : by_layer[layer]) {
      add_to_layer(p);
      grads_.push_back(TensorRef{p->name, &p->grad});
      layer_grads_.back().push_back(TensorRef{p->name, &p->grad});
    }
    for (int i : layer_state_[layer]) add_to_layer(state_[i].variable);
  }
  // Unbounded staleness pushes layer by layer (RunStepOverlapped), and there
  // each Dense kernel's gradient travels as its factors (PsClient::Push).
  model_->set_factored_kernel_grads(!options_.config.training.max_staleness.has_value());
  num_features_ = request.num_features();
  num_classes_ = request.num_classes();
  fingerprint_ = request.plan_fingerprint();
  prepared_ = true;
  spdlog::info("worker:{} ready: {}, data shard {}/{}, {} ps task(s)", worker_index_,
               model_->Summary(), worker_index_, num_workers_, num_ps);
  return absl::OkStatus();
}

grpc::Status PsWorkerService::Prepare(grpc::ServerContext* ctx, const v1::PrepareRequest* request,
                                      v1::PrepareResponse* response) {
  if (grpc::Status s = CheckChief(*ctx, "Prepare"); !s.ok()) return s;
  if (leaving_.load()) return Leaving();
  absl::MutexLock lock(&mu_);
  absl::Status s = PrepareLocked(*request);
  if (!s.ok()) {
    spdlog::warn("worker:{} Prepare: {}", worker_index_, s.message());
    return ToGrpcStatus(s);
  }
  response->set_worker_index(worker_index_);
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

grpc::Status PsWorkerService::RunStep(grpc::ServerContext* ctx, const v1::RunStepRequest* request,
                                      v1::RunStepResponse* response) {
  if (grpc::Status s = CheckChief(*ctx, "RunStep"); !s.ok()) return s;
  // Closures run on gRPC's threads: give this one the process's share of
  // the cores for its ops, as the main thread has.
  ops::SetCpuThreadsForThisThread(cpu::BlasThreads());
  if (request->closure_id() < 0 || request->attempt() < 0) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        absl::StrCat("RunStep: closure_id (", request->closure_id(),
                                     ") and attempt (", request->attempt(), ") must be >= 0"));
  }
  absl::MutexLock lock(&mu_);
  // After the lock: a closure that waited for the one in flight does not
  // start once the worker is stopping.
  if (leaving_.load()) return Leaving();
  if (!prepared_) {
    // A restarted worker that the coordinator has not re-admitted yet: the
    // coordinator treats this like a lost worker and probes with Prepare.
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("worker:", worker_index_, " is not prepared (restarted?)"));
  }
  auto report_ps_error = [&](const absl::Status& s) {
    response->Clear();
    response->set_ps_error(std::string(s.message()));
    response->set_ps_error_code(static_cast<int>(s.code()));
    spdlog::error("worker:{} closure {}: {}", worker_index_, request->closure_id(), s.message());
    return grpc::Status::OK;
  };
  Batch batch = batches_->Next();
  if (!options_.config.training.max_staleness.has_value()) {
    absl::Status s = RunStepOverlapped(batch, StepContextOf(*request), response);
    if (!s.ok()) return report_ps_error(s);
  } else {
    absl::Status s = RunStepBounded(batch, StepContextOf(*request), response);
    if (!s.ok()) return report_ps_error(s);
  }
  ++steps_run_;
  pull_seconds_ += response->pull_seconds();
  compute_seconds_ += response->compute_seconds();
  push_seconds_ += response->push_seconds();
  return grpc::Status::OK;
}

// A closure's random streams (Dropout) are those of step `closure_id` on
// this worker, so a closure re-run on the same worker draws the same masks.
StepContext PsWorkerService::StepContextOf(const v1::RunStepRequest& request) const {
  return StepContext{request.closure_id(), worker_index_};
}

void PsWorkerService::SnapshotPulledState(StateVariable& v) {
  std::memcpy(v.pulled.data(), v.variable->value.data(), v.pulled.bytes());
}

void PsWorkerService::AppendStateDeltas(std::vector<TensorRef>* pushes) {
  for (StateVariable& v : state_) {
    const float* after = v.variable->value.data();
    const float* before = v.pulled.data();
    float* delta = v.delta.data();
    for (int64_t i = 0; i < v.delta.size(); ++i) delta[i] = after[i] - before[i];
    pushes->push_back(TensorRef{v.variable->name, &v.delta});
  }
}

absl::Status PsWorkerService::RunStepOverlapped(const Batch& batch, const StepContext& step,
                                                v1::RunStepResponse* response) {
  // 1. Current parameters, pulled on a ps-client thread: each ps streams its
  // shards in parameter (= forward) order, and layer i's forward waits only
  // until the shards of layer i have arrived, so the rest of the pull
  // overlaps the forward pass of the earlier layers. Every push of a dense
  // model changes every shard, so nothing is skipped; the versions are kept
  // for staleness.
  // Shared with the client's thread running the pull, which may still hold
  // its reference after this closure has seen `done`.
  struct PullState {
    absl::Mutex mu;
    std::vector<int> missing ABSL_GUARDED_BY(mu);  // shards still to arrive, per layer
    bool done ABSL_GUARDED_BY(mu) = false;         // PullIntoAsync has finished
    absl::Status status ABSL_GUARDED_BY(mu);
    ShardVersions pulled;  // written by the pull before `done`
  };
  auto pull = std::make_shared<PullState>();
  pull->missing = layer_shards_;
  ps_->PullIntoAsync(
      values_, &pull->pulled,
      [this, pull](const ShardInfo& shard) {
        absl::MutexLock lock(&pull->mu);
        --pull->missing[variable_layer_.at(shard.variable)];
      },
      [pull](absl::Status s) {
        absl::MutexLock lock(&pull->mu);
        pull->status = std::move(s);
        pull->done = true;
      });
  double waited = 0;
  auto wait_for_layer = [&](int layer) {
    const auto start = std::chrono::steady_clock::now();
    std::pair<PullState*, int> arg(pull.get(), layer);
    absl::MutexLock lock(&pull->mu);
    pull->mu.Await(absl::Condition(
        +[](std::pair<PullState*, int>* a) {
          return a->first->missing[a->second] <= 0 || a->first->done;
        },
        &arg));
    waited += Seconds(start);
    // The layer's moving statistics as pulled, before its forward pass moves
    // them (after a failed pull they may be partial; nothing is pushed then).
    for (int i : layer_state_[layer]) SnapshotPulledState(state_[i]);
  };
  // 2. Forward as parameters arrive, then backward.
  auto t0 = std::chrono::steady_clock::now();
  LossResult r = model_->TrainStep(batch.features, batch.labels, {}, wait_for_layer, step);
  absl::Status pull_status;
  {
    absl::MutexLock lock(&pull->mu);
    pull->mu.Await(absl::Condition(&pull->done));
    pull_status = pull->status;
  }
  const ShardVersions& pulled = pull->pulled;
  response->set_pull_seconds(waited);
  response->set_compute_seconds(Seconds(t0) - waited);
  // 3. One push of every layer's gradients (one stream per ps), each Dense
  // kernel's as its factors. Pushing each layer the moment backward finished
  // it overlapped the transfer with the layers below, but cost an RPC per
  // layer and ps: on 2 shared cores (bench/ps_training.py, batch 32) the
  // single push ran 13% more closures per second at 12% less CPU per
  // closure, the RPC machinery costing more than the overlap saved, and
  // every extra RPC also loads the ps that all workers share. Nothing is
  // pushed when the pull failed.
  t0 = std::chrono::steady_clock::now();
  if (!pull_status.ok()) return pull_status;
  std::vector<TensorRef> dense;
  std::vector<FactoredGradRef> factored;
  for (int layer = 0; layer < static_cast<int>(layer_grads_.size()); ++layer) {
    const std::optional<GradFactors> factors = model_->kernel_grad_factors(layer);
    for (const TensorRef& g : layer_grads_[layer]) {
      if (factors && g.name == factors->kernel->name) {
        factored.push_back(FactoredGradRef{g.name, factors->left, factors->right});
      } else {
        dense.push_back(g);
      }
    }
  }
  // The moving statistics' updates ride along as deltas; nothing rejects a
  // push without a staleness bound, so each is applied exactly once.
  AppendStateDeltas(&dense);
  absl::StatusOr<PushResult> pushed = ps_->Push(dense, &pulled, factored);
  response->set_push_seconds(Seconds(t0));
  if (!pushed.ok()) return pushed.status();
  const int64_t staleness = pushed->max_staleness;
  response->set_loss(r.loss);
  response->set_correct(r.correct);
  response->set_examples(static_cast<int64_t>(batch.labels.size()));
  response->set_max_staleness(staleness);
  return absl::OkStatus();
}

absl::Status PsWorkerService::RunStepBounded(const Batch& batch, const StepContext& step,
                                             v1::RunStepResponse* response) {
  // The ps tasks that took this closure's gradients: a redone closure pushes
  // only to the others (each ps decides on its own part of a push).
  std::vector<bool> applied;
  for (int attempt = 0;; ++attempt) {
    // 1. Current parameters. Every push of a dense model changes every shard,
    // so there is nothing to skip: pull all, keep the versions for staleness.
    auto t0 = std::chrono::steady_clock::now();
    ShardVersions pulled;
    if (absl::Status s = ps_->PullInto(values_, &pulled); !s.ok()) return s;
    for (StateVariable& v : state_) SnapshotPulledState(v);
    response->set_pull_seconds(response->pull_seconds() + Seconds(t0));
    // 2. Gradients of this worker's batch (and moved moving statistics).
    t0 = std::chrono::steady_clock::now();
    LossResult r = model_->TrainStep(batch.features, batch.labels, {}, {}, step);
    response->set_compute_seconds(response->compute_seconds() + Seconds(t0));
    // 3. Push; the ps applies the optimizer.
    t0 = std::chrono::steady_clock::now();
    absl::StatusOr<PushResult> pushed = ps_->PushRemaining(grads_, &pulled, &applied);
    if (!pushed.ok() && pushed.status().code() == absl::StatusCode::kFailedPrecondition &&
        attempt < kMaxStaleRetries) {
      response->set_push_seconds(response->push_seconds() + Seconds(t0));
      // Rejected by the staleness bound on some ps (each checks every shard
      // of its part before applying any, so those applied nothing): redo it
      // on fresher parameters, for those ps only.
      response->set_stale_retries(attempt + 1);
      continue;
    }
    if (!pushed.ok()) return pushed.status();
    // 4. The moving statistics' deltas, once the gradients were taken: in
    // the push above, a ps holding only deltas would apply them even when
    // another ps rejected its gradients, and the retry would apply the
    // closure's update twice. The ps takes deltas whatever their staleness.
    if (!state_.empty()) {
      std::vector<TensorRef> deltas;
      AppendStateDeltas(&deltas);
      if (absl::Status s = ps_->Push(deltas, &pulled).status(); !s.ok()) return s;
    }
    response->set_push_seconds(response->push_seconds() + Seconds(t0));
    response->set_loss(r.loss);
    response->set_correct(r.correct);
    response->set_examples(static_cast<int64_t>(batch.labels.size()));
    response->set_max_staleness(pushed->max_staleness);
    return absl::OkStatus();
  }
}

grpc::Status PsWorkerService::Finish(grpc::ServerContext* ctx, const v1::FinishRequest*,
                                     v1::FinishResponse*) {
  if (grpc::Status s = CheckChief(*ctx, "Finish"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const double n = static_cast<double>(std::max<int64_t>(1, steps_run_));
  spdlog::info("worker:{}: the coordinator says the job is done after {} closure(s) here "
               "(mean pull {:.1f} ms, compute {:.1f} ms, push {:.1f} ms)",
               worker_index_, steps_run_, 1000 * pull_seconds_ / n, 1000 * compute_seconds_ / n,
               1000 * push_seconds_ / n);
  finished_.store(true);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------
// GrpcWorkerTransport

GrpcWorkerTransport::GrpcWorkerTransport(std::vector<std::string> worker_addresses, Options options)
    : initial_workers_(static_cast<int>(worker_addresses.size())), options_(std::move(options)) {
  for (size_t worker = 0; worker < worker_addresses.size(); ++worker) {
    SetWorkerAddress(static_cast<int>(worker), worker_addresses[worker]);
  }
}

GrpcWorkerTransport::~GrpcWorkerTransport() = default;

void GrpcWorkerTransport::SetWorkerAddress(int worker, const std::string& address) {
  DISTRAIN_CHECK(worker >= 0) << "worker index " << worker;
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(addresses_.size()) <= worker) {
    addresses_.resize(worker + 1);
    stubs_.resize(worker + 1);
  }
  if (addresses_[worker] == address && stubs_[worker] != nullptr) return;
  if (!addresses_[worker].empty()) {
    spdlog::info("coordinator: worker:{} now serves on {} (was {})", worker, address,
                 addresses_[worker]);
  }
  grpc::ChannelArguments args;
  // A restarted worker is back within a second or two: re-admit it then.
  ApplyJobChannelArgs(&args);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      ChannelCredentialsFor(options_.security.get(), TaskId{"worker", worker}, &args);
  addresses_[worker] = address;
  stubs_[worker] = v1::PsWorker::NewStub(grpc::CreateCustomChannel(address, credentials, args));
}

std::shared_ptr<v1::PsWorker::Stub> GrpcWorkerTransport::Stub(int worker) const {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= static_cast<int>(stubs_.size())) return nullptr;
  return stubs_[worker];
}

std::string GrpcWorkerTransport::WorkerName(int worker) const {
  absl::MutexLock lock(&mu_);
  const bool known = worker >= 0 && worker < static_cast<int>(addresses_.size()) &&
                     !addresses_[worker].empty();
  return absl::StrCat("worker:", worker, " (", known ? addresses_[worker] : "no address yet", ")");
}

bool GrpcWorkerTransport::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  in_flight_.push_back(ctx);
  return true;
}

void GrpcWorkerTransport::Untrack(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  std::erase(in_flight_, ctx);
}

void GrpcWorkerTransport::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
}

absl::StatusOr<std::string> GrpcWorkerTransport::Prepare(int worker) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.prepare_timeout));
  if (!Track(&ctx)) return absl::CancelledError("coordinator stopped");
  v1::PrepareRequest request;
  request.set_num_features(options_.dims.num_features);
  request.set_num_classes(options_.dims.num_classes);
  for (int64_t d : options_.dims.example_shape) request.add_example_shape(d);
  request.set_plan_fingerprint(options_.plan_fingerprint);
  request.set_worker_index(worker);
  v1::PrepareResponse response;
  std::shared_ptr<v1::PsWorker::Stub> stub = Stub(worker);
  if (stub == nullptr) {
    Untrack(&ctx);
    return absl::UnavailableError(absl::StrCat("no address known for worker:", worker));
  }
  grpc::Status s = stub->Prepare(&ctx, request, &response);
  Untrack(&ctx);
  if (!s.ok()) return FromGrpcStatus(s);
  return response.incarnation();
}

ClosureOutcome GrpcWorkerTransport::RunStep(int worker, int64_t closure_id, int attempt) {
  ClosureOutcome outcome;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.step_timeout));
  if (!Track(&ctx)) {
    outcome.kind = ClosureOutcome::Kind::kWorkerLost;
    outcome.status = absl::CancelledError("coordinator stopped");
    return outcome;
  }
  v1::RunStepRequest request;
  request.set_closure_id(closure_id);
  request.set_attempt(attempt);
  v1::RunStepResponse response;
  std::shared_ptr<v1::PsWorker::Stub> stub = Stub(worker);
  grpc::Status s = stub != nullptr
                       ? stub->RunStep(&ctx, request, &response)
                       : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                      absl::StrCat("no address known for worker:", worker));
  Untrack(&ctx);
  if (!s.ok()) {
    outcome.kind = ClosureOutcome::Kind::kWorkerLost;
    outcome.status = FromGrpcStatus(s);
    return outcome;
  }
  if (!response.ps_error().empty()) {
    // The ps is what failed; naming it is the worker's message. UNAVAILABLE
    // keeps it retryable for the Trainer (kExitPeerLost).
    outcome.kind = ClosureOutcome::Kind::kFatal;
    outcome.status = absl::UnavailableError(
        absl::StrCat("parameter server lost: ", response.ps_error(), " (reported by ",
                     WorkerName(worker), " running closure ", closure_id, ")"));
    return outcome;
  }
  outcome.result.loss = response.loss();
  outcome.result.correct = response.correct();
  outcome.result.examples = response.examples();
  outcome.result.max_staleness = response.max_staleness();
  outcome.result.stale_retries = response.stale_retries();
  return outcome;
}

void GrpcWorkerTransport::Finish(int worker) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::FinishResponse response;
  std::shared_ptr<v1::PsWorker::Stub> stub = Stub(worker);
  if (stub == nullptr) return;
  grpc::Status s = stub->Finish(&ctx, v1::FinishRequest(), &response);
  if (!s.ok()) spdlog::warn("coordinator: Finish to {}: {}", WorkerName(worker), s.error_message());
}

// ---------------------------------------------------------------------------
// Task entry points

namespace {

// Requests this process's ps service has answered (distrain_ps_rpc_seconds
// samples with side="server").
int64_t ServedRpcs(prometheus::Registry& registry) {
  int64_t total = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "distrain_ps_rpc_seconds") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "side" && label.value == "server") {
          total += static_cast<int64_t>(metric.histogram.sample_count);
        }
      }
    }
  }
  return total;
}

absl::StatusOr<std::string> ListenAddress(const ClusterSpec& cluster) {
  std::optional<std::string> mine = cluster.my_address();
  if (!mine) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG: no address for this task ", cluster.task().ToString()));
  }
  return CoordinatorListenAddress(*mine);
}

}  // namespace

std::unique_ptr<grpc::Server> StartPsWorkerServer(const std::string& address,
                                                  PsWorkerService& service, int* port) {
  grpc::ServerBuilder builder;
  *port = 0;
  builder.AddListeningPort(address, ServerCredentialsFor(service.options().security.get()), port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(service.options().limits.max_message_bytes, INT32_MAX)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) return nullptr;
  return server;
}

int RunParameterServerTask(const JobConfig& config, const ClusterSpec& cluster,
                           prometheus::Registry* registry, const std::atomic<bool>& stop) {
  KeepPsBuffersMapped();
  // A ps forms factored gradients (one GEMM per pushed kernel shard) on the
  // gRPC thread of each push; pushes from several workers run on several
  // threads at once, so one BLAS thread per call is the parallelism that
  // fits, and a multi-threaded BLAS would spin on cores the other calls use.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) cpu::SetBlasThreads(1);
  auto listen = ListenAddress(cluster);
  if (!listen.ok()) {
    spdlog::error("{}", listen.status().message());
    return kExitInvalidConfig;
  }
  PsServiceOptions options;
  options.task_index = cluster.task().index;
  options.num_ps = cluster.num_tasks("ps");
  options.optimizer = config.training.optimizer;
  options.max_staleness = config.training.max_staleness.value_or(-1);
  options.checkpoint_keep = std::max(1, config.training.checkpoint.keep);
  // The ps's own directory, from its own environment (main.cc); requests
  // name only a step.
  options.checkpoint_dir = PsCheckpointRoot(config.training.checkpoint.dir);
  options.max_step = config.training.steps > 0 ? config.training.steps : -1;
  options.registry = registry;
  auto server = PsServer::Start(*listen, options);
  if (!server.ok()) {
    spdlog::error("ps:{}: {}", cluster.task().index, server.status().message());
    return server.status().code() == absl::StatusCode::kInvalidArgument ? kExitInvalidConfig
                                                                         : kExitUnreachable;
  }
  spdlog::info("ps:{} of {} serving on {} (optimizer applied here; staleness {}; checkpoints {})",
               options.task_index, options.num_ps, *listen,
               options.max_staleness < 0 ? std::string("unbounded")
                                         : absl::StrCat("<= ", options.max_staleness),
               options.checkpoint_dir.empty() ? std::string("off: no DISTRAIN_CHECKPOINT_DIR")
                                              : options.checkpoint_dir);
  // Like TensorFlow's ps tasks: serve until the process is told to stop.
  WaitUntil(stop, [] { return false; });
  // SIGTERM reaches every task of a stopping job at about the same time, and
  // the chief may be writing its final checkpoint through this ps: keep
  // serving while requests keep coming, until kPsQuietPeriod passes without
  // one (at most kPsStopGrace).
  constexpr auto kPsQuietPeriod = std::chrono::milliseconds(500);
  constexpr auto kPsStopGrace = std::chrono::seconds(10);
  if (registry != nullptr) {
    const auto give_up = std::chrono::steady_clock::now() + kPsStopGrace;
    int64_t seen = ServedRpcs(*registry);
    auto quiet_since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - quiet_since < kPsQuietPeriod &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int64_t now = ServedRpcs(*registry);
      if (now != seen) {
        seen = now;
        quiet_since = std::chrono::steady_clock::now();
      }
    }
  }
  spdlog::info("ps:{}: stopping", options.task_index);
  (*server)->Shutdown();
  return kExitOk;
}

int RunPsWorkerTask(const JobConfig& config, const ClusterSpec& cluster,
                    prometheus::Registry* registry, const std::atomic<bool>& stop) {
  KeepPsBuffersMapped();
  auto listen = ListenAddress(cluster);
  if (!listen.ok()) {
    spdlog::error("{}", listen.status().message());
    return kExitInvalidConfig;
  }
  PsWorkerOptions options;
  options.config = config;
  options.cluster = cluster;
  options.ps_rpc_timeout = absl::Seconds(config.training.communication.timeout_seconds);
  options.registry = registry;
  PsWorkerService service(options);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartPsWorkerServer(*listen, service, &port);
  if (server == nullptr) {
    spdlog::error("worker:{}: cannot listen on {} (port in use?)", cluster.task().index, *listen);
    return kExitUnreachable;
  }
  spdlog::info("worker:{} serving step closures on {} (incarnation {}); waiting for the coordinator",
               cluster.task().index, *listen, service.incarnation());
  // Join the chief's worker set (ps_membership.h), so that a chief whose
  // TF_CONFIG predates this worker (a scale-up) schedules closures onto it.
  std::unique_ptr<PsMembershipClient> membership;
  const std::vector<std::string> chiefs = cluster.addresses("chief");
  if (!chiefs.empty()) {
    PsMembershipClientOptions membership_options;
    membership_options.chief_address = chiefs.front();
    membership_options.worker_index = cluster.task().index;
    membership_options.incarnation = service.incarnation();
    membership_options.address = *cluster.my_address();
    membership = std::make_unique<PsMembershipClient>(membership_options);
    membership->Start();
  } else {
    spdlog::warn("worker:{}: TF_CONFIG has no chief; ParameterServer needs one to schedule "
                 "closures (add cluster.chief)",
                 cluster.task().index);
  }
  WaitUntil(stop, [&] { return service.finished(); });
  if (!service.finished()) {
    // Stopped (SIGTERM: a scale-down or a preemption; step 5 of
    // ps_membership.h): take no new closure, leave the set so the chief stops
    // counting on this worker, let the closure in flight finish and answer.
    service.BeginLeaving();
    if (membership) {
      absl::Status left = membership->Leave();
      if (left.ok()) {
        spdlog::info("worker:{}: stopping; left the chief's worker set", cluster.task().index);
      } else {
        spdlog::warn("worker:{}: stopping; Leave to the chief failed ({}); it will see this "
                     "worker's stream close",
                     cluster.task().index, left.message());
      }
    }
    service.WaitIdle();
  } else if (membership) {
    // The job is done: leave quietly (the chief may already be gone).
    (void)membership->Leave();
  }
  membership.reset();
  // Let the last answer (Finish, or the closure in flight) reach the
  // coordinator before closing.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  return service.finished() ? kExitOk : kExitTerminated;
}

}  // namespace distrain

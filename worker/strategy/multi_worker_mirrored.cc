#include "worker/strategy/multi_worker_mirrored.h"
#include "worker/strategy/variable_state.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/collective/hierarchical.h"
#include "worker/collective/ring.h"
#include "worker/collective/tcp_socket.h"
#include "worker/tensor/cpu_math.h"

namespace distrain {
namespace {

constexpr char kVariablePrefix[] = "variables/";
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kIterationsKey[] = "optimizer_iterations";

// How long a collective error waits for the membership watcher to name the
// process that died (the coordinator reports it well under a second after
// the process is gone on loopback; a little more across hosts).
constexpr absl::Duration kExplainWait = absl::Seconds(3);
// How long the chief waits in Shutdown for the others to leave, and how long
// the others wait for the chief's initial-state manifest (it may be reading a
// large checkpoint).
constexpr absl::Duration kShutdownWait = absl::Seconds(60);
constexpr absl::Duration kManifestWait = absl::Minutes(5);

bool IsLoopbackHost(const std::string& host) {
  const std::string h = absl::AsciiStrToLower(host);
  return absl::StartsWith(h, "127.") || h == "localhost" || h == "::1";
}

}  // namespace

absl::Status CheckCollectiveImplementation(const CommunicationConfig& communication) {
  if (communication.implementation != CollectiveImplementation::kNccl) return absl::OkStatus();
#ifdef DISTRAIN_HAVE_CUDA
  return absl::UnimplementedError(
      "spec.training.communication.implementation: NCCL all-reduce for MultiWorkerMirrored is "
      "not available in this build of distrain yet; use implementation: Ring (or Auto)");
#else
  return absl::InvalidArgumentError(
      "spec.training.communication.implementation: NCCL needs GPUs and a CUDA build of "
      "distrain, but this distrain-worker is a CPU-only build; use implementation: Ring (or "
      "Auto) to train on CPUs, or run an image built with DISTRAIN_CUDA=ON on GPU nodes");
#endif
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // the watcher must not touch collectives from now on
  }
  replicas_.reset();  // joins replica and communication threads
  hierarchical_.clear();
  ring_.reset();
  rendezvous_.reset();  // without Shutdown: the peers hear that this task failed
  if (previous_blas_threads_ > 0) cpu::SetBlasThreads(previous_blas_threads_);
}

void MultiWorkerMirroredStrategy::AttachMetrics(prometheus::Registry& registry) {
  metrics_ = std::make_unique<CollectiveMetrics>(registry);
}

absl::Status MultiWorkerMirroredStrategy::Init(const ClusterSpec& cluster,
                                               const JobConfig& config) {
  const TrainingConfig& t = config.training;
  // 1.
  if (absl::Status s = CheckCollectiveImplementation(t.communication); !s.ok()) return s;
  const std::optional<int> rank = cluster.my_training_rank();
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultiWorkerMirrored trains on chief and worker tasks, but this task is ",
                     cluster.task().ToString(), "; remove PS/Evaluator replicas from the job"));
  }
  rank_ = *rank;
  num_workers_ = cluster.num_training_tasks();
  chief_ = cluster.is_chief();
  local_replicas_ = t.local_replicas > 0 ? t.local_replicas : 1;
  const int64_t in_sync = static_cast<int64_t>(num_workers_) * local_replicas_;
  if (t.global_batch_size % in_sync != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.globalBatchSize: ", t.global_batch_size, " is not divisible by the ",
        in_sync, " replicas in sync (", num_workers_, " tasks x ", local_replicas_,
        " local replicas); use a multiple of ", in_sync));
  }
  bytes_per_pack_ = t.communication.bytes_per_pack;
  collective_options_.timeout = absl::Seconds(t.communication.timeout_seconds);
  collective_options_.tag = "gradients";
  if (local_replicas_ > 1) {
    const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int cores = std::max(1, std::min(hardware, cpu::BlasThreads()));
    const int blas = std::max(1, cores / local_replicas_);
    if (blas != cpu::BlasThreads()) {
      previous_blas_threads_ = cpu::BlasThreads();
      cpu::SetBlasThreads(blas);
    }
  }

  // 2.
  std::vector<TaskId> members;
  std::vector<std::string> names;
  for (int r = 0; r < num_workers_; ++r) {
    members.push_back(cluster.TaskForTrainingRank(r));
    names.push_back(members.back().ToString());
  }
  auto rendezvous = Rendezvous::Start(cluster, members);
  if (!rendezvous.ok()) return rendezvous.status();
  rendezvous_ = std::move(*rendezvous);
  const int64_t generation = rendezvous_->generation();
  if (metrics_ != nullptr) metrics_->SetMembershipGeneration(generation);
  store_prefix_ = absl::StrCat("mwms/g", generation);

  // 3. The ring listens where peers can reach this task: its TF_CONFIG host
  // (loopback hosts exactly, so local runs may use several 127.0.0.x).
  auto me = tcp::ParseHostPort(cluster.my_address().value_or(""));
  if (!me.ok()) return me.status();
  RingOptions ring_options;
  ring_options.key_prefix = store_prefix_;
  ring_options.bind_host = IsLoopbackHost(me->host) ? me->host : ListenHost();
  ring_options.advertised_host = me->host;
  ring_options.peer_names = names;
  ring_options.setup_timeout = std::max(collective_options_.timeout, absl::Seconds(60));
  auto ring = RingCollective::Create(rendezvous_->store(), rank_, num_workers_, ring_options);
  if (!ring.ok()) return ring.status();
  ring_ = std::shared_ptr<Collective>(std::move(*ring));
  if (local_replicas_ > 1) {
    std::vector<std::string> local_names;
    for (int l = 0; l < local_replicas_; ++l) {
      local_names.push_back(absl::StrCat(cluster.task().ToString(), " local replica ", l));
    }
    for (auto& member :
         HierarchicalCollective::CreateLocalGroup(ring_, local_replicas_, local_names)) {
      hierarchical_.push_back(std::move(member));
    }
  }

  // 4.
  rendezvous_->StartWatching([this](const absl::Status& reason) { OnPeerFailure(reason); });
  spdlog::info(
      "MultiWorkerMirrored: rank {} of {} ({}), generation {}, {} local replica(s), "
      "ring all-reduce, buckets of {} bytes, timeout {}s",
      rank_, num_workers_, cluster.task().ToString(), generation, local_replicas_, bytes_per_pack_,
      t.communication.timeout_seconds);
  return absl::OkStatus();
}

void MultiWorkerMirroredStrategy::OnPeerFailure(const absl::Status& reason) {
  spdlog::error("membership: {}", std::string(reason.message()));
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  if (ring_ != nullptr) ring_->Abort(reason);
  for (auto& c : hierarchical_) c->Abort(reason);
}

absl::Status MultiWorkerMirroredStrategy::ExplainFailure(const absl::Status& error) {
  const absl::Time deadline = absl::Now() + kExplainWait;
  while (true) {
    absl::Status cause = rendezvous_->health();
    if (!cause.ok()) {
      if (absl::StrContains(error.message(), cause.message())) return error;
      return absl::UnavailableError(
          absl::StrCat(cause.message(), " (the step failed: ", error.message(), ")"));
    }
    if (absl::Now() >= deadline) return error;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status MultiWorkerMirroredStrategy::CreateVariables(const ModelFactory& factory,
                                                          const OptimizerConfig& optimizer) {
  std::vector<Collective*> collectives;
  if (hierarchical_.empty()) {
    collectives.push_back(ring_.get());
  } else {
    for (auto& c : hierarchical_) collectives.push_back(c.get());
  }
  LocalReplicas::Options options;
  options.first_replica_id = rank_ * local_replicas_;
  options.num_replicas_in_sync = num_replicas_in_sync();
  options.bytes_per_pack = bytes_per_pack_;
  options.collective_options = collective_options_;
  options.metrics = metrics_.get();
  auto replicas = LocalReplicas::Create(factory, optimizer, std::move(collectives), options);
  if (!replicas.ok()) return replicas.status();
  replicas_ = std::move(*replicas);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MultiWorkerMirroredStrategy::SynchronizeInitialState(
    int64_t local_start_step) {
  // 5. Manifest: what the chief broadcasts, so the others can size buffers.
  const std::string key = absl::StrCat(store_prefix_, "/initial_state");
  CheckpointState state;
  std::string manifest_text;
  if (rank_ == 0) {
    state = replicas_->Capture(local_start_step);
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& [name, tensor] : state.tensors) {
      if (absl::StartsWith(name, kOptimizerPrefix)) slots.push_back({name, tensor.shape()});
    }
    nlohmann::json manifest = {{"step", local_start_step},
                               {"iterations", state.metadata[kIterationsKey]},
                               {"slots", slots}};
    manifest_text = manifest.dump();
    if (absl::Status s = rendezvous_->store().Set(key, manifest_text); !s.ok()) return s;
  } else {
    auto text = rendezvous_->store().Get(key, kManifestWait);
    if (!text.ok()) return ExplainFailure(text.status());
    manifest_text = *text;
  }
  int64_t step = 0;
  std::string iterations;
  std::vector<std::pair<std::string, std::vector<int64_t>>> slots;
  try {
    nlohmann::json manifest = nlohmann::json::parse(manifest_text);
    step = manifest.at("step").get<int64_t>();
    iterations = manifest.at("iterations").get<std::string>();
    for (const auto& slot : manifest.at("slots")) {
      slots.emplace_back(slot.at(0).get<std::string>(), slot.at(1).get<std::vector<int64_t>>());
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(
        absl::StrCat("initial-state manifest from the chief (", key, ") is malformed: ", e.what()));
  }

  // One flat buffer: every variable (AllVariables order), then every slot.
  std::vector<Parameter*> params = AllVariables(*replicas_->model(0));
  int64_t total = 0;
  for (Parameter* p : params) total += p->value.size();
  for (const auto& [name, shape] : slots) total += Tensor::NumElements(shape);
  std::vector<float> buffer(total);
  if (rank_ == 0) {
    float* out = buffer.data();
    for (Parameter* p : params)
      out = std::copy(p->value.data(), p->value.data() + p->value.size(), out);
    for (const auto& [name, shape] : slots) {
      const Tensor& t = state.tensors.at(name);
      out = std::copy(t.data(), t.data() + t.size(), out);
    }
  }
  CollectiveOptions options = collective_options_;
  options.tag = "initial state";
  const absl::Time start = absl::Now();
  if (absl::Status s = ring_->Broadcast(absl::MakeSpan(buffer), 0, options); !s.ok()) {
    return ExplainFailure(s);
  }
  if (metrics_ != nullptr) {
    metrics_->Observe(CollectiveOp::kBroadcast, total * static_cast<int64_t>(sizeof(float)),
                      absl::Now() - start);
  }
  if (rank_ != 0) {
    CheckpointState received;
    received.step = step;
    received.metadata[kIterationsKey] = iterations;
    const float* in = buffer.data();
    for (Parameter* p : params) {
      Tensor t(p->value.shape());
      std::memcpy(t.data(), in, t.bytes());
      in += t.size();
      received.tensors.emplace(absl::StrCat(kVariablePrefix, p->name), std::move(t));
    }
    for (const auto& [name, shape] : slots) {
      Tensor t(shape);
      std::memcpy(t.data(), in, t.bytes());
      in += t.size();
      received.tensors.emplace(name, std::move(t));
    }
    if (absl::Status s = replicas_->Restore(received); !s.ok()) return s;
    if (step != local_start_step) {
      spdlog::info("starting at the chief's step {} (this process alone would start at {})", step,
                   local_start_step);
    }
  }
  return step;
}

absl::StatusOr<StepOutput> MultiWorkerMirroredStrategy::Run(const StepFn& step_fn,
                                                            int64_t examples) {
  auto out = replicas_->Run(step_fn, examples);
  if (!out.ok()) return ExplainFailure(out.status());
  return out;
}

bool MultiWorkerMirroredStrategy::RequestStop() {
  replicas_->VoteStop();
  return true;
}

absl::StatusOr<CheckpointState> MultiWorkerMirroredStrategy::SaveState(int64_t step) {
  return replicas_->Capture(step);
}

absl::Status MultiWorkerMirroredStrategy::RestoreState(const CheckpointState& state) {
  return replicas_->Restore(state);
}

void MultiWorkerMirroredStrategy::Shutdown() {
  if (rendezvous_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // peers leaving from now on is expected
  }
  if (absl::Status s = rendezvous_->Shutdown(kShutdownWait); !s.ok()) {
    spdlog::warn("leaving the rendezvous: {}", std::string(s.message()));
  }
}

}  // namespace distrain

#include "worker/strategy/multi_worker_mirrored.h"
#include "worker/strategy/variable_state.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/collective/hierarchical.h"
#include "worker/collective/ring.h"
#include "worker/collective/tcp_socket.h"
#include "worker/tensor/cpu_math.h"

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/collective/nccl/nccl_collective.h"
#endif

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
  // 1. (CreateStrategy checked the devices.)
  const std::optional<int> rank = cluster.my_training_rank();
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultiWorkerMirrored trains on chief and worker tasks, but this task is ",
                     cluster.task().ToString(), "; remove PS/Evaluator replicas from the job"));
  }
  rank_ = *rank;
  num_workers_ = cluster.num_training_tasks();
  chief_ = cluster.is_chief();
  local_replicas_ = t.local_replicas > 0 ? t.local_replicas : (gpus_ > 0 ? gpus_ : 1);
  if (gpus_ > 0 && local_replicas_ > gpus_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.localReplicas: ", local_replicas_, " replicas per worker, but this process "
        "sees ", gpus_, " GPU(s) and MultiWorkerMirrored puts one replica on each; set "
        "localReplicas: 0 (one per GPU) or at most ", gpus_));
  }
  const int64_t in_sync = static_cast<int64_t>(num_workers_) * local_replicas_;
  if (t.global_batch_size % in_sync != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.globalBatchSize: ", t.global_batch_size, " is not divisible by the ",
        in_sync, " replicas in sync (", num_workers_, " tasks x ", local_replicas_,
        " local replicas); use a multiple of ", in_sync));
  }
  use_nccl_ = gpus_ > 0 && t.communication.implementation == CollectiveImplementation::kNccl;
  recovery_policy_ = config.run_policy.recovery_policy;
  recovery_timeout_ = absl::Seconds(config.run_policy.recovery_timeout_seconds.value_or(300));
  bytes_per_pack_ = t.communication.bytes_per_pack;
  collective_options_.timeout = absl::Seconds(t.communication.timeout_seconds);
  collective_options_.tag = "gradients";
  if (local_replicas_ > 1 && gpus_ == 0) {
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
  for (int r = 0; r < num_workers_; ++r) members.push_back(cluster.TaskForTrainingRank(r));
  RendezvousOptions rendezvous_options;
  if (config.elastic_policy.has_value() && recovery_policy_ == RecoveryPolicy::kInPlace) {
    // Elastic membership (coordination_service.h, step E): any worker index
    // below maxReplicas may join; a group may train when its worker count is
    // within the bounds and the global batch divides among its replicas.
    elastic_ = true;
    const int min_workers = config.elastic_policy->min_replicas;
    const int max_workers =
        std::max(config.elastic_policy->max_replicas, cluster.num_tasks("worker"));
    const int chiefs = cluster.has_chief() ? 1 : 0;
    CoordinationServiceOptions::Elastic elastic;
    if (chiefs > 0) elastic.candidates.push_back(cluster.chief_task());
    for (int i = 0; i < max_workers; ++i) elastic.candidates.push_back(TaskId{"worker", i});
    const int64_t global_batch = t.global_batch_size;
    const int local = local_replicas_;
    elastic.allowed_size = [=](int n) {
      const int workers = n - chiefs;
      return workers >= min_workers && workers <= max_workers &&
             global_batch % (static_cast<int64_t>(n) * local) == 0;
    };
    rendezvous_options.service.elastic =
        std::make_shared<const CoordinationServiceOptions::Elastic>(std::move(elastic));
  }
  auto rendezvous = Rendezvous::Start(cluster, members, rendezvous_options);
  if (!rendezvous.ok()) return rendezvous.status();
  rendezvous_ = std::move(*rendezvous);
  const int64_t generation = rendezvous_->generation();

  // 3. The ring listens where peers can reach this task: its TF_CONFIG host
  // (loopback hosts exactly, so local runs may use several 127.0.0.x), else
  // its pod IP. Peers dial the pod IP itself when there is one, not the DNS
  // name: a replaced pod's name resolves to its predecessor's address for a
  // few seconds (the kubelet, the EndpointSlice and the DNS cache each lag),
  // exactly when the survivors dial it to re-form the ring.
  auto me = tcp::ParseHostPort(cluster.my_address().value_or(""));
  if (!me.ok()) return me.status();
  task_name_ = cluster.task().ToString();
  ring_options_.bind_host = IsLoopbackHost(me->host) ? me->host : ListenHost();
  ring_options_.advertised_host =
      IsWildcardHost(ring_options_.bind_host) ? me->host : ring_options_.bind_host;
  ring_options_.setup_timeout = std::max(collective_options_.timeout, absl::Seconds(60));
  // The group the coordinator admitted (elastic: not necessarily TF_CONFIG's).
  AdoptMembership();
  if (absl::Status s = FormCollectives(generation); !s.ok()) return s;

  // 4.
  rendezvous_->StartWatching([this](const absl::Status& reason) { OnPeerFailure(reason); });
  spdlog::info(
      "MultiWorkerMirrored: rank {} of {} ({}), generation {}, {} local replica(s){}, "
      "{} all-reduce, buckets of {} bytes, timeout {}s{}",
      rank_, num_workers_, cluster.task().ToString(), generation, local_replicas_,
      gpus_ > 0 ? absl::StrCat(" on GPU:0..", local_replicas_ - 1,
                               use_nccl_ ? "" : " (staged through host memory)")
                : std::string(),
      use_nccl_ ? absl::StrCat("NCCL (", num_workers_ * local_replicas_, " ranks)") : "ring",
      bytes_per_pack_,
      t.communication.timeout_seconds,
      elastic_ ? absl::StrCat(", elastic membership (", config.elastic_policy->min_replicas, "..",
                              config.elastic_policy->max_replicas, " workers)")
               : std::string());
  return absl::OkStatus();
}

absl::Status MultiWorkerMirroredStrategy::FormCollectives(int64_t generation) {
  const std::string prefix = absl::StrCat("mwms/g", generation);
  RingOptions options = ring_options_;
  options.key_prefix = prefix;
  auto ring = RingCollective::Create(rendezvous_->store(), rank_, num_workers_, options);
  if (!ring.ok()) return ring.status();
  std::shared_ptr<Collective> new_ring(std::move(*ring));
  std::vector<std::unique_ptr<Collective>> new_local;
  std::vector<std::unique_ptr<Collective>> new_nccl;
  if (use_nccl_) {
    auto ranks = FormNcclRanks(prefix);
    if (!ranks.ok()) return ranks.status();
    new_nccl = std::move(*ranks);
  } else if (local_replicas_ > 1) {
    std::vector<std::string> local_names;
    for (int l = 0; l < local_replicas_; ++l) {
      local_names.push_back(absl::StrCat(task_name_, " local replica ", l));
    }
    for (auto& member :
         HierarchicalCollective::CreateLocalGroup(new_ring, local_replicas_, local_names)) {
      new_local.push_back(std::move(member));
    }
  }
  // The old collectives live until the end of this function: the replicas
  // drop them first (their communication threads are idle: the failed step
  // has returned).
  // GPU replicas reach the host collectives through staging, one wrapper
  // per replica handle.
  std::vector<std::unique_ptr<HostStagedCollective>> new_staged;
  if (gpus_ > 0 && !use_nccl_) {
    for (int l = 0; l < local_replicas_; ++l) {
      Collective* handle = new_local.empty() ? new_ring.get() : new_local[l].get();
      new_staged.push_back(
          std::make_unique<HostStagedCollective>(handle, LocalReplicaDevice(l, gpus_)));
    }
  }
  std::shared_ptr<Collective> old_ring;
  std::vector<std::unique_ptr<Collective>> old_local;
  std::vector<std::unique_ptr<HostStagedCollective>> old_staged;
  std::vector<std::unique_ptr<Collective>> old_nccl;
  {
    absl::MutexLock lock(&mu_);
    old_ring = std::move(ring_);
    old_local = std::move(hierarchical_);
    old_staged = std::move(staged_);
    old_nccl = std::move(nccl_);
    ring_ = std::move(new_ring);
    hierarchical_ = std::move(new_local);
    staged_ = std::move(new_staged);
    nccl_ = std::move(new_nccl);
  }
  if (replicas_ != nullptr) replicas_->ResetCollectives(ReplicaCollectives());
  generation_ = generation;
  store_prefix_ = prefix;
  if (metrics_ != nullptr) metrics_->SetMembershipGeneration(generation);
  // A peer lost while the ring formed was reported to a ring that is gone
  // now (or to none): abort the new one, so the next step fails at once.
  if (absl::Status lost = rendezvous_->health(); !lost.ok()) OnPeerFailure(lost);
  return absl::OkStatus();
}

void MultiWorkerMirroredStrategy::AdoptMembership() {
  const int old_size = num_workers_;
  const int old_rank = rank_;
  rank_ = rendezvous_->rank();
  num_workers_ = rendezvous_->size();
  ring_options_.peer_names.clear();
  const std::vector<TaskId> members = rendezvous_->members();
  for (int r = 0; r < num_workers_; ++r) ring_options_.peer_names.push_back(members[r].ToString());
  if (replicas_ != nullptr) {
    replicas_->SetReplicaIds(rank_ * local_replicas_, num_workers_ * local_replicas_);
  }
  if (replicas_ != nullptr && (old_size != num_workers_ || old_rank != rank_)) {
    spdlog::warn("membership resized: this process is now rank {} of {} (was {} of {}); the "
                 "global batch is re-split among {} replicas",
                 rank_, num_workers_, old_rank, old_size, num_workers_ * local_replicas_);
  }
}

absl::StatusOr<std::vector<std::unique_ptr<Collective>>>
MultiWorkerMirroredStrategy::FormNcclRanks(const std::string& prefix) {
#ifdef DISTRAIN_HAVE_CUDA
  // The id is 128 opaque bytes; the store carries text, so it travels as hex.
  const std::string key = absl::StrCat(prefix, "/nccl_unique_id");
  std::string id;
  if (rank_ == 0) {
    absl::StatusOr<std::string> fresh = NcclCollective::NewUniqueId();
    if (!fresh.ok()) return fresh.status();
    id = *fresh;
    if (absl::Status s = rendezvous_->store().Set(key, absl::BytesToHexString(id)); !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> hex = rendezvous_->store().Get(key, ring_options_.setup_timeout);
    if (!hex.ok()) return ExplainFailure(hex.status());
    id = absl::HexStringToBytes(*hex);
  }
  auto ranks = NcclCollective::CreateRanks(id, rank_ * local_replicas_,
                                           num_workers_ * local_replicas_, local_replicas_);
  if (!ranks.ok()) return ExplainFailure(ranks.status());
  std::vector<std::unique_ptr<Collective>> out;
  for (auto& r : *ranks) out.push_back(std::move(r));
  return out;
#else
  (void)prefix;
  return absl::InternalError("MultiWorkerMirrored: NCCL in a CPU-only build");  // gpus_ is 0 there
#endif
}

std::vector<Collective*> MultiWorkerMirroredStrategy::ReplicaCollectives() {
  std::vector<Collective*> collectives;
  if (!nccl_.empty()) {
    for (auto& c : nccl_) collectives.push_back(c.get());
  } else if (!staged_.empty()) {
    for (auto& c : staged_) collectives.push_back(c.get());
  } else if (hierarchical_.empty()) {
    collectives.push_back(ring_.get());
  } else {
    for (auto& c : hierarchical_) collectives.push_back(c.get());
  }
  return collectives;
}

void MultiWorkerMirroredStrategy::OnPeerFailure(const absl::Status& reason) {
  // ABORTED: an elastic resize, expected; anything else: a process was lost.
  if (reason.code() == absl::StatusCode::kAborted) {
    spdlog::warn("membership: {}", std::string(reason.message()));
  } else {
    spdlog::error("membership: {}", std::string(reason.message()));
  }
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  if (ring_ != nullptr) ring_->Abort(reason);
  for (auto& c : hierarchical_) c->Abort(reason);
  for (auto& c : nccl_) c->Abort(reason);
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
  std::vector<Collective*> collectives = ReplicaCollectives();
  LocalReplicas::Options options;
  options.first_replica_id = rank_ * local_replicas_;
  options.num_replicas_in_sync = num_replicas_in_sync();
  options.bytes_per_pack = bytes_per_pack_;
  options.collective_options = collective_options_;
  options.metrics = metrics_.get();
  if (gpus_ > 0) {
    for (int l = 0; l < local_replicas_; ++l) options.devices.push_back(LocalReplicaDevice(l, gpus_));
  }
  auto replicas = LocalReplicas::Create(factory, optimizer, std::move(collectives), options);
  if (!replicas.ok()) return replicas.status();
  replicas_ = std::move(*replicas);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MultiWorkerMirroredStrategy::SynchronizeInitialState(
    int64_t local_start_step) {
  return AgreeOnState(/*candidate_step=*/-1, local_start_step);
}

absl::StatusOr<int64_t> MultiWorkerMirroredStrategy::AgreeOnState(int64_t candidate_step,
                                                                  int64_t local_start_step) {
  // R4. Candidates: who holds the newest state. Fresh processes hold none.
  if (absl::Status s = rendezvous_->store().Set(
          absl::StrCat(store_prefix_, "/candidate/", rank_), absl::StrCat(candidate_step));
      !s.ok()) {
    return ExplainFailure(s);
  }
  int root = 0;
  int64_t best = -1;
  for (int r = 0; r < num_workers_; ++r) {
    int64_t candidate = -1;
    if (r == rank_) {
      candidate = candidate_step;
    } else {
      auto text = rendezvous_->store().Get(absl::StrCat(store_prefix_, "/candidate/", r),
                                           kManifestWait);
      if (!text.ok()) return ExplainFailure(text.status());
      if (!absl::SimpleAtoi(*text, &candidate)) {
        return absl::InternalError(absl::StrCat("malformed state candidate of ",
                                                rendezvous_->peer_name(r), ": '", *text, "'"));
      }
    }
    if (candidate > best) {
      best = candidate;
      root = r;
    }
  }
  if (best >= 0 && rank_ == root) {
    spdlog::info("membership generation {}: this process holds the newest state (step {}) and "
                 "broadcasts it",
                 generation_, best);
  }

  // 5. Manifest: what the root broadcasts, so the others can size buffers.
  const std::string key = absl::StrCat(store_prefix_, "/initial_state");
  CheckpointState state;
  std::string manifest_text;
  if (rank_ == root) {
    // Its local replicas may disagree when some applied the failed step:
    // replica 0's state is the one published.
    if (absl::Status s = replicas_->CopyReplicaZeroToOthers(); !s.ok()) return s;
    const int64_t step = best >= 0 ? best : local_start_step;
    state = replicas_->Capture(step);
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& [name, tensor] : state.tensors) {
      if (absl::StartsWith(name, kOptimizerPrefix)) slots.push_back({name, tensor.shape()});
    }
    nlohmann::json manifest = {{"step", step},
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
  if (rank_ == root) {
    // From the captured state (host copies), not the variables, which may
    // live on a GPU.
    float* out = buffer.data();
    for (Parameter* p : params) {
      const Tensor& t = state.tensors.at(absl::StrCat(kVariablePrefix, p->name));
      out = std::copy(t.data(), t.data() + t.size(), out);
    }
    for (const auto& [name, shape] : slots) {
      const Tensor& t = state.tensors.at(name);
      out = std::copy(t.data(), t.data() + t.size(), out);
    }
  }
  CollectiveOptions options = collective_options_;
  options.tag = "initial state";
  const absl::Time start = absl::Now();
  if (absl::Status s = ring_->Broadcast(absl::MakeSpan(buffer), root, options); !s.ok()) {
    return ExplainFailure(s);
  }
  if (metrics_ != nullptr) {
    metrics_->Observe(CollectiveOp::kBroadcast, total * static_cast<int64_t>(sizeof(float)),
                      absl::Now() - start);
  }
  if (rank_ != root) {
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
      spdlog::info("starting at {}'s step {} (this process alone would start at {})",
                   best >= 0 ? rendezvous_->peer_name(root) : std::string("the chief"), step,
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

absl::StatusOr<int64_t> MultiWorkerMirroredStrategy::Recover(
    const absl::Status& error, int64_t steps_done, const std::function<bool()>& stop_requested) {
  // R1. Run already waited for the watcher (ExplainFailure).
  absl::Status lost = rendezvous_->health();
  if (recovery_policy_ != RecoveryPolicy::kInPlace || lost.ok()) return error;
  if (rendezvous_->coordinator_lost()) {
    return absl::UnavailableError(absl::StrCat(
        error.message(), "; not recoverable in place: the coordinator hosted the rendezvous, so "
                         "the group restarts from the last checkpoint"));
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + recovery_timeout_;
  // Survivors that completed the failed step elsewhere than replica 0 hold
  // it too; with one local replica a failed Run applied nothing.
  int64_t candidate = steps_done + (replicas_->replica_zero_applied_failed_step() ? 1 : 0);
  spdlog::warn("{}; recovering in place: waiting up to {} for the group to re-form{} "
               "(runPolicy.recoveryTimeoutSeconds)",
               std::string(lost.message()), absl::FormatDuration(recovery_timeout_),
               elastic_ ? " (with a replacement, or without the lost worker within "
                          "spec.elasticPolicy)"
                        : " around a replacement");
  while (true) {
    // R2.
    absl::StatusOr<int64_t> generation =
        rendezvous_->AwaitRegroup(generation_, deadline, stop_requested);
    if (!generation.ok()) {
      return absl::Status(generation.status().code(),
                          absl::StrCat("in-place recovery failed: ", generation.status().message(),
                                       " (after: ", lost.message(), ")"));
    }
    // R3, R4. (Elastic: the group may be another set; ranks follow it.)
    AdoptMembership();
    absl::Status formed = FormCollectives(*generation);
    absl::StatusOr<int64_t> step = formed.ok() ? AgreeOnState(candidate, steps_done) : formed;
    if (step.ok()) {
      spdlog::warn("recovered in place in {}: membership generation {}, resuming at step {} "
                   "(this process had completed {})",
                   absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
                   *generation, *step, steps_done);
      if (metrics_ != nullptr) metrics_->ObserveRecovery(absl::Now() - start);
      return step;
    }
    // Another loss while the group re-formed: wait for its replacement too.
    lost = rendezvous_->health();
    if (lost.ok() || absl::Now() >= deadline) return step.status();
    spdlog::warn("{}; still recovering", std::string(lost.message()));
  }
}

bool MultiWorkerMirroredStrategy::RequestStop() {
  if (elastic_ && !rendezvous_->is_coordinator()) {
    // Elastic: a stopped worker (scaled down, preempted) departs alone and
    // the group trains on without it; the coordinator's stop still stops all.
    departing_ = true;
    return false;
  }
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
  if (departing_) spdlog::warn("leaving the group, which trains on without this process");
  if (absl::Status s = rendezvous_->Shutdown(kShutdownWait, departing_); !s.ok()) {
    spdlog::warn("leaving the rendezvous: {}", std::string(s.message()));
  }
}

}  // namespace distrain

#include "worker/ps/ps_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "worker/ps/ps_wire.h"
#include "worker/tensor/cpu_math.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {

namespace {

class Timer {
 public:
  Timer(PsMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(
          method_,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  PsMetrics* metrics_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

// Threads that outlive the calls they serve: a call takes an idle thread or
// starts one, and a thread waits for the next call instead of exiting. A
// ParameterServer worker makes three or four calls' worth of per-ps threads
// per closure; starting and reaping them was 2% of the job's CPU.
// Thread-safe.
class PsClient::ReusableThreads {
 public:
  // Runs what is queued, then joins every thread (also ones that calls still
  // running start meanwhile).
  ~ReusableThreads() {
    while (true) {
      std::vector<std::thread> threads;
      {
        absl::MutexLock lock(&mu_);
        stopping_ = true;
        threads.swap(threads_);
      }
      if (threads.empty()) return;
      for (std::thread& t : threads) t.join();
    }
  }
  void Run(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (idle_ < static_cast<int>(queue_.size())) threads_.emplace_back([this] { Loop(); });
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      ++idle_;
      mu_.Await(absl::Condition(
          +[](ReusableThreads* t) { return t->stopping_ || !t->queue_.empty(); },
          this));
      --idle_;
      if (queue_.empty()) return;  // stopping, nothing left to run
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting in Loop
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

absl::Status PsClient::RunPerPs(const std::vector<int>& tasks,
                                const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(tasks.size());
  absl::BlockingCounter pending(static_cast<int>(tasks.empty() ? 0 : tasks.size() - 1));
  for (size_t i = 1; i < tasks.size(); ++i) {
    threads_->Run([&, i] {
      results[i] = fn(tasks[i]);
      pending.DecrementCount();
    });
  }
  if (!tasks.empty()) results[0] = fn(tasks[0]);
  pending.Wait();
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

struct PsClient::RawMethods {
  explicit RawMethods(std::shared_ptr<grpc::Channel> ch)
      : channel(std::move(ch)),
        initialize("/distrain.v1.ParameterServer/Initialize",
                   grpc::internal::RpcMethod::CLIENT_STREAMING, channel),
        pull("/distrain.v1.ParameterServer/Pull", grpc::internal::RpcMethod::SERVER_STREAMING,
             channel),
        push("/distrain.v1.ParameterServer/Push", grpc::internal::RpcMethod::CLIENT_STREAMING,
             channel) {}
  std::shared_ptr<grpc::Channel> channel;
  grpc::internal::RpcMethod initialize;
  grpc::internal::RpcMethod pull;
  grpc::internal::RpcMethod push;
};

// One shard's slice of an uploaded tensor.
struct PsClient::Upload {
  const ShardInfo* shard;
  const float* data;  // `elements` values
  std::optional<int64_t> pulled_version;
  int64_t elements = 0;     // shard->num_elements(), or the factors' count
  int64_t factor_rank = 0;  // > 0: data is L then R (UploadShard.factor_rank)
  // Keeps `data` alive when it is not the caller's memory (gathered factors,
  // a gradient formed here); shared by the copies of this Upload.
  std::shared_ptr<const std::vector<float>> owned;
};

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(std::vector<std::string> addresses,
                                                           ShardingPlan plan,
                                                           PsClientOptions options) {
  if (static_cast<int>(addresses.size()) != plan.num_ps()) {
    return absl::InvalidArgumentError(absl::StrCat("ps client: ", addresses.size(),
                                                   " ps addresses but the sharding plan is for ",
                                                   plan.num_ps(), " ps tasks"));
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("ps client: address of ps:", i, " is empty"));
    }
  }
  if (options.chunk_bytes < 4 || options.chunk_bytes > kPsMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ps client: chunk_bytes must be in [4, ",
                                                   kPsMaxChunkBytes, "], got ",
                                                   options.chunk_bytes));
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ps client: rpc_timeout must be positive");
  }
  return std::unique_ptr<PsClient>(
      new PsClient(std::move(addresses), std::move(plan), std::move(options)));
}

PsClient::PsClient(std::vector<std::string> addresses, ShardingPlan plan, PsClientOptions options)
    : addresses_(std::move(addresses)),
      plan_(std::move(plan)),
      options_(std::move(options)),
      threads_(std::make_unique<ReusableThreads>()) {
  for (size_t ps = 0; ps < addresses_.size(); ++ps) {
    const std::string& address = addresses_[ps];
    grpc::ChannelArguments args;
    // A ps pod's DNS name may appear a few seconds after the worker starts;
    // one connection per ps per client (tests run several in a process).
    ApplyJobChannelArgs(&args);
    // Pushes send the caller's gradient memory without copying it; a retry
    // buffer would keep references to it beyond the call. Nothing here is
    // retried by gRPC anyway (failures go to the coordinator).
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    for (const auto& [name, value] : PsTransportArgs()) args.SetInt(name, value);
    std::shared_ptr<grpc::ChannelCredentials> credentials = ChannelCredentialsFor(
        options_.security.get(), TaskId{"ps", static_cast<int>(ps)}, &args);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, credentials, args);
    stubs_.push_back(v1::ParameterServer::NewStub(channel));
    raw_.push_back(std::make_unique<RawMethods>(std::move(channel)));
  }
  if (options_.registry != nullptr) {
    metrics_ = std::make_unique<PsMetrics>(*options_.registry, "client");
  }
}

PsClient::~PsClient() = default;

std::string PsClient::PsName(int task) const {
  return absl::StrCat("ps:", task, " (", addresses_[task], ")");
}

absl::Status PsClient::Error(int task, const char* method, const grpc::Status& status) const {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(PsName(task), ": ", method, ": ", status.error_message()));
}

void PsClient::SetDeadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.rpc_timeout));
}

absl::Status PsClient::WaitForReady() {
  const auto give_up =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.connect_timeout);
  std::vector<int> tasks;
  for (int t = 0; t < plan_.num_ps(); ++t) tasks.push_back(t);
  return RunPerPs(tasks, [&](int task) -> absl::Status {
    auto backoff = std::chrono::milliseconds(50);
    grpc::Status last;
    while (true) {
      const auto now = std::chrono::system_clock::now();
      if (now >= give_up) break;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::min(give_up, now + absl::ToChronoMilliseconds(options_.rpc_timeout)));
      // Waits through transient connect failures (refused, unresolvable name)
      // until the deadline instead of failing at once.
      ctx.set_wait_for_ready(true);
      v1::HealthRequest request;
      v1::HealthResponse response;
      last = stubs_[task]->Health(&ctx, request, &response);
      if (last.ok()) {
        if (response.task_index() != task || response.num_ps() != plan_.num_ps()) {
          return absl::FailedPreconditionError(absl::StrCat(
              PsName(task), " says it is ps task ", response.task_index(), " of ",
              response.num_ps(), "; this process expects task ", task, " of ", plan_.num_ps(),
              " — every process must be given the same TF_CONFIG cluster"));
        }
        return absl::OkStatus();
      }
      if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
          last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return Error(task, "Health", last);
      }
      std::this_thread::sleep_for(std::min<std::chrono::system_clock::duration>(
          backoff, give_up - std::chrono::system_clock::now()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    return absl::UnavailableError(absl::StrCat(
        PsName(task), " is not reachable after ", absl::FormatDuration(options_.connect_timeout),
        " (last error: ", last.error_message().empty() ? "deadline exceeded" : last.error_message(),
        "); check that the ps pod runs and its name resolves"));
  });
}

absl::Status PsClient::CreateVariables() {
  std::vector<int> tasks;
  for (int t = 0; t < plan_.num_ps(); ++t) {
    if (!plan_.ShardsOnPs(t).empty()) tasks.push_back(t);
  }
  return RunPerPs(tasks, [&](int task) -> absl::Status {
    Timer timer(metrics_.get(), "CreateVariables");
    v1::CreateVariablesRequest request;
    for (const ShardInfo* s : plan_.ShardsOnPs(task)) {
      v1::ShardSpec* spec = request.add_shards();
      spec->set_variable(s->variable);
      spec->set_shard(s->index);
      spec->set_num_shards(s->num_shards);
      for (int64_t d : s->full_shape) spec->add_full_shape(d);
      spec->set_row_begin(s->row_begin);
      spec->set_row_end(s->row_end);
      if (!s->trainable) spec->set_non_trainable(true);
    }
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::CreateVariablesResponse response;
    grpc::Status status = stubs_[task]->CreateVariables(&ctx, request, &response);
    return status.ok() ? absl::OkStatus() : Error(task, "CreateVariables", status);
  });
}

absl::StatusOr<const std::vector<int64_t>*> PsClient::PulledVersions(
    const std::string& name, const ShardVersions* pulled, const char* method) const {
  if (pulled == nullptr) return nullptr;
  auto it = pulled->find(name);
  if (it == pulled->end()) return nullptr;
  const VariablePlan* var = plan_.Find(name);
  if (it->second.size() != var->shards.size()) {
    return absl::InvalidArgumentError(absl::StrCat(method, ": pulled versions of \"", name,
                                                   "\" list ", it->second.size(),
                                                   " shards; the variable has ", var->shards.size()));
  }
  return &it->second;
}

absl::Status PsClient::PlanFactoredUploads(absl::Span<const FactoredGradRef> factored,
                                           absl::Span<const TensorRef> dense,
                                           const ShardVersions* pulled,
                                           std::vector<Upload>* uploads) const {
  for (size_t i = 0; i < factored.size(); ++i) {
    const FactoredGradRef& ref = factored[i];
    const VariablePlan* var = plan_.Find(ref.name);
    if (var == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Push: \"", ref.name, "\" is not a variable of the sharding plan"));
    }
    if (!var->trainable) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Push: \"", ref.name, "\" is non-trainable; push its delta dense, not as factors"));
    }
    DISTRAIN_CHECK(ref.left != nullptr && ref.right != nullptr) << ref.name;
    const Tensor& left = *ref.left;
    const Tensor& right = *ref.right;
    if (var->shape.size() != 2 || left.rank() != 2 || right.rank() != 2 ||
        left.dim(1) != var->shape[0] || right.dim(1) != var->shape[1] ||
        left.dim(0) != right.dim(0) || left.dim(0) < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Push: factors of \"", ref.name, "\" are ", left.ShapeString(), " and ",
          right.ShapeString(), "; a variable of shape ", ShapeString(var->shape),
          " needs [rank, ", var->shape.empty() ? 0 : var->shape[0], "] and [rank, ",
          var->shape.size() < 2 ? 0 : var->shape[1], "], rank >= 1"));
    }
    auto listed_before = [&](const std::string& name) {
      for (size_t j = 0; j < i; ++j) {
        if (factored[j].name == name) return true;
      }
      for (const TensorRef& d : dense) {
        if (d.name == name) return true;
      }
      return false;
    };
    if (listed_before(ref.name)) {
      return absl::InvalidArgumentError(absl::StrCat("Push: \"", ref.name, "\" is given twice"));
    }
    absl::StatusOr<const std::vector<int64_t>*> versions = PulledVersions(ref.name, pulled, "Push");
    if (!versions.ok()) return versions.status();
    const int64_t rank = left.dim(0);
    const int64_t cols = var->shape[1];
    for (size_t k = 0; k < var->shards.size(); ++k) {
      const ShardInfo& s = plan_.shards()[var->shards[k]];
      const int64_t rows = s.row_end - s.row_begin;
      // L's columns of this shard, gathered: [rank, rows].
      const float* shard_left = left.data();
      std::vector<float> gathered;
      if (rows != left.dim(1)) {
        gathered.resize(static_cast<size_t>(rank * rows));
        for (int64_t r = 0; r < rank; ++r) {
          std::memcpy(gathered.data() + r * rows, left.data() + r * left.dim(1) + s.row_begin,
                      static_cast<size_t>(rows) * sizeof(float));
        }
        shard_left = gathered.data();
      }
      auto buffer = std::make_shared<std::vector<float>>();
      Upload u{&s, nullptr, *versions ? std::optional<int64_t>((**versions)[k]) : std::nullopt,
               /*elements=*/0, /*factor_rank=*/0, /*owned=*/nullptr};
      if (rank <= s.num_elements() / (rows + cols)) {
        // The factors are smaller than the gradient: send them (the server's
        // rule, UploadShard.factor_rank).
        buffer->resize(static_cast<size_t>(rank * (rows + cols)));
        std::memcpy(buffer->data(), shard_left, static_cast<size_t>(rank * rows) * sizeof(float));
        std::memcpy(buffer->data() + rank * rows, right.data(),
                    static_cast<size_t>(rank * cols) * sizeof(float));
        u.factor_rank = rank;
      } else {
        // A narrow shard (or a large rank): the dense gradient is smaller.
        buffer->resize(static_cast<size_t>(rows * cols));
        cpu::Gemm(true, false, rows, cols, rank, 1.0f, shard_left, right.data(), 0.0f,
                  buffer->data());
      }
      u.elements = static_cast<int64_t>(buffer->size());
      u.data = buffer->data();
      u.owned = std::move(buffer);
      uploads->push_back(std::move(u));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PsClient::Upload>> PsClient::PlanUploads(
    absl::Span<const TensorRef> tensors, const ShardVersions* pulled, const char* method) const {
  std::vector<Upload> uploads;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& ref = tensors[i];
    const VariablePlan* var = plan_.Find(ref.name);
    if (var == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(method, ": \"", ref.name, "\" is not a variable of the sharding plan"));
    }
    DISTRAIN_CHECK(ref.tensor != nullptr) << ref.name;
    if (ref.tensor->shape() != var->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(method, ": \"", ref.name, "\" has shape ", ref.tensor->ShapeString(),
                       "; the variable is ", ShapeString(var->shape)));
    }
    for (size_t j = 0; j < i; ++j) {
      if (tensors[j].name == ref.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": \"", ref.name, "\" is given twice"));
      }
    }
    absl::StatusOr<const std::vector<int64_t>*> versions = PulledVersions(ref.name, pulled, method);
    if (!versions.ok()) return versions.status();
    for (size_t k = 0; k < var->shards.size(); ++k) {
      const ShardInfo& s = plan_.shards()[var->shards[k]];
      uploads.push_back(Upload{&s, ref.tensor->data() + s.element_offset(),
                               *versions ? std::optional<int64_t>((**versions)[k]) : std::nullopt,
                               s.num_elements(), /*factor_rank=*/0, /*owned=*/nullptr});
    }
  }
  return uploads;
}

absl::Status PsClient::UploadShards(const char* method, int task, const std::vector<Upload>& shards,
                                    bool overwrite, google::protobuf::Message* response) {
  Timer timer(metrics_.get(), method);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  const bool push = std::strcmp(method, "Push") == 0;
  const RawMethods& raw = *raw_[task];
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          raw.channel.get(), push ? raw.push : raw.initialize, &ctx, response));
  v1::UploadHeader header;
  header.set_overwrite(overwrite);
  for (const Upload& u : shards) {
    v1::UploadShard* us = header.add_shards();
    us->mutable_ref()->set_variable(u.shard->variable);
    us->mutable_ref()->set_shard(u.shard->index);
    us->set_num_elements(u.elements);
    if (u.pulled_version) us->set_pulled_version(*u.pulled_version);
    if (u.factor_rank > 0) us->set_factor_rank(u.factor_rank);
  }
  ps_wire::FrameBuilder msg;
  msg.AddMessage(ps_wire::kHeaderField, header);
  bool stream_ok = true;
  const int64_t chunk_elements = options_.chunk_bytes / static_cast<int64_t>(sizeof(float));
  for (size_t i = 0; i < shards.size() && stream_ok; ++i) {
    const Upload& u = shards[i];
    const int64_t total = u.elements;
    int64_t offset = 0;
    while (offset < total && stream_ok) {
      const int64_t room =
          (options_.chunk_bytes - msg.size()) / static_cast<int64_t>(sizeof(float));
      if (room <= 0) {
        stream_ok = writer->Write(msg.Finish());
        continue;
      }
      const int64_t take = std::min({total - offset, room, chunk_elements});
      // The caller's memory itself: it stays unchanged until this call
      // returns, and the synchronous Write returns only once gRPC has handed
      // the bytes to the socket.
      msg.AddChunk(static_cast<int32_t>(i), offset,
                   grpc::Slice(u.data + offset, take * sizeof(float), grpc::Slice::STATIC_SLICE));
      offset += take;
    }
    if (metrics_) {
      if (push)
        metrics_->AddBytes("pushed", u.shard->key(), static_cast<double>(total * sizeof(float)));
    }
  }
  if (stream_ok && !msg.empty()) stream_ok = writer->Write(msg.Finish());
  if (stream_ok) writer->WritesDone();
  // Finish reports the server's status even when a Write failed because the
  // server rejected the stream early.
  grpc::Status status = writer->Finish();
  return status.ok() ? absl::OkStatus() : Error(task, method, status);
}

absl::StatusOr<InitializeResult> PsClient::Initialize(absl::Span<const TensorRef> values,
                                                      bool overwrite) {
  absl::StatusOr<std::vector<Upload>> uploads = PlanUploads(values, nullptr, "Initialize");
  if (!uploads.ok()) return uploads.status();
  std::map<int, std::vector<Upload>> by_ps;
  for (const Upload& u : *uploads) by_ps[u.shard->ps_task].push_back(u);
  std::vector<int> tasks;
  for (const auto& [task, list] : by_ps) tasks.push_back(task);
  std::vector<v1::InitializeResponse> responses(plan_.num_ps());
  absl::Status status = RunPerPs(tasks, [&](int task) {
    return UploadShards("Initialize", task, by_ps[task], overwrite, &responses[task]);
  });
  if (!status.ok()) return status;
  InitializeResult result;
  for (const v1::InitializeResponse& r : responses) {
    result.initialized += r.initialized_size();
    result.skipped += r.skipped_size();
  }
  return result;
}

absl::StatusOr<PushResult> PsClient::Push(absl::Span<const TensorRef> grads,
                                          const ShardVersions* pulled,
                                          absl::Span<const FactoredGradRef> factored) {
  return PushTo(grads, pulled, factored, nullptr);
}

absl::StatusOr<PushResult> PsClient::PushRemaining(absl::Span<const TensorRef> grads,
                                                   const ShardVersions* pulled,
                                                   std::vector<bool>* applied) {
  DISTRAIN_CHECK(applied != nullptr);
  applied->resize(plan_.num_ps(), false);
  return PushTo(grads, pulled, {}, applied);
}

absl::StatusOr<PushResult> PsClient::PushTo(absl::Span<const TensorRef> grads,
                                            const ShardVersions* pulled,
                                            absl::Span<const FactoredGradRef> factored,
                                            std::vector<bool>* applied) {
  absl::StatusOr<std::vector<Upload>> uploads = PlanUploads(grads, pulled, "Push");
  if (!uploads.ok()) return uploads.status();
  if (absl::Status s = PlanFactoredUploads(factored, grads, pulled, &*uploads); !s.ok()) return s;
  std::map<int, std::vector<Upload>> by_ps;
  for (const Upload& u : *uploads) {
    if (applied != nullptr && (*applied)[u.shard->ps_task]) continue;
    by_ps[u.shard->ps_task].push_back(u);
  }
  std::vector<int> tasks;
  for (const auto& [task, list] : by_ps) tasks.push_back(task);
  std::vector<v1::PushResponse> responses(plan_.num_ps());
  // One slot per ps, written by that ps's thread only (a vector<bool> shares bytes).
  std::vector<char> took(plan_.num_ps(), 0);
  absl::Status status = RunPerPs(tasks, [&](int task) {
    absl::Status s = UploadShards("Push", task, by_ps[task], false, &responses[task]);
    took[task] = s.ok();
    return s;
  });
  if (applied != nullptr) {
    for (int task : tasks) {
      if (took[task]) (*applied)[task] = true;
    }
  }
  if (!status.ok()) return status;
  PushResult result;
  for (const TensorRef& g : grads) {
    result.versions[g.name].assign(plan_.Find(g.name)->shards.size(), -1);
  }
  for (const FactoredGradRef& g : factored) {
    result.versions[g.name].assign(plan_.Find(g.name)->shards.size(), -1);
  }
  for (size_t task = 0; task < responses.size(); ++task) {
    for (const v1::ShardVersion& v : responses[task].shards()) {
      auto it = result.versions.find(v.ref().variable());
      if (it == result.versions.end() || v.ref().shard() < 0 ||
          v.ref().shard() >= static_cast<int>(it->second.size())) {
        return absl::InternalError(absl::StrCat(
            PsName(static_cast<int>(task)), ": Push: the answer names variable \"",
            v.ref().variable(), "\" shard ", v.ref().shard(), ", which this push did not send"));
      }
      it->second[v.ref().shard()] = v.version();
      result.max_staleness = std::max(result.max_staleness, v.staleness());
    }
  }
  return result;
}

absl::StatusOr<PushResult> PsClient::Push(const std::map<std::string, Tensor>& grads,
                                          const ShardVersions* pulled) {
  std::vector<TensorRef> refs;
  refs.reserve(grads.size());
  for (const auto& [name, tensor] : grads) refs.push_back(TensorRef{name, &tensor});
  return Push(refs, pulled);
}

absl::Status PsClient::PullInto(absl::Span<const MutableTensorRef> targets,
                                ShardVersions* versions) {
  return PullInto(targets, versions, nullptr);
}

absl::Status PsClient::PullInto(absl::Span<const MutableTensorRef> targets, ShardVersions* versions,
                                const std::function<void(const ShardInfo&)>& on_shard) {
  struct Dest {
    const ShardInfo* shard;
    float* data;
    int64_t version = -1;
  };
  std::map<int, std::vector<Dest>> by_ps;
  for (size_t i = 0; i < targets.size(); ++i) {
    const MutableTensorRef& ref = targets[i];
    const VariablePlan* var = plan_.Find(ref.name);
    if (var == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: \"", ref.name, "\" is not a variable of the sharding plan"));
    }
    DISTRAIN_CHECK(ref.tensor != nullptr) << ref.name;
    if (ref.tensor->shape() != var->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: the tensor for \"", ref.name, "\" has shape ",
                       ref.tensor->ShapeString(), "; the variable is ", ShapeString(var->shape)));
    }
    for (int idx : var->shards) {
      const ShardInfo& s = plan_.shards()[idx];
      by_ps[s.ps_task].push_back(Dest{&s, ref.tensor->data() + s.element_offset()});
    }
  }
  std::vector<int> tasks;
  for (const auto& [task, list] : by_ps) tasks.push_back(task);
  absl::Status status = RunPerPs(tasks, [&](int task) -> absl::Status {
    Timer timer(metrics_.get(), "Pull");
    std::vector<Dest>& dests = by_ps[task];
    v1::PullRequest request;
    for (const Dest& d : dests) {
      v1::ShardRef* ref = request.add_shards();
      ref->set_variable(d.shard->variable);
      ref->set_shard(d.shard->index);
    }
    request.set_max_chunk_bytes(options_.chunk_bytes);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const RawMethods& raw = *raw_[task];
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(raw.channel.get(), raw.pull,
                                                                      &ctx, request));
    std::vector<int64_t> received(dests.size(), 0);
    std::vector<bool> announced(dests.size(), false);
    absl::Status bad;
    grpc::ByteBuffer buffer;
    ps_wire::Frame frame;
    v1::PulledShard h;
    while (bad.ok() && reader->Read(&buffer)) {
      if (absl::Status s = frame.Parse(buffer); !s.ok()) {
        bad = absl::InternalError(
            absl::StrCat(PsName(task), ": Pull: the answer is not a PullMessage: ", s.message()));
        break;
      }
      for (const std::string& bytes : frame.headers()) {
        if (!h.ParseFromString(bytes) || h.index() < 0 ||
            h.index() >= static_cast<int>(dests.size()) ||
            h.ref().variable() != dests[h.index()].shard->variable ||
            h.ref().shard() != dests[h.index()].shard->index ||
            !std::equal(h.shape().begin(), h.shape().end(), dests[h.index()].shard->shape.begin(),
                        dests[h.index()].shard->shape.end())) {
          bad = absl::InternalError(
              absl::StrCat(PsName(task), ": Pull: the answer's shard header #", h.index(),
                           " (variable \"", h.ref().variable(), "\" shard ", h.ref().shard(),
                           ") does not match the request; is the ps running a different model?"));
          break;
        }
        const bool first_header = !announced[h.index()];
        announced[h.index()] = true;
        dests[h.index()].version = h.version();
        if (on_shard && first_header && dests[h.index()].shard->num_elements() == 0) {
          on_shard(*dests[h.index()].shard);
        }
      }
      for (const ps_wire::DecodedChunk& c : frame.chunks()) {
        if (!bad.ok()) break;
        const int64_t count = static_cast<int64_t>(c.data.size / sizeof(float));
        if (c.index < 0 || c.index >= static_cast<int>(dests.size()) || !announced[c.index] ||
            c.offset != received[c.index] || c.data.size % sizeof(float) != 0 ||
            count > dests[c.index].shard->num_elements() - received[c.index]) {
          bad = absl::InternalError(absl::StrCat(PsName(task), ": Pull: malformed chunk (index ",
                                                 c.index, ", offset ", c.offset, ", ", c.data.size,
                                                 " bytes) in the answer"));
          break;
        }
        frame.CopyTo(c.data, dests[c.index].data + c.offset);
        received[c.index] += count;
        if (on_shard && count > 0 && received[c.index] == dests[c.index].shard->num_elements()) {
          on_shard(*dests[c.index].shard);
        }
      }
    }
    if (!bad.ok()) {
      ctx.TryCancel();
      reader->Finish();
      return bad;
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) return Error(task, "Pull", s);
    for (size_t i = 0; i < dests.size(); ++i) {
      if (!announced[i] || received[i] != dests[i].shard->num_elements()) {
        return absl::InternalError(
            absl::StrCat(PsName(task), ": Pull: the answer ended after ", received[i], " of ",
                         dests[i].shard->num_elements(), " elements of variable \"",
                         dests[i].shard->variable, "\" shard ", dests[i].shard->index));
      }
      if (metrics_) {
        metrics_->AddBytes("pulled", dests[i].shard->key(),
                           static_cast<double>(received[i] * sizeof(float)));
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (versions != nullptr) {
    for (const MutableTensorRef& ref : targets) {
      (*versions)[ref.name].assign(plan_.Find(ref.name)->shards.size(), -1);
    }
    for (const auto& [task, dests] : by_ps) {
      for (const Dest& d : dests) (*versions)[d.shard->variable][d.shard->index] = d.version;
    }
  }
  return absl::OkStatus();
}

void PsClient::PullIntoAsync(absl::Span<const MutableTensorRef> targets, ShardVersions* versions,
                             std::function<void(const ShardInfo&)> on_shard,
                             std::function<void(absl::Status)> done) {
  threads_->Run([this, targets, versions, on_shard = std::move(on_shard),
                 done = std::move(done)] { done(PullInto(targets, versions, on_shard)); });
}

absl::StatusOr<PullResult> PsClient::Pull(const std::vector<std::string>& names) {
  PullResult result;
  std::vector<MutableTensorRef> targets;
  const auto add = [&](const std::string& name) -> absl::Status {
    const VariablePlan* var = plan_.Find(name);
    if (var == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: \"", name, "\" is not a variable of the sharding plan"));
    }
    auto [it, inserted] = result.values.try_emplace(name, var->shape);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("Pull: \"", name, "\" is requested twice"));
    }
    targets.push_back(MutableTensorRef{name, &it->second});
    return absl::OkStatus();
  };
  if (names.empty()) {
    for (const VariablePlan& v : plan_.variables()) {
      if (absl::Status s = add(v.name); !s.ok()) return s;
    }
  } else {
    for (const std::string& name : names) {
      if (absl::Status s = add(name); !s.ok()) return s;
    }
  }
  if (absl::Status s = PullInto(targets, &result.versions); !s.ok()) return s;
  return result;
}

absl::Status PsClient::Save(int64_t step) {
  std::vector<int> tasks;
  for (int t = 0; t < plan_.num_ps(); ++t) tasks.push_back(t);
  return RunPerPs(tasks, [&](int task) -> absl::Status {
    Timer timer(metrics_.get(), "Save");
    v1::SaveRequest request;
    request.set_step(step);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::SaveResponse response;
    grpc::Status s = stubs_[task]->Save(&ctx, request, &response);
    return s.ok() ? absl::OkStatus() : Error(task, "Save", s);
  });
}

absl::StatusOr<int64_t> PsClient::Restore(std::optional<int64_t> step) {
  auto restore = [&](int task, std::optional<int64_t> at) -> absl::StatusOr<int64_t> {
    Timer timer(metrics_.get(), "Restore");
    v1::RestoreRequest request;
    if (at) request.set_step(*at);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::RestoreResponse response;
    grpc::Status s = stubs_[task]->Restore(&ctx, request, &response);
    if (!s.ok()) return Error(task, "Restore", s);
    return response.step();
  };
  absl::StatusOr<int64_t> chosen = restore(0, step);
  if (!chosen.ok()) return chosen.status();
  std::vector<int> rest;
  for (int t = 1; t < plan_.num_ps(); ++t) rest.push_back(t);
  absl::Status s = RunPerPs(rest, [&](int task) { return restore(task, *chosen).status(); });
  if (!s.ok()) return s;
  return *chosen;
}

absl::StatusOr<std::vector<v1::HealthResponse>> PsClient::Health() {
  std::vector<v1::HealthResponse> out(plan_.num_ps());
  std::vector<int> tasks;
  for (int t = 0; t < plan_.num_ps(); ++t) tasks.push_back(t);
  absl::Status s = RunPerPs(tasks, [&](int task) -> absl::Status {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    grpc::Status st = stubs_[task]->Health(&ctx, v1::HealthRequest(), &out[task]);
    return st.ok() ? absl::OkStatus() : Error(task, "Health", st);
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace distrain

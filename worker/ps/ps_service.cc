#include "worker/ps/ps_service.h"

#include <malloc.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "common/logging.h"
#include "grpc/grpc.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/method_handler.h"
#include "spdlog/spdlog.h"
#include "worker/ps/partitioner.h"
#include "worker/ps/ps_wire.h"
#include "worker/tensor/cpu_math.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {

static_assert(std::endian::native == std::endian::little,
              "ps tensors travel as raw host floats, which must be little-endian");

namespace {

constexpr char kVariablePrefix[] = "variables/";
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kShardPrefix[] = "shard/";
// Accounted per shard header in a Pull message, so a pull of very many tiny
// shards still splits into messages below the receive limit.
constexpr int64_t kHeaderOverheadBytes = 64;

// The single answer of a client-streaming method served raw.
grpc::Status WriteAnswer(grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream,
                         const google::protobuf::MessageLite& answer) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::Status s =
      grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(answer, &buffer, &own);
  if (!s.ok()) return s;
  if (!stream->Write(buffer)) {
    return grpc::Status(grpc::CANCELLED, "the client went away before the answer");
  }
  return grpc::Status::OK;
}

std::string RefString(const std::string& variable, int index) {
  return absl::StrCat("variable \"", variable, "\" shard ", index);
}

// Names go into error messages; keep those readable when they are huge.
std::string Shown(const std::string& name) {
  constexpr size_t kShown = 64;
  if (name.size() <= kShown) return name;
  return absl::StrCat(name.substr(0, kShown), "...");
}

// `field` names a variable; INVALID_ARGUMENT when it is longer than the limit.
absl::Status CheckName(const std::string& field, const std::string& name, const PsLimits& limits) {
  if (static_cast<int64_t>(name.size()) > limits.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " \"", Shown(name), "\" is ", name.size(), " bytes; the limit is ",
        limits.max_name_bytes, " (PsLimits::max_name_bytes)"));
  }
  return absl::OkStatus();
}

// A declared variable's shape: rank, non-negative dimensions and a product
// of its non-zero dimensions within max_variable_elements, so that neither
// the element count nor the elements of a row (the product of dimensions
// 1..) can overflow, whatever the other dimensions are. Returns the element
// count.
absl::StatusOr<int64_t> CheckShape(const std::string& field, absl::Span<const int64_t> shape,
                                   const PsLimits& limits) {
  if (static_cast<int64_t>(shape.size()) > limits.max_rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", shape.size(),
                                                   " dimensions; the limit is ", limits.max_rank,
                                                   " (PsLimits::max_rank)"));
  }
  int64_t nonzero = 1;
  bool empty = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": dimension ", d, " is ", shape[d],
                                                     "; dimensions must be >= 0"));
    }
    if (shape[d] == 0) {
      empty = true;
      continue;
    }
    if (nonzero > limits.max_variable_elements / shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " [", absl::StrJoin(shape, ", "), "] has more than ",
          limits.max_variable_elements, " elements (PsLimits::max_variable_elements)"));
    }
    nonzero *= shape[d];
  }
  return empty ? 0 : nonzero;
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

// Times one handler into distrain_ps_rpc_seconds.
class RpcTimer {
 public:
  RpcTimer(PsMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  ~RpcTimer() {
    if (metrics_ == nullptr) return;
    metrics_->ObserveRpc(
        method_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  PsMetrics* metrics_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

PsMetrics::PsMetrics(prometheus::Registry& registry, const std::string& side)
    : side_(side),
      rpc_seconds_(prometheus::BuildHistogram()
                       .Name("distrain_ps_rpc_seconds")
                       .Help("Parameter-server RPC latency by method (side=client|server)")
                       .Register(registry)),
      bytes_(prometheus::BuildCounter()
                 .Name("distrain_ps_bytes_total")
                 .Help("Tensor bytes moved by parameter-server RPCs, by direction and shard")
                 .Register(registry)),
      staleness_(prometheus::BuildHistogram()
                     .Name("distrain_ps_staleness")
                     .Help("Updates applied to a shard between a worker's pull and its push")
                     .Register(registry)) {}

void PsMetrics::ObserveRpc(const std::string& method, double seconds) {
  static const auto* kBuckets =
      new prometheus::Histogram::BucketBoundaries(ExponentialBuckets(0.0001, 2, 18));
  rpc_seconds_.Add({{"method", method}, {"side", side_}}, *kBuckets).Observe(seconds);
}

void PsMetrics::AddBytes(const std::string& direction, const std::string& shard, double bytes) {
  bytes_.Add({{"direction", direction}, {"shard", shard}, {"side", side_}}).Increment(bytes);
}

void PsMetrics::ObserveStaleness(int64_t staleness) {
  static const auto* kBuckets =
      new prometheus::Histogram::BucketBoundaries({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128});
  staleness_.Add({{"side", side_}}, *kBuckets).Observe(static_cast<double>(staleness));
}

// One hosted shard. `info` is immutable after creation; the rest is guarded.
namespace {

// Rows of a factored gradient formed and applied at a time: small enough to
// stay in the L1/L2 cache between the GEMM that writes them and the
// optimizer that reads them.
constexpr int64_t kFactorBlockBytes = 64 << 10;

// A shard's values, shared copy-on-write with the pulls sending them. A pull
// takes a reference (Share, under the shard's reader lock) instead of copying
// the shard, and gRPC writes the bytes to the socket from this buffer. An
// update (Mutable, under the writer lock) works in place when no pull holds
// the buffer; otherwise it copies the values into a second buffer, updates
// that, and leaves the old one unchanged to the pulls still sending it. The
// buffer left behind is reused by the next such update once its pulls are
// done, so a shard has at most a few buffers and no update pays for fresh
// pages. The pull snapshot copy this replaces was 5% of the CPU of
// ParameterServer training at 32 examples per closure (bench/ps_training.py).
// Not thread-safe: the owning Shard's mutex guards it.
class ShardValue {
 public:
  int64_t size() const { return size_; }
  const float* data() const { return current_.get(); }
  // Replaces the values (writer lock).
  void Assign(const float* values, int64_t n) {
    if (n != size_) {
      current_.reset();
      spare_.reset();
      size_ = n;
    }
    std::memcpy(Mutable(), values, static_cast<size_t>(n) * sizeof(float));
  }
  // A buffer no pull holds, with the current values (writer lock).
  float* Mutable() {
    if (current_ == nullptr) {
      current_ = Allocate();
      return current_.get();
    }
    if (Unshared(current_)) return current_.get();
    std::shared_ptr<float[]> next = spare_ != nullptr && Unshared(spare_) ? spare_ : Allocate();
    std::memcpy(next.get(), current_.get(), static_cast<size_t>(size_) * sizeof(float));
    spare_ = std::move(current_);
    current_ = std::move(next);
    return current_.get();
  }
  // The current bytes as a slice that keeps them alive and unchanged until
  // gRPC releases it (reader lock).
  grpc::Slice Share() const {
    auto* ref = new std::shared_ptr<float[]>(current_);
    return grpc::Slice(current_.get(), static_cast<size_t>(size_) * sizeof(float),
                       [](void* p) { delete static_cast<std::shared_ptr<float[]>*>(p); }, ref);
  }

 private:
  std::shared_ptr<float[]> Allocate() const {
    return std::shared_ptr<float[]>(new float[static_cast<size_t>(std::max<int64_t>(size_, 1))]);
  }
  // Only the shard's own reference is left. New references need the shard's
  // reader lock, which the caller's writer lock excludes; the fence orders
  // this thread's writes after the reads of the pull that dropped the last
  // other reference (shared_ptr's decrement is a release).
  static bool Unshared(const std::shared_ptr<float[]>& buffer) {
    if (buffer.use_count() != 1) return false;
    std::atomic_thread_fence(std::memory_order_acquire);
    return true;
  }

  std::shared_ptr<float[]> current_;
  std::shared_ptr<float[]> spare_;  // an earlier buffer, maybe still being sent
  int64_t size_ = 0;
};

}  // namespace

struct PsService::Shard {
  ShardInfo info;
  std::string key;
  mutable absl::Mutex mu;
  bool initialized ABSL_GUARDED_BY(mu) = false;
  ShardValue value ABSL_GUARDED_BY(mu);
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  // Null for a non-trainable shard: its pushes are deltas added to the value.
  std::unique_ptr<Optimizer> optimizer ABSL_GUARDED_BY(mu);
};

// A validated upload stream (Initialize or Push), held whole before any
// shard changes.
struct PsService::Upload {
  struct Item {
    Shard* shard;
    std::optional<int64_t> pulled_version;
    // > 0: `data` holds the gradient's factors L [factor_rank, rows] and
    // R [factor_rank, cols] (UploadShard.factor_rank), not the gradient.
    int64_t factor_rank = 0;
    // Elements announced and received: the shard's num_elements(), or
    // factor_rank * (rows + cols) for factors.
    int64_t elements = 0;
    // `elements` values, allocated when the first chunk arrives (not
    // zero-filled: every element is written before it is read).
    std::unique_ptr<float[]> data;
  };
  bool overwrite = false;
  std::vector<Item> items;
  // Staging bytes reserved from owner->staging_bytes_, returned when the
  // upload goes away.
  PsService* owner = nullptr;
  int64_t reserved = 0;
  Upload() = default;
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;
  ~Upload() {
    if (reserved == 0) return;
    absl::MutexLock lock(&owner->staging_mu_);
    owner->staging_bytes_ -= reserved;
  }
};

absl::StatusOr<std::unique_ptr<PsService>> PsService::Create(PsServiceOptions options) {
  if (options.num_ps < 1 || options.task_index < 0 || options.task_index >= options.num_ps) {
    return absl::InvalidArgumentError(absl::StrCat("ps service: task index ", options.task_index,
                                                   " is not in [0, num_ps=", options.num_ps, ")"));
  }
  if (options.chunk_bytes < 4 || options.chunk_bytes > kPsMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ps service: chunk_bytes must be in [4, ",
                                                   kPsMaxChunkBytes, "], got ",
                                                   options.chunk_bytes));
  }
  const PsLimits& l = options.limits;
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, int64_t>>{
           {"max_name_bytes", l.max_name_bytes},
           {"max_rank", l.max_rank},
           {"max_shards", l.max_shards},
           {"max_shards_per_variable", l.max_shards_per_variable},
           {"max_variable_elements", l.max_variable_elements},
           {"max_hosted_bytes", l.max_hosted_bytes},
           {"max_staging_bytes", l.max_staging_bytes}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps service: limits.", name, " must be >= 1, got ", value));
    }
  }
  if (l.max_message_bytes < options.chunk_bytes + (64 << 10) || l.max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ps service: limits.max_message_bytes must be in [chunk_bytes + 64 KiB = ",
        options.chunk_bytes + (64 << 10), ", 2^31 - 1], got ", l.max_message_bytes));
  }
  if (options.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps service: checkpoint_keep must be >= 1, got ", options.checkpoint_keep));
  }
  if (absl::StatusOr<std::unique_ptr<Optimizer>> probe = Optimizer::Create(options.optimizer);
      !probe.ok()) {
    return probe.status();
  }
  return std::unique_ptr<PsService>(new PsService(std::move(options)));
}

PsService::PsService(PsServiceOptions options) : options_(std::move(options)) {
  // The bulk methods take raw ByteBuffers (ps_wire.h) instead of the
  // generated protobuf handlers; the bytes on the wire are unchanged. Indices
  // are the methods' order in parameter_server.proto.
  using Handler =
      grpc::internal::BidiStreamingHandler<PsService, grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(1, new Handler(&PsService::InitializeRaw, this));
  MarkMethodStreamed(2, new Handler(&PsService::PullRaw, this));
  MarkMethodStreamed(3, new Handler(&PsService::PushRaw, this));
  if (options_.registry != nullptr) {
    metrics_ = std::make_unique<PsMetrics>(*options_.registry, "server");
  }
}

PsService::~PsService() = default;

std::string PsService::Name() const { return absl::StrCat("ps:", options_.task_index); }

std::unique_ptr<Optimizer> PsService::NewOptimizer(const ShardInfo& info) const {
  if (!info.trainable) return nullptr;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(options_.optimizer);
  DISTRAIN_CHECK(opt.ok()) << "validated in Create";
  return std::move(*opt);
}

PsService::Shard* PsService::FindShard(const std::string& variable, int index) const {
  absl::ReaderMutexLock lock(&shards_mu_);
  auto it = shards_.find(absl::StrCat(variable, "/part_", index));
  if (it == shards_.end() || it->second->info.variable != variable) return nullptr;
  return it->second.get();
}

std::vector<PsService::Shard*> PsService::ShardsOfVariable(const std::string& variable) const {
  absl::ReaderMutexLock lock(&shards_mu_);
  auto it = by_variable_.find(variable);
  return it == by_variable_.end() ? std::vector<Shard*>() : it->second;
}

std::vector<PsService::Shard*> PsService::AllShards() const {
  std::vector<Shard*> out;
  absl::ReaderMutexLock lock(&shards_mu_);
  for (const auto& [key, shard] : shards_) out.push_back(shard.get());
  std::sort(out.begin(), out.end(), [](const Shard* a, const Shard* b) { return a->key < b->key; });
  return out;
}

grpc::Status PsService::CreateVariables(grpc::ServerContext* ctx,
                                        const v1::CreateVariablesRequest* request,
                                        v1::CreateVariablesResponse* response) {
  RpcTimer timer(metrics_.get(), "CreateVariables");
  if (grpc::Status s = CheckCoordinator(*ctx, "CreateVariables"); !s.ok()) return s;
  const PsLimits& limits = options_.limits;
  if (request->shards_size() > limits.max_shards) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        absl::StrCat("CreateVariables: shards lists ", request->shards_size(),
                                     " shards; the limit is ", limits.max_shards,
                                     " (PsLimits::max_shards)"));
  }
  // Validate every spec before declaring any, so a bad request changes nothing.
  std::vector<ShardInfo> infos;
  for (int i = 0; i < request->shards_size(); ++i) {
    const v1::ShardSpec& spec = request->shards(i);
    const std::string field = absl::StrCat("CreateVariables: shards[", i, "]");
    if (spec.variable().empty()) {
      return grpc::Status(grpc::INVALID_ARGUMENT, absl::StrCat(field, ".variable is empty"));
    }
    if (absl::Status s = CheckName(absl::StrCat(field, ".variable"), spec.variable(), limits);
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    const std::string what =
        absl::StrCat(field, " (", RefString(spec.variable(), spec.shard()), ")");
    std::vector<int64_t> full(spec.full_shape().begin(), spec.full_shape().end());
    absl::StatusOr<int64_t> n = CheckShape(absl::StrCat(what, ".full_shape"), full, limits);
    if (!n.ok()) return ToGrpcStatus(n.status());
    const int64_t rows = full.empty() ? 1 : full[0];
    if (spec.num_shards() > limits.max_shards_per_variable) {
      return grpc::Status(grpc::INVALID_ARGUMENT,
                          absl::StrCat(what, ": num_shards is ", spec.num_shards(),
                                       "; the limit is ", limits.max_shards_per_variable,
                                       " (PsLimits::max_shards_per_variable)"));
    }
    if (spec.num_shards() < 1 || spec.shard() < 0 || spec.shard() >= spec.num_shards()) {
      return grpc::Status(grpc::INVALID_ARGUMENT,
                          absl::StrCat(what, ": shard index ", spec.shard(),
                                       " is not in [0, num_shards=", spec.num_shards(), ")"));
    }
    if (spec.row_begin() < 0 || spec.row_end() < spec.row_begin() || spec.row_end() > rows) {
      return grpc::Status(grpc::INVALID_ARGUMENT,
                          absl::StrCat(what, ": rows [", spec.row_begin(), ", ", spec.row_end(),
                                       ") are not a range inside the variable's ", rows, " rows"));
    }
    ShardInfo info;
    info.variable = spec.variable();
    info.index = spec.shard();
    info.num_shards = spec.num_shards();
    info.full_shape = full;
    info.shape = full;
    if (!info.shape.empty()) info.shape[0] = spec.row_end() - spec.row_begin();
    info.row_begin = spec.row_begin();
    info.row_end = spec.row_end();
    info.row_elements = 1;
    for (size_t d = 1; d < full.size(); ++d) info.row_elements *= full[d];
    info.ps_task = options_.task_index;
    info.trainable = !spec.non_trainable();
    infos.push_back(std::move(info));
  }
  absl::MutexLock lock(&shards_mu_);
  for (const ShardInfo& info : infos) {
    auto it = shards_.find(info.key());
    if (it == shards_.end()) continue;
    const ShardInfo& have = it->second->info;
    if (have.variable != info.variable || have.full_shape != info.full_shape ||
        have.num_shards != info.num_shards || have.row_begin != info.row_begin ||
        have.row_end != info.row_end || have.trainable != info.trainable) {
      auto kind = [](const ShardInfo& i) { return i.trainable ? "" : " (non-trainable)"; };
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("CreateVariables: ", RefString(info.variable, info.index), " exists on ",
                       Name(), " with shape [", absl::StrJoin(have.full_shape, ", "), "], rows [",
                       have.row_begin, ", ", have.row_end, ") of ", have.num_shards, " shards",
                       kind(have), "; the request asks for shape [",
                       absl::StrJoin(info.full_shape, ", "), "], rows [", info.row_begin, ", ",
                       info.row_end, ") of ", info.num_shards, kind(info),
                       " — every process must build the same model and sharding plan "
                       "(restart the ps tasks after changing the model)"));
    }
  }
  // The budgets, for the shards this request adds (a shard listed twice
  // counts once): nothing is declared when they would be exceeded.
  {
    absl::flat_hash_set<std::string> fresh;
    int64_t fresh_bytes = 0;
    for (const ShardInfo& info : infos) {
      std::string key = info.key();
      if (shards_.contains(key) || !fresh.insert(std::move(key)).second) continue;
      fresh_bytes += info.num_elements() * static_cast<int64_t>(sizeof(float));
      // Each term is at most 4 * max_variable_elements; checked per term so
      // the sum cannot overflow either.
      if (hosted_bytes_ + fresh_bytes > limits.max_hosted_bytes) {
        return grpc::Status(
            grpc::RESOURCE_EXHAUSTED,
            absl::StrCat("CreateVariables: ", Name(), " hosts ", hosted_bytes_,
                         " bytes of shards; declaring ", RefString(info.variable, info.index),
                         " (", info.num_elements(), " elements) with the request's other new "
                         "shards would make ", hosted_bytes_ + fresh_bytes,
                         " bytes; the limit is ", limits.max_hosted_bytes,
                         " (PsLimits::max_hosted_bytes); nothing declared"));
      }
    }
    const int64_t total = static_cast<int64_t>(shards_.size() + fresh.size());
    if (total > limits.max_shards) {
      return grpc::Status(grpc::RESOURCE_EXHAUSTED,
                          absl::StrCat("CreateVariables: ", Name(), " hosts ", shards_.size(),
                                       " shards; this request adds ", fresh.size(),
                                       ", more than the limit of ", limits.max_shards,
                                       " (PsLimits::max_shards); nothing declared"));
    }
  }
  int created = 0, existing = 0;
  for (ShardInfo& info : infos) {
    std::string key = info.key();
    if (shards_.contains(key)) {
      ++existing;
      continue;
    }
    hosted_bytes_ += info.num_elements() * static_cast<int64_t>(sizeof(float));
    auto shard = std::make_unique<Shard>();
    shard->info = std::move(info);
    shard->key = key;
    {
      absl::MutexLock shard_lock(&shard->mu);
      shard->optimizer = NewOptimizer(shard->info);
    }
    std::vector<Shard*>& siblings = by_variable_[shard->info.variable];
    siblings.push_back(shard.get());
    std::sort(siblings.begin(), siblings.end(),
              [](const Shard* a, const Shard* b) { return a->info.index < b->info.index; });
    shards_.emplace(std::move(key), std::move(shard));
    ++created;
  }
  response->set_created(created);
  response->set_existing(existing);
  return grpc::Status::OK;
}

namespace {

// Elements of a factored gradient (UploadShard.factor_rank) of `shard`, or
// why the factors cannot be taken. The bound on the rank keeps a hostile
// header from making the ps allocate more than the dense gradient would.
absl::StatusOr<int64_t> FactoredElements(const char* method, const std::string& field,
                                         const std::string& what, const ShardInfo& shard,
                                         int64_t factor_rank) {
  if (std::strcmp(method, "Push") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", what, ": factor_rank is only for Push; ", method, " takes values"));
  }
  if (!shard.trainable) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", what,
                     ": factor_rank is only for gradients; a non-trainable shard takes its "
                     "delta dense"));
  }
  if (shard.full_shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", what, ": factor_rank needs a rank-2 variable, this one has shape [",
        absl::StrJoin(shard.full_shape, ", "), "]; push its gradient dense"));
  }
  const int64_t rows = shard.row_end - shard.row_begin;
  const int64_t cols = shard.row_elements;
  const int64_t dense = shard.num_elements();
  if (factor_rank < 0 || factor_rank > dense / (rows + cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", what, ": factor_rank ", factor_rank, " must be in [1, ",
        dense / (rows + cols), "] for a shard of shape [", rows, ", ", cols,
        "]: factors may not be larger than the dense gradient (", dense,
        " elements); push that instead"));
  }
  return factor_rank * (rows + cols);
}

}  // namespace

absl::Status PsService::ReadUpload(const char* method, grpc::ServerContext* ctx, RawStream* stream,
                                   Upload& upload) {
  grpc::ByteBuffer buffer;
  ps_wire::Frame frame;
  if (!stream->Read(&buffer)) {
    if (ctx->IsCancelled())
      return absl::CancelledError(absl::StrCat(method, ": cancelled by the client"));
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": empty stream; the first message must carry the header"));
  }
  if (absl::Status s = frame.Parse(buffer); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": message 0 is not an UploadMessage: ", s.message()));
  }
  v1::UploadHeader header;
  for (const std::string& bytes : frame.headers()) {
    // Repeated occurrences of a message field merge, as protobuf does.
    if (!header.MergeFromString(bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(method, ": message 0: the header is not a valid UploadHeader"));
    }
  }
  if (frame.headers().empty() || header.shards_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": the first message must carry a header listing at least one shard"));
  }
  upload.overwrite = header.overwrite();
  const PsLimits& limits = options_.limits;
  if (header.shards_size() > limits.max_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        method, ": header.shards lists ", header.shards_size(), " shards; the limit is ",
        limits.max_shards, " (PsLimits::max_shards)"));
  }
  std::vector<int64_t> received;
  absl::flat_hash_set<const Shard*> listed;
  for (int i = 0; i < header.shards_size(); ++i) {
    const v1::UploadShard& us = header.shards(i);
    const std::string field = absl::StrCat(method, ": header.shards[", i, "]");
    if (us.ref().variable().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".ref.variable is empty"));
    }
    if (absl::Status s = CheckName(absl::StrCat(field, ".ref.variable"), us.ref().variable(),
                                   limits);
        !s.ok()) {
      return s;
    }
    const std::string what = RefString(us.ref().variable(), us.ref().shard());
    Shard* shard = FindShard(us.ref().variable(), us.ref().shard());
    if (shard == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          field, ": ", what, " is not hosted on ", Name(),
          "; create it first (CreateVariables) and check that every process uses the same "
          "sharding plan"));
    }
    if (!listed.insert(shard).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", what, " is listed twice"));
    }
    int64_t elements = shard->info.num_elements();
    if (us.factor_rank() != 0) {
      absl::StatusOr<int64_t> factored =
          FactoredElements(method, field, what, shard->info, us.factor_rank());
      if (!factored.ok()) return factored.status();
      elements = *factored;
    }
    if (us.num_elements() != elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", what, " announces ", us.num_elements(), " elements, but ",
          us.factor_rank() != 0
              ? absl::StrCat("factors of rank ", us.factor_rank(), " of a shard of shape [",
                             absl::StrJoin(shard->info.shape, ", "), "] have ", elements)
              : absl::StrCat("the shard has ", elements, " (shape [",
                             absl::StrJoin(shard->info.shape, ", "), "])")));
    }
    if (us.has_pulled_version() && us.pulled_version() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", what, ": pulled_version ",
                                                     us.pulled_version(), " is negative"));
    }
    upload.items.push_back(Upload::Item{
        shard,
        us.has_pulled_version() ? std::optional<int64_t>(us.pulled_version()) : std::nullopt,
        us.factor_rank(), elements, {}});
    received.push_back(0);
  }
  // Reserve every buffer the announced shards need before taking a chunk:
  // each element count is a hosted shard's (or less, for factors), so the
  // sum is bounded by max_hosted_bytes; the budget bounds many streams.
  int64_t staging = 0;
  for (const Upload::Item& item : upload.items) {
    staging += item.elements * static_cast<int64_t>(sizeof(float));
  }
  if (staging > 0) {
    absl::MutexLock lock(&staging_mu_);
    if (staging_bytes_ + staging > limits.max_staging_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          method, ": the header announces ", staging, " bytes while uploads in flight hold ",
          staging_bytes_, " bytes of ", Name(), "'s staging budget of ",
          limits.max_staging_bytes,
          " (PsLimits::max_staging_bytes); nothing applied, retry when they are done"));
    }
    staging_bytes_ += staging;
    upload.owner = this;
    upload.reserved = staging;
  }
  const int n = static_cast<int>(upload.items.size());
  for (int64_t message = 0;; ++message) {
    if (message > 0) {
      if (!stream->Read(&buffer)) break;
      if (absl::Status s = frame.Parse(buffer); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": message ", message, " is not an UploadMessage: ", s.message()));
      }
      if (!frame.headers().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": a header arrived after the first message; send it once"));
      }
      // Every later message must move data: a stream of empty messages
      // would hold its staging reservation and a handler thread for ever.
      bool moves_data = false;
      for (const ps_wire::DecodedChunk& chunk : frame.chunks()) {
        moves_data = moves_data || chunk.data.size >= sizeof(float);
      }
      if (!moves_data) {
        return absl::InvalidArgumentError(absl::StrCat(
            method, ": message ", message,
            " carries no element; every message after the first must carry data"));
      }
    }
    for (const ps_wire::DecodedChunk& chunk : frame.chunks()) {
      if (chunk.index < 0 || chunk.index >= n) {
        return absl::InvalidArgumentError(absl::StrCat(method, ": chunk index ", chunk.index,
                                                       " is out of range; the header lists ", n,
                                                       " shards"));
      }
      Upload::Item& item = upload.items[chunk.index];
      const std::string what = RefString(item.shard->info.variable, item.shard->info.index);
      const int64_t total = item.elements;
      int64_t& got = received[chunk.index];
      if (chunk.data.size % sizeof(float) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": ", what, ": chunk at offset ", chunk.offset, " has ",
                         chunk.data.size, " bytes, not a whole number of float32 elements"));
      }
      const int64_t count = static_cast<int64_t>(chunk.data.size / sizeof(float));
      if (chunk.offset < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": ", what, ": chunk offset ", chunk.offset, " is negative"));
      }
      if (chunk.offset < got) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": ", what, ": duplicate or overlapping chunk at element offset ",
                         chunk.offset, " (", got, " elements already received)"));
      }
      if (chunk.offset > got) {
        return absl::InvalidArgumentError(absl::StrCat(
            method, ": ", what, ": chunk at offset ", chunk.offset,
            " skips elements; expected offset ", got, " (chunks must arrive in order)"));
      }
      if (count > total - got) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": ", what, ": chunk at offset ", chunk.offset, " with ", count,
                         " elements runs past the shard's ", total, " elements"));
      }
      if (count == 0) continue;
      if (item.data == nullptr) item.data.reset(new float[total]);
      frame.CopyTo(chunk.data, item.data.get() + got);
      got += count;
    }
  }
  if (ctx->IsCancelled()) {
    return absl::CancelledError(absl::StrCat(method, ": cancelled by the client; nothing applied"));
  }
  for (int i = 0; i < n; ++i) {
    const int64_t total = upload.items[i].elements;
    if (received[i] != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          method, ": the stream ended after ", received[i], " of ", total, " elements of ",
          RefString(upload.items[i].shard->info.variable, upload.items[i].shard->info.index),
          " (truncated); nothing applied"));
    }
  }
  return absl::OkStatus();
}

grpc::Status PsService::InitializeRaw(grpc::ServerContext* ctx, RawStream* stream) {
  RpcTimer timer(metrics_.get(), "Initialize");
  if (grpc::Status s = CheckCoordinator(*ctx, "Initialize"); !s.ok()) return s;
  Upload upload;
  if (absl::Status s = ReadUpload("Initialize", ctx, stream, upload); !s.ok()) return ToGrpcStatus(s);
  v1::InitializeResponse answer;
  v1::InitializeResponse* response = &answer;
  for (Upload::Item& item : upload.items) {
    Shard& shard = *item.shard;
    v1::ShardRef* ref;
    {
      absl::MutexLock lock(&shard.mu);
      if (shard.initialized && !upload.overwrite) {
        ref = response->add_skipped();
      } else {
        shard.optimizer = NewOptimizer(shard.info);
        const int64_t n = shard.info.num_elements();
        shard.value.Assign(item.data.get(), n);
        shard.version = 0;
        shard.initialized = true;
        ref = response->add_initialized();
      }
    }
    ref->set_variable(shard.info.variable);
    ref->set_shard(shard.info.index);
  }
  return WriteAnswer(stream, answer);
}

grpc::Status PsService::PullRaw(grpc::ServerContext* ctx, RawStream* stream) {
  RpcTimer timer(metrics_.get(), "Pull");
  if (grpc::Status s = CheckTrainer(*ctx, "Pull"); !s.ok()) return s;
  v1::PullRequest request_message;
  {
    grpc::ByteBuffer buffer;
    if (!stream->Read(&buffer)) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "Pull: the call carries no PullRequest");
    }
    if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(&buffer, &request_message).ok()) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "Pull: the request is not a valid PullRequest");
    }
  }
  const v1::PullRequest* request = &request_message;
  const PsLimits& limits = options_.limits;
  if (request->variables_size() + static_cast<int64_t>(request->shards_size()) >
      limits.max_shards) {
    return grpc::Status(
        grpc::INVALID_ARGUMENT,
        absl::StrCat("Pull: the request names ", request->variables_size(), " variables and ",
                     request->shards_size(), " shards; the limit is ", limits.max_shards,
                     " together (PsLimits::max_shards)"));
  }
  std::vector<Shard*> targets;
  absl::flat_hash_set<const Shard*> seen;
  auto add = [&](Shard* s) -> bool {
    if (!seen.insert(s).second) return false;
    targets.push_back(s);
    return true;
  };
  for (int i = 0; i < request->variables_size(); ++i) {
    const std::string& name = request->variables(i);
    if (absl::Status s = CheckName(absl::StrCat("Pull: variables[", i, "]"), name, limits);
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    std::vector<Shard*> shards = ShardsOfVariable(name);
    if (shards.empty()) {
      return grpc::Status(grpc::NOT_FOUND, absl::StrCat("Pull: variables[", i, "]: variable \"",
                                                        name, "\" has no shards on ", Name()));
    }
    for (Shard* s : shards) {
      if (!add(s)) {
        return grpc::Status(grpc::INVALID_ARGUMENT, absl::StrCat("Pull: variables[", i, "]: \"",
                                                                 name, "\" is requested twice"));
      }
    }
  }
  for (int i = 0; i < request->shards_size(); ++i) {
    const v1::ShardRef& ref = request->shards(i);
    if (absl::Status s =
            CheckName(absl::StrCat("Pull: shards[", i, "].variable"), ref.variable(), limits);
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    Shard* s = FindShard(ref.variable(), ref.shard());
    if (s == nullptr) {
      return grpc::Status(grpc::NOT_FOUND, absl::StrCat("Pull: shards[", i, "]: ",
                                                        RefString(ref.variable(), ref.shard()),
                                                        " is not hosted on ", Name()));
    }
    if (!add(s)) {
      return grpc::Status(
          grpc::INVALID_ARGUMENT,
          absl::StrCat("Pull: shards[", i, "]: ", RefString(ref.variable(), ref.shard()),
                       " is requested twice"));
    }
  }
  if (targets.empty()) {
    return grpc::Status(grpc::INVALID_ARGUMENT, "Pull: the request names no variables or shards");
  }
  int64_t chunk_bytes = options_.chunk_bytes;
  if (request->max_chunk_bytes() != 0) {
    if (request->max_chunk_bytes() < 4 || request->max_chunk_bytes() > kPsMaxChunkBytes) {
      return grpc::Status(
          grpc::INVALID_ARGUMENT,
          absl::StrCat("Pull: max_chunk_bytes must be 0 (server default) or in [4, ",
                       kPsMaxChunkBytes, "], got ", request->max_chunk_bytes()));
    }
    chunk_bytes = request->max_chunk_bytes();
  }
  const int64_t chunk_elements = chunk_bytes / static_cast<int64_t>(sizeof(float));
  for (Shard* s : targets) {
    absl::ReaderMutexLock lock(&s->mu);
    if (!s->initialized) {
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("Pull: ", RefString(s->info.variable, s->info.index), " on ", Name(),
                       " has no value yet; the chief initialises "
                       "variables (Initialize) or restores them (Restore)"));
    }
  }

  // Each shard's current buffer is shared, under its reader lock, as a slice
  // (a consistent snapshot without a copy: updates meanwhile go to another
  // buffer, see ShardValue); messages reference sub-slices of it and are
  // written after the lock is released, so a slow reader never blocks pushes.
  std::vector<grpc::ByteBuffer> ready;
  ps_wire::FrameBuilder current;
  auto flush = [&] { ready.push_back(current.Finish()); };
  for (size_t t = 0; t < targets.size(); ++t) {
    Shard& shard = *targets[t];
    const int64_t total = shard.info.num_elements();
    const size_t bytes = static_cast<size_t>(total) * sizeof(float);
    grpc::Slice snapshot;
    v1::PulledShard header;
    header.set_index(static_cast<int32_t>(t));
    header.mutable_ref()->set_variable(shard.info.variable);
    header.mutable_ref()->set_shard(shard.info.index);
    for (int64_t d : shard.info.shape) header.add_shape(d);
    {
      absl::ReaderMutexLock lock(&shard.mu);
      header.set_version(shard.version);
      if (bytes > 0) snapshot = shard.value.Share();
    }
    if (current.size() + kHeaderOverheadBytes > chunk_bytes && !current.empty()) flush();
    current.AddMessage(ps_wire::kHeaderField, header);
    int64_t offset = 0;
    while (offset < total) {
      const int64_t room = (chunk_bytes - current.size()) / static_cast<int64_t>(sizeof(float));
      if (room <= 0) {
        flush();
        continue;
      }
      const int64_t take = std::min({total - offset, room, chunk_elements});
      current.AddChunk(static_cast<int32_t>(t), offset,
                       snapshot.sub(offset * sizeof(float), (offset + take) * sizeof(float)));
      offset += take;
    }
    if (metrics_)
      metrics_->AddBytes("pulled", shard.key, static_cast<double>(total * sizeof(float)));
    for (grpc::ByteBuffer& m : ready) {
      if (!stream->Write(m)) {
        return grpc::Status(grpc::CANCELLED, "Pull: the client went away mid-stream");
      }
    }
    ready.clear();
  }
  if (!current.empty()) {
    if (!stream->Write(current.Finish())) {
      return grpc::Status(grpc::CANCELLED, "Pull: the client went away mid-stream");
    }
  }
  return grpc::Status::OK;
}

grpc::Status PsService::PushRaw(grpc::ServerContext* ctx, RawStream* stream) {
  RpcTimer timer(metrics_.get(), "Push");
  if (grpc::Status s = CheckTrainer(*ctx, "Push"); !s.ok()) return s;
  Upload upload;
  if (absl::Status s = ReadUpload("Push", ctx, stream, upload); !s.ok()) return ToGrpcStatus(s);
  v1::PushResponse answer;
  v1::PushResponse* response = &answer;

  // Checks that cannot change between here and the apply (values never lose
  // initialisation; versions only grow), so failing them applies nothing.
  for (const Upload::Item& item : upload.items) {
    absl::ReaderMutexLock lock(&item.shard->mu);
    const std::string what = RefString(item.shard->info.variable, item.shard->info.index);
    if (!item.shard->initialized) {
      return grpc::Status(grpc::FAILED_PRECONDITION,
                          absl::StrCat("Push: ", what, " on ", Name(),
                                       " has no value yet; initialise or restore it first"));
    }
    if (item.pulled_version && *item.pulled_version > item.shard->version) {
      return grpc::Status(
          grpc::INVALID_ARGUMENT,
          absl::StrCat("Push: ", what, ": pulled_version ", *item.pulled_version,
                       " is ahead of the shard's version ", item.shard->version, " on ", Name()));
    }
  }

  // Callers hold item.shard->mu.
  auto apply = [&](Upload::Item& item) {
    Shard& shard = *item.shard;
    const bool trainable = shard.info.trainable;
    const int64_t staleness =
        trainable && item.pulled_version ? shard.version - *item.pulled_version : 0;
    const int64_t n = shard.info.num_elements();
    float* value = shard.value.Mutable();
    if (!trainable) {
      // A delta from one replica's forward pass (moving = moving * momentum
      // + batch * (1 - momentum) there, sent as moving_after - moving_pulled):
      // added to whatever the value is now, so every worker's update lands
      // even when others updated meanwhile, as TensorFlow's assign_sub on a
      // ps variable does. Mutable() keeps pulls in flight unaffected.
      const float* delta = item.data.get();
      for (int64_t i = 0; i < n; ++i) value[i] += delta[i];
    } else if (item.factor_rank > 0) {
      // G = L^T R: the product the worker did not form, at the same cost
      // here (the GEMM moves, the dense gradient's bytes do not travel).
      // Formed under the shard's lock so a staleness-rejected push never
      // pays for it, and a block of rows at a time, each applied while it
      // is still in cache instead of writing the whole gradient out and
      // reading it back (ApplyDenseRange equals ApplyDense bit for bit).
      // L arrives [rank, rows]; transposed first (rank * rows floats, a few
      // KiB) so each block is (L^T) R with a short inner dimension, the
      // shape cpu::Gemm's small kernels take without packing or zero-filling.
      thread_local std::vector<float> block, left_t;
      const int64_t rank = item.factor_rank;
      const int64_t rows = shard.info.row_end - shard.info.row_begin;
      const int64_t cols = shard.info.row_elements;
      const int64_t block_rows =
          std::max<int64_t>(1, kFactorBlockBytes / (std::max<int64_t>(cols, 1) * sizeof(float)));
      block.resize(static_cast<size_t>(std::min(rows, block_rows) * cols));
      left_t.resize(static_cast<size_t>(rank * rows));
      const float* left = item.data.get();
      const float* right = left + rank * rows;
      cpu::Transpose(rank, rows, left, left_t.data());
      for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
        const int64_t m = std::min(block_rows, rows - r0);
        cpu::Gemm(false, false, m, cols, rank, 1.0f, left_t.data() + r0 * rank, right, 0.0f,
                  block.data());
        shard.optimizer->ApplyDenseRange(
            shard.key, n, r0 * cols, absl::MakeSpan(value + r0 * cols, static_cast<size_t>(m * cols)),
            absl::MakeConstSpan(block.data(), static_cast<size_t>(m * cols)), shard.version + 1);
      }
    } else {
      shard.optimizer->ApplyDense(shard.key, absl::MakeSpan(value, static_cast<size_t>(n)),
                                  absl::MakeConstSpan(item.data.get(), static_cast<size_t>(n)),
                                  shard.version + 1);
    }
    ++shard.version;
    v1::ShardVersion* v = response->add_shards();
    v->mutable_ref()->set_variable(shard.info.variable);
    v->mutable_ref()->set_shard(shard.info.index);
    v->set_version(shard.version);
    v->set_staleness(staleness);
    if (metrics_) {
      metrics_->AddBytes("pushed", shard.key, static_cast<double>(item.elements * sizeof(float)));
      if (trainable && item.pulled_version) metrics_->ObserveStaleness(staleness);
    }
  };

  if (options_.max_staleness < 0) {
    for (Upload::Item& item : upload.items) {
      absl::MutexLock lock(&item.shard->mu);
      apply(item);
    }
  } else {
    // Lock every shard of the push in key order (no deadlock between pushes),
    // check all, then apply all: a rejected push changes nothing.
    std::vector<Upload::Item*> order;
    for (Upload::Item& item : upload.items) order.push_back(&item);
    std::sort(order.begin(), order.end(), [](const Upload::Item* a, const Upload::Item* b) {
      return a->shard->key < b->shard->key;
    });
    std::vector<std::unique_ptr<absl::MutexLock>> locks;
    for (Upload::Item* item : order)
      locks.push_back(std::make_unique<absl::MutexLock>(&item->shard->mu));
    for (Upload::Item* item : order) {
      // The bound protects gradients from parameters too old to apply them
      // to; a delta of moving statistics is valid whenever it arrives.
      if (!item->shard->info.trainable) continue;
      if (!item->pulled_version) {
        return grpc::Status(
            grpc::INVALID_ARGUMENT,
            absl::StrCat("Push: ", RefString(item->shard->info.variable, item->shard->info.index),
                         ": pulled_version is required because ", Name(),
                         " enforces max_staleness ", options_.max_staleness));
      }
      const int64_t staleness = item->shard->version - *item->pulled_version;
      if (staleness > options_.max_staleness) {
        return grpc::Status(
            grpc::FAILED_PRECONDITION,
            absl::StrCat("Push: ", RefString(item->shard->info.variable, item->shard->info.index),
                         " is ", staleness, " updates stale (pulled version ",
                         *item->pulled_version, ", now ", item->shard->version,
                         "), more than max_staleness ", options_.max_staleness,
                         "; pull again and recompute the gradient"));
      }
    }
    for (Upload::Item* item : order) apply(*item);
  }
  pushes_applied_.fetch_add(1, std::memory_order_relaxed);
  return WriteAnswer(stream, answer);
}

grpc::Status PsService::NoCheckpointDir(const char* method) const {
  return grpc::Status(
      grpc::FAILED_PRECONDITION,
      absl::StrCat(method, ": ", Name(),
                   " has no checkpoint directory (DISTRAIN_CHECKPOINT_DIR is not set for this ps "
                   "task); give the chief and every ps task one shared checkpoint directory "
                   "(spec.training.checkpoint.dir on a volume they all mount)"));
}

grpc::Status PsService::Save(grpc::ServerContext* ctx, const v1::SaveRequest* request,
                             v1::SaveResponse* response) {
  RpcTimer timer(metrics_.get(), "Save");
  if (grpc::Status s = CheckCoordinator(*ctx, "Save"); !s.ok()) return s;
  if (options_.checkpoint_dir.empty()) return NoCheckpointDir("Save");
  if (request->step() < 0 || (options_.max_step >= 0 && request->step() > options_.max_step)) {
    return grpc::Status(
        grpc::INVALID_ARGUMENT,
        absl::StrCat("Save: step is ", request->step(), "; it must be in [0, ",
                     options_.max_step >= 0 ? absl::StrCat(options_.max_step, "] (the job's steps)")
                                            : std::string("2^63)")));
  }
  // Retention is the ps's own: a caller may keep more, never prune more.
  if (request->keep() < 0 || (request->keep() > 0 && request->keep() < options_.checkpoint_keep)) {
    return grpc::Status(
        grpc::INVALID_ARGUMENT,
        absl::StrCat("Save: keep is ", request->keep(), "; it must be 0 (", Name(),
                     "'s own retention, ", options_.checkpoint_keep, ") or at least that"));
  }
  absl::MutexLock save_lock(&save_mu_);
  CheckpointState state;
  state.step = request->step();
  state.metadata["ps/task"] = absl::StrCat(options_.task_index);
  state.metadata["ps/num_ps"] = absl::StrCat(options_.num_ps);
  const std::vector<Shard*> shards = AllShards();
  for (Shard* s : shards) {
    absl::ReaderMutexLock lock(&s->mu);
    if (!s->initialized) {
      return grpc::Status(grpc::FAILED_PRECONDITION,
                          absl::StrCat("Save: ", RefString(s->info.variable, s->info.index), " on ",
                                       Name(), " has no value yet; nothing saved"));
    }
    state.tensors.emplace(absl::StrCat(kVariablePrefix, s->key), Tensor(s->info.shape, std::vector<float>(s->value.data(),
                                                          s->value.data() + s->value.size())));
    if (s->optimizer != nullptr) {
      for (auto& [name, slot] : s->optimizer->SlotState()) {
        state.tensors.emplace(absl::StrCat(kOptimizerPrefix, name), std::move(slot));
      }
    }
    const std::string prefix = absl::StrCat(kShardPrefix, s->key, "/");
    state.metadata[prefix + "variable"] = s->info.variable;
    state.metadata[prefix + "rows"] = absl::StrCat(s->info.row_begin, ":", s->info.row_end);
    state.metadata[prefix + "full_shape"] = absl::StrJoin(s->info.full_shape, ",");
    state.metadata[prefix + "version"] = absl::StrCat(s->version);
    state.metadata[prefix + "trainable"] = s->info.trainable ? "true" : "false";
  }
  const std::string dir =
      PsCheckpointDir(options_.checkpoint_dir, options_.task_index, options_.num_ps);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return grpc::Status(grpc::FAILED_PRECONDITION,
                        absl::StrCat("Save: cannot create ", dir, ": ", ec.message()));
  }
  CheckpointManager manager(dir, request->keep() > 0 ? request->keep() : options_.checkpoint_keep);
  if (absl::Status s = manager.Save(state); !s.ok()) return ToGrpcStatus(s);
  response->set_path(manager.PathForStep(state.step));
  response->set_shards(static_cast<int32_t>(shards.size()));
  return grpc::Status::OK;
}

grpc::Status PsService::Restore(grpc::ServerContext* ctx, const v1::RestoreRequest* request,
                                v1::RestoreResponse* response) {
  RpcTimer timer(metrics_.get(), "Restore");
  if (grpc::Status s = CheckCoordinator(*ctx, "Restore"); !s.ok()) return s;
  if (options_.checkpoint_dir.empty()) return NoCheckpointDir("Restore");
  if (request->has_step() && request->step() < 0) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        absl::StrCat("Restore: step must be >= 0, got ", request->step()));
  }
  absl::MutexLock save_lock(&save_mu_);
  absl::StatusOr<PsCheckpoint> ckpt =
      LoadPsCheckpoint(options_.checkpoint_dir,
                       request->has_step() ? std::optional<int64_t>(request->step()) : std::nullopt);
  if (!ckpt.ok()) return ToGrpcStatus(ckpt.status());

  // Build every shard's new state first; commit only when all are valid.
  struct Staged {
    Shard* shard;
    std::vector<float> value;
    int64_t version;
    std::unique_ptr<Optimizer> optimizer;
  };
  std::vector<Staged> staged;
  for (Shard* s : AllShards()) {
    const std::string what = RefString(s->info.variable, s->info.index);
    auto it = ckpt->variables.find(s->info.variable);
    if (it == ckpt->variables.end()) {
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("Restore: the checkpoint at step ", ckpt->step, " in ",
                       options_.checkpoint_dir,
                       " has no variable \"", s->info.variable,
                       "\"; the model changed since it was written — use a new checkpoint "
                       "directory"));
    }
    const PsCheckpoint::Variable& var = it->second;
    if (var.trainable != s->info.trainable) {
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("Restore: variable \"", s->info.variable, "\" is ",
                       var.trainable ? "trainable" : "non-trainable", " in the checkpoint at step ",
                       ckpt->step, " but ", s->info.trainable ? "trainable" : "non-trainable",
                       " in the model; use a new checkpoint directory"));
    }
    if (var.value.shape() != s->info.full_shape) {
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("Restore: variable \"", s->info.variable, "\" has shape ",
                       var.value.ShapeString(), " in the checkpoint at step ", ckpt->step, " but [",
                       absl::StrJoin(s->info.full_shape, ", "),
                       "] in the model; use a new checkpoint directory"));
    }
    const int64_t begin = s->info.element_offset();
    const int64_t n = s->info.num_elements();
    Staged st;
    st.shard = s;
    st.value.assign(var.value.data() + begin, var.value.data() + begin + n);
    st.version = var.VersionForRows(s->info.row_begin, s->info.row_end);
    std::map<std::string, Tensor> slots;
    for (const auto& [slot, full] : var.slots) {
      slots.emplace(absl::StrCat(s->key, "/", slot),
                    Tensor({n}, std::vector<float>(full.data() + begin, full.data() + begin + n)));
    }
    st.optimizer = NewOptimizer(s->info);
    if (st.optimizer != nullptr) {
      if (absl::Status rs = st.optimizer->RestoreState(slots, st.version); !rs.ok()) {
        return grpc::Status(grpc::FAILED_PRECONDITION,
                            absl::StrCat("Restore: ", what, ": ", rs.message()));
      }
    }
    staged.push_back(std::move(st));
  }
  for (Staged& st : staged) {
    absl::MutexLock lock(&st.shard->mu);
    st.shard->value.Assign(st.value.data(), static_cast<int64_t>(st.value.size()));
    st.shard->version = st.version;
    st.shard->optimizer = std::move(st.optimizer);
    st.shard->initialized = true;
  }
  spdlog::info("{}: restored {} shards from step {} ({} ps layout) in {}", Name(), staged.size(),
               ckpt->step, ckpt->saved_num_ps, options_.checkpoint_dir);
  response->set_step(ckpt->step);
  response->set_shards(static_cast<int32_t>(staged.size()));
  response->set_saved_num_ps(ckpt->saved_num_ps);
  return grpc::Status::OK;
}

grpc::Status PsService::Health(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                               v1::HealthResponse* response) {
  response->set_task_index(options_.task_index);
  response->set_num_ps(options_.num_ps);
  int initialized = 0;
  const std::vector<Shard*> shards = AllShards();
  for (Shard* s : shards) {
    absl::ReaderMutexLock lock(&s->mu);
    if (s->initialized) ++initialized;
  }
  response->set_shards(static_cast<int32_t>(shards.size()));
  response->set_initialized_shards(initialized);
  response->set_pushes_applied(pushes_applied_.load(std::memory_order_relaxed));
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------
// Role checks (with TLS; plaintext has no identities).

grpc::Status PsService::CheckCoordinator(const grpc::ServerContext& ctx,
                                         std::string_view method) const {
  return CheckCaller(
      options_.security.get(), ctx, method,
      [](const TaskId& caller) { return caller.type == "chief"; }, "only the chief");
}

grpc::Status PsService::CheckTrainer(const grpc::ServerContext& ctx,
                                     std::string_view method) const {
  return CheckCaller(
      options_.security.get(), ctx, method,
      [](const TaskId& caller) { return caller.type == "chief" || caller.type == "worker"; },
      "only the chief and the workers");
}

// PsServer

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const std::string& address,
                                                          PsServiceOptions options) {
  absl::StatusOr<std::unique_ptr<PsService>> service = PsService::Create(std::move(options));
  if (!service.ok()) return service.status();
  std::unique_ptr<PsServer> server(new PsServer());
  server->service_ = std::move(*service);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, ServerCredentialsFor(server->service_->options().security.get()),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  for (const auto& [name, value] : PsTransportArgs()) builder.AddChannelArgument(name, value);
  // gRPC refuses a larger message (RESOURCE_EXHAUSTED) before a handler sees it.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(server->service_->options().limits.max_message_bytes));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("ps server: cannot listen on ", address,
                                               " (port in use, or not an address of this host?)"));
  }
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = "127.0.0.1";
  server->host_ = host;
  return server;
}

PsServer::~PsServer() { Shutdown(); }

std::string PsServer::address() const { return absl::StrCat(host_, ":", port_); }

void PsServer::Shutdown() {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
}

void PsServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

// ---------------------------------------------------------------------------
// Checkpoints

std::vector<std::pair<std::string, int>> PsTransportArgs() {
  return {
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20},
      {GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20},
      {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10},
  };
}

void KeepPsBuffersMapped() {
  // The working set is about the model's size and stable from the first
  // closure on, so memory kept is memory reused.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

std::string PsCheckpointDir(const std::string& dir, int task, int num_ps) {
  return absl::StrCat(dir, "/ps-", task, "-of-", num_ps);
}

int64_t PsCheckpoint::Variable::VersionForRows(int64_t begin, int64_t end) const {
  int64_t v = 0;
  for (const RowVersion& rv : versions) {
    const bool overlaps = rv.row_begin < end && begin < rv.row_end;
    // An empty range (zero-row variable) takes the version of its only shard.
    if (overlaps || (begin == end && rv.row_begin == begin)) v = std::max(v, rv.version);
  }
  return v;
}

CheckpointState PsCheckpoint::ToCheckpointState() const {
  CheckpointState state;
  state.step = step;
  int64_t iterations = 0;
  for (const auto& [name, var] : variables) {
    state.tensors.emplace(absl::StrCat(kVariablePrefix, name), var.value);
    for (const auto& [slot, tensor] : var.slots) {
      state.tensors.emplace(absl::StrCat(kOptimizerPrefix, name, "/", slot), tensor);
    }
    // A non-trainable shard's version counts deltas, not optimizer steps.
    if (!var.trainable) continue;
    for (const RowVersion& rv : var.versions) iterations = std::max(iterations, rv.version);
  }
  state.metadata["optimizer_iterations"] = absl::StrCat(iterations);
  return state;
}

namespace {

// Adds one ps task's file to the assembled checkpoint.
absl::Status MergePsFile(const std::string& path, const CheckpointState& file, PsCheckpoint& out,
                         std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>& rows) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  for (const auto& [key, variable] : file.metadata) {
    if (!absl::StartsWith(key, kShardPrefix) || !absl::EndsWith(key, "/variable")) continue;
    const std::string shard_key =
        key.substr(std::strlen(kShardPrefix), key.size() - std::strlen(kShardPrefix) - 9);
    const std::string prefix = absl::StrCat(kShardPrefix, shard_key, "/");
    auto meta = [&](const char* field) -> const std::string* {
      auto it = file.metadata.find(prefix + field);
      return it == file.metadata.end() ? nullptr : &it->second;
    };
    const std::string* rows_text = meta("rows");
    const std::string* shape_text = meta("full_shape");
    const std::string* version_text = meta("version");
    if (!rows_text || !shape_text || !version_text) {
      return bad(
          absl::StrCat("shard \"", shard_key, "\" lacks rows, full_shape or version metadata"));
    }
    // Files written before trainability was recorded hold trainable shards only.
    const std::string* trainable_text = meta("trainable");
    if (trainable_text && *trainable_text != "true" && *trainable_text != "false") {
      return bad(absl::StrCat("shard \"", shard_key, "\" has malformed trainable \"",
                              *trainable_text, "\""));
    }
    const bool trainable = trainable_text == nullptr || *trainable_text == "true";
    int64_t begin = 0, end = 0, version = 0;
    std::vector<std::string> rb = absl::StrSplit(*rows_text, ':');
    if (rb.size() != 2 || !absl::SimpleAtoi(rb[0], &begin) || !absl::SimpleAtoi(rb[1], &end) ||
        !absl::SimpleAtoi(*version_text, &version) || version < 0) {
      return bad(absl::StrCat("shard \"", shard_key, "\" has malformed rows \"", *rows_text,
                              "\" or version \"", *version_text, "\""));
    }
    std::vector<int64_t> full_shape;
    if (!shape_text->empty()) {
      for (absl::string_view d : absl::StrSplit(*shape_text, ',')) {
        int64_t v;
        if (!absl::SimpleAtoi(d, &v)) {
          return bad(absl::StrCat("shard \"", shard_key, "\" has malformed full_shape \"",
                                  *shape_text, "\""));
        }
        full_shape.push_back(v);
      }
    }
    absl::StatusOr<int64_t> total =
        CheckedNumElements(full_shape, absl::StrCat("shard \"", shard_key, "\""));
    if (!total.ok()) return bad(std::string(total.status().message()));
    const int64_t num_rows = full_shape.empty() ? 1 : full_shape[0];
    int64_t row_elements = 1;
    for (size_t d = 1; d < full_shape.size(); ++d) row_elements *= full_shape[d];
    if (begin < 0 || end < begin || end > num_rows) {
      return bad(absl::StrCat("shard \"", shard_key, "\" rows ", *rows_text,
                              " are outside the variable's ", num_rows, " rows"));
    }
    auto value_it = file.tensors.find(absl::StrCat(kVariablePrefix, shard_key));
    const int64_t n = (end - begin) * row_elements;
    if (value_it == file.tensors.end() || value_it->second.size() != n) {
      return bad(absl::StrCat("shard \"", shard_key, "\" has no value tensor of ", n, " elements"));
    }
    auto [vit, inserted] = out.variables.try_emplace(variable);
    PsCheckpoint::Variable& var = vit->second;
    if (inserted) {
      var.value = Tensor(full_shape);
      var.trainable = trainable;
    } else if (var.value.shape() != full_shape) {
      return bad(absl::StrCat("variable \"", variable, "\" has shards with different full shapes"));
    } else if (var.trainable != trainable) {
      return bad(absl::StrCat("variable \"", variable,
                              "\" has trainable and non-trainable shards"));
    }
    const int64_t offset = begin * row_elements;
    std::copy(value_it->second.data(), value_it->second.data() + n, var.value.data() + offset);
    var.versions.push_back({begin, end, version});
    rows[variable].push_back({begin, end});
    const std::string slot_prefix = absl::StrCat(kOptimizerPrefix, shard_key, "/");
    for (auto it = file.tensors.lower_bound(slot_prefix);
         it != file.tensors.end() && absl::StartsWith(it->first, slot_prefix); ++it) {
      const std::string slot = it->first.substr(slot_prefix.size());
      // Slot names have no '/'; a longer name belongs to another shard whose
      // key extends this one (variables "w" and "w/part_0/part_0" may coexist).
      if (slot.find('/') != std::string::npos) continue;
      if (slot.empty() || it->second.size() != n) {
        return bad(absl::StrCat("optimizer slot \"", it->first, "\" does not match shard \"",
                                shard_key, "\" (", n, " elements)"));
      }
      auto [sit, fresh] = var.slots.try_emplace(slot, Tensor({*total}));
      std::copy(it->second.data(), it->second.data() + n, sit->second.data() + offset);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PsCheckpoint> LoadPsCheckpoint(const std::string& dir, std::optional<int64_t> step) {
  // layouts[num_ps][task] = directory
  std::map<int, std::map<int, std::string>> layouts;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int task = -1, num = -1;
    std::vector<std::string> parts = absl::StrSplit(name, '-');
    if (parts.size() != 4 || parts[0] != "ps" || parts[2] != "of" ||
        !absl::SimpleAtoi(parts[1], &task) || !absl::SimpleAtoi(parts[3], &num) || num < 1 ||
        task < 0 || task >= num || name != PsCheckpointDir("", task, num).substr(1)) {
      continue;
    }
    layouts[num][task] = entry.path().string();
  }
  struct Candidate {
    int64_t step;
    int num_ps;
    std::filesystem::file_time_type written;
  };
  std::vector<Candidate> candidates;
  for (const auto& [num_ps, tasks] : layouts) {
    if (static_cast<int>(tasks.size()) != num_ps) continue;
    std::vector<int64_t> common;
    bool first = true;
    for (const auto& [task, path] : tasks) {
      std::vector<int64_t> steps = CheckpointManager(path, 1).ListSteps();
      if (first) {
        common = steps;
        first = false;
      } else {
        std::vector<int64_t> both;
        std::set_intersection(common.begin(), common.end(), steps.begin(), steps.end(),
                              std::back_inserter(both));
        common = std::move(both);
      }
    }
    for (int64_t s : common) {
      if (step && s != *step) continue;
      std::filesystem::file_time_type written{};
      for (const auto& [task, path] : tasks) {
        written = std::max(written, std::filesystem::last_write_time(
                                        CheckpointManager(path, 1).PathForStep(s), ec));
      }
      candidates.push_back({s, num_ps, written});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.written > b.written;
  });
  if (candidates.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no ps checkpoint ", step ? absl::StrCat("for step ", *step, " ") : std::string(),
        "that every ps task of one layout wrote in ", dir,
        " (expected <dir>/ps-<task>-of-<num_ps>/ckpt-<step>.dtc)"));
  }
  absl::Status last_error;
  for (const Candidate& c : candidates) {
    PsCheckpoint out;
    out.step = c.step;
    out.saved_num_ps = c.num_ps;
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> rows;
    absl::Status status;
    for (const auto& [task, path] : layouts[c.num_ps]) {
      const std::string file = CheckpointManager(path, 1).PathForStep(c.step);
      absl::StatusOr<CheckpointState> state = CheckpointManager::ReadFile(file);
      if (!state.ok()) {
        status = state.status();
        break;
      }
      status = MergePsFile(file, *state, out, rows);
      if (!status.ok()) break;
    }
    // Every variable's shards must tile its rows exactly.
    for (auto& [name, ranges] : rows) {
      if (!status.ok()) break;
      std::sort(ranges.begin(), ranges.end());
      const std::vector<int64_t>& shape = out.variables[name].value.shape();
      const int64_t num_rows = shape.empty() ? 1 : shape[0];
      int64_t next = 0;
      for (const auto& [b, e] : ranges) {
        if (b != next) {
          status = absl::DataLossError(absl::StrCat(
              "ps checkpoint step ", c.step, " in ", dir, ": variable \"", name, "\" rows ",
              std::min(b, next), "..", std::max(b, next), b > next ? " are missing" : " overlap"));
          break;
        }
        next = e;
      }
      if (status.ok() && next != num_rows) {
        status = absl::DataLossError(absl::StrCat("ps checkpoint step ", c.step, " in ", dir,
                                                  ": variable \"", name, "\" rows ", next, "..",
                                                  num_rows, " are missing"));
      }
    }
    if (status.ok()) return out;
    if (step) return status;
    spdlog::warn("ps checkpoint: skipping step {} ({} ps) in {}: {}", c.step, c.num_ps, dir,
                 status.message());
    last_error = status;
  }
  return absl::DataLossError(absl::StrCat("no readable ps checkpoint in ", dir,
                                          "; the newest error: ", last_error.message()));
}

}  // namespace distrain

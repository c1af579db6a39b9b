#ifndef DISTRAIN_WORKER_PS_PS_SERVICE_H_
#define DISTRAIN_WORKER_PS_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/job_config.h"
#include "distrain/v1/parameter_server.grpc.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/optimizer.h"
#include "worker/ps/partitioner.h"
#include "worker/tensor/tensor.h"
#include "worker/security/transport_security.h"

namespace distrain {

// Largest data payload per streamed message. gRPC's default receive limit is
// 4 MiB; 3 MiB leaves room for headers and for many small-shard headers.
inline constexpr int64_t kPsMaxChunkBytes = 3 << 20;

// Bounds on every size that reaches a ps from the network. Each request is
// checked against them before the ps allocates anything for it; a request
// beyond one is refused with INVALID_ARGUMENT (a size no job of this ps can
// have) or RESOURCE_EXHAUSTED (a budget the ps's state would exceed),
// naming the field, the value and the limit.
//
// The defaults are sized from the models distrain trains. The largest today
// is bench/ps_training.py's MLP 784-1024-1024-10: 1.9 M parameters, 7.4 MB
// of float32 for the whole model, less per ps. One ps hosting 1 GiB of
// values holds a model 140 times that on a single ps (and P times more over
// P ps tasks); the staging budget lets about 140 uploads of such a model
// share be in flight at once (each worker has at most one push per ps in
// flight, the chief one Initialize). Names, ranks and shard counts are far
// above what Keras layers produce ("conv2d_1/kernel", rank <= 4, at most
// one shard per ps under MinSize). Raise them for bigger jobs; the worst
// case a ps allocates is about (2 + optimizer slots) * max_hosted_bytes
// (values, a copy-on-write spare, Adam's m and v) + max_staging_bytes.
struct PsLimits {
  // Any one gRPC message the ps receives (gRPC's own default). Chunks carry
  // at most kPsMaxChunkBytes, so headers have a MiB to spare.
  int64_t max_message_bytes = 4 << 20;
  // ShardSpec.variable, UploadShard.ref.variable, Pull's names.
  int64_t max_name_bytes = 1024;
  // ShardSpec.full_shape dimensions (Conv2D kernels have 4).
  int64_t max_rank = 8;
  // Shards hosted by this ps, over every CreateVariables call.
  int64_t max_shards = 65536;
  // ShardSpec.num_shards: shards one variable is split into.
  int64_t max_shards_per_variable = 4096;
  // Elements of one whole variable (full_shape's product; 16 GiB of floats),
  // so that no product of dimensions can overflow.
  int64_t max_variable_elements = int64_t{1} << 32;
  // Bytes of values of every shard declared on this ps together (the shard
  // memory Initialize and Restore will allocate). CreateVariables beyond it
  // is RESOURCE_EXHAUSTED.
  int64_t max_hosted_bytes = int64_t{1} << 30;
  // Bytes of upload buffers (Initialize, Push) held by all streams in flight
  // together, reserved when a stream's header is read, before any chunk is
  // taken. A stream that would exceed it is RESOURCE_EXHAUSTED.
  int64_t max_staging_bytes = int64_t{1} << 30;
};

struct PsServiceOptions {
  int task_index = 0;  // this ps's index in TF_CONFIG's "ps" job
  int num_ps = 1;
  OptimizerConfig optimizer;  // the job's optimizer; every shard gets its own instance
  // Push rejects (FAILED_PRECONDITION) a shard whose staleness would exceed
  // this; < 0: unbounded (TensorFlow's asynchronous default).
  int64_t max_staleness = -1;
  int64_t chunk_bytes = 1 << 20;  // Pull's default chunk payload, 4 .. kPsMaxChunkBytes
  int checkpoint_keep = 3;        // Save's default retention
  // This ps's checkpoint root, from its own environment
  // (PsCheckpointRoot(DISTRAIN_CHECKPOINT_DIR): "<dir>/ps"): Save writes,
  // prunes and Restore reads only PsCheckpointDir(checkpoint_dir, task,
  // num_ps) and its siblings. Requests carry no path. Empty: Save and
  // Restore answer FAILED_PRECONDITION.
  std::string checkpoint_dir;
  // Save refuses a step above this (the job's spec.training.steps: a caller
  // cannot write a checkpoint that looks newer than every real one and so
  // prunes them); < 0: unbounded.
  int64_t max_step = -1;
  PsLimits limits;
  // Mutual TLS with the job's certificates; null: plaintext. With TLS,
  // CreateVariables, Initialize, Save and Restore are the chief's alone,
  // Pull and Push the chief's and the workers' (PERMISSION_DENIED naming
  // the caller otherwise).
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
  // Optional. Families (all with label side="server"):
  //   distrain_ps_rpc_seconds{method}          histogram  handler wall time
  //   distrain_ps_bytes_total{direction,shard} counter    direction=pushed|pulled,
  //   shard="<var>/part_<i>" distrain_ps_staleness                    histogram  per applied shard
  //   update
  prometheus::Registry* registry = nullptr;
};

// Metric handles shared by the ps service and client. Families are looked up
// (prometheus-cpp merges same-named families), so both sides can share one
// registry; the `side` label keeps their series apart. Thread-safe.
class PsMetrics {
 public:
  PsMetrics(prometheus::Registry& registry, const std::string& side);
  void ObserveRpc(const std::string& method, double seconds);
  void AddBytes(const std::string& direction, const std::string& shard, double bytes);
  void ObserveStaleness(int64_t staleness);

 private:
  std::string side_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& staleness_;
};

// gRPC ParameterServer service (proto/distrain/v1/parameter_server.proto):
// hosts the variable shards placed on one ps task and applies pushed
// gradients with the job's optimizer. Non-trainable shards (ShardInfo::
// trainable false: BatchNormalization's moving statistics) have no optimizer;
// what is pushed to them is a delta added to the value.
//
// Consistency protocol, per shard:
//   1. CreateVariables declares the shard (no memory yet); Initialize or
//      Restore gives it values, version 0 (or the saved version).
//   2. Pull takes value + version under the shard's reader lock, so a pull
//      never sees half an update: a reference to the value's buffer, which
//      updates leave unchanged while a pull still sends it (copy-on-write).
//   3. Push receives the whole gradient of every announced shard into staging
//      buffers (each allocated when its first chunk arrives) and validates it
//      before touching anything; a truncated, cancelled or malformed stream
//      applies nothing.
//   4. Apply, per shard under its writer lock: staleness = version -
//      pulled_version; with max_staleness set, every shard of the push is
//      locked (in key order) and checked first, so a rejected push applies
//      nothing; the optimizer runs with iteration version + 1 (Adam's t);
//      version += 1. Shards of one push are otherwise applied independently,
//      so workers pushing the same shards pipeline through them.
//      A non-trainable shard instead adds the pushed delta to its value
//      (copy-on-write like any update) and version += 1 so that pulls see
//      a new version; it is exempt from the staleness check (reported as 0;
//      a delta stays valid however many updates came between), locked and
//      applied with the rest of its push, so a push this ps rejects for a
//      stale gradient applies the deltas it carries neither (other ps tasks
//      decide on their part of a push independently).
//   5. Save snapshots each shard (value, slots, version, trainability) under
//      its lock; a snapshot consistent across shards and ps tasks needs the
//      coordinator to quiesce pushes first. Restore refuses a checkpoint
//      whose variable's trainability differs from the declared shard's.
//      Both work only under options.checkpoint_dir: the request names a
//      step, never a directory.
// Sizes from the network are bounded by options.limits (PsLimits) before
// anything is allocated: CreateVariables checks names, ranks, shard counts
// and element counts, and the bytes all declared shards would take; an
// upload reserves its staging bytes from a budget shared by all streams
// when its header is read and returns them when the call ends.
// Shards are never removed while the service lives. Thread-safe: gRPC calls
// handlers from many threads.
class PsService final : public distrain::v1::ParameterServer::Service {
 public:
  // INVALID_ARGUMENT for a bad optimizer config, task index, chunk size or
  // limit.
  static absl::StatusOr<std::unique_ptr<PsService>> Create(PsServiceOptions options);
  ~PsService() override;

  grpc::Status CreateVariables(grpc::ServerContext* ctx,
                               const distrain::v1::CreateVariablesRequest* request,
                               distrain::v1::CreateVariablesResponse* response) override;
  grpc::Status Save(grpc::ServerContext* ctx, const distrain::v1::SaveRequest* request,
                    distrain::v1::SaveResponse* response) override;
  grpc::Status Restore(grpc::ServerContext* ctx, const distrain::v1::RestoreRequest* request,
                       distrain::v1::RestoreResponse* response) override;
  grpc::Status Health(grpc::ServerContext* ctx, const distrain::v1::HealthRequest* request,
                      distrain::v1::HealthResponse* response) override;

  const PsServiceOptions& options() const { return options_; }

 private:
  struct Shard;
  struct Upload;
  using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  explicit PsService(PsServiceOptions options);

  // Initialize, Pull and Push are served on raw ByteBuffers in the proto's
  // wire format (worker/ps/ps_wire.h): a pulled shard is sent from the
  // shard's own buffer, a pushed gradient is copied once (its staging)
  // instead of through protobuf `bytes` fields. Clients of the generated
  // stubs see the same protocol.
  grpc::Status CheckCoordinator(const grpc::ServerContext& ctx, std::string_view method) const;
  grpc::Status CheckTrainer(const grpc::ServerContext& ctx, std::string_view method) const;
  grpc::Status InitializeRaw(grpc::ServerContext* ctx, RawStream* stream);
  grpc::Status PullRaw(grpc::ServerContext* ctx, RawStream* stream);
  grpc::Status PushRaw(grpc::ServerContext* ctx, RawStream* stream);

  // A fresh optimizer for a trainable shard; null for a non-trainable one.
  std::unique_ptr<Optimizer> NewOptimizer(const ShardInfo& info) const;
  // nullptr when not hosted.
  Shard* FindShard(const std::string& variable, int index) const;
  std::vector<Shard*> ShardsOfVariable(const std::string& variable) const;
  std::vector<Shard*> AllShards() const;
  absl::Status ReadUpload(const char* method, grpc::ServerContext* ctx, RawStream* stream,
                          Upload& upload);
  std::string Name() const;  // "ps:0"
  // FAILED_PRECONDITION for Save/Restore on a ps without checkpoint_dir.
  grpc::Status NoCheckpointDir(const char* method) const;

  const PsServiceOptions options_;
  std::unique_ptr<PsMetrics> metrics_;  // null without a registry

  mutable absl::Mutex shards_mu_;
  // Keyed "<variable>/part_<i>"; values are never erased, so Shard* stay valid.
  absl::flat_hash_map<std::string, std::unique_ptr<Shard>> shards_ ABSL_GUARDED_BY(shards_mu_);
  // variable -> its hosted shards, by index.
  absl::flat_hash_map<std::string, std::vector<Shard*>> by_variable_ ABSL_GUARDED_BY(shards_mu_);
  absl::Mutex save_mu_;  // serialises Save/Restore with each other
  std::atomic<int64_t> pushes_applied_{0};
  // Sum of the declared shards' value bytes (PsLimits::max_hosted_bytes).
  int64_t hosted_bytes_ ABSL_GUARDED_BY(shards_mu_) = 0;
  // Upload buffers reserved by streams in flight (max_staging_bytes).
  absl::Mutex staging_mu_;
  int64_t staging_bytes_ ABSL_GUARDED_BY(staging_mu_) = 0;
};

// Owns a grpc::Server hosting one PsService.
class PsServer {
 public:
  // `address` like "0.0.0.0:2222", or "127.0.0.1:0" for a free port.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const std::string& address,
                                                         PsServiceOptions options);
  ~PsServer();  // Shutdown()

  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>" for a loopback/any bind
  PsService& service() { return *service_; }
  // Cancels in-flight calls and stops serving; idempotent.
  void Shutdown();
  void Wait();

 private:
  PsServer() = default;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string host_;
  int port_ = 0;
  bool shut_down_ = false;
};

// The ps-side checkpoint of the whole job, assembled from every ps task's
// files of one layout and step: full (unsharded) variables, so it can be
// restored with any ps count or by a strategy without ps.
//
// Layout: <dir>/ps-<task>-of-<num_ps>/ckpt-<step>.dtc, one CheckpointManager
// directory per ps task. Each file holds, per hosted shard "<var>/part_<i>":
//   tensor   "variables/<var>/part_<i>"          the shard's values
//   tensors  "optimizer/<var>/part_<i>/<slot>"   its optimizer slots (flat)
//   metadata "shard/<var>/part_<i>/variable", ".../rows" ("<begin>:<end>"),
//            ".../full_shape" ("d0,d1,..."), ".../version",
//            ".../trainable" ("true" | "false"; absent in older files: true)
// A step is consistent when every ps of a layout wrote a valid file for it.
struct PsCheckpoint {
  struct RowVersion {
    int64_t row_begin;
    int64_t row_end;
    int64_t version;
  };
  struct Variable {
    Tensor value;                         // full shape
    bool trainable = true;                // false: no slots, versions count deltas
    std::map<std::string, Tensor> slots;  // slot ("m", "v", "momentum") -> flat, full size
    std::vector<RowVersion> versions;     // per saved shard
    // Max version of the saved shards overlapping rows [begin, end): the
    // version a re-sharded shard continues from.
    int64_t VersionForRows(int64_t begin, int64_t end) const;
  };
  int64_t step = 0;
  int saved_num_ps = 0;
  std::map<std::string, Variable> variables;

  // "variables/<var>", "optimizer/<var>/<slot>" and metadata
  // "optimizer_iterations" (max version of the trainable variables): what
  // RestoreVariableState reads. Non-trainable variables are
  // "variables/<var>" too, as variable_state.h names them.
  CheckpointState ToCheckpointState() const;
};

// gRPC transport settings of the ps channels, client and server side alike
// (name, value): HTTP/2 windows and frames large enough that a shard of a
// few MiB streams without waiting for window updates, and socket reads in
// large pieces. On loopback (bench/ps_throughput) they change nothing
// measurable; on a real network they spare the ramp-up from gRPC's 64 KiB
// initial window.
std::vector<std::pair<std::string, int>> PsTransportArgs();

// Process-wide: tunes glibc malloc for a process that moves tensors through
// the parameter server (ps tasks, their workers, benchmarks). Each closure
// allocates and frees blocks of a few MiB (gRPC slices, staging buffers);
// by default glibc serves them with fresh mmaps and unmaps them on free, so
// every closure paid page faults, zero-filled pages and munmaps (a fifth of
// a ps task's CPU). Keeps such blocks in the heap and the heap mapped.
void KeepPsBuffersMapped();

std::string PsCheckpointDir(const std::string& dir, int task, int num_ps);
// `step` unset: the newest consistent step (a corrupt file makes that step
// inconsistent; older ones are tried). NOT_FOUND when none exists.
absl::StatusOr<PsCheckpoint> LoadPsCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step = std::nullopt);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_PS_PS_SERVICE_H_

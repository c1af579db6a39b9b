#ifndef DISTRAIN_WORKER_PS_PS_CLIENT_H_
#define DISTRAIN_WORKER_PS_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "distrain/v1/parameter_server.grpc.pb.h"
#include "prometheus/registry.h"
#include "worker/ps/partitioner.h"
#include "worker/ps/ps_service.h"
#include "worker/tensor/tensor.h"

namespace distrain {

struct PsClientOptions {
  // Deadline of every RPC, so a hung ps fails the call instead of the job
  // hanging. Large pulls and pushes must fit in it.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // WaitForReady keeps retrying an unreachable ps (DNS names of new pods may
  // not resolve yet) until this much time has passed.
  absl::Duration connect_timeout = absl::Seconds(120);
  int64_t chunk_bytes = 1 << 20;  // upload and pull chunk payload, 4 .. kPsMaxChunkBytes
  // Optional; the client records distrain_ps_rpc_seconds{method} and
  // distrain_ps_bytes_total{direction,shard} with side="client".
  prometheus::Registry* registry = nullptr;
  // Mutual TLS as this task; ps i must present ps:i's certificate. Null:
  // plaintext.
  std::shared_ptr<const TransportSecurity> security = ProcessTransportSecurity();
};

// Version of every shard of a variable: name -> version per shard index.
using ShardVersions = std::map<std::string, std::vector<int64_t>>;

// A named tensor borrowed for one call (the caller keeps it alive).
struct TensorRef {
  std::string name;
  const Tensor* tensor;
};
struct MutableTensorRef {
  std::string name;
  Tensor* tensor;  // must already have the variable's shape
};

// The gradient of a rank-2 variable [rows, cols] as two factors, grad =
// left^T right, left [rank, rows] and right [rank, cols]: a Dense kernel's
// gradient over a batch is input^T d(output), of rank <= the batch size.
// Borrowed for one call, like TensorRef.
struct FactoredGradRef {
  std::string name;
  const Tensor* left;
  const Tensor* right;
};

struct PullResult {
  std::map<std::string, Tensor> values;
  ShardVersions versions;
};

struct PushResult {
  ShardVersions versions;     // after this push
  int64_t max_staleness = 0;  // over the pushed shards (0 without pulled versions)
};

struct InitializeResult {
  int initialized = 0;  // shards that took the uploaded values
  int skipped = 0;      // shards that already had values (first writer wins)
};

// Client of every ps task of a job: splits variables into shards with the
// ShardingPlan, talks to the ps tasks in parallel (one thread per ps involved
// in a call, threads reused across calls), and reassembles whole tensors. Tensor bytes travel in the
// proto's wire format without protobuf copies (ps_wire.h): a push sends the
// caller's gradient memory as it is, a pull copies each chunk once, straight
// into the caller's tensor.
//
// Failures name the ps: "ps:1 (host:port): Pull: UNAVAILABLE ...". Only
// WaitForReady retries; every other call fails fast (its deadline is
// rpc_timeout) so the coordinator learns of a dead ps at once.
// Owns one gRPC channel per ps. Thread-safe: many threads of one worker may
// call concurrently.
class PsClient {
 public:
  // `addresses[i]` is ps task i (TF_CONFIG's "ps" list); its size must equal
  // plan.num_ps().
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(std::vector<std::string> addresses,
                                                          ShardingPlan plan,
                                                          PsClientOptions options = {});
  ~PsClient();

  // Probes every ps with Health until it answers (retrying UNAVAILABLE and
  // DEADLINE_EXCEEDED with backoff until connect_timeout) and checks it
  // reports the expected task index and ps count.
  absl::Status WaitForReady();
  // Declares every shard of the plan on its ps (idempotent).
  absl::Status CreateVariables();
  // Uploads initial values (chief). Shards that already have values keep
  // them unless `overwrite`. Every tensor must be a plan variable of its shape.
  absl::StatusOr<InitializeResult> Initialize(absl::Span<const TensorRef> values,
                                              bool overwrite = false);
  // Whole variables (empty `names`: every variable of the plan).
  absl::StatusOr<PullResult> Pull(const std::vector<std::string>& names = {});
  // Pulls straight into caller-owned tensors of the variables' shapes.
  absl::Status PullInto(absl::Span<const MutableTensorRef> targets, ShardVersions* versions);
  // As above; each ps streams its shards in `targets` order, and `on_shard`
  // runs (on the thread reading that ps, so concurrently for different ps
  // tasks) the moment a shard's last element has been written, while the
  // rest still streams. A shard announced before a failure may have been
  // reported; the call's status is what counts. `versions` is written last.
  absl::Status PullInto(absl::Span<const MutableTensorRef> targets, ShardVersions* versions,
                        const std::function<void(const ShardInfo&)>& on_shard);
  // The same on one of this client's threads; returns at once. `done` runs
  // there with the status once the call is over; `targets`, `versions` and
  // the tensors must stay alive until then.
  void PullIntoAsync(absl::Span<const MutableTensorRef> targets, ShardVersions* versions,
                     std::function<void(const ShardInfo&)> on_shard,
                     std::function<void(absl::Status)> done);
  // Pushes gradients shaped like their variables. `pulled` (optional): the
  // versions the gradients were computed from, for staleness. `factored`:
  // more gradients, given as factors; each shard gets the factors (its
  // columns of `left`, and `right`) when they are fewer bytes than its
  // gradient, else the gradient formed here. A variable appears once in
  // `grads` and `factored` together. For a non-trainable variable of the
  // plan, `grads` carries a delta the ps adds to the value (only dense);
  // max_staleness leaves those shards out.
  absl::StatusOr<PushResult> Push(absl::Span<const TensorRef> grads,
                                  const ShardVersions* pulled = nullptr,
                                  absl::Span<const FactoredGradRef> factored = {});
  absl::StatusOr<PushResult> Push(const std::map<std::string, Tensor>& grads,
                                  const ShardVersions* pulled = nullptr);
  // As Push, but only to the ps tasks `applied` (one flag per ps task) does not
  // mark yet, marking each ps that applied its part, also when another ps
  // refused its own part as stale (FAILED_PRECONDITION). Each ps decides on its
  // part alone, so a closure redone after a partial refusal must push its fresh
  // gradients only where the refusal was, or the ps that took the first push
  // applies the closure twice.
  absl::StatusOr<PushResult> PushRemaining(absl::Span<const TensorRef> grads,
                                           const ShardVersions* pulled,
                                           std::vector<bool>* applied);
  // Every ps writes its shards at `step` under its own checkpoint directory
  // (see PsService::Save; the caller names no path). FAILED_PRECONDITION
  // from a ps that has none.
  absl::Status Save(int64_t step);
  // Every ps restores the same step from its own checkpoint directory: ps 0
  // picks it (newest consistent unless `step`), the others follow. Returns
  // the step.
  absl::StatusOr<int64_t> Restore(std::optional<int64_t> step = std::nullopt);
  absl::StatusOr<std::vector<distrain::v1::HealthResponse>> Health();

  const ShardingPlan& plan() const { return plan_; }
  std::string PsName(int task) const;  // "ps:1 (host:port)"

 private:
  struct Upload;
  struct RawMethods;  // Initialize, Pull, Push on raw ByteBuffers (ps_wire.h)
  class ReusableThreads;
  PsClient(std::vector<std::string> addresses, ShardingPlan plan, PsClientOptions options);
  absl::Status UploadShards(const char* method, int task, const std::vector<Upload>& shards,
                            bool overwrite, google::protobuf::Message* response);
  // Push and PushRemaining: `applied` (or null: every ps) as PushRemaining says.
  absl::StatusOr<PushResult> PushTo(absl::Span<const TensorRef> grads,
                                    const ShardVersions* pulled,
                                    absl::Span<const FactoredGradRef> factored,
                                    std::vector<bool>* applied);
  absl::StatusOr<std::vector<Upload>> PlanUploads(absl::Span<const TensorRef> tensors,
                                                  const ShardVersions* pulled,
                                                  const char* method) const;
  // Appends the shards of `factored` (checked against `dense` for names
  // given twice).
  absl::Status PlanFactoredUploads(absl::Span<const FactoredGradRef> factored,
                                   absl::Span<const TensorRef> dense, const ShardVersions* pulled,
                                   std::vector<Upload>* uploads) const;
  // `pulled`'s versions of `name` (null when not listed), checked against the plan.
  absl::StatusOr<const std::vector<int64_t>*> PulledVersions(const std::string& name,
                                                             const ShardVersions* pulled,
                                                             const char* method) const;
  absl::Status Error(int task, const char* method, const grpc::Status& status) const;
  // Runs fn(task) for every task, on the caller for the first and on
  // threads_ for the rest, and returns the first error in task order.
  absl::Status RunPerPs(const std::vector<int>& tasks, const std::function<absl::Status(int)>& fn);
  void SetDeadline(grpc::ClientContext& ctx) const;

  const std::vector<std::string> addresses_;
  const ShardingPlan plan_;
  const PsClientOptions options_;
  std::vector<std::unique_ptr<distrain::v1::ParameterServer::Stub>> stubs_;
  std::vector<std::unique_ptr<RawMethods>> raw_;  // per ps, like stubs_
  std::unique_ptr<PsMetrics> metrics_;            // null without a registry
  // Declared last: destroyed (its threads joined) first.
  std::unique_ptr<ReusableThreads> threads_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_PS_PS_CLIENT_H_

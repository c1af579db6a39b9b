#ifndef DISTRAIN_WORKER_PS_PARTITIONER_H_
#define DISTRAIN_WORKER_PS_PARTITIONER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace distrain {

// Decides how many shards a variable is split into along axis 0, with the
// semantics of tf.distribute.experimental.partitioners:
//   None                      1 shard
//   FixedShards(n)            min(n, rows)
//   MinSize(min_bytes, max)   min(rows, max, ceil(total_bytes / min_bytes)), at least 1
//   MaxSize(max_bytes, max)   ceil(rows / max(1, floor(max_bytes / row_bytes))),
//                             capped by max (0 = no cap)
// A scalar or empty variable is always one shard. Value type; thread-compatible.
class Partitioner {
 public:
  enum class Kind { kNone, kFixedShards, kMinSize, kMaxSize };

  Partitioner() = default;  // None
  static Partitioner None() { return Partitioner(); }
  static absl::StatusOr<Partitioner> FixedShards(int num_shards);
  // TF's defaults: 256 KiB, 1 shard.
  static absl::StatusOr<Partitioner> MinSize(int64_t min_shard_bytes = 256 << 10,
                                             int max_shards = 1);
  static absl::StatusOr<Partitioner> MaxSize(int64_t max_shard_bytes, int max_shards = 0);

  // Shard count for a variable of `shape` (dims already validated >= 0).
  int NumShards(absl::Span<const int64_t> shape, int64_t element_bytes = 4) const;

  Kind kind() const { return kind_; }
  std::string DebugString() const;  // "MinSize(262144 bytes, max 4 shards)"
  bool operator==(const Partitioner&) const = default;

 private:
  Kind kind_ = Kind::kNone;
  int64_t bytes_ = 0;  // MinSize / MaxSize
  int shards_ = 1;     // FixedShards: n; MinSize / MaxSize: max shards (MaxSize 0 = no cap)
};

// TF's split of `rows` over `num_shards`: the first rows % n shards get one
// extra row (13 over 5 -> 3,3,3,2,2). CHECKs 1 <= num_shards and
// (num_shards <= rows or rows == 0 and num_shards == 1).
std::vector<int64_t> SplitRows(int64_t rows, int num_shards);

struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;
  // False for state a model updates itself rather than through the optimizer
  // (BatchNormalization's moving statistics): the ps adds pushed deltas to
  // such a variable instead of applying them as gradients (PsService).
  bool trainable = true;
};

// One shard of a variable: rows [row_begin, row_end) of axis 0, which are
// elements [row_begin * row_elements, row_end * row_elements) of the
// row-major whole, so a shard is a contiguous span of the full tensor.
struct ShardInfo {
  std::string variable;
  int index = 0;
  int num_shards = 1;
  std::vector<int64_t> full_shape;
  std::vector<int64_t> shape;  // the shard's own shape (full_shape with rows replaced)
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t row_elements = 1;  // elements per row (1 for a scalar)
  int ps_task = 0;
  bool trainable = true;  // the variable's VariableSpec::trainable

  int64_t num_elements() const { return (row_end - row_begin) * row_elements; }
  int64_t element_offset() const { return row_begin * row_elements; }
  std::string key() const;  // "<variable>/part_<index>", TF's naming
};

// Name, shape and shards of one variable in a plan.
struct VariablePlan {
  std::string name;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  bool trainable = true;
  std::vector<int> shards;  // indices into ShardingPlan::shards(), by shard index
};

// Where every shard of every variable lives. A pure function of (variables in
// creation order, partitioner, ps count), so the chief, workers and ps tasks
// compute the same plan independently, and compare Fingerprint()s to prove
// it. Placement is TF's default: shards round-robin over ps tasks in
// creation order, continuing across variables. Non-trainable variables are
// split and placed like the others (callers list them after the trainable
// ones, so adding them moves no trainable shard). Immutable after Create;
// thread-safe.
class ShardingPlan {
 public:
  // Fails (INVALID_ARGUMENT, naming the variable) on an empty or duplicate
  // name, a negative dimension, an element count above 2^40, or num_ps < 1.
  static absl::StatusOr<ShardingPlan> Create(const std::vector<VariableSpec>& variables,
                                             const Partitioner& partitioner, int num_ps);

  int num_ps() const { return num_ps_; }
  const Partitioner& partitioner() const { return partitioner_; }
  const std::vector<VariablePlan>& variables() const { return variables_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }
  const VariablePlan* Find(const std::string& name) const;
  // Shards placed on ps `task`, in plan order.
  std::vector<const ShardInfo*> ShardsOnPs(int task) const;
  // Stable digest (hex) of the whole plan, trainability included; equal
  // plans have equal fingerprints, and a plan of trainable variables only
  // keeps the fingerprint it had before trainability existed.
  std::string Fingerprint() const;

 private:
  int num_ps_ = 1;
  Partitioner partitioner_;
  std::vector<VariablePlan> variables_;
  std::vector<ShardInfo> shards_;
  absl::flat_hash_map<std::string, int> by_name_;  // into variables_
};

// Validates a shape (dims >= 0, element count <= 2^40) for `what` ("variable
// \"w\""); returns the element count.
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape,
                                           const std::string& what);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_PS_PARTITIONER_H_

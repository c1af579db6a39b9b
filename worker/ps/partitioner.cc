#include "worker/ps/partitioner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace distrain {
namespace {

// Far above any real variable (4 TiB of float32), far below int64 overflow
// of byte counts, so arithmetic on sizes never needs overflow checks later.
constexpr int64_t kMaxElements = int64_t{1} << 40;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<Partitioner> Partitioner::FixedShards(int num_shards) {
  if (num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FixedShards partitioner: num_shards must be >= 1, got ", num_shards));
  }
  Partitioner p;
  p.kind_ = Kind::kFixedShards;
  p.shards_ = num_shards;
  return p;
}

absl::StatusOr<Partitioner> Partitioner::MinSize(int64_t min_shard_bytes, int max_shards) {
  if (min_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MinSize partitioner: min_shard_bytes must be >= 1, got ", min_shard_bytes));
  }
  if (max_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MinSize partitioner: max_shards must be >= 1, got ", max_shards));
  }
  Partitioner p;
  p.kind_ = Kind::kMinSize;
  p.bytes_ = min_shard_bytes;
  p.shards_ = max_shards;
  return p;
}

absl::StatusOr<Partitioner> Partitioner::MaxSize(int64_t max_shard_bytes, int max_shards) {
  if (max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MaxSize partitioner: max_shard_bytes must be >= 1, got ", max_shard_bytes));
  }
  if (max_shards < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MaxSize partitioner: max_shards must be >= 0 (0 = no cap), got ", max_shards));
  }
  Partitioner p;
  p.kind_ = Kind::kMaxSize;
  p.bytes_ = max_shard_bytes;
  p.shards_ = max_shards;
  return p;
}

int Partitioner::NumShards(absl::Span<const int64_t> shape, int64_t element_bytes) const {
  if (shape.empty() || shape[0] <= 0) return 1;  // scalars and empty variables
  const int64_t rows = shape[0];
  int64_t row_elements = 1;
  for (size_t i = 1; i < shape.size(); ++i) row_elements *= shape[i];
  const int64_t row_bytes = row_elements * element_bytes;
  int64_t n = 1;
  switch (kind_) {
    case Kind::kNone:
      n = 1;
      break;
    case Kind::kFixedShards:
      n = std::min<int64_t>(shards_, rows);
      break;
    case Kind::kMinSize:
      n = std::min<int64_t>({rows, shards_, CeilDiv(rows * row_bytes, bytes_)});
      break;
    case Kind::kMaxSize: {
      if (row_bytes == 0) break;
      const int64_t rows_per_shard = std::max<int64_t>(1, bytes_ / row_bytes);
      n = CeilDiv(rows, rows_per_shard);
      if (shards_ > 0) n = std::min<int64_t>(n, shards_);
      break;
    }
  }
  return static_cast<int>(std::max<int64_t>(1, n));
}

std::string Partitioner::DebugString() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kFixedShards:
      return absl::StrCat("FixedShards(", shards_, ")");
    case Kind::kMinSize:
      return absl::StrCat("MinSize(", bytes_, " bytes, max ", shards_, " shards)");
    case Kind::kMaxSize:
      return absl::StrCat("MaxSize(", bytes_, " bytes, max ",
                          shards_ == 0 ? std::string("unbounded") : absl::StrCat(shards_),
                          " shards)");
  }
  return "?";
}

std::vector<int64_t> SplitRows(int64_t rows, int num_shards) {
  DISTRAIN_CHECK_GE(num_shards, 1);
  DISTRAIN_CHECK(num_shards <= rows || (rows == 0 && num_shards == 1))
      << rows << " rows cannot be split into " << num_shards << " shards";
  std::vector<int64_t> sizes(num_shards, rows / num_shards);
  for (int64_t i = 0; i < rows % num_shards; ++i) ++sizes[i];
  return sizes;
}

std::string ShardInfo::key() const { return absl::StrCat(variable, "/part_", index); }

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape,
                                           const std::string& what) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dimension ", i, " is ", shape[i], "; dimensions must be >= 0"));
    }
    if (shape[i] > 0 && n > kMaxElements / shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", absl::StrJoin(shape, ", "),
                                                     "] has more than 2^40 elements"));
    }
    n *= shape[i];
  }
  return n;
}

absl::StatusOr<ShardingPlan> ShardingPlan::Create(const std::vector<VariableSpec>& variables,
                                                  const Partitioner& partitioner, int num_ps) {
  if (num_ps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan: the cluster needs at least one ps task, got ", num_ps));
  }
  ShardingPlan plan;
  plan.num_ps_ = num_ps;
  plan.partitioner_ = partitioner;
  absl::flat_hash_set<std::string> seen;
  int next_ps = 0;
  for (const VariableSpec& v : variables) {
    if (v.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding plan: variable #", plan.variables_.size(), " has an empty name"));
    }
    if (!seen.insert(v.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding plan: variable \"", v.name, "\" is declared twice"));
    }
    absl::StatusOr<int64_t> n =
        CheckedNumElements(v.shape, absl::StrCat("variable \"", v.name, "\""));
    if (!n.ok()) return n.status();

    VariablePlan vp;
    vp.name = v.name;
    vp.shape = v.shape;
    vp.num_elements = *n;
    vp.trainable = v.trainable;
    const int num_shards = partitioner.NumShards(v.shape);
    const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
    int64_t row_elements = 1;
    for (size_t i = 1; i < v.shape.size(); ++i) row_elements *= v.shape[i];
    int64_t row = 0;
    int index = 0;
    for (int64_t size : SplitRows(rows, num_shards)) {
      ShardInfo s;
      s.variable = v.name;
      s.index = index++;
      s.num_shards = num_shards;
      s.full_shape = v.shape;
      s.shape = v.shape;
      if (!s.shape.empty()) s.shape[0] = size;
      s.row_begin = row;
      s.row_end = row + size;
      s.row_elements = row_elements;
      s.ps_task = next_ps;
      s.trainable = v.trainable;
      next_ps = (next_ps + 1) % num_ps;
      row += size;
      vp.shards.push_back(static_cast<int>(plan.shards_.size()));
      plan.shards_.push_back(std::move(s));
    }
    plan.by_name_[vp.name] = static_cast<int>(plan.variables_.size());
    plan.variables_.push_back(std::move(vp));
  }
  return plan;
}

const VariablePlan* ShardingPlan::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &variables_[it->second];
}

std::vector<const ShardInfo*> ShardingPlan::ShardsOnPs(int task) const {
  std::vector<const ShardInfo*> out;
  for (const ShardInfo& s : shards_) {
    if (s.ps_task == task) out.push_back(&s);
  }
  return out;
}

std::string ShardingPlan::Fingerprint() const {
  // FNV-1a over a canonical text: stable across processes and builds, unlike
  // absl::Hash.
  std::string text = absl::StrCat("ps=", num_ps_, ";", partitioner_.DebugString(), ";");
  for (const ShardInfo& s : shards_) {
    absl::StrAppend(&text, s.variable.size(), ":", s.variable, "[",
                    absl::StrJoin(s.full_shape, ","), "]", s.index, "/", s.num_shards, ":",
                    s.row_begin, "-", s.row_end, "@", s.ps_task, s.trainable ? "" : "!nt", ";");
  }
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace distrain

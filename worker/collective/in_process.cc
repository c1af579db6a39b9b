#include "worker/collective/in_process.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "worker/collective/reduce_kernel.h"

namespace distrain {
namespace {

const char* KindName(InProcessGroup::OpKind kind) {
  switch (kind) {
    case InProcessGroup::OpKind::kAllReduce:
      return "all-reduce";
    case InProcessGroup::OpKind::kReduce:
      return "reduce";
    case InProcessGroup::OpKind::kBroadcast:
      return "broadcast";
    case InProcessGroup::OpKind::kAllGather:
      return "all-gather";
    case InProcessGroup::OpKind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string Describe(const char* what, const std::string& tag) {
  return tag.empty() ? std::string(what) : absl::StrCat(what, " '", tag, "'");
}

int64_t TotalElements(absl::Span<const absl::Span<float>> buffers) {
  int64_t total = 0;
  for (const auto& b : buffers) total += static_cast<int64_t>(b.size());
  return total;
}

// Walks a list of buffers as one logical vector.
class Cursor {
 public:
  Cursor() = default;
  Cursor(absl::Span<const absl::Span<float>> buffers, int64_t position) : buffers_(buffers) {
    while (index_ < buffers_.size() && position >= static_cast<int64_t>(buffers_[index_].size())) {
      position -= static_cast<int64_t>(buffers_[index_].size());
      ++index_;
    }
    offset_ = static_cast<size_t>(position);
  }
  float* data() const { return buffers_[index_].data() + offset_; }
  size_t contiguous() const { return buffers_[index_].size() - offset_; }
  void Advance(size_t n) {
    offset_ += n;
    while (index_ < buffers_.size() && offset_ == buffers_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

 private:
  absl::Span<const absl::Span<float>> buffers_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, std::vector<std::string> names)
    : size_(size), names_([&] {
        if (names.empty()) {
          for (int r = 0; r < size; ++r) names.push_back(absl::StrCat("replica ", r));
        }
        return std::move(names);
      }()),
      calls_(size, nullptr),
      arrived_mask_(size, false) {
  DISTRAIN_CHECK_GE(size, 1);
  DISTRAIN_CHECK_EQ(static_cast<int>(names_.size()), size);
}

absl::Status InProcessGroup::Arrive(int rank, absl::Time deadline, const std::string& what) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  const int64_t generation = generation_;
  arrived_mask_[rank] = true;
  if (++arrived_ == size_) {
    arrived_ = 0;
    std::fill(arrived_mask_.begin(), arrived_mask_.end(), false);
    ++generation_;
    return absl::OkStatus();
  }
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return generation_ != generation || !status_.ok();
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (generation_ != generation) return absl::OkStatus();
  if (!status_.ok()) return status_;
  std::vector<std::string> missing;
  for (int r = 0; r < size_; ++r) {
    if (!arrived_mask_[r]) missing.push_back(names_[r]);
  }
  status_ = absl::DeadlineExceededError(absl::StrCat(
      names_[rank], " timed out waiting for ", absl::StrJoin(missing, ", "), " to reach ", what,
      " (", missing.size(), " of ", size_, " replicas missing); a replica thread is stuck, slow "
      "or calling a different sequence of collectives; raise the timeout if it is only slow"));
  return status_;
}

absl::Status InProcessGroup::Begin(int rank, const Call* call, absl::Time deadline,
                                   const std::string& what) {
  calls_[rank] = call;
  return Arrive(rank, deadline, what);
}

void InProcessGroup::Finish(int rank) {
  // Unconditional: between Begin and Finish ranks only compute (they never
  // wait), so this wait is short, and no rank may return while a peer may
  // still touch its buffers, not even after an abort or a deadline.
  absl::MutexLock lock(&mu_);
  const int64_t generation = finish_generation_;
  if (++finished_ == size_) {
    finished_ = 0;
    ++finish_generation_;
  } else {
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finish_generation_ != generation; };
    mu_.Await(absl::Condition(&done));
  }
  calls_[rank] = nullptr;
}

void InProcessGroup::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (status_.ok()) {
    status_ = reason.ok() ? absl::AbortedError("collective group aborted") : reason;
  }
}

std::vector<std::unique_ptr<InProcessCollective>> InProcessCollective::CreateGroup(
    int size, std::vector<std::string> names) {
  auto group = std::make_shared<InProcessGroup>(size, std::move(names));
  std::vector<std::unique_ptr<InProcessCollective>> members;
  for (int r = 0; r < size; ++r) members.push_back(std::make_unique<InProcessCollective>(group, r));
  return members;
}

InProcessCollective::InProcessCollective(std::shared_ptr<InProcessGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  DISTRAIN_CHECK(rank >= 0 && rank < group_->size()) << "rank " << rank;
}

absl::Status InProcessCollective::Run(const InProcessGroup::Call& call,
                                      const CollectiveOptions& options, const char* what_kind,
                                      int64_t* bytes_in, int64_t* bytes_out) {
  const std::string what = Describe(what_kind, options.tag);
  const absl::Time deadline = absl::Now() + options.timeout;
  const int n = group_->size();
  if (absl::Status s = group_->Begin(rank_, &call, deadline, what); !s.ok()) return s;

  // Every rank sees the same descriptors, so every rank reaches the same verdict.
  for (int r = 0; r < n; ++r) {
    const InProcessGroup::Call& other = group_->call(r);
    if (other.kind != call.kind || other.elements != call.elements || other.root != call.root ||
        other.op != call.op) {
      const InProcessGroup::Call& first = group_->call(0);
      absl::Status mismatch = absl::InvalidArgumentError(absl::StrCat(
          "replicas disagree on the collective call: ", group_->name(0), " called ",
          KindName(first.kind), " (", first.elements, " elements, root ", first.root, ") but ",
          group_->name(r), " called ", KindName(other.kind), " (", other.elements,
          " elements, root ", other.root, "); every replica must issue the same collectives "
          "in the same order with the same sizes"));
      group_->Abort(mismatch);
      group_->Finish(rank_);
      return mismatch;
    }
  }

  switch (call.kind) {
    case InProcessGroup::OpKind::kAllReduce:
    case InProcessGroup::OpKind::kReduce: {
      const int64_t begin = call.elements * rank_ / n;
      const int64_t end = call.elements * (rank_ + 1) / n;
      absl::InlinedVector<Cursor, 8> cursors;
      for (int r = 0; r < n; ++r) cursors.emplace_back(group_->call(r).buffers, begin);
      constexpr size_t kBlock = 2048;
      float block[kBlock];
      const bool all = call.kind == InProcessGroup::OpKind::kAllReduce;
      int64_t remaining = end - begin;
      while (remaining > 0) {
        size_t len = std::min<size_t>(kBlock, static_cast<size_t>(remaining));
        for (const Cursor& c : cursors) len = std::min(len, c.contiguous());
        // Fixed rank order: the same arithmetic whichever thread does it.
        std::memcpy(block, cursors[0].data(), len * sizeof(float));
        for (int r = 1; r < n; ++r) collective_internal::AddInto(block, cursors[r].data(), len);
        if (call.op == ReduceOp::kMean && n > 1) {
          collective_internal::DivideInPlace(block, len, static_cast<float>(n));
        }
        for (int r = 0; r < n; ++r) {
          if (all || r == call.root) std::memcpy(cursors[r].data(), block, len * sizeof(float));
        }
        for (Cursor& c : cursors) c.Advance(len);
        remaining -= static_cast<int64_t>(len);
      }
      const int64_t share = (end - begin) * static_cast<int64_t>(sizeof(float));
      *bytes_in = share * (n - 1);
      *bytes_out = all ? share * (n - 1) : (rank_ == call.root ? 0 : share);
      break;
    }
    case InProcessGroup::OpKind::kBroadcast:
      if (rank_ != call.root) {
        Cursor mine(call.buffers, 0);
        Cursor theirs(group_->call(call.root).buffers, 0);
        int64_t remaining = call.elements;
        while (remaining > 0) {
          const size_t len =
              std::min({static_cast<size_t>(remaining), mine.contiguous(), theirs.contiguous()});
          std::memcpy(mine.data(), theirs.data(), len * sizeof(float));
          mine.Advance(len);
          theirs.Advance(len);
          remaining -= static_cast<int64_t>(len);
        }
        *bytes_in = call.elements * static_cast<int64_t>(sizeof(float));
      }
      break;
    case InProcessGroup::OpKind::kAllGather:
      for (int r = 0; r < n; ++r) {
        const float* src = group_->call(r).input.data();
        float* dst = call.output.data() + r * call.elements;
        if (call.elements > 0 && src != dst) {
          std::memmove(dst, src, call.elements * sizeof(float));
        }
      }
      *bytes_in = call.elements * static_cast<int64_t>(sizeof(float)) * (n - 1);
      break;
    case InProcessGroup::OpKind::kBarrier:
      break;
  }
  group_->Finish(rank_);
  return absl::OkStatus();
}

absl::Status InProcessCollective::Reduction(InProcessGroup::OpKind kind,
                                            absl::Span<const absl::Span<float>> buffers,
                                            ReduceOp op, int root,
                                            const CollectiveOptions& options) {
  InProcessGroup::Call call;
  call.kind = kind;
  call.op = op;
  call.root = root;
  call.elements = TotalElements(buffers);
  call.buffers = buffers;
  int64_t in = 0, out = 0;
  absl::Status status = Run(call, options, KindName(kind), &in, &out);
  if (status.ok()) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    bytes_received_.fetch_add(in, std::memory_order_relaxed);
    bytes_sent_.fetch_add(out, std::memory_order_relaxed);
  }
  return status;
}

absl::Status InProcessCollective::AllReduce(absl::Span<const absl::Span<float>> buffers,
                                            ReduceOp op, const CollectiveOptions& options) {
  return Reduction(InProcessGroup::OpKind::kAllReduce, buffers, op, 0, options);
}

absl::Status InProcessCollective::Reduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                                         int root, const CollectiveOptions& options) {
  if (root < 0 || root >= size()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("reduce root ", root, " is outside the group of ", size()));
    group_->Abort(s);
    return s;
  }
  return Reduction(InProcessGroup::OpKind::kReduce, buffers, op, root, options);
}

absl::Status InProcessCollective::Broadcast(absl::Span<float> buffer, int root,
                                            const CollectiveOptions& options) {
  return Broadcast(absl::MakeConstSpan(&buffer, 1), root, options);
}

absl::Status InProcessCollective::Broadcast(absl::Span<const absl::Span<float>> buffers, int root,
                                            const CollectiveOptions& options) {
  if (root < 0 || root >= size()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside the group of ", size()));
    group_->Abort(s);
    return s;
  }
  InProcessGroup::Call call;
  call.kind = InProcessGroup::OpKind::kBroadcast;
  call.root = root;
  call.elements = TotalElements(buffers);
  call.buffers = buffers;
  int64_t in = 0, out = 0;
  absl::Status status = Run(call, options, "broadcast", &in, &out);
  if (status.ok()) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    bytes_received_.fetch_add(in, std::memory_order_relaxed);
  }
  return status;
}

absl::Status InProcessCollective::AllGather(absl::Span<const float> input, absl::Span<float> output,
                                            const CollectiveOptions& options) {
  if (output.size() != input.size() * size()) {
    absl::Status s = absl::InvalidArgumentError(absl::StrCat(
        "all-gather output holds ", output.size(), " elements; it must hold size() * input = ",
        size(), " * ", input.size()));
    group_->Abort(s);
    return s;
  }
  InProcessGroup::Call call;
  call.kind = InProcessGroup::OpKind::kAllGather;
  call.elements = static_cast<int64_t>(input.size());
  call.input = input;
  call.output = output;
  int64_t in = 0, out = 0;
  absl::Status status = Run(call, options, "all-gather", &in, &out);
  if (status.ok()) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    bytes_received_.fetch_add(in, std::memory_order_relaxed);
  }
  return status;
}

absl::Status InProcessCollective::Barrier(const CollectiveOptions& options) {
  InProcessGroup::Call call;
  call.kind = InProcessGroup::OpKind::kBarrier;
  int64_t in = 0, out = 0;
  absl::Status status = Run(call, options, "barrier", &in, &out);
  if (status.ok()) operations_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

void InProcessCollective::Abort(const absl::Status& reason) { group_->Abort(reason); }

CollectiveStats InProcessCollective::stats() const {
  CollectiveStats s;
  s.operations = operations_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace distrain

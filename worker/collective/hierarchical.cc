#include "worker/collective/hierarchical.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/collective/reduce_kernel.h"

namespace distrain {

std::vector<std::unique_ptr<HierarchicalCollective>> HierarchicalCollective::CreateLocalGroup(
    std::shared_ptr<Collective> cross, int local_size, std::vector<std::string> local_names) {
  DISTRAIN_CHECK(cross != nullptr);
  std::vector<std::unique_ptr<HierarchicalCollective>> members;
  for (auto& local : InProcessCollective::CreateGroup(local_size, std::move(local_names))) {
    members.push_back(std::make_unique<HierarchicalCollective>(std::move(local), cross));
  }
  return members;
}

HierarchicalCollective::HierarchicalCollective(std::unique_ptr<InProcessCollective> local,
                                               std::shared_ptr<Collective> cross)
    : local_(std::move(local)), cross_(std::move(cross)) {
  DISTRAIN_CHECK(local_ != nullptr && cross_ != nullptr);
}

absl::Status HierarchicalCollective::Cross(absl::Status status) {
  if (!status.ok()) local_->Abort(status);
  return status;
}

absl::Status HierarchicalCollective::Count(absl::Status status) {
  if (status.ok()) operations_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

CollectiveOptions HierarchicalCollective::AfterCross(const CollectiveOptions& options) const {
  CollectiveOptions waiting = options;
  if (local_->rank() != 0) waiting.timeout = options.timeout * 2;
  return waiting;
}

absl::Status HierarchicalCollective::AllReduce(absl::Span<const absl::Span<float>> buffers,
                                               ReduceOp op, const CollectiveOptions& options) {
  if (absl::Status s = local_->Reduce(buffers, ReduceOp::kSum, 0, options); !s.ok()) return s;
  if (local_->rank() == 0) {
    if (cross_->size() > 1) {
      if (absl::Status s = Cross(cross_->AllReduce(buffers, ReduceOp::kSum, options)); !s.ok()) {
        return s;
      }
    }
    if (op == ReduceOp::kMean && size() > 1) {
      for (const absl::Span<float>& b : buffers) {
        collective_internal::DivideInPlace(b.data(), b.size(), static_cast<float>(size()));
      }
    }
  }
  return Count(local_->Broadcast(buffers, 0, AfterCross(options)));
}

absl::Status HierarchicalCollective::Broadcast(absl::Span<float> buffer, int root,
                                               const CollectiveOptions& options) {
  if (root < 0 || root >= size()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside the group of ", size()));
    Abort(s);
    return s;
  }
  const int root_worker = root / local_->size();
  const int root_local = root % local_->size();
  const bool on_root_worker = cross_->rank() == root_worker;
  if (on_root_worker) {
    if (absl::Status s = local_->Broadcast(buffer, root_local, options); !s.ok()) return s;
  }
  if (local_->rank() == 0 && cross_->size() > 1) {
    if (absl::Status s = Cross(cross_->Broadcast(buffer, root_worker, options)); !s.ok()) return s;
  }
  if (on_root_worker) return Count(absl::OkStatus());
  return Count(local_->Broadcast(buffer, 0, AfterCross(options)));
}

absl::Status HierarchicalCollective::AllGather(absl::Span<const float> input,
                                               absl::Span<float> output,
                                               const CollectiveOptions& options) {
  if (output.size() != input.size() * size()) {
    absl::Status s = absl::InvalidArgumentError(absl::StrCat(
        "all-gather output holds ", output.size(), " elements; it must hold size() * input = ",
        size(), " * ", input.size()));
    Abort(s);
    return s;
  }
  const size_t block = input.size() * local_->size();
  absl::Span<float> worker_block = output.subspan(cross_->rank() * block, block);
  if (absl::Status s = local_->AllGather(input, worker_block, options); !s.ok()) return s;
  if (local_->rank() == 0 && cross_->size() > 1) {
    if (absl::Status s = Cross(cross_->AllGather(worker_block, output, options)); !s.ok()) return s;
  }
  return Count(local_->Broadcast(output, 0, AfterCross(options)));
}

absl::Status HierarchicalCollective::Barrier(const CollectiveOptions& options) {
  if (absl::Status s = local_->Barrier(options); !s.ok()) return s;
  if (local_->rank() == 0 && cross_->size() > 1) {
    if (absl::Status s = Cross(cross_->Barrier(options)); !s.ok()) return s;
  }
  return Count(local_->Barrier(AfterCross(options)));
}

void HierarchicalCollective::Abort(const absl::Status& reason) {
  local_->Abort(reason);
  cross_->Abort(reason);
}

CollectiveStats HierarchicalCollective::stats() const {
  CollectiveStats s = local_->stats();
  s.operations = operations_.load(std::memory_order_relaxed);
  if (local_->rank() == 0) {
    CollectiveStats c = cross_->stats();
    s.bytes_sent += c.bytes_sent;
    s.bytes_received += c.bytes_received;
  }
  return s;
}

}  // namespace distrain

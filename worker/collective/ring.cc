#include "worker/collective/ring.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "worker/collective/mesh_algorithms.h"
#include "worker/collective/reduce_kernel.h"
#include "worker/collective/ring_allreduce.h"
#include "worker/collective/ring_pipeline.h"
#include "worker/collective/tcp_transport.h"

namespace distrain {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

// ---- setup -----------------------------------------------------------------

RingCollective::RingCollective(int rank, int size, const RingOptions& options)
    : rank_(rank), size_(size), options_(options) {
  barrier_blocks_.assign(size, 0.0f);
  mesh_in_.assign(size, nullptr);
}

RingCollective::~RingCollective() = default;

absl::StatusOr<std::unique_ptr<RingCollective>> RingCollective::Create(Store& store, int rank,
                                                                       int size,
                                                                       const RingOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring rank ", rank, " / size ", size, " is invalid; need 0 <= rank < size"));
  }
  if (!options.peer_names.empty() && static_cast<int>(options.peer_names.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("RingOptions.peer_names has ",
                                                   options.peer_names.size(),
                                                   " names; it needs one per rank (", size, ")"));
  }
  if (options.advertised_host.empty() && IsWildcardHost(options.bind_host) && size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RingOptions.bind_host '", options.bind_host,
        "' listens on every interface; set advertised_host to the name peers should dial"));
  }
  std::unique_ptr<RingCollective> ring(new RingCollective(rank, size, options));
  if (size > 1) {
    if (absl::Status s = ring->Setup(store); !s.ok()) return s;
  }
  return ring;
}

absl::Status RingCollective::Setup(Store& store) {
  TcpTransportOptions transport;
  transport.key_prefix = options_.key_prefix;
  transport.bind_host = options_.bind_host;
  transport.advertised_host = options_.advertised_host;
  transport.names = options_.peer_names;
  transport.group_id = options_.group_id;
  transport.ring_key = options_.security != nullptr ? options_.security->ring_key() : "";
  transport.setup_timeout = options_.setup_timeout;
  transport.socket_buffer_bytes = options_.socket_buffer_bytes;
  transport.busy_poll = options_.busy_poll;
  transport.mesh = size_ >= 2 && size_ <= options_.mesh_max_ranks;
  absl::StatusOr<std::unique_ptr<TcpTransport>> connected =
      TcpTransport::Create(store, rank_, size_, transport);
  if (!connected.ok()) return connected.status();
  transport_ = *std::move(connected);
  left_name_ = transport_->name(Mod(rank_ - 1, size_));
  right_name_ = transport_->name((rank_ + 1) % size_);
  ring_all_reduce_ = std::make_unique<SlicedRingAllReduce>(*transport_, op_, options_.chunk_bytes,
                                                           options_.stage_slices);
  pipeline_ = std::make_unique<RingPipeline>(*transport_, op_);
  if (transport_->fully_connected()) {
    mesh_ = std::make_unique<MeshAlgorithms>(*transport_, op_, options_.busy_poll,
                                             options_.chunk_bytes);
  }
  return absl::OkStatus();
}

// ---- failure handling ------------------------------------------------------

void RingCollective::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason.ok() ? absl::AbortedError("ring collective aborted") : reason;
    aborted_.store(true);
  }
  // After aborted_: whatever error the transport's abort causes in the
  // operation thread, Fail turns it into abort_reason_.
  if (transport_ != nullptr) transport_->Abort();
}

absl::Status RingCollective::Fail(absl::Status status) {
  if (aborted_.load()) {
    absl::MutexLock lock(&abort_mu_);
    status = abort_reason_;
  }
  if (failed_.ok()) failed_ = status;
  return status;
}

absl::Status RingCollective::Finish(absl::Status status) {
  if (!status.ok()) return Fail(std::move(status));
  operations_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

CollectiveStats RingCollective::stats() const {
  CollectiveStats s;
  s.operations = operations_.load(std::memory_order_relaxed);
  if (transport_ != nullptr) {
    const TransportStats t = transport_->stats();
    s.bytes_sent = t.bytes_sent;
    s.bytes_received = t.bytes_received;
  }
  return s;
}

// ---- operations ------------------------------------------------------------

absl::Status RingCollective::BeginOp(OpKind kind, ReduceOp op, int root, int64_t payload_bytes) {
  if (aborted_.load()) return Fail(absl::OkStatus());
  if (!failed_.ok()) {
    return absl::Status(failed_.code(), absl::StrCat("the ring group failed earlier and cannot be "
                                                     "used until a new rendezvous: ",
                                                     failed_.message()));
  }
  op_.Begin(kind, op, root, payload_bytes);
  if (pipeline_ != nullptr) pipeline_->Clear();
  return absl::OkStatus();
}

absl::Status RingCollective::GatherAllReduce(absl::Span<const absl::Span<float>> buffers,
                                             int64_t elements, ReduceOp op, absl::Time deadline) {
  gather_.resize(static_cast<size_t>(elements) * size_);
  float* mine = gather_.data() + elements * rank_;
  for (const absl::Span<float>& b : buffers) {
    if (!b.empty()) std::memcpy(mine, b.data(), b.size() * sizeof(float));
    mine += b.size();
  }
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  absl::Status status;
  if (mesh_ != nullptr) {
    for (int p = 0; p < size_; ++p) {
      mesh_in_[p] = reinterpret_cast<char*>(gather_.data() + p * elements);
    }
    status = mesh_->OneHop(mesh_in_[rank_], mesh_in_.data(), bytes, -1, deadline);
  } else {
    gather_view_.Clear();
    gather_view_.Add(gather_.data(), static_cast<int64_t>(gather_.size() * sizeof(float)));
    pipeline_->PlanAllGather(&gather_view_, bytes);
    status = pipeline_->Run(deadline);
  }
  if (!status.ok()) return status;
  // Rank order 0..N-1 on every rank: identical bits everywhere.
  int64_t offset = 0;
  for (const absl::Span<float>& b : buffers) {
    const size_t n = b.size();
    if (n == 0) continue;
    std::memcpy(b.data(), gather_.data() + offset, n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      collective_internal::AddInto(b.data(), gather_.data() + r * elements + offset, n);
    }
    if (op == ReduceOp::kMean) {
      collective_internal::DivideInPlace(b.data(), n, static_cast<float>(size_));
    }
    offset += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RingCollective::AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                                       const CollectiveOptions& options) {
  int64_t elements = 0;
  for (const auto& b : buffers) elements += static_cast<int64_t>(b.size());
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  if (absl::Status s = BeginOp(OpKind::kAllReduce, op, 0, bytes); !s.ok()) return s;
  if (size_ == 1) return Finish(absl::OkStatus());  // the mean of one value is itself
  const absl::Time deadline = absl::Now() + options.timeout;
  op_.Name("all-reduce", &options.tag);
  if (bytes <= options_.small_allreduce_bytes) {
    return Finish(mesh_ != nullptr ? mesh_->DoublingAllReduce(buffers, elements, op, deadline)
                                   : GatherAllReduce(buffers, elements, op, deadline));
  }
  const bool power_of_two = (size_ & (size_ - 1)) == 0;
  if (mesh_ != nullptr && size_ >= 4 && power_of_two && bytes <= options_.halving_doubling_bytes) {
    return Finish(mesh_->HalvingDoublingAllReduce(buffers, elements, op, deadline));
  }
  data_.Clear();
  for (const auto& b : buffers) data_.Add(b.data(), static_cast<int64_t>(b.size() * sizeof(float)));
  return Finish(ring_all_reduce_->Run(data_, op, deadline));
}

absl::Status RingCollective::Broadcast(absl::Span<float> buffer, int root,
                                       const CollectiveOptions& options) {
  if (root < 0 || root >= size_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside the ring of ", size_, " ranks")));
  }
  const int64_t bytes = static_cast<int64_t>(buffer.size() * sizeof(float));
  if (absl::Status s = BeginOp(OpKind::kBroadcast, ReduceOp::kSum, root, bytes); !s.ok()) {
    return s;
  }
  if (size_ == 1) return Finish(absl::OkStatus());
  const absl::Time deadline = absl::Now() + options.timeout;
  op_.Name("broadcast", &options.tag);
  if (mesh_ != nullptr && bytes <= options_.small_allreduce_bytes) {
    mesh_in_[root] = reinterpret_cast<char*>(buffer.data());
    return Finish(mesh_->OneHop(reinterpret_cast<const char*>(buffer.data()), mesh_in_.data(),
                                bytes, root, deadline));
  }
  data_.Clear();
  data_.Add(buffer.data(), bytes);
  const int distance = Mod(rank_ - root, size_);
  int received = -1;
  if (distance > 0) {
    pipeline_->AddReceiveHeader();
    received = pipeline_->AddReceive(&data_, 0, bytes);
  }
  if (distance < size_ - 1) {
    pipeline_->AddSendHeader();
    pipeline_->AddSend(&data_, 0, bytes, received);
  }
  return Finish(pipeline_->Run(deadline));
}

absl::Status RingCollective::AllGather(absl::Span<const float> input, absl::Span<float> output,
                                       const CollectiveOptions& options) {
  if (output.size() != input.size() * size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "all-gather output holds ", output.size(), " elements; it must hold size() * input = ",
        size_, " * ", input.size())));
  }
  const int64_t bytes = static_cast<int64_t>(input.size() * sizeof(float));
  if (absl::Status s = BeginOp(OpKind::kAllGather, ReduceOp::kSum, 0, bytes); !s.ok()) return s;
  float* mine = output.data() + input.size() * rank_;
  if (!input.empty() && mine != input.data()) {
    std::memmove(mine, input.data(), static_cast<size_t>(bytes));
  }
  if (size_ == 1) return Finish(absl::OkStatus());
  const absl::Time deadline = absl::Now() + options.timeout;
  op_.Name("all-gather", &options.tag);
  if (mesh_ != nullptr && bytes <= options_.small_allreduce_bytes) {
    for (int p = 0; p < size_; ++p) {
      mesh_in_[p] = reinterpret_cast<char*>(output.data() + input.size() * p);
    }
    return Finish(mesh_->OneHop(reinterpret_cast<const char*>(mine), mesh_in_.data(), bytes, -1,
                                deadline));
  }
  data_.Clear();
  data_.Add(output.data(), static_cast<int64_t>(output.size() * sizeof(float)));
  pipeline_->PlanAllGather(&data_, bytes);
  return Finish(pipeline_->Run(deadline));
}

absl::Status RingCollective::Barrier(const CollectiveOptions& options) {
  if (absl::Status s = BeginOp(OpKind::kBarrier, ReduceOp::kSum, 0, 0); !s.ok()) return s;
  if (size_ == 1) return Finish(absl::OkStatus());
  const absl::Time deadline = absl::Now() + options.timeout;
  op_.Name("barrier", &options.tag);
  // All-to-all rather than a log-step dissemination: a rank that never
  // arrives is then named by every other rank, not just by its successor.
  if (mesh_ != nullptr) return Finish(mesh_->OneHop(nullptr, mesh_in_.data(), 0, -1, deadline));
  gather_view_.Clear();
  gather_view_.Add(barrier_blocks_.data(), static_cast<int64_t>(size_ * sizeof(float)));
  pipeline_->PlanAllGather(&gather_view_, sizeof(float));
  return Finish(pipeline_->Run(deadline));
}

}  // namespace distrain

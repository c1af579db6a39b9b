#include "worker/strategy/gradient_buckets.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace distrain {

std::vector<GradientBucket> PlanGradientBuckets(
    const std::vector<std::vector<int64_t>>& layer_param_sizes, int64_t bytes_per_pack) {
  const int64_t capacity =
      std::max<int64_t>(1, bytes_per_pack / static_cast<int64_t>(sizeof(float)));
  std::vector<GradientBucket> buckets;
  GradientBucket current;
  for (int layer = static_cast<int>(layer_param_sizes.size()) - 1; layer >= 0; --layer) {
    const std::vector<int64_t>& sizes = layer_param_sizes[layer];
    for (int param = 0; param < static_cast<int>(sizes.size()); ++param) {
      for (int64_t offset = 0; offset < sizes[param];) {
        const int64_t take = std::min(capacity - current.elements, sizes[param] - offset);
        current.slices.push_back(BucketSlice{layer, param, offset, take});
        current.elements += take;
        current.ready_layer = layer;
        offset += take;
        if (current.elements == capacity) {
          buckets.push_back(std::move(current));
          current = GradientBucket();
        }
      }
    }
  }
  if (current.elements > 0) buckets.push_back(std::move(current));
  return buckets;
}

std::vector<std::vector<int64_t>> LayerParameterSizes(Model& model) {
  std::vector<std::vector<int64_t>> sizes;
  for (const std::vector<Parameter*>& layer : model.parameters_by_layer()) {
    std::vector<int64_t>& s = sizes.emplace_back();
    for (const Parameter* p : layer) s.push_back(p->value.size());
  }
  return sizes;
}

OverlappedGradientReducer::OverlappedGradientReducer(
    Model* model, Collective* collective, int64_t bytes_per_pack, CollectiveOptions options,
    CollectiveMetrics* metrics, std::function<void(const absl::Status&)> on_error,
    absl::Span<float> extra)
    : collective_(collective),
      options_(std::move(options)),
      metrics_(metrics),
      on_error_(std::move(on_error)),
      params_by_layer_(model->parameters_by_layer()),
      buckets_(PlanGradientBuckets(LayerParameterSizes(*model), bytes_per_pack)),
      extra_(extra) {
  // A model without parameters still carries the extra data.
  if (buckets_.empty() && !extra_.empty()) buckets_.emplace_back();
  comm_thread_ = std::thread([this] { CommLoop(); });
}

OverlappedGradientReducer::~OverlappedGradientReducer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  comm_thread_.join();
}

void OverlappedGradientReducer::BeginStep() {
  next_to_enqueue_ = 0;
  absl::MutexLock lock(&mu_);
  DISTRAIN_CHECK(queue_.empty()) << "BeginStep while the previous step is still reducing";
  completed_ = 0;
}

void OverlappedGradientReducer::OnLayerGradsReady(int layer) {
  // Backward reports layers last first, so the buckets complete in plan order.
  while (next_to_enqueue_ < buckets_.size() && buckets_[next_to_enqueue_].ready_layer >= layer) {
    Enqueue(next_to_enqueue_++);
  }
}

absl::Status OverlappedGradientReducer::FinishStep() {
  while (next_to_enqueue_ < buckets_.size()) Enqueue(next_to_enqueue_++);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](OverlappedGradientReducer* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->completed_ == self->buckets_.size();
      },
      this));
  return error_;
}

void OverlappedGradientReducer::Enqueue(size_t bucket) {
  // Spans are taken now, on the compute thread, after the layer wrote its
  // grads; the tensors are not resized afterwards within the step.
  std::vector<absl::Span<float>> spans;
  spans.reserve(buckets_[bucket].slices.size());
  for (const BucketSlice& s : buckets_[bucket].slices) {
    Parameter* p = params_by_layer_[s.layer][s.param];
    DISTRAIN_CHECK_LE(s.offset + s.count, p->grad.size()) << p->name;
    spans.emplace_back(p->grad.data() + s.offset, static_cast<size_t>(s.count));
  }
  if (bucket + 1 == buckets_.size() && !extra_.empty()) spans.push_back(extra_);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(spans));
}

void OverlappedGradientReducer::CommLoop() {
  while (true) {
    std::vector<absl::Span<float>> spans;
    bool skip = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OverlappedGradientReducer* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stop_ || !self->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stop_ with nothing left to do
      spans = std::move(queue_.front());
      queue_.pop_front();
      skip = !error_.ok();  // the group is unusable after an error; do not wait on it again
    }
    absl::Status status;
    if (!skip) {
      int64_t elements = 0;
      for (const absl::Span<float>& s : spans) elements += static_cast<int64_t>(s.size());
      const absl::Time start = absl::Now();
      status = collective_->AllReduce(absl::MakeConstSpan(spans), ReduceOp::kMean, options_);
      if (metrics_ != nullptr && status.ok()) {
        metrics_->Observe(CollectiveOp::kAllReduce, elements * static_cast<int64_t>(sizeof(float)),
                          absl::Now() - start);
      }
    }
    if (!status.ok() && on_error_) on_error_(status);
    absl::MutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    ++completed_;
  }
}

}  // namespace distrain

#ifndef DISTRAIN_WORKER_STRATEGY_GRADIENT_BUCKETS_H_
#define DISTRAIN_WORKER_STRATEGY_GRADIENT_BUCKETS_H_

// Gradient bucketing with communication/backward overlap (docs/architecture.md §6,
// horovod's tensor fusion / PyTorch DDP's buckets).
//
// Planning (PlanGradientBuckets, a pure function): the gradients are walked
// in REVERSE layer order (the order backward produces them; inside a layer,
// kernel before bias) and packed greedily into buckets of at most
// `bytes_per_pack` bytes. A gradient that does not fit in the current bucket
// is split at element granularity, so every bucket respects the limit (a
// bucket is never empty, and is at least one float). A bucket becomes ready
// once the lowest layer that has a slice in it has its gradients final.
//
// Reduction (OverlappedGradientReducer): while backward runs on the compute
// thread, Model::TrainStep calls OnLayerGradsReady(layer) last layer first;
// every bucket that became ready is handed to a communication thread that
// all-reduces it (MEAN) in place while backward continues with lower layers.
// FinishStep hands over whatever is left and waits for every bucket. Buckets
// are always reduced in plan order, so every rank issues the same collective
// sequence.

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/collective/collective.h"
#include "worker/model/model.h"
#include "worker/strategy/collective_metrics.h"

namespace distrain {

// A contiguous run of one parameter's gradient.
struct BucketSlice {
  int layer = 0;       // index into Model::parameters_by_layer()
  int param = 0;       // index within that layer's parameters
  int64_t offset = 0;  // first element
  int64_t count = 0;   // elements
  bool operator==(const BucketSlice&) const = default;
};

struct GradientBucket {
  std::vector<BucketSlice> slices;
  int64_t elements = 0;
  int ready_layer = 0;  // the bucket is ready once this (its lowest) layer's grads are final
  bool operator==(const GradientBucket&) const = default;
};

// `layer_param_sizes[l][p]` = element count of parameter p of layer l
// (layers without parameters have an empty list). Zero-sized parameters are
// skipped. bytes_per_pack below sizeof(float) is treated as one float.
std::vector<GradientBucket> PlanGradientBuckets(
    const std::vector<std::vector<int64_t>>& layer_param_sizes, int64_t bytes_per_pack);

// The element counts of a model's parameters, by layer (PlanGradientBuckets' input).
std::vector<std::vector<int64_t>> LayerParameterSizes(Model& model);

// Reduces one replica's gradients bucket by bucket on its own communication
// thread. Borrows `model` and `collective` (both must outlive it) and
// `metrics` (may be null).
//
// Thread-safety: BeginStep / OnLayerGradsReady / FinishStep are called from
// the replica's compute thread, in that order, once per step; the
// communication thread is internal. `on_error` (may be empty) is called on the
// communication thread when a reduction fails, so a strategy can Abort the
// other replicas' collectives rather than let them wait for this one.
class OverlappedGradientReducer {
 public:
  // `extra` (may be empty; borrowed) is reduced with the last bucket every
  // step: a few floats of control data (the stop vote) that ride along with
  // the gradients instead of costing an operation of their own.
  OverlappedGradientReducer(Model* model, Collective* collective, int64_t bytes_per_pack,
                            CollectiveOptions options, CollectiveMetrics* metrics,
                            std::function<void(const absl::Status&)> on_error = {},
                            absl::Span<float> extra = {});
  ~OverlappedGradientReducer();
  OverlappedGradientReducer(const OverlappedGradientReducer&) = delete;
  OverlappedGradientReducer& operator=(const OverlappedGradientReducer&) = delete;

  void BeginStep();
  // `layer`'s gradients are final: start every bucket that is now complete.
  void OnLayerGradsReady(int layer);
  // Starts the remaining buckets, waits for all of them, and returns the
  // first error (the gradients are then unusable).
  absl::Status FinishStep();

  const std::vector<GradientBucket>& buckets() const { return buckets_; }

 private:
  void Enqueue(size_t bucket);
  void CommLoop();

  Collective* const collective_;
  const CollectiveOptions options_;
  CollectiveMetrics* const metrics_;
  const std::function<void(const absl::Status&)> on_error_;
  std::vector<std::vector<Parameter*>> params_by_layer_;
  std::vector<GradientBucket> buckets_;
  const absl::Span<float> extra_;
  size_t next_to_enqueue_ = 0;  // compute thread only

  absl::Mutex mu_;
  // Spans of the buckets handed over and not yet reduced, in plan order.
  std::deque<std::vector<absl::Span<float>>> queue_ ABSL_GUARDED_BY(mu_);
  size_t completed_ ABSL_GUARDED_BY(mu_) = 0;  // buckets of this step reduced (or skipped)
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread comm_thread_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_GRADIENT_BUCKETS_H_

#ifndef DISTRAIN_WORKER_STRATEGY_COLLECTIVE_METRICS_H_
#define DISTRAIN_WORKER_STRATEGY_COLLECTIVE_METRICS_H_

// Prometheus metrics of the synchronous strategies (names are stable API; the
// Grafana dashboard reads them):
//   distrain_collective_bytes_total{op}   counter   payload bytes this process's
//                                                   replicas passed to collective ops
//   distrain_collective_seconds{op}       histogram wall time of one op on one replica
//   distrain_membership_generation        gauge     rendezvous generation of this process
// op is "allreduce", "broadcast", "allgather" or "barrier". Payload bytes (not
// wire bytes) so the figure means the same for in-process and ring collectives;
// a ring moves 2(N-1)/N times the payload over the network.
//
// Owns nothing but references into the registry; prometheus-cpp metrics are
// thread-safe, so Observe may be called from any thread.

#include <cstdint>

#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace distrain {

enum class CollectiveOp { kAllReduce, kBroadcast, kAllGather, kBarrier };

class CollectiveMetrics {
 public:
  explicit CollectiveMetrics(prometheus::Registry& registry);
  void Observe(CollectiveOp op, int64_t bytes, absl::Duration elapsed);
  void SetMembershipGeneration(int64_t generation);
  // One in-place recovery (multi_worker_mirrored.h R1-R4) that took `elapsed`.
  void ObserveRecovery(absl::Duration elapsed);

 private:
  static constexpr int kNumOps = 4;
  prometheus::Counter* bytes_[kNumOps];
  prometheus::Histogram* seconds_[kNumOps];
  prometheus::Gauge& generation_;
  prometheus::Counter& recoveries_;
  prometheus::Gauge& last_recovery_seconds_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_COLLECTIVE_METRICS_H_

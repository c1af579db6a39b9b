#include "worker/strategy/collective_metrics.h"

namespace distrain {
namespace {

constexpr const char* kOpNames[] = {"allreduce", "broadcast", "allgather", "barrier"};

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  // 50 us .. ~1.6 s, doubling: a small-bucket ring step on loopback to a
  // 256 MiB all-reduce across hosts.
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 5e-5; b.size() < 16; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

CollectiveMetrics::CollectiveMetrics(prometheus::Registry& registry)
    : generation_(
          prometheus::BuildGauge()
              .Name("distrain_membership_generation")
              .Help("Rendezvous generation this process trains in (bumps on membership changes)")
              .Register(registry)
              .Add({})),
      recoveries_(prometheus::BuildCounter()
                      .Name("distrain_recoveries_total")
                      .Help("In-place recoveries from a lost peer this process took part in "
                            "(runPolicy.recoveryPolicy InPlace)")
                      .Register(registry)
                      .Add({})),
      last_recovery_seconds_(prometheus::BuildGauge()
                                 .Name("distrain_last_recovery_seconds")
                                 .Help("Wall time of this process's last in-place recovery, from "
                                       "the failed step to the re-formed group's agreed state")
                                 .Register(registry)
                                 .Add({})) {
  auto& bytes =
      prometheus::BuildCounter()
          .Name("distrain_collective_bytes_total")
          .Help("Payload bytes passed to collective operations by this process's replicas")
          .Register(registry);
  auto& seconds = prometheus::BuildHistogram()
                      .Name("distrain_collective_seconds")
                      .Help("Wall time of one collective operation on one replica")
                      .Register(registry);
  for (int i = 0; i < kNumOps; ++i) {
    bytes_[i] = &bytes.Add({{"op", kOpNames[i]}});
    seconds_[i] = &seconds.Add({{"op", kOpNames[i]}}, SecondsBuckets());
  }
}

void CollectiveMetrics::Observe(CollectiveOp op, int64_t bytes, absl::Duration elapsed) {
  const int i = static_cast<int>(op);
  bytes_[i]->Increment(static_cast<double>(bytes));
  seconds_[i]->Observe(absl::ToDoubleSeconds(elapsed));
}

void CollectiveMetrics::SetMembershipGeneration(int64_t generation) {
  generation_.Set(static_cast<double>(generation));
}

void CollectiveMetrics::ObserveRecovery(absl::Duration elapsed) {
  recoveries_.Increment();
  last_recovery_seconds_.Set(absl::ToDoubleSeconds(elapsed));
}

}  // namespace distrain

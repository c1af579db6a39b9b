#ifndef DISTRAIN_WORKER_TRAINING_METRICS_H_
#define DISTRAIN_WORKER_TRAINING_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace distrain {

// The worker's Prometheus metrics (served by MetricsServer on
// DISTRAIN_METRICS_PORT). Names are stable API: the operator, the Grafana
// dashboard and alerts read them.
//   distrain_steps_total                 counter   training steps completed by this process
//   distrain_step                        gauge     the job's step this process is at: the
//                                                  step it resumed from plus the steps it ran
//                                                  (what status.progress.step shows)
//   distrain_examples_total              counter   examples consumed by this process
//   distrain_step_duration_seconds       histogram wall time per step
//   distrain_loss                        gauge     loss of the latest step
//   distrain_examples_per_second         gauge     this process's throughput over the last
//                                                  log interval (sum over pods: the job's)
//   distrain_job_examples_per_second     gauge     the whole job's throughput as this process
//                                                  sees it (its rate x the input shards its
//                                                  step stands for: MultiWorkerMirrored's W)
//   distrain_total_steps                 gauge     steps the job asked for
//   distrain_eval_accuracy / _eval_loss  gauge     latest evaluation
//   distrain_checkpoint_duration_seconds histogram time to write a checkpoint
//   distrain_progress_deadline_seconds   gauge     the progress deadline this process applies
//   distrain_loss_scale                  gauge     mixed_float16's dynamic loss scale of the
//                                                  latest step (1 without loss scaling)
//                                                  (common/progress_deadline.h); the
//                                                  operator judges Stalled against the
//                                                  master's when the spec sets none
// and, with spec.strategy Auto (ExportAutoStrategy):
//   distrain_auto_strategy_info{strategy,reason}   gauge 1: what Auto chose in this
//                                                  process and why; the operator copies
//                                                  the master's into status.strategy
//   distrain_device_copy_gigabytes_per_second{link="host_device"|"device_device"}
//                                        gauge     the copy bandwidths Auto decided on
// Owns nothing but references into `registry`; prometheus-cpp metrics are
// thread-safe.
struct TrainingMetrics {
  explicit TrainingMetrics(prometheus::Registry& registry);

  // The registry these live in; strategies add their own metrics to it
  // (Strategy::AttachMetrics).
  prometheus::Registry& registry;
  prometheus::Counter& steps;
  prometheus::Gauge& step;
  prometheus::Counter& examples;
  prometheus::Histogram& step_duration;
  prometheus::Gauge& loss;
  prometheus::Gauge& examples_per_second;
  prometheus::Gauge& job_examples_per_second;
  prometheus::Gauge& total_steps;
  prometheus::Gauge& eval_accuracy;
  prometheus::Gauge& eval_loss;
  prometheus::Histogram& checkpoint_duration;
  prometheus::Gauge& progress_deadline;
  prometheus::Gauge& loss_scale;
};

// The Auto metrics above: `strategy` and `reason` as ResolveAutoStrategy gave
// them (common/auto_strategy.h), the bandwidths of `facts` that were measured.
struct DeviceFacts;
void ExportAutoStrategy(prometheus::Registry& registry, const std::string& strategy,
                        const std::string& reason, const DeviceFacts& facts);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_TRAINING_METRICS_H_

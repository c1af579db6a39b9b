#include "worker/training_metrics.h"

#include "common/auto_strategy.h"

namespace distrain {
namespace {

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

}  // namespace

TrainingMetrics::TrainingMetrics(prometheus::Registry& registry)
    : registry(registry),
      steps(prometheus::BuildCounter()
                .Name("distrain_steps_total")
                .Help("Training steps completed by this process")
                .Register(registry)
                .Add({})),
      step(prometheus::BuildGauge()
               .Name("distrain_step")
               .Help("The job's step this process is at: the step it resumed from plus the steps "
                     "it ran")
               .Register(registry)
               .Add({})),
      examples(prometheus::BuildCounter()
                   .Name("distrain_examples_total")
                   .Help("Training examples consumed by this process")
                   .Register(registry)
                   .Add({})),
      step_duration(prometheus::BuildHistogram()
                        .Name("distrain_step_duration_seconds")
                        .Help("Wall time of one training step")
                        .Register(registry)
                        .Add({}, ExponentialBuckets(0.0005, 2, 16))),
      loss(prometheus::BuildGauge()
               .Name("distrain_loss")
               .Help("Training loss of the latest step")
               .Register(registry)
               .Add({})),
      examples_per_second(prometheus::BuildGauge()
                              .Name("distrain_examples_per_second")
                              .Help("Training throughput of this process over the last log interval")
                              .Register(registry)
                              .Add({})),
      job_examples_per_second(
          prometheus::BuildGauge()
              .Name("distrain_job_examples_per_second")
              .Help("Training throughput of the whole job over the last log interval, as this "
                    "process sees it (what the operator reports as examplesPerSecond)")
              .Register(registry)
              .Add({})),
      total_steps(prometheus::BuildGauge()
                      .Name("distrain_total_steps")
                      .Help("Number of steps the job trains for")
                      .Register(registry)
                      .Add({})),
      eval_accuracy(prometheus::BuildGauge()
                        .Name("distrain_eval_accuracy")
                        .Help("Accuracy of the latest evaluation")
                        .Register(registry)
                        .Add({})),
      eval_loss(prometheus::BuildGauge()
                    .Name("distrain_eval_loss")
                    .Help("Loss of the latest evaluation")
                    .Register(registry)
                    .Add({})),
      checkpoint_duration(prometheus::BuildHistogram()
                              .Name("distrain_checkpoint_duration_seconds")
                              .Help("Time to write one checkpoint")
                              .Register(registry)
                              .Add({}, ExponentialBuckets(0.001, 2, 16))),
      progress_deadline(prometheus::BuildGauge()
                            .Name("distrain_progress_deadline_seconds")
                            .Help("Seconds this process may go without completing a step before "
                                  "its /healthz fails (spec.runPolicy.progressDeadlineSeconds, "
                                  "else derived from the median step time)")
                            .Register(registry)
                            .Add({})),
      loss_scale(prometheus::BuildGauge()
                     .Name("distrain_loss_scale")
                     .Help("The dynamic loss scale of the latest step (spec.training.precision: "
                           "mixed_float16; halves on every skipped step); 1 without loss scaling")
                     .Register(registry)
                     .Add({})) {
  loss_scale.Set(1.0);
}

void ExportAutoStrategy(prometheus::Registry& registry, const std::string& strategy,
                        const std::string& reason, const DeviceFacts& facts) {
  prometheus::BuildGauge()
      .Name("distrain_auto_strategy_info")
      .Help("spec.strategy Auto: the strategy this process chose and why (value 1)")
      .Register(registry)
      .Add({{"strategy", strategy}, {"reason", reason}})
      .Set(1);
  if (!facts.host_device_gbps && !facts.device_device_gbps) return;
  auto& bandwidth = prometheus::BuildGauge()
                        .Name("distrain_device_copy_gigabytes_per_second")
                        .Help("Copy bandwidth measured at start for spec.strategy Auto, by link")
                        .Register(registry);
  if (facts.host_device_gbps) bandwidth.Add({{"link", "host_device"}}).Set(*facts.host_device_gbps);
  if (facts.device_device_gbps) {
    bandwidth.Add({{"link", "device_device"}}).Set(*facts.device_device_gbps);
  }
}

}  // namespace distrain

// The worker's Auto metrics, as the operator's progress reporter reads them
// (operator/progress_reporter.h: the master's choice becomes status.strategy).
#include "worker/training_metrics.h"

#include <gtest/gtest.h>

#include "common/auto_strategy.h"
#include "gmock/gmock.h"
#include "prometheus/text_serializer.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TrainingMetricsTest, AutoExportsItsChoiceItsReasonAndTheBandwidthsItMeasured) {
  prometheus::Registry registry;
  DeviceFacts facts;
  facts.gpus = 2;
  facts.host_device_gbps = 51.25;
  facts.device_device_gbps = 24.5;
  // A reason with the characters the text format must escape.
  ExportAutoStrategy(registry, "CentralStorage", "2 GPUs: \"variables\" on the CPU\\", facts);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("distrain_auto_strategy_info{reason=\"2 GPUs: \\\"variables\\\" on "
                              "the CPU\\\\\",strategy=\"CentralStorage\"} 1"));
  EXPECT_THAT(text, HasSubstr("distrain_device_copy_gigabytes_per_second{link=\"host_device\"} 51.25"));
  EXPECT_THAT(text, HasSubstr("distrain_device_copy_gigabytes_per_second{link=\"device_device\"} 24.5"));
}

TEST(TrainingMetricsTest, AutoWithoutMeasurementsExportsNoBandwidth) {
  prometheus::Registry registry;
  ExportAutoStrategy(registry, "OneDevice", "one training task, one replica and no GPU",
                     DeviceFacts{});
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("distrain_auto_strategy_info{reason=\"one training task, one replica "
                              "and no GPU\",strategy=\"OneDevice\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("distrain_device_copy_gigabytes_per_second")));
}

}  // namespace
}  // namespace distrain

#include "cli/progress.h"

#include <gtest/gtest.h>

namespace distrain {
namespace {

TEST(ProgressTest, ParsesTheWorkerStatusFile) {
  auto p = ParseProgress(
      R"({"state":"Succeeded","step":400,"totalSteps":400,"loss":0.05,"examplesPerSecond":9000,)"
      R"("wallSeconds":12.5,"evalAccuracy":0.97,"evalLoss":0.1,"message":""})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->state, "Succeeded");
  EXPECT_EQ(p->step, 400);
  ASSERT_TRUE(p->eval_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*p->eval_accuracy, 0.97);
}

TEST(ProgressTest, HalfWrittenOrWrongTypedStatusIsAnErrorNotACrash) {
  EXPECT_FALSE(ParseProgress(R"({"step": 4)").ok());
  EXPECT_FALSE(ParseProgress(R"({"step": "four"})").ok());
  EXPECT_FALSE(ParseProgress("[]").ok());
}

TEST(ProgressTest, BarShowsStepsLossThroughputAndEtaWithinWidth) {
  Progress p;
  p.step = 100;
  p.total_steps = 400;
  p.loss = 0.3123;
  p.examples_per_second = 5120;
  p.wall_seconds = 10;  // 0.1 s/step -> 30 s left
  for (int width : {120, 80, 60, 30}) {
    std::string bar = RenderProgressBar(p, width);
    EXPECT_LE(static_cast<int>(bar.size()), width) << bar;
  }
  std::string bar = RenderProgressBar(p, 120);
  EXPECT_NE(bar.find("100/400"), std::string::npos) << bar;
  EXPECT_NE(bar.find("25%"), std::string::npos) << bar;
  EXPECT_NE(bar.find("0.3123"), std::string::npos) << bar;
  EXPECT_NE(bar.find("5120 ex/s"), std::string::npos) << bar;
  EXPECT_NE(bar.find("ETA 0:30"), std::string::npos) << bar;
  EXPECT_NE(bar.find("[##"), std::string::npos) << bar;
}

TEST(ProgressTest, FormatsDurations) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(72), "1:12");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(-1), "?");
}

}  // namespace
}  // namespace distrain

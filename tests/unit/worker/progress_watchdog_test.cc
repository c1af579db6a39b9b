#include "worker/progress_watchdog.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

// A watchdog on a clock the test moves.
class ProgressWatchdogTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  ProgressWatchdog Make(std::optional<int64_t> explicit_seconds) {
    return ProgressWatchdog(explicit_seconds, [this] { return now_; });
  }
  // n steps of `seconds` each, the clock moving with them.
  void Steps(ProgressWatchdog& w, int n, double seconds, int64_t* step) {
    for (int i = 0; i < n; ++i) {
      now_ += absl::Seconds(seconds);
      w.StepCompleted(++*step, seconds);
    }
  }
};

TEST_F(ProgressWatchdogTest, ExplicitDeadlineFailsOnlyOnceAStepIsLate) {
  ProgressWatchdog w = Make(30);
  int64_t step = 0;
  Steps(w, 5, 0.5, &step);
  EXPECT_EQ(w.deadline(), absl::Seconds(30));
  now_ += absl::Seconds(29);
  EXPECT_TRUE(w.Check().ok());
  now_ += absl::Seconds(2);
  const absl::Status s = w.Check();
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("no step completed for 31 s since step 5"));
  EXPECT_THAT(s.message(), HasSubstr("the progress deadline of 30 s"));
  EXPECT_THAT(s.message(), HasSubstr("spec.runPolicy.progressDeadlineSeconds"));
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
  // Progress resumes: healthy again.
  Steps(w, 1, 0.5, &step);
  EXPECT_TRUE(w.Check().ok());
}

TEST_F(ProgressWatchdogTest, DefaultIsSixtySecondsOrTwentyMediansWhicheverIsLonger) {
  ProgressWatchdog fast = Make(std::nullopt);
  EXPECT_EQ(fast.deadline(), absl::Seconds(60));  // before any step is timed
  int64_t step = 0;
  Steps(fast, 50, 0.01, &step);
  EXPECT_EQ(fast.deadline(), absl::Seconds(60));

  ProgressWatchdog slow = Make(std::nullopt);
  int64_t slow_step = 0;
  // The first step carries the warm-up and is left out; a few outliers
  // (checkpoint steps) do not move the median.
  Steps(slow, 1, 500, &slow_step);
  Steps(slow, 20, 5, &slow_step);
  Steps(slow, 3, 200, &slow_step);
  EXPECT_EQ(slow.deadline(), absl::Seconds(100));  // 20 x 5 s
  now_ += absl::Seconds(99);
  EXPECT_TRUE(slow.Check().ok());
  now_ += absl::Seconds(2);
  const absl::Status s = slow.Check();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("max(60 s, 20 x the median step time 5 s)"));
}

TEST_F(ProgressWatchdogTest, StartUpGetsTenMinutesThenFails) {
  ProgressWatchdog w = Make(30);
  now_ += absl::Minutes(9);
  EXPECT_TRUE(w.Check().ok()) << "rendezvous and data loading are not a stall";
  now_ += absl::Minutes(1) + absl::Seconds(1);
  const absl::Status s = w.Check();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("start-up has lasted 601 s without a completed step"));
  EXPECT_THAT(s.message(), HasSubstr("allowance of 600 s"));
}

TEST_F(ProgressWatchdogTest, ALongerExplicitDeadlineAlsoLengthensStartUp) {
  ProgressWatchdog w = Make(3600);
  now_ += absl::Minutes(59);
  EXPECT_TRUE(w.Check().ok());
  now_ += absl::Minutes(2);
  EXPECT_FALSE(w.Check().ok());
}

TEST_F(ProgressWatchdogTest, CheckpointWritesAndEvaluationsGetTheLongAllowance) {
  ProgressWatchdog w = Make(30);
  int64_t step = 0;
  Steps(w, 3, 1, &step);
  w.BeginLongPhase("writing a checkpoint");
  now_ += absl::Minutes(9);
  EXPECT_TRUE(w.Check().ok());
  now_ += absl::Minutes(2);
  const absl::Status hung = w.Check();
  ASSERT_FALSE(hung.ok()) << "a checkpoint write that never ends is found too";
  EXPECT_THAT(hung.message(), HasSubstr("writing a checkpoint after step 3 has lasted 660 s"));
  w.EndLongPhase();
  // The next step's clock starts when the phase ends.
  EXPECT_TRUE(w.Check().ok());
  now_ += absl::Seconds(31);
  EXPECT_FALSE(w.Check().ok());
}

TEST_F(ProgressWatchdogTest, AnExpectedLongStepIsAllowedOnceOnly) {
  ProgressWatchdog w = Make(30);
  int64_t step = 0;
  Steps(w, 3, 1, &step);
  w.ExpectLongStep("the chief writes a checkpoint");
  now_ += absl::Minutes(5);
  EXPECT_TRUE(w.Check().ok());
  Steps(w, 1, 300, &step);
  now_ += absl::Seconds(31);
  const absl::Status s = w.Check();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("since step 4"));
}

// What the operator judges the master by (operator/controller/stall.h): it
// sees only the step counter, so a long phase must lengthen the figure.
TEST_F(ProgressWatchdogTest, TheGaugeIsTheAllowanceFromTheLastStep) {
  prometheus::Registry registry;
  prometheus::Gauge& gauge =
      prometheus::BuildGauge().Name("distrain_progress_deadline_seconds").Register(registry).Add({});
  ProgressWatchdog w = Make(30);
  w.AttachGauge(&gauge);
  EXPECT_EQ(gauge.Value(), 600) << "start-up";
  int64_t step = 0;
  Steps(w, 3, 1, &step);
  EXPECT_EQ(gauge.Value(), 30);
  now_ += absl::Seconds(2);
  w.BeginLongPhase("writing a checkpoint");
  EXPECT_EQ(gauge.Value(), 602);
  EXPECT_EQ(w.AllowanceFromLastStep(), absl::Seconds(602));
  now_ += absl::Seconds(40);
  w.EndLongPhase();
  EXPECT_EQ(gauge.Value(), 72) << "the next step has 30 s from the phase's end";
  Steps(w, 1, 1, &step);
  EXPECT_EQ(gauge.Value(), 30);
}

TEST_F(ProgressWatchdogTest, DoneIsAlwaysHealthy) {
  ProgressWatchdog w = Make(30);
  w.Done();
  now_ += absl::Hours(5);
  EXPECT_TRUE(w.Check().ok());
}

}  // namespace
}  // namespace distrain

#include "operator/progress_reporter.h"

#include "operator/api/distributed_training_job.h"

#include "gtest/gtest.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain {
namespace {

TEST(ProgressReporterTest, ReadsTheChiefsTrainingMetricsFromPrometheusText) {
  const std::string text =
      "# HELP distrain_steps_total Training steps completed by this process\n"
      "# TYPE distrain_steps_total counter\n"
      "distrain_steps_total 120\n"
      "distrain_total_steps 400\n"
      "distrain_examples_per_second 5123.46\n"
      "distrain_loss 0.312345678\n"
      "distrain_step_duration_seconds_bucket{le=\"0.001\"} 3\n"
      "distrain_lossy 7\n";
  ScrapedProgress p = ParseProgressMetrics(text);
  ASSERT_TRUE(p.step && p.total_steps && p.examples_per_second && p.loss);
  EXPECT_EQ(*p.step, 120);
  EXPECT_EQ(*p.total_steps, 400);
  EXPECT_DOUBLE_EQ(*p.examples_per_second, 5123.46);
  EXPECT_DOUBLE_EQ(*p.loss, 0.312345678);
}

TEST(ProgressReporterTest, ExamplesPerSecondIsTheJobsRateWhenTheChiefGivesIt) {
  // A MultiWorkerMirrored chief of 4 workers: its own rate is a quarter of
  // the job's, which status.progress must show.
  ScrapedProgress p = ParseProgressMetrics(
      "distrain_examples_per_second 1000\ndistrain_job_examples_per_second 4000\n");
  ASSERT_TRUE(p.examples_per_second);
  EXPECT_DOUBLE_EQ(*p.examples_per_second, 4000);
  ScrapedProgress reversed = ParseProgressMetrics(
      "distrain_job_examples_per_second 4000\ndistrain_examples_per_second 1000\n");
  EXPECT_DOUBLE_EQ(*reversed.examples_per_second, 4000);
}

TEST(ProgressReporterTest, StepIsTheJobsStepWhenTheChiefGivesIt) {
  // A chief that resumed from step 500 and ran 20 more: its own counter says
  // 20, the job is at step 520.
  ScrapedProgress p = ParseProgressMetrics("distrain_steps_total 20\ndistrain_step 520\n");
  ASSERT_TRUE(p.step);
  EXPECT_DOUBLE_EQ(*p.step, 520);
  ScrapedProgress old = ParseProgressMetrics("distrain_steps_total 20\n");  // an older worker
  EXPECT_DOUBLE_EQ(*old.step, 20);
}

// spec.strategy Auto on GPUs: the operator plans one pod and cannot measure
// its links; the master measures them and reports what it chose, which
// becomes status.strategy (decidedBy: worker). The reason is the worker's
// words, escaped as the text format escapes label values.
TEST(ProgressReporterTest, TheMastersAutoChoiceBecomesTheJobsStrategy) {
  const std::string text =
      "# TYPE distrain_auto_strategy_info gauge\n"
      "distrain_auto_strategy_info{reason=\"2 GPUs; CPU<->GPU 51.2 GB/s is faster than "
      "GPU<->GPU 24.0 GB/s: \\\"variables\\\" on the CPU\\\\\",strategy=\"CentralStorage\"} 1\n"
      "distrain_steps_total 3\n";
  ScrapedProgress p = ParseProgressMetrics(text);
  ASSERT_TRUE(p.auto_strategy && p.auto_reason);
  EXPECT_EQ(*p.auto_strategy, "CentralStorage");
  EXPECT_EQ(*p.auto_reason,
            "2 GPUs; CPU<->GPU 51.2 GB/s is faster than GPU<->GPU 24.0 GB/s: \"variables\" on "
            "the CPU\\");
  EXPECT_EQ(*p.step, 3);
  const nlohmann::json operators = {
      {"name", "Mirrored"}, {"reason", "2 GPUs (bandwidths not measured)"}, {"decidedBy", "operator"}};
  const nlohmann::json merged = MergeStrategy(operators, p);
  EXPECT_EQ(merged["name"], "CentralStorage");
  EXPECT_EQ(merged["reason"], *p.auto_reason);
  EXPECT_EQ(merged["decidedBy"], "worker");
  EXPECT_EQ(MergeStrategy(merged, p), merged) << "nothing new: nothing to write";

  // No Auto metric (a named strategy, an older worker, a user's image) or a
  // malformed one: status.strategy is left as it was.
  for (const char* page : {"distrain_steps_total 3\n",
                           "distrain_auto_strategy_info{strategy=\"Mirrored\"} 1\n",
                           "distrain_auto_strategy_info{strategy=\"Mirrored\",reason=\"open} 1\n",
                           "distrain_auto_strategy_info{strategy=Mirrored,reason=\"x\"} 1\n"}) {
    ScrapedProgress none = ParseProgressMetrics(page);
    EXPECT_FALSE(none.auto_strategy) << page;
    EXPECT_EQ(MergeStrategy(operators, none), operators) << page;
  }
}

TEST(ProgressReporterTest, AccuracyIsTheChiefsEvaluationOnceItHasOne) {
  ScrapedProgress none = ParseProgressMetrics("distrain_steps_total 5\ndistrain_eval_accuracy 0\n");
  EXPECT_FALSE(MergeProgress(nullptr, none).contains("accuracy"));  // not evaluated yet
  ScrapedProgress p = ParseProgressMetrics("distrain_eval_accuracy 0.912345\n");
  EXPECT_DOUBLE_EQ(MergeProgress(nullptr, p)["accuracy"].get<double>(), 0.9123);
}

TEST(ProgressReporterTest, FinishedJobsAreLeftToTheReconcile) {
  // A Succeeded job: nothing scraped, nothing patched (its final figures are
  // the reconcile's, controller/final_progress.h).
  kube::testing::ScriptedClient client;  // no request expected
  ProgressReporter reporter(
      &client,
      {.jobs =
           [] {
             return std::vector<nlohmann::json>{
                 {{"metadata", {{"namespace", "ns"}, {"name", "done"}}},
                  {"status",
                   {{"conditions", {{{"type", "Succeeded"}, {"status", "True"}},
                                    {{"type", "Running"}, {"status", "True"}}}},
                    {"progress", {{"step", 713}, {"totalSteps", 1500}}}}}}};
           },
       .pods = [](const std::string&, const std::string&) {
         ADD_FAILURE() << "a finished job's pods were listed";
         return std::vector<nlohmann::json>{};
       }});
  ProgressReporter::RoundStats stats = reporter.ReportOnce();
  EXPECT_EQ(stats.scraped, 0);
  EXPECT_EQ(stats.patched, 0);
  client.ExpectAllConsumed();
}

TEST(ProgressReporterTest, MissingOrMalformedSamplesAreLeftOutNotInvented) {
  ScrapedProgress p = ParseProgressMetrics("distrain_steps_total NaN\ndistrain_loss abc\ngarbage\n");
  EXPECT_FALSE(p.step);
  EXPECT_FALSE(p.loss);
  EXPECT_FALSE(p.total_steps);
  // Merging keeps what the status already had for fields the scrape lacks.
  nlohmann::json current = {{"totalSteps", 400}, {"step", 10}};
  ScrapedProgress step_only;
  step_only.step = 20;
  nlohmann::json merged = MergeProgress(current, step_only);
  EXPECT_EQ(merged["step"], 20);
  EXPECT_EQ(merged["totalSteps"], 400);
  EXPECT_FALSE(merged.contains("loss"));
}

TEST(ProgressReporterTest, RoundingKeepsUnchangedProgressEqualSoNothingIsWritten) {
  ScrapedProgress a, b;
  a.step = b.step = 5;
  a.loss = 0.123456;
  b.loss = 0.1234561;
  a.examples_per_second = 100.01;
  b.examples_per_second = 100.02;
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  EXPECT_EQ(MergeProgress(nullptr, a, now), MergeProgress(nullptr, b, now));
}

// The clock of the Stalled condition (controller/stall.h).
TEST(ProgressReporterTest, LastStepTimeMovesOnlyWhenTheStepDoes) {
  const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
  const absl::Time t1 = t0 + absl::Seconds(5);
  const nlohmann::json current = {{"step", 10}, {"lastStepTime", api::FormatKubeTime(t0)}};
  EXPECT_EQ(MergeProgress(current, ParseProgressMetrics("distrain_steps_total 10\n"), t1),
            current)
      << "the same step: nothing to write, the clock runs on";
  nlohmann::json moved = MergeProgress(current, ParseProgressMetrics("distrain_steps_total 11\n"), t1);
  EXPECT_EQ(moved["step"], 11);
  EXPECT_EQ(moved["lastStepTime"], api::FormatKubeTime(t1));
  // A restarted process that has completed no step yet: step 0 is shown,
  // but it has not moved.
  nlohmann::json restarted =
      MergeProgress(current, ParseProgressMetrics("distrain_steps_total 0\n"), t1);
  EXPECT_EQ(restarted["step"], 0);
  EXPECT_EQ(restarted["lastStepTime"], api::FormatKubeTime(t0));
  EXPECT_EQ(MergeProgress(restarted, ParseProgressMetrics("distrain_steps_total 1\n"), t1)
                ["lastStepTime"],
            api::FormatKubeTime(t1));
}

TEST(ProgressReporterTest, TheMastersProgressDeadlineIsCopiedInWholeSeconds) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  EXPECT_EQ(MergeProgress(nullptr, ParseProgressMetrics("distrain_progress_deadline_seconds 90.2\n"),
                          now)["progressDeadlineSeconds"],
            91);
  // 0: a process that sets none (an older worker, another image's gauge).
  EXPECT_FALSE(MergeProgress(nullptr, ParseProgressMetrics("distrain_progress_deadline_seconds 0\n"),
                             now)
                   .contains("progressDeadlineSeconds"));
}

// Found by tests/fuzz/prometheus_text_fuzz (corpus regression-step-beyond-int64):
// converting a count beyond int64 was undefined behaviour.
TEST(ProgressReporterTest, CountsBeyondInt64AreLeftOut) {
  ScrapedProgress p =
      ParseProgressMetrics("distrain_steps_total 1e30\ndistrain_total_steps 1e19\n");
  ASSERT_TRUE(p.step.has_value() && p.total_steps.has_value());
  nlohmann::json current = {{"totalSteps", 400}, {"step", 10}};
  nlohmann::json merged = MergeProgress(current, p);
  EXPECT_EQ(merged["step"], 10);
  EXPECT_EQ(merged["totalSteps"], 400);
}

}  // namespace
}  // namespace distrain

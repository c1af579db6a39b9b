#include "worker/evaluator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/exit_codes.h"
#include "worker/strategy/variable_state.h"
#include "tests/unit/worker/model/event_files.h"

namespace distrain {
namespace {

namespace fs = std::filesystem;

constexpr int kFeatures = 6;
constexpr int kClasses = 3;
constexpr int64_t kFinalStep = 30;

JobConfig Job(std::vector<int> hidden = {8}) {
  JobConfig c;
  c.training.steps = kFinalStep;
  c.training.model.hidden_units = std::move(hidden);
  c.training.optimizer.type = OptimizerType::kSgd;
  return c;
}

std::unique_ptr<Dataset> EvalData() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  constexpr int kExamples = 50;
  std::vector<float> features(kExamples * kFeatures);
  std::vector<int32_t> labels(kExamples);
  for (float& f : features) f = normal(rng);
  for (int i = 0; i < kExamples; ++i) labels[i] = i % kClasses;
  return std::make_unique<InMemoryDataset>("eval", kFeatures, kClasses, std::move(features),
                                           std::move(labels));
}

// A fake clock that only moves when the evaluator sleeps, and a hook that
// plays the chief: what happens in the directory while the evaluator waits.
struct FakeTime {
  absl::Time now = absl::UnixEpoch();
  std::function<void()> on_sleep = [] {};
  int sleeps = 0;
};

class EvaluatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test.begin(), test.end(), '/', '_');  // parameterised names
    dir_ = (fs::temp_directory_path() /
            ("distrain_evaluator_test_" + std::to_string(::getpid()) + "_" + test))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  EvaluatorOptions Options(absl::Duration timeout = absl::Seconds(60)) {
    EvaluatorOptions o;
    o.checkpoint_dir = dir_;
    o.poll_interval = absl::Seconds(1);
    o.timeout = timeout;
    o.now = [this] { return time_.now; };
    o.sleep = [this](absl::Duration d) {
      time_.now += d;
      ++time_.sleeps;
      time_.on_sleep();
    };
    return o;
  }

  std::unique_ptr<Evaluator> Make(EvaluatorMetrics* metrics = nullptr,
                                  absl::Duration timeout = absl::Seconds(60)) {
    auto e = Evaluator::CreateWithDataset(Job(), Options(timeout), EvalData(), metrics);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  // The model "after `step` steps": its parameters depend on the step, so
  // every checkpoint evaluates differently.
  std::unique_ptr<Model> ModelAt(int64_t step, std::vector<int> hidden = {8}) {
    auto model = Model::Create(Job(hidden).training.model, kFeatures, kClasses, 42);
    EXPECT_TRUE(model.ok());
    std::mt19937 rng(static_cast<uint32_t>(step));
    std::normal_distribution<float> normal(0, 0.5f);
    for (Parameter* p : (*model)->parameters()) {
      for (int64_t i = 0; i < p->value.size(); ++i) p->value[i] += normal(rng);
    }
    return std::move(*model);
  }

  void WriteCheckpoint(int64_t step, std::vector<int> hidden = {8}) {
    auto model = ModelAt(step, hidden);
    auto optimizer = Optimizer::Create(Job().training.optimizer);
    ASSERT_TRUE(optimizer.ok());
    // keep 100: retention must not interfere unless a test wants it to.
    ASSERT_TRUE(
        CheckpointManager(dir_, 100).Save(CaptureVariableState(*model, **optimizer, step)).ok());
  }

  std::string PathFor(int64_t step) { return CheckpointManager(dir_, 1).PathForStep(step); }

  EvalSummary Expected(int64_t step) {
    auto model = ModelAt(step);
    auto data = EvalData();
    return EvaluateModel(*model, *data);
  }

  std::string dir_;
  FakeTime time_;
  std::atomic<bool> stop_{false};
};

TEST_F(EvaluatorTest, EvaluatesEachNewCheckpointOnceAndExitsZeroAfterTheFinalStep) {
  prometheus::Registry registry;
  EvaluatorMetrics metrics(registry);
  auto evaluator = Make(&metrics);
  std::vector<int64_t> evaluated_before_sleep;
  // Sleeps 1, 3, 5 write steps 10, 20, 30: two polls see each state.
  time_.on_sleep = [&] {
    evaluated_before_sleep.push_back(evaluator->last_evaluated_step());
    if (time_.sleeps % 2 == 1) WriteCheckpoint(10 * (time_.sleeps / 2 + 1));
  };
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitOk) << outcome.status;
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.evaluations, 3);
  EXPECT_EQ(evaluated_before_sleep, (std::vector<int64_t>{-1, 10, 10, 20, 20}));
  ASSERT_TRUE(outcome.last.has_value());
  EXPECT_EQ(outcome.last->step, kFinalStep);
  const EvalSummary want = Expected(kFinalStep);
  EXPECT_DOUBLE_EQ(outcome.last->result.loss, want.loss);
  EXPECT_DOUBLE_EQ(outcome.last->result.accuracy, want.accuracy);
  EXPECT_EQ(outcome.last->result.examples, 50);
  EXPECT_DOUBLE_EQ(metrics.eval_loss.Value(), want.loss);
  EXPECT_DOUBLE_EQ(metrics.eval_accuracy.Value(), want.accuracy);
  EXPECT_EQ(metrics.checkpoint_step.Value(), kFinalStep);
  EXPECT_EQ(metrics.evaluations.Value(), 3);
  EXPECT_EQ(metrics.skipped.Value(), 0);
}

// TensorBoard's validation run: one point per evaluated checkpoint, at its step.
TEST_F(EvaluatorTest, WritesEachEvaluationToTheValidationRunAtTheCheckpointStep) {
  auto evaluator = Make();
  time_.on_sleep = [&] {
    if (time_.sleeps % 2 == 1) WriteCheckpoint(10 * (time_.sleeps / 2 + 1));
  };
  ASSERT_EQ(evaluator->Run(stop_).exit_code, kExitOk);
  const testing::ScalarCurves curves = testing::ReadScalars(dir_ + "/validation");
  std::map<int64_t, float> loss, accuracy;
  for (int64_t step : {10, 20, 30}) {
    loss[step] = static_cast<float>(Expected(step).loss);
    accuracy[step] = static_cast<float>(Expected(step).accuracy);
  }
  EXPECT_EQ(curves.size(), 2u);
  EXPECT_EQ(curves.at("loss"), loss);
  EXPECT_EQ(curves.at("accuracy"), accuracy);
}

// A restarted Evaluator evaluates the newest checkpoint again; its file
// starts with a SessionLog START there, so TensorBoard shows one point.
TEST_F(EvaluatorTest, RestartedEvaluatorStartsItsFileAtTheCheckpointItReevaluates) {
  WriteCheckpoint(10);
  ASSERT_TRUE(Make()->Poll().ok());
  auto restarted = Make();
  auto evaluated = restarted->Poll();
  ASSERT_TRUE(evaluated.ok() && evaluated->has_value());
  const std::vector<std::string> files = testing::EventFiles(dir_ + "/validation");
  ASSERT_EQ(files.size(), 2u);
  const std::vector<v1::TfEvent> events = testing::ReadEventFile(files[1]);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].session_log().status(), v1::TfSessionLog::START);
  EXPECT_EQ(events[1].step(), 10);
  EXPECT_EQ(events[2].step(), 10);
  EXPECT_EQ(events[2].summary().value_size(), 2);
}

TEST_F(EvaluatorTest, DifferentCheckpointsEvaluateDifferently) {
  // Guards the test above: equal losses would not show which checkpoint was read.
  EXPECT_NE(Expected(10).loss, Expected(30).loss);
}

// The chief got ahead (or the evaluator started late): only the newest
// checkpoint is evaluated, as TensorFlow's evaluator does.
TEST_F(EvaluatorTest, FallenBehindEvaluatesOnlyTheNewestCheckpoint) {
  WriteCheckpoint(10);
  WriteCheckpoint(20);
  auto evaluator = Make();
  auto first = evaluator->Poll();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->step, 20);
  EXPECT_DOUBLE_EQ((*first)->result.loss, Expected(20).loss);
  auto again = evaluator->Poll();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value()) << "a checkpoint is evaluated once";
}

// An evaluator started after the job finished evaluates the final checkpoint
// and exits at once, without waiting.
TEST_F(EvaluatorTest, FinishedJobIsEvaluatedAtOnce) {
  WriteCheckpoint(20);
  WriteCheckpoint(kFinalStep);
  auto evaluator = Make();
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitOk) << outcome.status;
  EXPECT_EQ(outcome.evaluations, 1);
  EXPECT_EQ(time_.sleeps, 0);
}

enum class Damage { kGarbage, kTruncated, kFlippedByte, kEmpty };

struct DamageCase {
  std::string name;
  Damage damage;
};

class EvaluatorDamagedCheckpointTest : public EvaluatorTest,
                                       public ::testing::WithParamInterface<DamageCase> {
 protected:
  void Damage(const std::string& path) {
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    switch (GetParam().damage) {
      case Damage::kGarbage:
        bytes = std::string(bytes.size(), 'x');
        break;
      case Damage::kTruncated:
        bytes.resize(bytes.size() / 2);
        break;
      case Damage::kFlippedByte:
        bytes[bytes.size() / 2] ^= 0x40;  // inside the tensors: a CRC fails
        break;
      case Damage::kEmpty:
        bytes.clear();
        break;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
};

TEST_P(EvaluatorDamagedCheckpointTest, IsSkippedOnceAndTheNextValidOneEvaluated) {
  prometheus::Registry registry;
  EvaluatorMetrics metrics(registry);
  WriteCheckpoint(10);
  WriteCheckpoint(20);
  Damage(PathFor(20));
  auto evaluator = Make(&metrics);
  auto polled = evaluator->Poll();
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_TRUE(polled->has_value()) << "the older valid checkpoint is evaluated instead";
  EXPECT_EQ((*polled)->step, 10);
  EXPECT_EQ(metrics.skipped.Value(), 1);
  polled = evaluator->Poll();
  ASSERT_TRUE(polled.ok());
  EXPECT_FALSE(polled->has_value());
  EXPECT_EQ(metrics.skipped.Value(), 1) << "a damaged file is read (and reported) once";
  WriteCheckpoint(kFinalStep);
  polled = evaluator->Poll();
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_TRUE(polled->has_value());
  EXPECT_EQ((*polled)->step, kFinalStep);
  EXPECT_TRUE(evaluator->final_evaluated());
}

TEST_P(EvaluatorDamagedCheckpointTest, DamagedFinalCheckpointIsAPermanentErrorNamingTheFile) {
  WriteCheckpoint(kFinalStep);
  Damage(PathFor(kFinalStep));
  auto evaluator = Make();
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitCheckpoint);
  EXPECT_FALSE(IsRetryableExitCode(outcome.exit_code));
  EXPECT_NE(outcome.status.message().find(PathFor(kFinalStep)), std::string::npos)
      << outcome.status;
}

INSTANTIATE_TEST_SUITE_P(Table, EvaluatorDamagedCheckpointTest,
                         ::testing::Values(DamageCase{"Garbage", Damage::kGarbage},
                                           DamageCase{"Truncated", Damage::kTruncated},
                                           DamageCase{"FlippedByte", Damage::kFlippedByte},
                                           DamageCase{"Empty", Damage::kEmpty}),
                         [](const ::testing::TestParamInfo<DamageCase>& info) {
                           return info.param.name;
                         });

TEST_F(EvaluatorTest, LeftoverTempFilesOfAnUnfinishedSaveAreIgnored) {
  WriteCheckpoint(10);
  // What a chief killed mid-save leaves behind (CheckpointManager's step 1).
  std::ofstream(PathFor(20) + ".tmp-1234") << "half a checkpoint";
  auto evaluator = Make();
  auto polled = evaluator->Poll();
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_TRUE(polled->has_value());
  EXPECT_EQ((*polled)->step, 10);
}

TEST_F(EvaluatorTest, GivesUpRetryablyWhenNoNewCheckpointAppearsWithinTheTimeout) {
  WriteCheckpoint(10);
  auto evaluator = Make(nullptr, absl::Seconds(10));
  // A new checkpoint at t = 8 s restarts the 10 s wait.
  time_.on_sleep = [&] {
    if (time_.now == absl::UnixEpoch() + absl::Seconds(8)) WriteCheckpoint(20);
  };
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitUnreachable);
  EXPECT_TRUE(IsRetryableExitCode(outcome.exit_code));
  EXPECT_EQ(time_.now - absl::UnixEpoch(), absl::Seconds(18));
  EXPECT_EQ(outcome.evaluations, 2);
  EXPECT_NE(outcome.status.message().find(dir_), std::string::npos) << outcome.status;
  EXPECT_NE(outcome.status.message().find("newest step seen 20"), std::string::npos)
      << outcome.status;
  EXPECT_NE(outcome.status.message().find("DISTRAIN_EVAL_TIMEOUT_SECONDS"), std::string::npos)
      << outcome.status;
}

TEST_F(EvaluatorTest, EmptyDirectoryTimesOutToo) {
  auto evaluator = Make(nullptr, absl::Seconds(5));
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitUnreachable);
  EXPECT_EQ(outcome.evaluations, 0);
  EXPECT_EQ(time_.now - absl::UnixEpoch(), absl::Seconds(5));
}

// The supervisor stops the evaluator right after the chief finished: the
// last poll still catches the final checkpoint.
TEST_F(EvaluatorTest, StopStillEvaluatesTheFinalCheckpointWrittenMeanwhile) {
  auto evaluator = Make();
  time_.on_sleep = [&] {
    WriteCheckpoint(kFinalStep);
    stop_ = true;
  };
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitOk) << outcome.status;
  EXPECT_TRUE(evaluator->final_evaluated());
}

TEST_F(EvaluatorTest, StopBeforeTheFinalCheckpointExitsTerminated) {
  WriteCheckpoint(10);
  auto evaluator = Make();
  time_.on_sleep = [&] { stop_ = true; };
  EvaluatorOutcome outcome = evaluator->Run(stop_);
  EXPECT_EQ(outcome.exit_code, kExitTerminated);
  EXPECT_EQ(outcome.evaluations, 1);
  EXPECT_EQ(evaluator->last_evaluated_step(), 10);
}

TEST_F(EvaluatorTest, CheckpointOfAnotherModelIsRefusedNamingFileAndVariable) {
  WriteCheckpoint(10, /*hidden=*/{5});
  auto evaluator = Make();
  auto polled = evaluator->Poll();
  ASSERT_FALSE(polled.ok());
  EXPECT_EQ(polled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(polled.status().message().find(PathFor(10)), std::string::npos) << polled.status();
  EXPECT_NE(polled.status().message().find("dense_0/kernel"), std::string::npos)
      << polled.status();
}

TEST_F(EvaluatorTest, NoCheckpointDirectoryIsAConfigurationErrorSayingWhatToSet) {
  EvaluatorOptions options = Options();
  options.checkpoint_dir = "";
  auto e = Evaluator::CreateWithDataset(Job(), options, EvalData(), nullptr);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("DISTRAIN_CHECKPOINT_DIR"), std::string::npos) << e.status();
}

TEST_F(EvaluatorTest, NoEvalDataIsAConfigurationErrorSayingWhatToSet) {
  JobConfig config = Job();
  config.training.dataset.num_eval_examples = 0;  // synthetic without a held-out split
  auto e = Evaluator::Create(config, Options(), nullptr);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("numEvalExamples"), std::string::npos) << e.status();
}

struct EnvCase {
  std::string name;
  std::string poll;     // "" = unset
  std::string timeout;  // "" = unset
  bool ok;
  absl::Duration want_poll;
  absl::Duration want_timeout;
  std::string error_part;
};

class EvaluatorOptionsFromEnvTest : public ::testing::TestWithParam<EnvCase> {};

TEST_P(EvaluatorOptionsFromEnvTest, ReadsSecondsAndNamesTheBadVariable) {
  const EnvCase& c = GetParam();
  auto set = [](const char* name, const std::string& value) {
    if (value.empty()) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value.c_str(), 1);
    }
  };
  set("DISTRAIN_EVAL_POLL_SECONDS", c.poll);
  set("DISTRAIN_EVAL_TIMEOUT_SECONDS", c.timeout);
  auto options = EvaluatorOptionsFromEnv("/ckpt");
  ::unsetenv("DISTRAIN_EVAL_POLL_SECONDS");
  ::unsetenv("DISTRAIN_EVAL_TIMEOUT_SECONDS");
  ASSERT_EQ(options.ok(), c.ok) << options.status();
  if (!c.ok) {
    EXPECT_NE(options.status().message().find(c.error_part), std::string::npos)
        << options.status();
    return;
  }
  EXPECT_EQ(options->checkpoint_dir, "/ckpt");
  EXPECT_EQ(options->poll_interval, c.want_poll);
  EXPECT_EQ(options->timeout, c.want_timeout);
}

INSTANTIATE_TEST_SUITE_P(
    Table, EvaluatorOptionsFromEnvTest,
    ::testing::Values(
        EnvCase{"Defaults", "", "", true, absl::Seconds(1), absl::Hours(1), ""},
        EnvCase{"Both", "0.25", "90", true, absl::Milliseconds(250), absl::Seconds(90), ""},
        EnvCase{"ZeroTimeout", "", "0", false, {}, {}, "DISTRAIN_EVAL_TIMEOUT_SECONDS"},
        EnvCase{"NegativePoll", "-1", "", false, {}, {}, "DISTRAIN_EVAL_POLL_SECONDS"},
        EnvCase{"NotANumber", "", "soon", false, {}, {}, "got \"soon\""}),
    [](const ::testing::TestParamInfo<EnvCase>& info) { return info.param.name; });

}  // namespace
}  // namespace distrain

#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "common/exit_codes.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/strategy/one_device.h"
#include "tests/unit/worker/model/event_files.h"

namespace distrain {
namespace {

namespace fs = std::filesystem;

ClusterSpec LoneWorker() {
  auto spec = ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

JobConfig SmallJob(int64_t steps) {
  JobConfig c;
  c.name = "small";
  c.strategy = StrategyKind::kOneDevice;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.training.steps = steps;
  c.training.global_batch_size = 32;
  c.training.log_every_steps = 10;
  c.training.model.hidden_units = {32};
  c.training.dataset.num_features = 16;
  c.training.dataset.num_classes = 4;
  c.training.dataset.num_examples = 2000;
  c.training.dataset.num_eval_examples = 500;
  c.training.optimizer.type = OptimizerType::kAdam;
  c.training.optimizer.learning_rate = 0.01f;
  return c;
}

std::string TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("distrain_trainer_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TrainOutcome Train(const JobConfig& config, const std::string& checkpoint_dir, bool stop = false) {
  TrainerEnv env;
  env.checkpoint_dir = checkpoint_dir;
  Trainer trainer(config, LoneWorker(), env, std::make_unique<OneDeviceStrategy>());
  std::atomic<bool> stop_flag{stop};
  return trainer.Run(stop_flag);
}

TEST(TrainerTest, OneDeviceExampleReaches95PercentWithinItsStepBudget) {
  auto config = LoadJobYamlFile(std::string(DISTRAIN_SOURCE_DIR) + "/examples/onedevice.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  TrainOutcome out = Train(*config, "");
  ASSERT_EQ(out.exit_code, kExitOk) << out.status;
  EXPECT_EQ(out.steps_done, config->training.steps);
  ASSERT_TRUE(out.eval_accuracy.has_value());
  EXPECT_GE(*out.eval_accuracy, 0.95);
}

// A run that has ended, however it ended, is never called stalled by the
// watchdog behind /healthz (progress_watchdog.h): the process is about to
// exit with a code that says how it went.
TEST(TrainerTest, TheWatchdogIsDoneWhenTheRunEndsHoweverItEnds) {
  for (bool stop : {false, true}) {
    absl::Time now = absl::FromUnixSeconds(1'800'000'000);
    ProgressWatchdog watchdog(/*explicit_deadline_seconds=*/std::nullopt, [&now] { return now; });
    TrainerEnv env;
    env.watchdog = &watchdog;
    JobConfig config = SmallJob(30);
    config.training.checkpoint.every_steps = 10;
    env.checkpoint_dir = TempDir(stop ? "watchdog_stop" : "watchdog");
    Trainer trainer(config, LoneWorker(), env, std::make_unique<OneDeviceStrategy>());
    std::atomic<bool> stop_flag{stop};
    TrainOutcome out = trainer.Run(stop_flag);
    ASSERT_EQ(out.exit_code, stop ? kExitTerminated : kExitOk) << out.status;
    now += absl::Hours(1);
    EXPECT_TRUE(watchdog.Check().ok()) << watchdog.Check();
  }
  // Without the end of the run, the same hour is a stall.
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  ProgressWatchdog idle(std::nullopt, [&now] { return now; });
  now += absl::Hours(1);
  EXPECT_FALSE(idle.Check().ok());
}

// Resume must be exact: same data order from the resumed step and the same
// optimizer slots, so an interrupted job ends where an uninterrupted one does.
TEST(TrainerTest, ResumedRunEndsBitIdenticalToUninterruptedRun) {
  const std::string straight = TempDir("straight");
  const std::string resumed = TempDir("resumed");
  ASSERT_EQ(Train(SmallJob(40), straight).exit_code, kExitOk);
  ASSERT_EQ(Train(SmallJob(17), resumed).exit_code, kExitOk);
  ASSERT_EQ(Train(SmallJob(40), resumed).exit_code, kExitOk);

  auto a = CheckpointManager(straight, 3).RestoreLatest();
  auto b = CheckpointManager(resumed, 3).RestoreLatest();
  ASSERT_TRUE(a.ok() && a->has_value());
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*a)->step, 40);
  EXPECT_EQ((*b)->step, 40);
  ASSERT_EQ((*a)->tensors.size(), (*b)->tensors.size());
  for (const auto& [name, ta] : (*a)->tensors) {
    const Tensor& tb = (*b)->tensors.at(name);
    ASSERT_TRUE(ta.SameShape(tb)) << name;
    EXPECT_EQ(std::memcmp(ta.data(), tb.data(), ta.bytes()), 0) << name << " differs after resume";
  }
  fs::remove_all(straight);
  fs::remove_all(resumed);
}

TEST(TrainerTest, StopRequestWritesCheckpointAndExitsRetryable) {
  const std::string dir = TempDir("stop");
  TrainOutcome out = Train(SmallJob(1000), dir, /*stop=*/true);
  EXPECT_EQ(out.exit_code, kExitTerminated);
  EXPECT_TRUE(IsRetryableExitCode(out.exit_code));
  EXPECT_FALSE(CheckpointManager(dir, 3).ListSteps().empty()) << "no checkpoint written on stop";
  fs::remove_all(dir);
}

TEST(TrainerTest, MissingDataFileFailsWithDataExitCodeNamingTheFile) {
  JobConfig c = SmallJob(10);
  c.training.dataset.type = DatasetType::kIdx;
  c.training.dataset.train_files = {"/nonexistent/train-images.idx"};
  c.training.dataset.train_label_files = {"/nonexistent/train-labels.idx"};
  TrainOutcome out = Train(c, "");
  EXPECT_EQ(out.exit_code, kExitInvalidData);
  EXPECT_NE(std::string(out.status.message()).find("/nonexistent/train-images.idx"), std::string::npos)
      << out.status;
}

TEST(TrainerTest, CheckpointOfAnotherModelIsRejectedNotSilentlyReused) {
  const std::string dir = TempDir("othermodel");
  ASSERT_EQ(Train(SmallJob(5), dir).exit_code, kExitOk);
  JobConfig wider = SmallJob(10);
  wider.training.model.hidden_units = {64};
  TrainOutcome out = Train(wider, dir);
  EXPECT_EQ(out.exit_code, kExitCheckpoint);
  EXPECT_NE(std::string(out.status.message()).find("dense_0/kernel"), std::string::npos) << out.status;
  fs::remove_all(dir);
}

// Keras' TensorBoard layout next to the checkpoints: train/ at every logged
// step, validation/ at every evaluation, each run beginning with a
// SessionLog START at the first step the process runs.
TEST(TrainerTest, ChiefWritesTensorBoardRunsAtTheLoggedAndEvaluatedSteps) {
  const std::string dir = TempDir("tensorboard");
  JobConfig c = SmallJob(40);
  c.training.eval_every_steps = 20;
  TrainOutcome out = Train(c, dir);
  ASSERT_EQ(out.exit_code, kExitOk) << out.status;

  const testing::ScalarCurves train = testing::ReadScalars(dir + "/train");
  for (const char* tag :
       {"loss", "accuracy", "examples_per_second", "step_time_seconds", "learning_rate"}) {
    ASSERT_EQ(train.count(tag), 1u) << tag;
    std::vector<int64_t> steps;
    for (const auto& [step, value] : train.at(tag)) steps.push_back(step);
    EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 30, 40})) << tag;
  }
  EXPECT_EQ(train.at("loss").at(40), static_cast<float>(out.final_loss));
  for (const auto& [step, value] : train.at("learning_rate")) EXPECT_EQ(value, 0.01f);
  for (const auto& [step, value] : train.at("accuracy")) {
    EXPECT_GE(value, 0);
    EXPECT_LE(value, 1);
  }
  for (const auto& [step, value] : train.at("examples_per_second")) EXPECT_GT(value, 0);
  for (const auto& [step, value] : train.at("step_time_seconds")) EXPECT_GT(value, 0);

  const testing::ScalarCurves validation = testing::ReadScalars(dir + "/validation");
  EXPECT_EQ(validation.size(), 2u);
  ASSERT_EQ(validation.count("loss"), 1u);
  ASSERT_EQ(validation.count("accuracy"), 1u);
  EXPECT_EQ(validation.at("loss").size(), 2u);
  EXPECT_EQ(validation.at("loss").count(20), 1u);
  ASSERT_TRUE(out.eval_loss.has_value() && out.eval_accuracy.has_value());
  EXPECT_EQ(validation.at("loss").at(40), static_cast<float>(*out.eval_loss));
  EXPECT_EQ(validation.at("accuracy").at(40), static_cast<float>(*out.eval_accuracy));

  for (const char* run : {"/train", "/validation"}) {
    const std::vector<std::string> files = testing::EventFiles(dir + run);
    ASSERT_EQ(files.size(), 1u) << run;
    const std::vector<v1::TfEvent> events = testing::ReadEventFile(files[0]);
    ASSERT_GE(events.size(), 2u) << run;
    EXPECT_EQ(events[0].file_version(), "brain.Event:2") << run;
    EXPECT_EQ(events[1].session_log().status(), v1::TfSessionLog::START) << run;
    EXPECT_EQ(events[1].step(), 1) << run;
  }
  fs::remove_all(dir);
}

// Under a schedule the learning_rate curve is the rate each logged step's
// update used: the schedule at step - 1, as Keras' iterations count.
TEST(TrainerTest, TensorBoardLearningRateFollowsTheSchedule) {
  const std::string dir = TempDir("schedule");
  JobConfig c = SmallJob(40);
  LearningRateScheduleConfig& schedule = c.training.optimizer.schedule;
  schedule.type = LearningRateScheduleType::kPiecewiseConstantDecay;
  schedule.boundaries = {15, 25};
  schedule.values = {0.01f, 0.005f, 0.001f};
  TrainOutcome out = Train(c, dir);
  ASSERT_EQ(out.exit_code, kExitOk) << out.status;
  const testing::ScalarCurves train = testing::ReadScalars(dir + "/train");
  ASSERT_EQ(train.count("learning_rate"), 1u);
  EXPECT_EQ(train.at("learning_rate"),
            (std::map<int64_t, float>{{10, 0.01f}, {20, 0.005f}, {30, 0.001f}, {40, 0.001f}}));
  fs::remove_all(dir);
}

// A resumed chief appends a new file whose START is the step after its
// checkpoint: TensorBoard drops what the previous process logged after it.
TEST(TrainerTest, ResumedChiefStartsANewEventFileAtTheStepAfterItsCheckpoint) {
  const std::string dir = TempDir("tensorboard_resume");
  ASSERT_EQ(Train(SmallJob(17), dir).exit_code, kExitOk);
  ASSERT_EQ(Train(SmallJob(40), dir).exit_code, kExitOk);
  const std::vector<std::string> files = testing::EventFiles(dir + "/train");
  ASSERT_EQ(files.size(), 2u);
  const std::vector<v1::TfEvent> second = testing::ReadEventFile(files[1]);
  ASSERT_GE(second.size(), 3u);
  EXPECT_EQ(second[1].session_log().status(), v1::TfSessionLog::START);
  EXPECT_EQ(second[1].step(), 18);
  EXPECT_EQ(second[2].step(), 20);
  std::vector<int64_t> steps;
  // Named: a range-for over a temporary's member would outlive the temporary.
  const testing::ScalarCurves curves = testing::ReadScalars(dir + "/train");
  for (const auto& [step, value] : curves.at("loss")) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 17, 20, 30, 40}));
  fs::remove_all(dir);
}

// validation/ has one writer: the job's Evaluator when it has one.
TEST(TrainerTest, JobWithAnEvaluatorLeavesTheValidationRunToIt) {
  const std::string dir = TempDir("tensorboard_evaluator");
  JobConfig c = SmallJob(20);
  c.replicas[ReplicaType::kEvaluator].replicas = 1;
  TrainOutcome out = Train(c, dir);
  ASSERT_EQ(out.exit_code, kExitOk) << out.status;
  EXPECT_TRUE(out.eval_loss.has_value()) << "the chief still evaluates and logs";
  EXPECT_EQ(testing::EventFiles(dir + "/train").size(), 1u);
  EXPECT_FALSE(fs::exists(dir + "/validation"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distrain

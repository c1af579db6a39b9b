// The DISTRAIN_PARAM_CHECKSUM_FILE hook (strategy.h), driven through the Trainer.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/exit_codes.h"
#include "worker/strategy/mirrored.h"
#include "worker/strategy/one_device.h"
#include "worker/strategy/param_checksum.h"
#include "worker/trainer.h"

namespace distrain {
namespace {

namespace fs = std::filesystem;

JobConfig SmallJob(StrategyKind strategy) {
  JobConfig c;
  c.strategy = strategy;
  c.replicas[ReplicaType::kWorker].replicas = 1;
  c.training.steps = 12;
  c.training.global_batch_size = 32;
  c.training.local_replicas = strategy == StrategyKind::kMirrored ? 4 : 0;
  c.training.log_every_steps = 0;
  c.training.model.hidden_units = {16};
  c.training.dataset.num_features = 12;
  c.training.dataset.num_classes = 4;
  c.training.dataset.num_examples = 512;
  c.training.dataset.num_eval_examples = 64;
  return c;
}

class ChecksumHookTest : public ::testing::TestWithParam<StrategyKind> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distrain_checksum_hook_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::setenv("DISTRAIN_PARAM_CHECKSUM_FILE", (dir_ / "sums.{task}.txt").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("DISTRAIN_PARAM_CHECKSUM_FILE");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_P(ChecksumHookTest, AppendsOneLinePerStepForTheTaskEndingAtTheFinalParameters) {
  const JobConfig config = SmallJob(GetParam());
  auto spec = ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0});
  ASSERT_TRUE(spec.ok());
  std::unique_ptr<Strategy> strategy;
  if (GetParam() == StrategyKind::kMirrored) {
    strategy = std::make_unique<MirroredStrategy>(/*gpus=*/0);
  } else {
    strategy = std::make_unique<OneDeviceStrategy>(/*gpus=*/0);
  }
  Trainer trainer(config, *spec, TrainerEnv{}, std::move(strategy));
  std::atomic<bool> stop{false};
  TrainOutcome out = trainer.Run(stop);
  ASSERT_EQ(out.exit_code, kExitOk) << out.status;

  std::ifstream in(dir_ / "sums.worker-0.txt");
  ASSERT_TRUE(in) << "the hook did not substitute {task}";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 12u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].substr(0, lines[i].find(' ')), std::to_string(i + 1));
    EXPECT_EQ(lines[i].size(), lines[i].find(' ') + 1 + 16) << lines[i];
  }
  EXPECT_NE(lines[0], lines[1]) << "parameters did not change between steps";
  EXPECT_EQ(lines.back(),
            "12 " + ChecksumHex(ParameterChecksum(*trainer.strategy().primary_model())));
}

INSTANTIATE_TEST_SUITE_P(Strategies, ChecksumHookTest,
                         ::testing::Values(StrategyKind::kOneDevice, StrategyKind::kMirrored),
                         [](const ::testing::TestParamInfo<StrategyKind>& info) {
                           return std::string(StrategyName(info.param));
                         });

}  // namespace
}  // namespace distrain

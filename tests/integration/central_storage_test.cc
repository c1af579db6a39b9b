// CentralStorage as a user runs it (`distrain run`): 4 local replicas with one
// host copy of the variables end where OneDevice ends on the same global batch
// and seed, every replica equals the host copy after every step, a job resumed
// from its checkpoint still does, and the shipped example trains to accuracy.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FinalVariables;
using testing::FreshTempDir;
using testing::kReferenceSteps;
using testing::OneDeviceReference;
using testing::ReadLines;
using testing::SourceDir;
using testing::Subprocess;
using testing::SyncJobYaml;
using testing::WriteTextFile;

constexpr char kOneWorker[] = "    Worker: {replicas: 1}\n";
constexpr char kFourReplicas[] = "    localReplicas: 4\n";

// `distrain run job` to success; returns its output.
std::string RunToSuccess(const std::string& job, const std::string& dir) {
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt",
                  "--work-dir", dir + "/work"},
                 {{"DISTRAIN_PARAM_CHECKSUM_FILE", dir + "/checksums.{task}.txt"}});
  auto rc = run.Wait(120);
  EXPECT_TRUE(rc.has_value()) << "distrain run did not finish in 120 s:\n" << run.output();
  EXPECT_EQ(rc.value_or(-1), 0) << run.output();
  return run.output();
}

TEST(CentralStorageTest, FourReplicasMatchOneDeviceAndEqualTheHostCopyEveryStep) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("central_storage");
  const std::string job = WriteTextFile(
      dir + "/job.yaml", SyncJobYaml("CentralStorage", kOneWorker, kReferenceSteps, kFourReplicas));
  const std::string out = RunToSuccess(job, dir);
  EXPECT_NE(out.find("CentralStorage: 4 local replica(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("replicas in sync 4"), std::string::npos) << out;
  testing::ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  // The Trainer's hook checks the host copy against the 4 replica copies
  // before writing each line, and fails the job if they differ.
  EXPECT_EQ(ReadLines(dir + "/checksums.worker-0.txt").size(),
            static_cast<size_t>(kReferenceSteps));
  std::filesystem::remove_all(dir);
}

// Half the job, then the whole job from the same checkpoint directory: the
// host variables and the optimizer's slots come back, so the end is the same.
TEST(CentralStorageTest, ResumedJobStillMatchesOneDevice) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("central_storage_resume");
  RunToSuccess(WriteTextFile(dir + "/first.yaml", SyncJobYaml("CentralStorage", kOneWorker,
                                                              kReferenceSteps / 2, kFourReplicas)),
               dir);
  const std::string out = RunToSuccess(
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("CentralStorage", kOneWorker, kReferenceSteps, kFourReplicas)),
      dir);
  EXPECT_NE(out.find("resumed from checkpoint step 100"), std::string::npos) << out;
  testing::ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  std::filesystem::remove_all(dir);
}

TEST(CentralStorageTest, ExampleRunsLocallyToSuccess) {
  const std::string dir = FreshTempDir("central_storage_example");
  Subprocess run({DistrainBinary(), "run", SourceDir() + "/examples/central-storage.yaml",
                  "--no-progress", "--work-dir", dir});
  auto rc = run.Wait(120);
  ASSERT_TRUE(rc.has_value()) << "did not finish in 120 s:\n" << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  std::smatch m;
  const std::string out = run.output();
  EXPECT_NE(out.find("strategy CentralStorage"), std::string::npos) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(eval accuracy\s+([0-9.]+))"))) << out;
  EXPECT_GE(std::stod(m[1]), 0.95) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distrain

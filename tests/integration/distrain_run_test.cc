// `distrain run` end to end: real distrain and distrain-worker processes.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/integration/subprocess.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::SourceDir;
using testing::Subprocess;
namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("distrain_run_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The example file with one training field replaced, so tests track the example itself.
std::string ExampleWith(const std::string& field, const std::string& value) {
  std::ifstream in(SourceDir() + "/examples/onedevice.yaml");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::regex line("\n(\\s+)" + field + ": [^\n]+");
  EXPECT_TRUE(std::regex_search(buf.str(), line)) << "examples/onedevice.yaml has no " << field;
  return std::regex_replace(buf.str(), line, "\n$1" + field + ": " + value);
}

TEST(DistrainRunTest, OneDeviceExampleSucceedsAndPrintsTheFinalAccuracy) {
  Subprocess run({DistrainBinary(), "run", SourceDir() + "/examples/onedevice.yaml", "--no-progress"});
  auto rc = run.Wait(300);
  ASSERT_TRUE(rc.has_value()) << "distrain run did not finish in 300 s:\n" << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("[worker-0] "), std::string::npos) << "replica output is not prefixed:\n" << out;
  EXPECT_NE(out.find("Succeeded"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(eval accuracy\s+([0-9.]+))"))) << out;
  EXPECT_GE(std::stod(m[1]), 0.95) << out;
}

// spec.strategy: Auto (common/auto_strategy.h) on a host without a GPU: one
// Worker is OneDevice, said by `distrain run` and by the worker, and it trains.
TEST(DistrainRunTest, AutoStrategyResolvesOnACpuHostAndTrains) {
  const std::string dir = TempDir("auto");
  std::string text = ExampleWith("steps", "40");
  text = std::regex_replace(text, std::regex("\n  strategy: OneDevice"), "\n  strategy: Auto");
  ASSERT_NE(text.find("strategy: Auto"), std::string::npos) << text;
  const std::string job = WriteFile(dir, "auto.yaml", text);
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--work-dir", dir + "/work"});
  auto rc = run.Wait(300);
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("distrain run: " + job + ": spec.strategy Auto chose OneDevice: one training "
                     "task, one replica and no GPU"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[worker-0] "), std::string::npos) << out;
  EXPECT_NE(out.find("task worker:0 strategy OneDevice"), std::string::npos) << out;
  EXPECT_NE(out.find("Succeeded"), std::string::npos) << out;
  // The worker started by hand with the file decides the same, and says why.
  Subprocess worker({testing::WorkerBinary(), "--config", job, "--checkpoint-dir", dir + "/alone"});
  rc = worker.Wait(300);
  ASSERT_TRUE(rc.has_value()) << worker.output();
  EXPECT_EQ(*rc, 0) << worker.output();
  EXPECT_NE(worker.output().find("spec.strategy Auto chose OneDevice: one training task, one "
                                 "replica and no GPU"),
            std::string::npos)
      << worker.output();
  fs::remove_all(dir);
}

TEST(DistrainRunTest, BadFieldIsRejectedWithItsPathBeforeAnyProcessStarts) {
  const std::string dir = TempDir("badfield");
  std::string job = WriteFile(dir, "bad.yaml", ExampleWith("globalBatchSize", "abc"));
  Subprocess run({DistrainBinary(), "run", job, "--no-progress"});
  auto rc = run.Wait(60);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 3) << run.output();
  EXPECT_NE(run.output().find("spec.training.globalBatchSize"), std::string::npos) << run.output();
  EXPECT_EQ(run.output().find("[worker-0]"), std::string::npos) << "a replica started:\n" << run.output();
  fs::remove_all(dir);
}

// communication.implementation: NCCL where no GPU replica can run (a CPU-only
// build, a host without a GPU, or a build without GPU strategies): exit 5
// (kExitUnsupported) naming the field, before any process starts — never a
// ring quietly standing in for NCCL. A worker in a pod that holds GPUs it
// would keep idle refuses the same way, and leaves its reason as the
// termination message the operator quotes.
TEST(DistrainRunTest, NcclWithoutGpuReplicasIsRefusedNamingTheFieldBeforeAnyProcessStarts) {
  const std::string dir = TempDir("nccl");
  std::string text = ExampleWith("globalBatchSize", "64\n    communication: {implementation: NCCL}");
  const std::string job = WriteFile(dir, "nccl.yaml", text);
  Subprocess run({DistrainBinary(), "run", job, "--no-progress"});
  auto rc = run.Wait(60);
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 5) << run.output();
  EXPECT_NE(run.output().find("spec.training.communication.implementation: NCCL"),
            std::string::npos)
      << run.output();
  EXPECT_EQ(run.output().find("[worker-0]"), std::string::npos) << "a replica started:\n"
                                                                << run.output();

  const std::string cpu_job = WriteFile(dir, "cpu.yaml", ExampleWith("steps", "5"));
  const std::string message_file = dir + "/termination-log";
  Subprocess worker({"/usr/bin/env", "DISTRAIN_POD_GPUS=1",
                     "DISTRAIN_TERMINATION_MESSAGE_PATH=" + message_file, testing::WorkerBinary(),
                     "--config", cpu_job, "--checkpoint-dir", dir + "/ckpt"});
  rc = worker.Wait(60);
  ASSERT_TRUE(rc.has_value()) << worker.output();
  EXPECT_EQ(*rc, 5) << worker.output();
  std::ifstream in(message_file);
  std::stringstream message;
  message << in.rdbuf();
  EXPECT_NE(message.str().find("\"error\":\"spec.replicaSpecs: this pod holds 1 GPU(s)"),
            std::string::npos)
      << message.str();
  EXPECT_NE(message.str().find("\"exitCode\":5"), std::string::npos) << message.str();
  fs::remove_all(dir);
}

TEST(DistrainRunTest, SigtermStopsTheJobWithACheckpointAndARerunResumesFromIt) {
  const std::string dir = TempDir("resume");
  std::string job = WriteFile(dir, "long.yaml", ExampleWith("steps", "1000000"));
  const std::string ckpt = dir + "/ckpt";
  {
    Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", ckpt});
    ASSERT_TRUE(run.WaitForOutput("step 100/", 120)) << run.output();
    run.Signal(SIGTERM);
    auto rc = run.Wait(60);
    ASSERT_TRUE(rc.has_value()) << "SIGTERM did not stop the job:\n" << run.output();
    EXPECT_EQ(*rc, 143) << run.output();
    EXPECT_NE(run.output().find("checkpoint step"), std::string::npos) << run.output();
  }
  Subprocess rerun({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", ckpt});
  ASSERT_TRUE(rerun.WaitForOutput("resumed from checkpoint step", 120)) << rerun.output();
  std::smatch m;
  std::string out = rerun.output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(resumed from checkpoint step (\d+))")));
  EXPECT_GE(std::stoll(m[1]), 100) << "resumed from an earlier step than the job had reached";
  rerun.Signal(SIGTERM);
  EXPECT_TRUE(rerun.Wait(60).has_value());
  fs::remove_all(dir);
}

// The pid of the child of `parent` whose TF_CONFIG names task `type`:`index`.
pid_t ReplicaPid(pid_t parent, const std::string& type, int index) {
  const std::string needle =
      "\"task\":{\"type\":\"" + type + "\",\"index\":" + std::to_string(index) + "}";
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream env(entry.path() / "environ");
    std::stringstream buf;
    buf << env.rdbuf();
    std::string text = buf.str();
    text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
    if (text.find(needle) != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// A killed MultiWorkerMirrored worker is restarted by its restartPolicy
// (ExitCode: 137 is retryable) and rejoins the others in place: the job
// Succeeds, the other processes recover without exiting.
TEST(DistrainRunTest, KilledMultiWorkerMirroredWorkerIsRestartedAndRejoinsInPlace) {
  std::ifstream in(SourceDir() + "/examples/multi-worker-mirrored.yaml");
  std::stringstream buf;
  buf << in.rdbuf();
  std::string yaml = std::regex_replace(buf.str(), std::regex("\n    steps: [0-9]+"), "\n    steps: 1500");
  yaml = std::regex_replace(yaml, std::regex("\n      numExamples: [0-9]+"), "\n      numExamples: 8000");
  const std::string dir = TempDir("mwms_rejoin");
  const std::string job = WriteFile(dir, "job.yaml", yaml);
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt"});
  ASSERT_TRUE(run.WaitForOutput("step 100/", 240)) << run.output();
  const pid_t victim = ReplicaPid(run.pid(), "worker", 2);
  ASSERT_GT(victim, 0) << "no worker-2 child of distrain run";
  ::kill(victim, SIGKILL);
  auto rc = run.Wait(600);
  ASSERT_TRUE(rc.has_value()) << "distrain run did not finish:\n" << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("worker-2 exited with code 137; restarting it (restart 1; it rejoins the "
                     "others in place)"),
            std::string::npos)
      << out;
  for (const std::string replica : {"[chief-0]", "[worker-0]", "[worker-1]"}) {
    bool recovered = false;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.find(replica) != std::string::npos &&
          line.find("recovered in place") != std::string::npos) {
        recovered = true;
      }
    }
    EXPECT_TRUE(recovered) << replica << " did not recover in place:\n" << out;
  }
  EXPECT_NE(out.find("Succeeded"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(DistrainRunTest, MissingJobFileIsAUsageError) {
  Subprocess run({DistrainBinary(), "run", "/nonexistent/job.yaml"});
  auto rc = run.Wait(30);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 2) << run.output();
  EXPECT_NE(run.output().find("/nonexistent/job.yaml"), std::string::npos) << run.output();
}

}  // namespace
}  // namespace distrain

// The side-car evaluator as real processes: it evaluates the checkpoints a
// training process writes to the shared directory, serves its metrics, ends
// with exit 0 on the final checkpoint and agrees with the chief's own final
// evaluation; a MultiWorkerMirrored job whose TF_CONFIG lists an evaluator
// trains without waiting for it (`distrain run`); without training it gives
// up after its timeout with a retryable code.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FreshTempDir;
using testing::Subprocess;
using testing::SyncJobYaml;
using testing::WorkerBinary;
using testing::WriteTextFile;

// TF_CONFIG of a one-worker job with an evaluator, for `task`.
std::string TfConfig(const std::string& worker, const std::string& evaluator,
                     const std::string& task) {
  return R"({"cluster":{"worker":[")" + worker + R"("],"evaluator":[")" + evaluator +
         R"("]},"task":{"type":")" + task + R"(","index":0}})";
}

// (loss, accuracy) of the last line matching `marker` ... eval_loss L eval_accuracy A.
std::pair<std::string, std::string> LastEval(const std::string& out, const std::string& marker) {
  const std::regex re(marker + R"([^\n]*eval_loss ([0-9.]+) eval_accuracy ([0-9.]+))");
  std::pair<std::string, std::string> last;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    last = {(*it)[1].str(), (*it)[2].str()};
  }
  return last;
}

TEST(EvaluatorTest, EvaluatesTheCheckpointsOfATrainingProcessAndExitsZeroOnTheFinalOne) {
  const std::string dir = FreshTempDir("evaluator");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n    Evaluator: {replicas: 1}\n", 200,
                  "    checkpoint: {everySteps: 50, keep: 2}\n"));
  const std::vector<int> ports = testing::FreeLoopbackPorts(3);
  const std::string worker = "127.0.0.1:" + std::to_string(ports[0]);
  const std::string evaluator = "127.0.0.1:" + std::to_string(ports[1]);
  // The evaluator starts first: it waits for checkpoints, not for training.
  Subprocess eval({WorkerBinary(), "--config", job, "--tf-config",
                   TfConfig(worker, evaluator, "evaluator"), "--checkpoint-dir", dir + "/ckpt",
                   "--metrics-port", std::to_string(ports[2])},
                  {{"OPENBLAS_NUM_THREADS", "1"}, {"DISTRAIN_EVAL_POLL_SECONDS", "0.1"}});
  ASSERT_TRUE(eval.WaitForOutput("evaluator: watching", 30)) << eval.output();
  Subprocess train({WorkerBinary(), "--config", job, "--tf-config",
                    TfConfig(worker, evaluator, "worker"), "--checkpoint-dir", dir + "/ckpt"},
                   {{"OPENBLAS_NUM_THREADS", "1"}});

  // The evaluator exits once it has evaluated the final checkpoint, and a fast
  // machine trains 200 steps in a blink: pause training at its first
  // checkpoint so the evaluator is still up to be scraped.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool paused = false;
  while (!paused && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("ckpt-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".dtc") {
        train.Signal(SIGSTOP);
        paused = true;
        break;
      }
    }
    if (!paused) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(paused) << train.output();
  ASSERT_TRUE(eval.WaitForOutput("evaluator: checkpoint step", 60)) << eval.output();
  const std::string metrics = testing::HttpGet(ports[2], "/metrics");
  train.Signal(SIGCONT);
  std::smatch step;
  ASSERT_TRUE(std::regex_search(metrics, step,
                                std::regex(R"(\ndistrain_eval_checkpoint_step ([0-9.e+]+))")))
      << metrics;
  EXPECT_GE(std::stod(step[1]), 50);
  EXPECT_NE(metrics.find("\ndistrain_eval_accuracy "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\ndistrain_eval_loss "), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("distrain_steps_total"), std::string::npos)
      << "the evaluator does not train, so it exports no training metrics:\n"
      << metrics;

  auto train_rc = train.Wait(120);
  ASSERT_TRUE(train_rc.has_value()) << train.output();
  ASSERT_EQ(*train_rc, 0) << train.output();
  auto eval_rc = eval.Wait(60);
  ASSERT_TRUE(eval_rc.has_value()) << "the evaluator did not stop after the final checkpoint:\n"
                                   << eval.output();
  EXPECT_EQ(*eval_rc, 0) << eval.output();
  const std::string out = eval.output();
  EXPECT_NE(out.find("evaluator: checkpoint step 200/200"), std::string::npos) << out;
  EXPECT_NE(out.find("evaluated the final checkpoint (step 200)"), std::string::npos) << out;
  // The same variables and eval set as the chief's final evaluation.
  const auto chief = LastEval(train.output(), "training complete");
  ASSERT_FALSE(chief.first.empty()) << train.output();
  EXPECT_EQ(LastEval(out, "evaluator: checkpoint step 200/200"), chief) << out;
  std::filesystem::remove_all(dir);
}

// The evaluator is in every task's TF_CONFIG, but the rendezvous only
// expects the chief and workers: if it waited for the evaluator, the workers
// would fail at the rendezvous deadline instead of training.
TEST(EvaluatorTest, MultiWorkerJobWithAnEvaluatorTrainsWithoutWaitingForIt) {
  const std::string dir = FreshTempDir("evaluator_mwms");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      SyncJobYaml("MultiWorkerMirrored",
                  "    Worker: {replicas: 2}\n    Evaluator: {replicas: 1}\n", 200,
                  "    checkpoint: {everySteps: 50}\n"
                  "    communication: {implementation: Ring, timeoutSeconds: 10}\n"));
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt",
                  "--work-dir", dir + "/work"},
                 {{"DISTRAIN_EVAL_POLL_SECONDS", "0.1"}});
  auto rc = run.Wait(120);
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("3 process(es)"), std::string::npos) << out;
  EXPECT_NE(out.find("[evaluator-0] "), std::string::npos) << out;
  EXPECT_NE(out.find("evaluated the final checkpoint (step 200)"), std::string::npos) << out;
  EXPECT_EQ(LastEval(out, "evaluator: checkpoint step 200/200"),
            LastEval(out, R"(\[worker-0\][^\n]*training complete)"))
      << out;
  std::filesystem::remove_all(dir);
}

TEST(EvaluatorTest, WithoutTrainingItGivesUpAfterTheTimeoutWithARetryableCode) {
  const std::string dir = FreshTempDir("evaluator_timeout");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n    Evaluator: {replicas: 1}\n", 200));
  const auto start = std::chrono::steady_clock::now();
  Subprocess eval({WorkerBinary(), "--config", job, "--tf-config",
                   TfConfig("127.0.0.1:1", "127.0.0.1:2", "evaluator"), "--checkpoint-dir",
                   dir + "/ckpt"},
                  {{"DISTRAIN_EVAL_POLL_SECONDS", "0.1"}, {"DISTRAIN_EVAL_TIMEOUT_SECONDS", "1"}});
  auto rc = eval.Wait(30);
  ASSERT_TRUE(rc.has_value()) << eval.output();
  EXPECT_EQ(*rc, 171) << eval.output();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  EXPECT_NE(eval.output().find("no new checkpoint in " + dir + "/ckpt"), std::string::npos)
      << eval.output();
  std::filesystem::remove_all(dir);
}

TEST(EvaluatorTest, WithoutACheckpointDirectoryItSaysWhatToSet) {
  const std::string dir = FreshTempDir("evaluator_nodir");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n    Evaluator: {replicas: 1}\n", 200));
  Subprocess eval({WorkerBinary(), "--config", job, "--tf-config",
                   TfConfig("127.0.0.1:1", "127.0.0.1:2", "evaluator")},
                  {{"DISTRAIN_CHECKPOINT_DIR", ""}});
  auto rc = eval.Wait(30);
  ASSERT_TRUE(rc.has_value()) << eval.output();
  EXPECT_EQ(*rc, 3) << eval.output();
  EXPECT_NE(eval.output().find("DISTRAIN_CHECKPOINT_DIR"), std::string::npos) << eval.output();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distrain

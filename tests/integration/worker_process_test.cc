// distrain-worker as the operator runs it: env contract in, metrics out.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"

namespace distrain {
namespace {

using testing::SourceDir;
using testing::Subprocess;
using testing::WorkerBinary;

// The example with steps raised so the worker is still training while we scrape.
std::string LongRunningJob() {
  std::ifstream in(SourceDir() + "/examples/onedevice.yaml");
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = std::regex_replace(buf.str(), std::regex(R"(\n(\s+)steps: \d+)"), "\n$1steps: 100000000");
  std::string path = ::testing::TempDir() + "/long_job_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

TEST(WorkerProcessTest, ServesPrometheusMetricsAndHealthWhileTraining) {
  const int port = testing::FreeLoopbackPort();
  Subprocess worker({WorkerBinary(), "--config", LongRunningJob()},
                    {{"DISTRAIN_METRICS_PORT", std::to_string(port)},
                     {"TF_CONFIG", R"({"cluster":{"worker":["localhost:2222"]},"task":{"type":"worker","index":0}})"}});
  ASSERT_TRUE(worker.WaitForOutput("step ", 120)) << worker.output();
  std::string health = testing::HttpGet(port, "/healthz");
  EXPECT_NE(health.find("200 OK"), std::string::npos) << health;
  std::string metrics = testing::HttpGet(port, "/metrics");
  for (const char* name : {"distrain_steps_total", "distrain_examples_total", "distrain_loss",
                           "distrain_step_duration_seconds_bucket", "distrain_total_steps",
                           "distrain_progress_deadline_seconds"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << " missing:\n" << metrics;
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(metrics, m, std::regex(R"(\ndistrain_steps_total ([0-9.e+]+))"))) << metrics;
  EXPECT_GT(std::stod(m[1]), 0) << "steps counter never moved";
  // A fresh run: the job's step is the steps this process ran (a resumed one
  // adds the checkpoint's step).
  const double ran = std::stod(m[1]);
  std::smatch at;
  ASSERT_TRUE(std::regex_search(metrics, at, std::regex(R"(\ndistrain_step ([0-9.e+]+))"))) << metrics;
  EXPECT_NEAR(std::stod(at[1]), ran, 1) << metrics;
  // The watchdog behind /healthz has timed its steps: millisecond steps give
  // the 60 s floor of the default deadline (common/progress_deadline.h), not
  // the 600 s start-up allowance.
  ASSERT_TRUE(std::regex_search(metrics, m,
                                std::regex(R"(\ndistrain_progress_deadline_seconds ([0-9.e+]+))")))
      << metrics;
  EXPECT_EQ(std::stod(m[1]), 60) << metrics;
  EXPECT_NE(testing::HttpGet(port, "/nope").find("404"), std::string::npos);
  worker.Signal(SIGTERM);
  auto rc = worker.Wait(60);
  ASSERT_TRUE(rc.has_value()) << "worker ignored SIGTERM";
  EXPECT_EQ(*rc, 143) << worker.output();
}

// The chief's final figures for the kubelet's termination message
// (operator/controller/final_progress.h), written only once training succeeded.
TEST(WorkerProcessTest, TheChiefLeavesItsFinalFiguresInTheTerminationMessage) {
  std::ifstream in(SourceDir() + "/examples/onedevice.yaml");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text =
      std::regex_replace(std::regex_replace(buf.str(), std::regex(R"(\n(\s+)steps: \d+)"), "\n$1steps: 60"),
                         std::regex(R"(\n(\s+)numExamples: \d+)"), "\n$1numExamples: 4000");
  const std::string job = ::testing::TempDir() + "/final_job_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(job) << text;
  const std::string message = ::testing::TempDir() + "/termination-log-" + std::to_string(::getpid());
  std::remove(message.c_str());
  Subprocess worker({WorkerBinary(), "--config", job},
                    {{"DISTRAIN_TERMINATION_MESSAGE_PATH", message},
                     {"TF_CONFIG", R"({"cluster":{"worker":["localhost:2222"]},"task":{"type":"worker","index":0}})"}});
  auto rc = worker.Wait(120);
  ASSERT_TRUE(rc.has_value());
  ASSERT_EQ(*rc, 0) << worker.output();
  std::ifstream m(message);
  std::stringstream written_buf;
  written_buf << m.rdbuf();
  const std::string written = written_buf.str();
  // {"step":60,"totalSteps":60,"loss":...,"examplesPerSecond":...,"accuracy":...}
  EXPECT_TRUE(std::regex_search(written, std::regex(R"re("step":60\b)re"))) << written;
  EXPECT_TRUE(std::regex_search(written, std::regex(R"re("totalSteps":60\b)re"))) << written;
  std::smatch loss, accuracy, line;
  ASSERT_TRUE(std::regex_search(written, loss, std::regex(R"re("loss":([0-9.e+-]+))re"))) << written;
  ASSERT_TRUE(std::regex_search(written, accuracy, std::regex(R"re("accuracy":([0-9.e+-]+))re")))
      << written;
  // The same figures the chief's last log line reports.
  const std::string output = worker.output();
  ASSERT_TRUE(std::regex_search(output, line,
                                std::regex(R"(training complete: steps 60 loss ([0-9.]+) eval_loss [0-9.]+ eval_accuracy ([0-9.]+))")))
      << worker.output();
  EXPECT_NEAR(std::stod(loss[1]), std::stod(line[1]), 1e-4);
  EXPECT_NEAR(std::stod(accuracy[1]), std::stod(line[2]), 1e-4);

  // Run again on a checkpoint of the final step: no step runs, so the
  // message has no loss or rate of its own (0 would overwrite the real ones).
  const std::string ckpt = ::testing::TempDir() + "/final_ckpt_" + std::to_string(::getpid());
  for (int run = 0; run < 2; ++run) {
    std::remove(message.c_str());
    Subprocess again({WorkerBinary(), "--config", job, "--checkpoint-dir", ckpt},
                     {{"DISTRAIN_TERMINATION_MESSAGE_PATH", message},
                      {"TF_CONFIG", R"({"cluster":{"worker":["localhost:2222"]},"task":{"type":"worker","index":0}})"}});
    auto again_rc = again.Wait(120);
    ASSERT_TRUE(again_rc.has_value() && *again_rc == 0) << again.output();
  }
  std::ifstream resumed_in(message);
  std::stringstream resumed;
  resumed << resumed_in.rdbuf();
  EXPECT_TRUE(std::regex_search(resumed.str(), std::regex(R"re("step":60\b)re"))) << resumed.str();
  EXPECT_EQ(resumed.str().find("\"loss\""), std::string::npos) << resumed.str();
  std::filesystem::remove_all(ckpt);
}

TEST(WorkerProcessTest, InvalidTfConfigExitsWithConfigCodeAndNamesTheField) {
  Subprocess worker({WorkerBinary(), "--config", SourceDir() + "/examples/onedevice.yaml"},
                    {{"TF_CONFIG", R"({"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":5}})"}});
  auto rc = worker.Wait(30);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 3) << worker.output();
  EXPECT_NE(worker.output().find("task.index"), std::string::npos) << worker.output();
}

TEST(WorkerProcessTest, MissingJobConfigExitsWithConfigCodeAndSaysWhatToSet) {
  Subprocess worker({WorkerBinary()}, {{"DISTRAIN_JOB_CONFIG", ""}});
  auto rc = worker.Wait(30);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 3) << worker.output();
  EXPECT_NE(worker.output().find("DISTRAIN_JOB_CONFIG"), std::string::npos) << worker.output();
}

TEST(WorkerProcessTest, TpuStrategyIsRefusedWithAnExplanation) {
  Subprocess worker({WorkerBinary(), "--config", SourceDir() + "/examples/tpu.yaml"});
  auto rc = worker.Wait(30);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 5) << worker.output();
  EXPECT_NE(worker.output().find("TPU"), std::string::npos) << worker.output();
}

}  // namespace
}  // namespace distrain

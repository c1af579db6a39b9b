// ParameterServer as real processes: a chief (the coordinator), workers and
// ps tasks started here with their own TF_CONFIG, the way the operator starts
// pods. 2 ps + 3 workers reach the example's accuracy; a worker killed with
// SIGKILL mid-training loses nothing (its closure is re-run elsewhere, the
// requested steps complete) and, restarted, rejoins and runs closures again; a
// ps killed with SIGKILL stops the chief with the retryable exit code, and a
// rerun resumes from the last checkpoint rather than step 0; `distrain run`
// runs examples/parameter-server.yaml end to end.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FreshTempDir;
using testing::SourceDir;
using testing::Subprocess;
using testing::WorkerBinary;
using testing::WriteTextFile;
namespace fs = std::filesystem;

constexpr int kExitPeerLost = 170;  // common/exit_codes.h

// The example's problem (examples/parameter-server.yaml), with the steps and
// checkpoint cadence each test needs.
std::string JobYaml(int workers, int64_t steps, const std::string& extra_training = "") {
  return absl::StrCat("apiVersion: distrain.io/v1alpha1\n",                                    //
                      "kind: DistributedTrainingJob\n",                                        //
                      "metadata: {name: ps}\n",                                                //
                      "spec:\n",                                                               //
                      "  strategy: ParameterServer\n",                                         //
                      "  replicaSpecs:\n",                                                     //
                      "    Chief: {replicas: 1}\n",                                            //
                      "    Worker: {replicas: ", workers, "}\n",                               //
                      "    PS: {replicas: 2}\n",                                               //
                      "  training:\n",                                                         //
                      "    model: {hiddenUnits: [128]}\n",                                     //
                      "    dataset: {type: synthetic, numExamples: 20000, numEvalExamples: 2000,",
                      " numFeatures: 64, numClasses: 10, noise: 1.0}\n",                       //
                      "    optimizer: {type: adam, learningRate: 0.001}\n",                    //
                      "    globalBatchSize: 64\n",                                             //
                      "    steps: ", steps, "\n",                                              //
                      "    logEverySteps: 50\n",                                               //
                      "    communication: {timeoutSeconds: 10}\n",                             //
                      extra_training);
}

// One process per task of a chief + W workers + 2 ps job. Ports are held
// for up to `max_workers` workers, so that workers a scale adds can start
// later with a larger TF_CONFIG (Start's `cluster_workers`).
class PsCluster {
 public:
  PsCluster(const std::string& job, const std::string& dir, int workers, int max_workers = 0)
      : job_(job), dir_(dir), workers_(workers), credentials_(dir) {
    max_workers = std::max(workers, max_workers);
    ports_ = testing::FreeLoopbackPorts(max_workers + 3 + 1);
    chief_metrics_port = ports_[max_workers + 3];
  }

  // The cluster object with `workers` workers (the same addresses for the
  // tasks every size has, as the operator's ConfigMap keeps them).
  std::string Cluster(int workers) const {
    // StrCat, not operator+: GCC 12 -Wrestrict misreads "literal" + std::string.
    auto address = [&](int i) { return absl::StrCat("\"127.0.0.1:", ports_[i], "\""); };
    std::string worker_list;
    for (int w = 0; w < workers; ++w) absl::StrAppend(&worker_list, w ? "," : "", address(3 + w));
    return absl::StrCat(R"({"chief":[)", address(0), R"(],"worker":[)", worker_list,
                        R"(],"ps":[)", address(1), ",", address(2), "]}");
  }

  std::unique_ptr<Subprocess> Start(const std::string& type, int index, int cluster_workers = 0) {
    const std::string cluster = Cluster(cluster_workers > 0 ? cluster_workers : workers_);
    const std::string tf_config = absl::StrCat(R"({"cluster":)", cluster, R"(,"task":{"type":")",
                                               type, R"(","index":)", index, "}}");
    std::vector<std::string> argv = {WorkerBinary(), "--config", job_, "--tf-config", tf_config};
    if (type == "chief" || type == "ps") {
      // One checkpoint directory shared by the chief and the ps tasks.
      argv.insert(argv.end(), {"--checkpoint-dir", dir_ + "/ckpt"});
    }
    if (type == "chief") {
      argv.insert(argv.end(), {"--metrics-port", std::to_string(chief_metrics_port)});
    }
    return std::make_unique<Subprocess>(
        argv, std::map<std::string, std::string>{
                  {"OPENBLAS_NUM_THREADS", "1"},
                  {"DISTRAIN_CREDENTIALS_DIR", credentials_.DirFor(type, index)}});
  }

  void StartAll() {
    for (int p = 0; p < 2; ++p) ps.push_back(Start("ps", p));
    for (int w = 0; w < workers_; ++w) workers.push_back(Start("worker", w));
    chief = Start("chief", 0);
  }

  // ps tasks serve until told to stop; they exit 0 on SIGTERM.
  void StopPs() {
    for (auto& p : ps) {
      p->Signal(SIGTERM);
      auto rc = p->Wait(10);
      ASSERT_TRUE(rc.has_value()) << p->output();
      EXPECT_EQ(*rc, 0) << p->output();
    }
  }

  int chief_metrics_port = 0;
  std::unique_ptr<Subprocess> chief;
  std::vector<std::unique_ptr<Subprocess>> workers;
  std::vector<std::unique_ptr<Subprocess>> ps;

 private:
  std::string job_;
  std::string dir_;
  int workers_;
  std::vector<int> ports_;
  testing::TestJobCredentials credentials_;
};

double MetricValue(const std::string& metrics, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(metrics, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return -1;
  return std::stod(m[1]);
}

// distrain_ps_worker_closures_completed_total{worker="worker:<w>"}; -1 when absent.
double WorkerClosures(const std::string& metrics, int w) {
  std::smatch m;
  if (!std::regex_search(metrics, m,
                         std::regex("\ndistrain_ps_worker_closures_completed_total\\{worker=\"worker:" +
                                    std::to_string(w) + "\"\\} ([0-9.e+]+)"))) {
    return -1;
  }
  return std::stod(m[1]);
}

TEST(PsTrainingTest, TwoPsThreeWorkersAndAChiefReachTheExamplesAccuracy) {
  const std::string dir = FreshTempDir("accuracy");
  const std::string job = WriteTextFile(dir + "/job.yaml", JobYaml(3, 400));
  PsCluster cluster(job, dir, 3);
  cluster.StartAll();
  auto rc = cluster.chief->Wait(60);
  ASSERT_TRUE(rc.has_value()) << cluster.chief->output();
  ASSERT_EQ(*rc, 0) << cluster.chief->output();
  const std::string out = cluster.chief->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("training complete: steps 400 loss [0-9.]+ eval_loss [0-9.]+ eval_accuracy ([0-9.]+)")))
      << out;
  EXPECT_GE(std::stod(m[1]), 0.95) << out;
  EXPECT_NE(out.find("400 closure(s) completed, 0 retried"), std::string::npos) << out;
  // Every worker ran closures, then the coordinator told it the job was done.
  for (int w = 0; w < 3; ++w) {
    auto wrc = cluster.workers[w]->Wait(10);
    ASSERT_TRUE(wrc.has_value()) << cluster.workers[w]->output();
    EXPECT_EQ(*wrc, 0) << cluster.workers[w]->output();
    EXPECT_TRUE(std::regex_search(cluster.workers[w]->output(),
                                  std::regex("job is done after [1-9][0-9]* closure")))
        << cluster.workers[w]->output();
  }
  cluster.StopPs();
  // The chief's checkpoint holds the ps tasks' optimizer slots too.
  EXPECT_TRUE(fs::exists(dir + "/ckpt/ps/ps-0-of-2"));
  EXPECT_TRUE(fs::exists(dir + "/ckpt/ps/ps-1-of-2"));
  fs::remove_all(dir);
}

TEST(PsTrainingTest, KilledWorkersClosureIsRerunAndTheRestartedWorkerRejoins) {
  const std::string dir = FreshTempDir("worker_kill");
  const int64_t kSteps = 2500;
  const std::string job = WriteTextFile(dir + "/job.yaml", JobYaml(2, kSteps));
  PsCluster cluster(job, dir, 2);
  cluster.StartAll();
  ASSERT_TRUE(cluster.chief->WaitForOutput("step 200/", 30)) << cluster.chief->output();
  cluster.workers[1]->Signal(SIGKILL);
  ASSERT_EQ(cluster.workers[1]->Wait(10), 128 + SIGKILL);
  ASSERT_TRUE(cluster.chief->WaitForOutput("re-queued", 10)) << cluster.chief->output();

  // The same task comes back (as Kubernetes restarts its pod) and rejoins.
  auto restarted = cluster.Start("worker", 1);
  ASSERT_TRUE(cluster.chief->WaitForOutput("rejoined (restarted process)", 20))
      << cluster.chief->output();
  const std::string metrics = testing::HttpGet(cluster.chief_metrics_port, "/metrics");
  EXPECT_GE(MetricValue(metrics, "distrain_ps_closures_retried_total"), 1) << metrics;
  EXPECT_GE(MetricValue(metrics, "distrain_ps_workers_admitted_total"), 3) << metrics;

  auto rc = cluster.chief->Wait(60);
  ASSERT_TRUE(rc.has_value()) << cluster.chief->output();
  ASSERT_EQ(*rc, 0) << cluster.chief->output();
  const std::string out = cluster.chief->output();
  EXPECT_TRUE(std::regex_search(out, std::regex("training complete: steps " +
                                                std::to_string(kSteps) + " ")))
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("([0-9]+) closure\\(s\\) completed, ([0-9]+) retried after a lost worker")))
      << out;
  EXPECT_EQ(std::stoll(m[1]), kSteps) << "each requested step counted exactly once";
  EXPECT_GE(std::stoll(m[2]), 1) << "the killed worker's closure ran again";
  // The restarted worker was scheduled again.
  auto wrc = restarted->Wait(10);
  ASSERT_TRUE(wrc.has_value()) << restarted->output();
  EXPECT_EQ(*wrc, 0) << restarted->output();
  EXPECT_TRUE(std::regex_search(restarted->output(),
                                std::regex("job is done after [1-9][0-9]* closure")))
      << restarted->output();
  cluster.StopPs();
  fs::remove_all(dir);
}

// kubectl scale as processes: the job starts with 2 workers; two more start
// with the 4-worker TF_CONFIG the operator gives pods a scale adds, join the
// chief's worker set and run closures within seconds; then the scale goes back
// to 2 (the operator deletes the two highest-indexed pods: SIGTERM), and every
// requested step is done, each counted once.
TEST(PsTrainingTest, ScaledUpWorkersRunClosuresAndAScaleDownLosesNoClosure) {
  const std::string dir = FreshTempDir("scale");
  const int64_t kSteps = 6000;
  const std::string job = WriteTextFile(dir + "/job.yaml", JobYaml(2, kSteps));
  PsCluster cluster(job, dir, 2, /*max_workers=*/4);
  cluster.StartAll();
  ASSERT_TRUE(cluster.chief->WaitForOutput("step 200/", 30)) << cluster.chief->output();

  // Scale 2 -> 4.
  const auto scaled_up = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Subprocess>> added;
  for (int w = 2; w < 4; ++w) added.push_back(cluster.Start("worker", w, /*cluster_workers=*/4));
  double seconds_to_closures = -1;
  std::string metrics;
  while (std::chrono::steady_clock::now() - scaled_up < std::chrono::seconds(20)) {
    metrics = testing::HttpGet(cluster.chief_metrics_port, "/metrics");
    if (WorkerClosures(metrics, 2) > 0 && WorkerClosures(metrics, 3) > 0) {
      seconds_to_closures =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - scaled_up).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(seconds_to_closures, 0) << "the added workers ran no closure within 20 s:\n"
                                    << metrics << "\n" << cluster.chief->output();
  std::cout << "scale 2 -> 4: both added workers completed closures " << seconds_to_closures
            << " s after their processes started\n";
  EXPECT_LT(seconds_to_closures, 10);
  EXPECT_EQ(MetricValue(metrics, "distrain_ps_workers_members"), 4) << metrics;
  EXPECT_TRUE(cluster.chief->WaitForOutput("joined the worker set", 1)) << cluster.chief->output();
  // Let them work a little, then scale 4 -> 2.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(cluster.chief->output().find("training complete"), std::string::npos)
      << "the job finished before the scale-down; raise kSteps:\n" << cluster.chief->output();
  for (auto& w : added) w->Signal(SIGTERM);
  for (auto& w : added) {
    auto rc = w->Wait(20);
    ASSERT_TRUE(rc.has_value()) << w->output();
    EXPECT_EQ(*rc, 128 + SIGTERM) << w->output();
    EXPECT_NE(w->output().find("left the chief's worker set"), std::string::npos) << w->output();
  }
  ASSERT_TRUE(cluster.chief->WaitForOutput("is out of the worker set (it left", 10))
      << cluster.chief->output();
  // Their last closures answered and counted: the coordinator let them go.
  for (int i = 0; i < 100; ++i) {
    metrics = testing::HttpGet(cluster.chief_metrics_port, "/metrics");
    if (MetricValue(metrics, "distrain_ps_workers_active") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(MetricValue(metrics, "distrain_ps_workers_active"), 2) << metrics;
  EXPECT_EQ(MetricValue(metrics, "distrain_ps_workers_members"), 2) << metrics;
  const double ran_on_2 = WorkerClosures(metrics, 2), ran_on_3 = WorkerClosures(metrics, 3);

  auto rc = cluster.chief->Wait(120);
  ASSERT_TRUE(rc.has_value()) << cluster.chief->output();
  ASSERT_EQ(*rc, 0) << cluster.chief->output();
  const std::string out = cluster.chief->output();
  EXPECT_TRUE(std::regex_search(
      out, std::regex("training complete: steps " + std::to_string(kSteps) + " ")))
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("([0-9]+) closure\\(s\\) completed, ([0-9]+) retried")))
      << out;
  EXPECT_EQ(std::stoll(m[1]), kSteps) << "every requested step done, each counted once";
  std::cout << "scale 4 -> 2: " << m[0] << "\n";
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("closures per worker: worker:0 ([0-9]+), worker:1 ([0-9]+), worker:2 "
                         "([0-9]+), worker:3 ([0-9]+)")))
      << out;
  std::cout << m[0] << "\n";
  EXPECT_EQ(std::stod(m[3]), ran_on_2) << "nothing ran on worker:2 after it left";
  EXPECT_EQ(std::stod(m[4]), ran_on_3) << "nothing ran on worker:3 after it left";
  EXPECT_EQ(std::stoll(m[1]) + std::stoll(m[2]) + std::stoll(m[3]) + std::stoll(m[4]), kSteps);
  for (int w = 0; w < 2; ++w) {
    auto wrc = cluster.workers[w]->Wait(10);
    ASSERT_TRUE(wrc.has_value()) << cluster.workers[w]->output();
    EXPECT_EQ(*wrc, 0) << cluster.workers[w]->output();
  }
  cluster.StopPs();
  fs::remove_all(dir);
}

TEST(PsTrainingTest, KilledPsStopsTheChiefRetryablyAndARerunResumesFromTheCheckpoint) {
  const std::string dir = FreshTempDir("ps_kill");
  const int64_t kSteps = 1200;
  const std::string job = WriteTextFile(
      dir + "/job.yaml", JobYaml(2, kSteps, "    checkpoint: {everySteps: 100, keep: 3}\n"));
  PsCluster cluster(job, dir, 2);
  cluster.StartAll();
  ASSERT_TRUE(cluster.chief->WaitForOutput("checkpoint step 200 written", 30))
      << cluster.chief->output();
  cluster.ps[1]->Signal(SIGKILL);
  ASSERT_EQ(cluster.ps[1]->Wait(10), 128 + SIGKILL);
  auto rc = cluster.chief->Wait(20);
  ASSERT_TRUE(rc.has_value()) << "the chief did not stop within 20 s of losing a ps:\n"
                              << cluster.chief->output();
  EXPECT_EQ(*rc, kExitPeerLost) << cluster.chief->output();
  const std::string failed = cluster.chief->output();
  EXPECT_NE(failed.find("parameter server lost: ps:1 ("), std::string::npos) << failed;
  EXPECT_NE(failed.find("retryable"), std::string::npos) << failed;
  EXPECT_EQ(failed.find("training complete"), std::string::npos) << failed;

  // The rerun: the lost ps and the chief restart (the operator's ExitCode
  // policy); ps:0 and the workers are the same processes as before.
  cluster.ps[1] = cluster.Start("ps", 1);
  cluster.chief = cluster.Start("chief", 0);
  rc = cluster.chief->Wait(60);
  ASSERT_TRUE(rc.has_value()) << cluster.chief->output();
  ASSERT_EQ(*rc, 0) << cluster.chief->output();
  const std::string out = cluster.chief->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("resumed from checkpoint step ([0-9]+)"))) << out;
  const int64_t resumed = std::stoll(m[1]);
  EXPECT_GE(resumed, 200) << out;
  EXPECT_EQ(resumed % 100, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("every ps restored its shards and optimizer slots of step ",
                                  resumed)),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(absl::StrCat(kSteps - resumed, " closure\\(s\\) completed"))))
      << "only the remaining steps run:\n"
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("training complete: steps 1200 .*eval_accuracy")))
      << out;
  cluster.StopPs();
  fs::remove_all(dir);
}

TEST(PsTrainingTest, DistrainRunRunsTheParameterServerExample) {
  const std::string dir = FreshTempDir("run");
  Subprocess run({DistrainBinary(), "run", SourceDir() + "/examples/parameter-server.yaml",
                  "--no-progress", "--work-dir", dir});
  auto rc = run.Wait(90);
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("job parameter-server Succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("steps           400/400"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("eval accuracy   ([0-9.]+)"))) << out;
  EXPECT_GE(std::stod(m[1]), 0.95) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distrain

// Synchronous strategies as real processes: MultiWorkerMirrored (chief + 3
// workers started here with their own TF_CONFIG) and Mirrored (4 replicas)
// end where OneDevice ends on the same global batch and seed; every replica
// holds identical parameters after every step; a worker killed with SIGKILL
// makes every other process fail fast, naming it (recoveryPolicy
// RestartGroup) or is replaced and rejoins the survivors in place (InPlace);
// `distrain run` runs both examples.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"
#include "worker/checkpoint/checkpoint.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::ExpectSameVariables;
using testing::FinalVariables;
using testing::FreshTempDir;
using testing::OneDeviceReference;
using testing::ReadLines;
using testing::SourceDir;
using testing::Subprocess;
using testing::SyncJobYaml;
using testing::WorkerBinary;
using testing::WriteTextFile;
namespace fs = std::filesystem;

constexpr int kSteps = testing::kReferenceSteps;

const char kOneWorker[] = "    Worker: {replicas: 1}\n";
const char kChiefAnd3Workers[] = "    Chief: {replicas: 1}\n    Worker: {replicas: 3}\n";
// Small buckets so every step reduces several buckets while backward runs.
const char kCommunication[] =
    "    communication: {implementation: Ring, timeoutSeconds: 10, bytesPerPack: 4096}\n";

using Cluster = testing::SyncCluster;

TEST(SyncTrainingTest, MultiWorkerMirroredChiefAnd3WorkersMatchesOneDeviceAndStaysInSync) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("mwms");
  const std::string job =
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, kSteps, kCommunication));
  Cluster cluster(job, dir, 3, kSteps);
  cluster.ExpectAllSucceed(120);
  // The chief wrote the checkpoint; it equals single-process training.
  ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  cluster.ExpectIdenticalChecksums(dir);
  fs::remove_all(dir);
}

// The loss and accuracy a MultiWorkerMirrored chief logs (and writes to
// TensorBoard) are the job's, as Keras reports them, not its own shard's: with
// DATA sharding the job's batch is the single-process batch, so the lines
// equal OneDevice's.
TEST(SyncTrainingTest, MultiWorkerMirroredLogsTheJobsLossNotTheChiefsShard) {
  const std::string dir = FreshTempDir("mwms_loss");
  auto logged = [&](const std::string& name, const std::string& strategy,
                    const std::string& replicas) {
    const std::string job = WriteTextFile(dir + "/" + name + ".yaml",
                                          SyncJobYaml(strategy, replicas, 60));
    Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--work-dir",
                    dir + "/" + name});
    auto rc = run.Wait(120);
    EXPECT_TRUE(rc.has_value() && *rc == 0) << run.output();
    // "[chief-0] ... step 20/60 loss 1.2345 accuracy 0.5000" (worker-0 without a chief).
    std::vector<std::pair<double, double>> lines;
    const std::string out = run.output();
    const std::regex line(R"(\[(chief|worker)-0\][^\n]* step \d+/60 loss ([0-9.]+) accuracy ([0-9.]+))");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
         ++it) {
      if (strategy != "OneDevice" && (*it)[1] != "chief") continue;
      lines.emplace_back(std::stod((*it)[2]), std::stod((*it)[3]));
    }
    return lines;
  };
  const auto one = logged("one", "OneDevice", "    Worker: {replicas: 1}\n");
  const auto mwms = logged("mwms", "MultiWorkerMirrored", kChiefAnd3Workers);
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(mwms.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    // 4 printed decimals; summation order differs in the last bits.
    EXPECT_NEAR(mwms[i].first, one[i].first, 2e-4) << "loss line " << i;
    EXPECT_NEAR(mwms[i].second, one[i].second, 1.0 / 64 + 1e-4) << "accuracy line " << i;
  }
  fs::remove_all(dir);
}

// A restarted job resumes from the chief's checkpoint even though the other
// processes cannot read it: the chief broadcasts variables, optimizer slots
// and step, and the job ends exactly where an uninterrupted one does.
TEST(SyncTrainingTest, MultiWorkerMirroredResumesFromACheckpointOnlyTheChiefHas) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("resume");
  {
    const std::string job =
        WriteTextFile(dir + "/first.yaml", SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers,
                                                       kSteps / 2, kCommunication));
    Cluster first(job, dir, 3, kSteps / 2);
    first.ExpectAllSucceed(120);
  }
  for (const char* task : {"worker-0", "worker-1", "worker-2"}) {
    const std::string theirs = dir + "/ckpt-" + task;
    ASSERT_TRUE(!fs::exists(theirs) || fs::is_empty(theirs)) << "only the chief writes checkpoints";
  }
  const std::string job =
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, kSteps, kCommunication));
  Cluster second(job, dir, 3, kSteps);
  second.ExpectAllSucceed(120);
  EXPECT_NE(second.processes[0]->output().find("resumed from checkpoint step 100"),
            std::string::npos)
      << second.processes[0]->output();
  EXPECT_NE(second.processes[1]->output().find("starting at the chief's step 100"),
            std::string::npos)
      << second.processes[1]->output();
  ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  // Lines 1-100 from the first run, 101-200 from the second, equal everywhere.
  second.ExpectIdenticalChecksums(dir);
  fs::remove_all(dir);
}

// 2 processes x 2 local replicas: hierarchical all-reduce (local reduce ->
// ring -> local broadcast), still the same 4 replicas in sync.
TEST(SyncTrainingTest, MultiWorkerMirroredWithLocalReplicasMatchesOneDevice) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("hierarchical");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      SyncJobYaml("MultiWorkerMirrored", "    Chief: {replicas: 1}\n    Worker: {replicas: 1}\n",
                  kSteps, std::string(kCommunication) + "    localReplicas: 2\n"));
  Cluster cluster(job, dir, 1, kSteps);
  cluster.ExpectAllSucceed(120);
  EXPECT_NE(cluster.processes[0]->output().find("replicas in sync 4"), std::string::npos)
      << cluster.processes[0]->output();
  ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  cluster.ExpectIdenticalChecksums(dir);
  fs::remove_all(dir);
}

TEST(SyncTrainingTest, MirroredFourReplicasMatchesOneDeviceAndStaysInSync) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("mirrored");
  const std::string job =
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("Mirrored", kOneWorker, kSteps,
                                "    localReplicas: 4\n    communication: {bytesPerPack: 4096}\n"));
  // Through distrain run, as a user would; the hook's file names the task.
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt"},
                 {{"DISTRAIN_PARAM_CHECKSUM_FILE", dir + "/checksums.{task}.txt"}});
  auto rc = run.Wait(120);
  ASSERT_TRUE(rc.has_value()) << run.output();
  ASSERT_EQ(*rc, 0) << run.output();
  EXPECT_NE(run.output().find("4 local replica(s)"), std::string::npos) << run.output();
  ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  // The worker checks its 4 replicas against each other before every line.
  EXPECT_EQ(ReadLines(dir + "/checksums.worker-0.txt").size(), static_cast<size_t>(kSteps));
  fs::remove_all(dir);
}

// SIGKILL of a worker (rank 3) or of the chief, which also hosts the
// coordination service (rank 0); SIGSTOP of a worker (a process that stops
// answering without closing its connections).
struct KillCase {
  std::string name;
  int victim;  // index into Cluster::processes
  int signal;
};

class SyncTrainingKillTest : public ::testing::TestWithParam<KillCase> {};

// A lost worker under recoveryPolicy RestartGroup (TensorFlow's behaviour),
// and a lost chief under any policy (it hosts the rendezvous): every process
// exits with the retryable code so that the group restarts from the
// checkpoint. (A lost worker under InPlace, the default, is tested below.)
TEST_P(SyncTrainingKillTest, EveryOtherProcessFailsFastNamingTheDeadOne) {
  const int victim = GetParam().victim;
  const std::string dir = FreshTempDir("kill_" + GetParam().name);
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      absl::StrCat(SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, 100000000,
                               kCommunication),
                   victim != 0 ? "  runPolicy: {recoveryPolicy: RestartGroup}\n" : ""));
  Cluster cluster(job, dir, 3, kSteps);
  // Training is under way everywhere.
  for (size_t i = 0; i < cluster.processes.size(); ++i) {
    ASSERT_TRUE(cluster.processes[i]->WaitForOutput("step 40/", 120))
        << cluster.tasks[i] << ":\n"
        << cluster.processes[i]->output();
  }
  // The strategy's metrics are served next to the Trainer's.
  const std::string metrics = testing::HttpGet(cluster.metrics_ports[0], "/metrics");
  std::smatch bytes;
  ASSERT_TRUE(std::regex_search(
      metrics, bytes,
      std::regex(R"(\ndistrain_collective_bytes_total\{op="allreduce"\} ([0-9.e+]+))")))
      << metrics;
  EXPECT_GT(std::stod(bytes[1]), 0);
  EXPECT_NE(metrics.find("distrain_collective_seconds_bucket{op=\"allreduce\""), std::string::npos);
  EXPECT_NE(metrics.find("\ndistrain_membership_generation 1"), std::string::npos) << metrics;
  const auto killed_at = std::chrono::steady_clock::now();
  cluster.processes[victim]->Signal(GetParam().signal);
  const std::string victim_name =
      std::string(victim == 0 ? "chief:0" : "worker:2") + " (" + cluster.addresses[victim] + ")";
  for (size_t i = 0; i < cluster.processes.size(); ++i) {
    if (static_cast<int>(i) == victim) continue;
    Subprocess& p = *cluster.processes[i];
    auto rc = p.Wait(10 + 5);  // timeoutSeconds + 5 s, measured from the kill
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    ASSERT_TRUE(rc.has_value()) << cluster.tasks[i] << " still running 15 s after the kill:\n"
                                << p.output();
    EXPECT_LE(seconds, 15.0) << cluster.tasks[i];
    EXPECT_EQ(*rc, 170) << cluster.tasks[i] << " should exit with the retryable peer-lost code:\n"
                        << p.output();
    // The error line (the last thing logged) names the dead process and its address.
    std::smatch m;
    const std::string out = p.output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(error +([^\n]*exit code 170[^\n]*))")))
        << cluster.tasks[i] << ":\n"
        << out;
    EXPECT_NE(m[1].str().find(victim_name), std::string::npos)
        << cluster.tasks[i] << "'s error does not name " << victim_name << ": " << m[1].str();
    std::cout << cluster.tasks[i] << " exited " << *rc << " after " << seconds
              << " s: " << m[1].str() << "\n";
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Victims, SyncTrainingKillTest,
                         ::testing::Values(KillCase{"KilledWorker", 3, SIGKILL},
                                           KillCase{"KilledChief", 0, SIGKILL},
                                           KillCase{"StoppedWorker", 3, SIGSTOP}),
                         [](const ::testing::TestParamInfo<KillCase>& info) {
                           return info.param.name;
                         });

// In-place recovery (multi_worker_mirrored.h R1-R5): a SIGKILLed worker is
// started again (as the operator recreates its pod); the survivors never
// exit, the group re-forms around the replacement, and because everyone
// resumes from the newest completed step with the input re-positioned
// there, the job ends exactly where fault-free single-process training
// ends: the kill cost the step in flight and nothing else.
std::map<int64_t, std::string> ChecksumsByStep(const std::string& path) {
  std::map<int64_t, std::string> out;
  for (const std::string& line : ReadLines(path)) {
    const size_t space = line.find(' ');
    out[std::stoll(line.substr(0, space))] = line.substr(space + 1);  // the last write wins
  }
  return out;
}

// Wherever two processes (any incarnation) recorded the same step, they held
// the same parameters; the chief recorded every step once.
void ExpectSameParametersWhereStepsMeet(const Cluster& cluster, const std::string& dir,
                                       int steps = kSteps) {
  const auto chief = ChecksumsByStep(dir + "/checksums.chief-0.txt");
  EXPECT_EQ(chief.size(), static_cast<size_t>(steps));
  for (size_t i = 1; i < cluster.tasks.size(); ++i) {
    for (const auto& [step, sum] : ChecksumsByStep(dir + "/checksums." + cluster.tasks[i] + ".txt")) {
      EXPECT_EQ(sum, chief.at(step)) << cluster.tasks[i] << " at step " << step;
    }
  }
}

void KillAndReplace(Cluster& cluster, size_t victim, const std::string& after_output) {
  ASSERT_TRUE(cluster.processes[victim]->WaitForOutput(after_output, 120))
      << cluster.tasks[victim] << ":\n"
      << cluster.processes[victim]->output();
  cluster.processes[victim]->Signal(SIGKILL);
  auto rc = cluster.processes[victim]->Wait(10);
  ASSERT_TRUE(rc.has_value());
  cluster.Restart(victim);
}

TEST(SyncTrainingTest, MultiWorkerMirroredKilledWorkersRejoinInPlaceAndTheJobMatchesOneDevice) {
  const auto& reference = OneDeviceReference();
  const std::string dir = FreshTempDir("inplace");
  const std::string job =
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, kSteps, kCommunication));
  Cluster cluster(job, dir, 3, kSteps);
  Subprocess* original_chief = cluster.processes[0].get();
  Subprocess* worker0 = cluster.processes[1].get();
  // worker:2, then its replacement once it trains, then worker:0: three
  // losses, each once the group has recovered from the one before.
  KillAndReplace(cluster, 3, "step 40/");
  KillAndReplace(cluster, 3, "step 100/");
  KillAndReplace(cluster, 1, "step 160/");
  // The chief never left: it is the process it was.
  EXPECT_EQ(cluster.processes[0].get(), original_chief);
  EXPECT_NE(cluster.processes[1].get(), worker0);
  cluster.ExpectAllSucceed(120);
  for (const std::string& out : cluster.replaced) std::cout << out.substr(0, out.find('\n')) << " replaced\n";
  // The chief and worker:1 survived all three losses; each recovery resumed
  // no earlier than the steps the process had completed.
  for (size_t i : {0u, 2u}) {
    const std::string out = cluster.processes[i]->output();
    std::regex recovered(R"(recovered in place in [^:]+: membership generation (\d+), resuming at step (\d+) \(this process had completed (\d+)\))");
    int recoveries = 0;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), recovered);
         it != std::sregex_iterator(); ++it) {
      ++recoveries;
      EXPECT_GE(std::stoll((*it)[2]), std::stoll((*it)[3])) << cluster.tasks[i] << ": " << it->str();
      std::cout << cluster.tasks[i] << ": " << it->str() << "\n";
    }
    EXPECT_EQ(recoveries, 3) << cluster.tasks[i] << ":\n" << out;
    EXPECT_EQ(out.find("exit code 170"), std::string::npos) << cluster.tasks[i] << ":\n" << out;
  }
  // The chief's checkpoint is single-process training's, bit for bit up to
  // the all-reduce's rounding, as in the fault-free test above.
  ExpectSameVariables(FinalVariables(dir + "/ckpt"), reference, 1e-5f);
  ExpectSameParametersWhereStepsMeet(cluster, dir);
  fs::remove_all(dir);
}

// spec.elasticPolicy (multi_worker_mirrored.h, E1-E4): a group that loses
// members trains on without them as soon as the smaller size divides the
// global batch, and grows back when processes join, without restarting any
// survivor. Here (global batch 64, so 2 or 4 processes): worker:2 is killed
// (3 would not divide: the survivors wait), worker:1 is stopped by SIGTERM and
// departs (now 2: the chief and worker:0 train on), later both come back
// (4 again). Every step's global batch is the same examples at every size,
// so the job still ends where single-process training ends. The job is 5x
// the usual length: on a fast machine the 200-step job finished between the
// shrink and the test's next look at the logs (20 ms polls), before the
// group could grow.
TEST(SyncTrainingTest, MultiWorkerMirroredElasticShrinksAndGrowsInPlaceAndMatchesOneDevice) {
  constexpr int kElasticSteps = 5 * kSteps;
  const auto& reference = OneDeviceReference(kElasticSteps);
  const std::string dir = FreshTempDir("elastic");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      absl::StrCat(
          SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, kElasticSteps, kCommunication),
          "  elasticPolicy: {minReplicas: 1, maxReplicas: 3}\n"));
  Cluster cluster(job, dir, 3, kElasticSteps);
  Subprocess* chief = cluster.processes[0].get();
  Subprocess* worker0 = cluster.processes[1].get();
  ASSERT_TRUE(cluster.processes[3]->WaitForOutput("step 40/", 120)) << cluster.processes[3]->output();
  cluster.processes[3]->Signal(SIGKILL);
  ASSERT_TRUE(cluster.processes[3]->Wait(10).has_value());
  ASSERT_TRUE(chief->WaitForOutput("recovering in place", 30)) << chief->output();
  cluster.processes[2]->Signal(SIGTERM);
  auto departed = cluster.processes[2]->Wait(30);
  ASSERT_TRUE(departed.has_value()) << cluster.processes[2]->output();
  EXPECT_EQ(*departed, 143) << cluster.processes[2]->output();
  EXPECT_NE(cluster.processes[2]->output().find("leaving the group"), std::string::npos)
      << cluster.processes[2]->output();
  // Two processes train on: the chief re-split the batch and keeps stepping.
  ASSERT_TRUE(chief->WaitForOutput("now rank 0 of 2", 30)) << chief->output();
  ASSERT_TRUE(worker0->WaitForOutput("now rank 1 of 2", 30)) << worker0->output();
  // The resize is logged before the state agreement that ends the recovery.
  ASSERT_TRUE(chief->WaitForOutput("recovered in place", 30)) << chief->output();
  const std::string at_shrink = chief->output();
  std::smatch m;
  const std::regex resumed(R"(resuming at step (\d+))");
  ASSERT_TRUE(std::regex_search(at_shrink, m, resumed)) << at_shrink;
  const int64_t shrink_step = std::stoll(m[1]);
  // Logged every 20 steps: the first log line at least 10 steps after the shrink.
  const int64_t trained_on = ((shrink_step + 10) / 20 + 1) * 20;
  ASSERT_TRUE(chief->WaitForOutput(absl::StrCat("step ", trained_on, "/"), 60)) << chief->output();
  // worker:0 paused while the two come back, so the job cannot finish
  // before they join however slow their start: the chief hears of the
  // growth in its step with worker:0 and regroups.
  worker0->Signal(SIGSTOP);
  cluster.Restart(2);
  cluster.Restart(3);
  const bool grown = chief->WaitForOutput("now rank 0 of 4", 60);
  worker0->Signal(SIGCONT);
  ASSERT_TRUE(grown) << chief->output();
  cluster.ExpectAllSucceed(120);
  EXPECT_EQ(cluster.processes[0].get(), chief);  // the survivors never restarted
  EXPECT_EQ(cluster.processes[1].get(), worker0);
  for (Subprocess* survivor : {chief, worker0}) {
    const std::string out = survivor->output();
    EXPECT_EQ(out.find("exit code 170"), std::string::npos) << out;
    EXPECT_NE(out.find("input re-split"), std::string::npos) << out;
  }
  ExpectSameVariables(FinalVariables(dir + "/ckpt", kElasticSteps), reference, 1e-5f);
  ExpectSameParametersWhereStepsMeet(cluster, dir, kElasticSteps);
  fs::remove_all(dir);
}

// The survivors do not wait forever: with no replacement they give up after
// runPolicy.recoveryTimeoutSeconds with the retryable code, naming the loss.
TEST(SyncTrainingTest, MultiWorkerMirroredSurvivorsGiveUpWhenNoReplacementComes) {
  const std::string dir = FreshTempDir("inplace_timeout");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      absl::StrCat(SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers, 100000000, kCommunication),
                   "  runPolicy: {recoveryTimeoutSeconds: 3}\n"));
  Cluster cluster(job, dir, 3, kSteps);
  ASSERT_TRUE(cluster.processes[3]->WaitForOutput("step 40/", 120)) << cluster.processes[3]->output();
  cluster.processes[3]->Signal(SIGKILL);
  for (size_t i = 0; i < 3; ++i) {
    auto rc = cluster.processes[i]->Wait(20);
    ASSERT_TRUE(rc.has_value()) << cluster.tasks[i] << ":\n" << cluster.processes[i]->output();
    EXPECT_EQ(*rc, 170) << cluster.tasks[i] << ":\n" << cluster.processes[i]->output();
    const std::string out = cluster.processes[i]->output();
    EXPECT_NE(out.find("in-place recovery failed: the group did not re-form"), std::string::npos)
        << cluster.tasks[i] << ":\n" << out;
    EXPECT_NE(out.find("worker:2"), std::string::npos) << out;
  }
  fs::remove_all(dir);
}

// SIGTERM reaches one process only: the whole job still stops after one
// common step, with the chief's final checkpoint at that step.
TEST(SyncTrainingTest, SigtermStopsEveryProcessAfterTheSameStepWithACheckpoint) {
  const std::string dir = FreshTempDir("sigterm");
  const std::string job =
      WriteTextFile(dir + "/job.yaml", SyncJobYaml("MultiWorkerMirrored", kChiefAnd3Workers,
                                                   100000000, kCommunication));
  Cluster cluster(job, dir, 3, kSteps);
  for (size_t i = 0; i < cluster.processes.size(); ++i) {
    ASSERT_TRUE(cluster.processes[i]->WaitForOutput("step 40/", 120))
        << cluster.tasks[i] << ":\n"
        << cluster.processes[i]->output();
  }
  cluster.processes[2]->Signal(SIGTERM);  // worker:1
  for (size_t i = 0; i < cluster.processes.size(); ++i) {
    auto rc = cluster.processes[i]->Wait(30);
    ASSERT_TRUE(rc.has_value()) << cluster.tasks[i] << ":\n" << cluster.processes[i]->output();
    EXPECT_EQ(*rc, 143) << cluster.tasks[i] << ":\n" << cluster.processes[i]->output();
  }
  const auto lines = ReadLines(dir + "/checksums.chief-0.txt");
  ASSERT_FALSE(lines.empty());
  for (size_t i = 1; i < cluster.tasks.size(); ++i) {
    EXPECT_EQ(ReadLines(dir + "/checksums." + cluster.tasks[i] + ".txt"), lines)
        << cluster.tasks[i];
  }
  const std::string last_step = lines.back().substr(0, lines.back().find(' '));
  auto state = CheckpointManager(dir + "/ckpt", 3).RestoreLatest();
  ASSERT_TRUE(state.ok() && state->has_value()) << cluster.processes[0]->output();
  EXPECT_EQ(std::to_string((*state)->step), last_step);
  for (size_t i = 0; i < cluster.processes.size(); ++i) {
    EXPECT_EQ(cluster.processes[i]->output().find("membership:"), std::string::npos)
        << cluster.tasks[i] << " saw a peer fail during a clean stop:\n"
        << cluster.processes[i]->output();
  }
  fs::remove_all(dir);
}

// `distrain run` of the shipped examples: success and the accuracy they promise.
void ExpectExampleSucceeds(const std::string& example) {
  Subprocess run({DistrainBinary(), "run", SourceDir() + "/examples/" + example, "--no-progress"});
  auto rc = run.Wait(120);
  ASSERT_TRUE(rc.has_value()) << example << " did not finish in 120 s:\n" << run.output();
  EXPECT_EQ(*rc, 0) << run.output();
  std::smatch m;
  const std::string out = run.output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(eval accuracy\s+([0-9.]+))"))) << out;
  EXPECT_GE(std::stod(m[1]), 0.95) << out;
}

TEST(SyncTrainingTest, MirroredExampleRunsLocallyToSuccess) {
  ExpectExampleSucceeds("mirrored.yaml");
}

TEST(SyncTrainingTest, MultiWorkerMirroredExampleRunsLocallyToSuccess) {
  ExpectExampleSucceeds("multi-worker-mirrored.yaml");
}

}  // namespace
}  // namespace distrain

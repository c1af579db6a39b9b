#ifndef DISTRAIN_TESTS_INTEGRATION_SYNC_REFERENCE_H_
#define DISTRAIN_TESTS_INTEGRATION_SYNC_REFERENCE_H_

// Test helpers for "synchronous strategy X matches single-process training":
// one small job YAML that every placement shares, the final variables of a
// checkpoint directory, their comparison, and the OneDevice reference run
// (trained once per test binary: the function-local static of an inline
// function is shared by every file that includes this header).
// Factored out of sync_training_test.cc for the CentralStorage test.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/job_credentials.h"
#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"
#include "worker/checkpoint/checkpoint.h"

namespace distrain::testing {

// Steps of the reference run (and of every run compared with it).
inline constexpr int kReferenceSteps = 200;

inline std::string FreshTempDir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() /
               ("distrain_it_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline std::string WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

inline std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One job, many placements. Small enough that 4 processes on a loaded
// 2-core machine finish 200 steps in seconds; Adam, so optimizer slots matter.
inline std::string SyncJobYaml(const std::string& strategy, const std::string& replica_specs,
                               int64_t steps, const std::string& extra_training = "") {
  return absl::StrCat("apiVersion: distrain.io/v1alpha1\n",                                       //
                      "kind: DistributedTrainingJob\n",                                           //
                      "metadata: {name: sync}\n",                                                 //
                      "spec:\n",                                                                  //
                      "  strategy: ", strategy, "\n",                                             //
                      "  replicaSpecs:\n", replica_specs,                                         //
                      "  training:\n",                                                            //
                      "    model: {hiddenUnits: [64, 32]}\n",                                     //
                      "    dataset: {type: synthetic, numExamples: 4096, numEvalExamples: 512,",  //
                      " numFeatures: 48, numClasses: 10, noise: 1.5, autoShardPolicy: DATA}\n",   //
                      "    optimizer: {type: adam, learningRate: 0.002}\n",                       //
                      "    globalBatchSize: 64\n",                                                //
                      "    steps: ", steps, "\n",                                                 //
                      "    logEverySteps: 20\n",                                                  //
                      "    seed: 7\n", extra_training);
}

// The variables ("variables/...") of the newest checkpoint, which must be at `step`.
inline std::map<std::string, Tensor> FinalVariables(const std::string& checkpoint_dir,
                                                    int64_t step = kReferenceSteps) {
  auto state = CheckpointManager(checkpoint_dir, 3).RestoreLatest();
  EXPECT_TRUE(state.ok()) << state.status();
  std::map<std::string, Tensor> out;
  if (!state.ok() || !state->has_value()) {
    ADD_FAILURE() << "no checkpoint in " << checkpoint_dir;
    return out;
  }
  EXPECT_EQ((*state)->step, step);
  for (auto& [name, tensor] : (*state)->tensors) {
    if (name.rfind("variables/", 0) == 0) out.emplace(name, tensor);
  }
  return out;
}

inline void ExpectSameVariables(const std::map<std::string, Tensor>& got,
                                const std::map<std::string, Tensor>& want, float tolerance) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  float overall = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    ASSERT_EQ(it->second.size(), w.size()) << name;
    float worst = 0;
    for (int64_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(it->second[i] - w[i]));
    EXPECT_LE(worst, tolerance) << name << " differs from OneDevice by " << worst;
    overall = std::max(overall, worst);
  }
  std::cout << "max abs difference from OneDevice: " << overall << "\n";
}

// The processes of a chief + N workers job, started with their own TF_CONFIG
// the way the operator starts pods.
struct SyncCluster {
  std::vector<std::string> tasks;  // "chief-0", "worker-0", ...
  std::vector<std::string> addresses;
  std::vector<int> metrics_ports;
  std::vector<std::unique_ptr<Subprocess>> processes;
  int64_t steps;  // of the job: one checksum line each
  TestJobCredentials credentials;

  SyncCluster(const std::string& job, const std::string& dir, int workers, int64_t steps)
      : steps(steps), credentials(dir) {
    const int n = workers + 1;
    std::vector<int> ports = testing::FreeLoopbackPorts(2 * n);
    std::string worker_list;
    for (int i = 0; i < n; ++i) {
      addresses.push_back("127.0.0.1:" + std::to_string(ports[i]));
      metrics_ports.push_back(ports[n + i]);
      if (i > 0) worker_list += std::string(i > 1 ? "," : "") + "\"" + addresses[i] + "\"";
    }
    const std::string cluster =
        R"({"chief":[")" + addresses[0] + R"("],"worker":[)" + worker_list + "]}";
    for (int i = 0; i < n; ++i) {
      const std::string type = i == 0 ? "chief" : "worker";
      const int index = i == 0 ? 0 : i - 1;
      tasks.push_back(type + "-" + std::to_string(index));
      const std::string tf_config = R"({"cluster":)" + cluster + R"(,"task":{"type":")" + type +
                                    R"(","index":)" + std::to_string(index) + "}}";
      // Only the chief's directory is shared with later runs, as in
      // Kubernetes where the other pods may have no volume at all.
      argvs.push_back({WorkerBinary(), "--config", job, "--tf-config", tf_config,
                       "--checkpoint-dir", dir + (i == 0 ? "/ckpt" : "/ckpt-" + tasks[i]),
                       "--metrics-port", std::to_string(metrics_ports[i])});
      envs.push_back({{"OPENBLAS_NUM_THREADS", "1"},
                      {"DISTRAIN_CREDENTIALS_DIR", credentials.DirFor(type, index)},
                      {"DISTRAIN_PARAM_CHECKSUM_FILE", dir + "/checksums.{task}.txt"}});
      processes.push_back(std::make_unique<Subprocess>(argvs.back(), envs.back()));
    }
  }

  // Starts process i again as it was started (a replacement pod), keeping the
  // output of the one it replaces in `replaced`.
  void Restart(size_t i) {
    replaced.push_back(tasks[i] + ":\n" + processes[i]->output());
    processes[i] = std::make_unique<Subprocess>(argvs[i], envs[i]);
  }
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::map<std::string, std::string>> envs;
  std::vector<std::string> replaced;

  void ExpectAllSucceed(double seconds) {
    for (size_t i = 0; i < processes.size(); ++i) {
      auto rc = processes[i]->Wait(seconds);
      ASSERT_TRUE(rc.has_value()) << tasks[i] << " did not finish:\n" << processes[i]->output();
      EXPECT_EQ(*rc, 0) << tasks[i] << ":\n" << processes[i]->output();
    }
  }

  // Every process held the same parameters after every step (the job must
  // run with DISTRAIN_PARAM_CHECKSUM_FILE, as the constructor sets it).
  void ExpectIdenticalChecksums(const std::string& dir) {
    const auto chief = ReadLines(dir + "/checksums.chief-0.txt");
    ASSERT_EQ(chief.size(), static_cast<size_t>(steps));
    EXPECT_EQ(chief.front().substr(0, 2), "1 ");
    for (size_t i = 1; i < tasks.size(); ++i) {
      EXPECT_EQ(ReadLines(dir + "/checksums." + tasks[i] + ".txt"), chief)
          << tasks[i] << " diverged from the chief";
    }
  }
};

// OneDevice on SyncJobYaml's job for `steps` (kReferenceSteps unless a test
// needs a longer job), trained once per test binary and step count.
inline const std::map<std::string, Tensor>& OneDeviceReference(int steps = kReferenceSteps) {
  static std::map<int, std::map<std::string, Tensor>>* references =
      new std::map<int, std::map<std::string, Tensor>>();
  auto it = references->find(steps);
  if (it != references->end()) return it->second;
  const std::string dir = FreshTempDir("onedevice_reference");
  const std::string job = WriteTextFile(
      dir + "/job.yaml", SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n", steps));
  Subprocess worker({WorkerBinary(), "--config", job, "--checkpoint-dir", dir + "/ckpt"},
                    {{"OPENBLAS_NUM_THREADS", "1"}});
  auto rc = worker.Wait(120);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << worker.output();
  auto& vars = (*references)[steps];
  vars = FinalVariables(dir + "/ckpt", steps);
  std::filesystem::remove_all(dir);
  return vars;
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_SYNC_REFERENCE_H_

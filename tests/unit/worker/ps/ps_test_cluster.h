#ifndef DISTRAIN_TESTS_UNIT_WORKER_PS_PS_TEST_CLUSTER_H_
#define DISTRAIN_TESTS_UNIT_WORKER_PS_PS_TEST_CLUSTER_H_

// In-process ps tasks on free loopback ports, and a client for them.

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/ps/partitioner.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_service.h"

namespace distrain::testing_ps {

inline OptimizerConfig MakeOptimizerConfig(OptimizerType type, float lr = 0.05f) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  return c;
}

struct PsTestCluster {
  // Starts `num_ps` servers sharing `options` (task_index/num_ps are filled in).
  explicit PsTestCluster(int num_ps, PsServiceOptions options = {}) {
    for (int t = 0; t < num_ps; ++t) {
      PsServiceOptions o = options;
      o.task_index = t;
      o.num_ps = num_ps;
      absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start("127.0.0.1:0", o);
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) servers.push_back(std::move(*s));
    }
  }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> out;
    for (const auto& s : servers) out.push_back(s->address());
    return out;
  }
  // A client with the plan already declared on the servers.
  std::unique_ptr<PsClient> Client(const ShardingPlan& plan, PsClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Create(Addresses(), plan, options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    absl::Status s = (*c)->WaitForReady();
    EXPECT_TRUE(s.ok()) << s;
    s = (*c)->CreateVariables();
    EXPECT_TRUE(s.ok()) << s;
    return std::move(*c);
  }
  std::vector<std::unique_ptr<PsServer>> servers;
};

// Deterministic, distinct values: a cheap LCG in [-1, 1).
inline Tensor Pattern(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = static_cast<float>(x >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  return t;
}

// A fresh directory under the system temp dir, removed with its contents
// when the object goes away.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("distrain_ps_" + name + "_" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove_all(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace distrain::testing_ps

#endif  // DISTRAIN_TESTS_UNIT_WORKER_PS_PS_TEST_CLUSTER_H_

#ifndef DISTRAIN_TESTS_KUBE_KUBE_TEST_UTIL_H_
#define DISTRAIN_TESTS_KUBE_KUBE_TEST_UTIL_H_

// Helpers shared by the kube-tier tests (tests/kube/*_test.cc), which run
// through tests/kube/with_control_plane.sh against the real API server:
// an admin client, the control plane's kubectl, a namespace per test, polling
// with a deadline, and a running distrain-operator.

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/paths.h"
#include "operator/kube/rest_client.h"
#include "tests/integration/loopback_http.h"
#include "tests/integration/subprocess.h"

namespace distrain::kubetest {

inline std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// A client as cluster admin (KUBECONFIG from with_control_plane.sh).
inline std::unique_ptr<kube::RestClient> AdminClient(kube::RestClientOptions options = {}) {
  auto config = kube::LoadRestConfig({});
  if (!config.ok()) {
    ADD_FAILURE() << "run through tests/kube/with_control_plane.sh (KUBECONFIG): " << config.status();
    return nullptr;
  }
  if (options.qps == kube::RestClientOptions{}.qps) {
    options.qps = 200;
    options.burst = 400;
  }
  auto client = kube::RestClient::Create(*config, std::move(options));
  if (!client.ok()) {
    ADD_FAILURE() << client.status();
    return nullptr;
  }
  return std::move(*client);
}

// Runs a shell command; returns its exit code and merged output.
inline int Shell(const std::string& cmd, std::string* out) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  out->clear();
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out->append(buf.data(), n);
  int rc = pclose(pipe);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

inline std::string KubectlPath() { return Env("DISTRAIN_KUBE_BINDIR") + "/kubectl"; }

// kubectl as admin; a non-zero exit fails the test (use Shell to expect one).
inline std::string Kubectl(const std::string& args) {
  std::string out;
  int rc = Shell(KubectlPath() + " --kubeconfig=" + Env("KUBECONFIG") + " " + args, &out);
  EXPECT_EQ(rc, 0) << "kubectl " << args << "\n" << out;
  return out;
}

// A namespace for one test, deleted (without waiting) at the end.
class TestNamespace {
 public:
  TestNamespace(kube::Client& client, const std::string& prefix) : client_(client) {
    std::random_device rd;
    name_ = prefix + "-" + std::to_string(rd() % 1000000);
    nlohmann::json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name_}}}};
    auto created = client_.Request("POST", kube::ResourcePath(kube::NamespacesResource()), &ns);
    EXPECT_TRUE(created.ok() && created->ok())
        << (created.ok() ? created->message() : std::string(created.status().message()));
    // Pods cannot be created before the controller manager has made the
    // namespace's default ServiceAccount (slow right after an API-server
    // restart); wait for it so tests do not race it.
    const std::string sa = kube::ResourcePath({"", "v1", "serviceaccounts", true}, name_, "default");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = client_.Request("GET", sa);
      if (r.ok() && r->ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~TestNamespace() { (void)client_.Request("DELETE", kube::ResourcePath(kube::NamespacesResource(), "", name_)); }
  const std::string& name() const { return name_; }

 private:
  kube::Client& client_;
  std::string name_;
};

// Polls `done` every 50 ms until it returns true or `seconds` pass.
inline bool WaitUntil(const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

inline std::string OperatorBinary() { return std::string(DISTRAIN_BINARY_DIR) + "/operator/distrain-operator"; }

// A distrain-operator process on free loopback ports, watching `namespace_name`.
class OperatorProcess {
 public:
  explicit OperatorProcess(const std::string& namespace_name, std::vector<std::string> extra_args = {},
                           std::map<std::string, std::string> env = {}) {
    std::vector<int> ports = testing::FreeLoopbackPorts(2);
    metrics_port_ = ports[0];
    health_port_ = ports[1];
    std::vector<std::string> argv = {OperatorBinary(),
                                     "--namespaces=" + namespace_name,
                                     "--metrics-bind-address=127.0.0.1:" + std::to_string(metrics_port_),
                                     "--health-probe-bind-address=127.0.0.1:" + std::to_string(health_port_)};
    auto given = [&](const char* flag) {
      for (const std::string& a : extra_args) {
        if (a.rfind(flag, 0) == 0) return true;
      }
      return false;
    };
    if (!given("--kubeconfig")) argv.push_back("--kubeconfig=" + Env("KUBECONFIG"));
    if (!given("--kube-api-qps")) argv.push_back("--kube-api-qps=500");
    if (!given("--kube-api-burst")) argv.push_back("--kube-api-burst=1000");
    for (std::string& a : extra_args) argv.push_back(std::move(a));
    process_ = std::make_unique<testing::Subprocess>(argv, std::move(env));
  }
  testing::Subprocess& process() { return *process_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }
  std::string Metrics() { return testing::HttpGet(metrics_port_, "/metrics"); }
  bool Ready() { return testing::HttpGet(health_port_, "/readyz").find(" 200 ") != std::string::npos; }

 private:
  int metrics_port_ = 0;
  int health_port_ = 0;
  std::unique_ptr<testing::Subprocess> process_;
};

}  // namespace distrain::kubetest

#endif  // DISTRAIN_TESTS_KUBE_KUBE_TEST_UTIL_H_

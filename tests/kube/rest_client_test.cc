// RestClient against the real API server of scripts/control-plane.sh (run via
// tests/kube/with_control_plane.sh, which exports KUBECONFIG and
// DISTRAIN_KUBE_BINDIR). Every test works in a namespace of its own.

#include "operator/kube/rest_client.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/clock.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/paths.h"
#include "prometheus/registry.h"
#include "tests/kube/kube_test_util.h"

namespace distrain::kube {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using kubetest::Env;
using kubetest::Kubectl;
using kubetest::TestNamespace;

RestConfig AdminConfig() {
  auto config = LoadRestConfig({});
  if (!config.ok()) {
    ADD_FAILURE() << "run through tests/kube/with_control_plane.sh (KUBECONFIG): "
                  << config.status();
    return {};
  }
  return *config;
}

std::unique_ptr<RestClient> MakeClient(const RestConfig& config, RestClientOptions options = {}) {
  auto client = RestClient::Create(config, std::move(options));
  if (!client.ok()) {
    ADD_FAILURE() << client.status();
    return nullptr;
  }
  return std::move(*client);
}

nlohmann::json ConfigMap(const std::string& ns, const std::string& name, const std::string& value) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "kubea"}}}}},
          {"data", {{"k", value}}}};
}

class RestClientKubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    admin_config_ = AdminConfig();
    client_ = MakeClient(admin_config_);
    ASSERT_NE(client_, nullptr);
    ns_ = std::make_unique<TestNamespace>(*client_, "kubea-rc");
  }
  void TearDown() override { ns_.reset(); }

  std::string CmPath(const std::string& name = "") {
    return ResourcePath(ConfigMapsResource(), ns_->name(), name);
  }

  RestConfig admin_config_;
  std::unique_ptr<RestClient> client_;
  std::unique_ptr<TestNamespace> ns_;
};

TEST_F(RestClientKubeTest, ConfigMapCrudRoundTrip) {
  nlohmann::json cm = ConfigMap(ns_->name(), "cm", "v1");
  auto created = client_->Request("POST", CmPath(), &cm);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->status_code, 201) << created->message();
  EXPECT_FALSE(ResourceVersionOf(created->body).empty());

  auto got = client_->Request("GET", CmPath("cm"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->ok());
  EXPECT_EQ(got->body["data"]["k"], "v1");

  nlohmann::json updated = got->body;
  updated["data"]["k"] = "v2";
  auto put = client_->Request("PUT", CmPath("cm"), &updated);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_EQ(put->status_code, 200) << put->message();
  EXPECT_EQ(put->body["data"]["k"], "v2");

  nlohmann::json patch = {{"data", {{"extra", "x"}}}};
  auto patched = client_->Request("PATCH", CmPath("cm"), &patch, "application/merge-patch+json");
  ASSERT_TRUE(patched.ok()) << patched.status();
  ASSERT_EQ(patched->status_code, 200) << patched->message();
  EXPECT_EQ(patched->body["data"]["extra"], "x");
  EXPECT_EQ(patched->body["data"]["k"], "v2");

  ListOptions by_label;
  by_label.label_selector = "app=kubea";
  auto listed = client_->Request("GET", WithQuery(CmPath(), by_label));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_TRUE(listed->ok());
  ASSERT_EQ(listed->body["items"].size(), 1u);
  EXPECT_EQ(listed->body["items"][0]["metadata"]["name"], "cm");

  auto deleted = client_->Request("DELETE", CmPath("cm"));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(deleted->ok()) << deleted->message();
  auto gone = client_->Request("GET", CmPath("cm"));
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(gone->not_found());
  EXPECT_THAT(gone->message(), HasSubstr("not found"));
}

TEST_F(RestClientKubeTest, ConflictsSurfaceAs409) {
  nlohmann::json cm = ConfigMap(ns_->name(), "dup", "v1");
  auto first = client_->Request("POST", CmPath(), &cm);
  ASSERT_TRUE(first.ok() && first->ok());
  auto second = client_->Request("POST", CmPath(), &cm);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->conflict());
  EXPECT_EQ(second->body["reason"], "AlreadyExists");

  // An update carrying a stale resourceVersion is a 409 Conflict too.
  nlohmann::json stale = first->body;
  stale["data"]["k"] = "v2";
  auto ok = client_->Request("PUT", CmPath("dup"), &stale);
  ASSERT_TRUE(ok.ok() && ok->ok());
  stale["data"]["k"] = "v3";
  auto conflict = client_->Request("PUT", CmPath("dup"), &stale);
  ASSERT_TRUE(conflict.ok()) << conflict.status();
  EXPECT_TRUE(conflict->conflict());
  EXPECT_EQ(conflict->body["reason"], "Conflict");
}

TEST_F(RestClientKubeTest, StatusOnlyRequestsSkipSuccessBodiesButExplainErrors) {
  nlohmann::json cm = ConfigMap(ns_->name(), "quiet", "v1");
  auto created = client_->RequestStatusOnly("POST", CmPath(), &cm);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->status_code, 201) << created->message();
  EXPECT_TRUE(created->body.is_null());  // not parsed
  auto again = client_->RequestStatusOnly("POST", CmPath(), &cm);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->conflict());
  EXPECT_EQ(again->body["reason"], "AlreadyExists");  // errors are parsed
  auto got = client_->Request("GET", CmPath("quiet"));
  ASSERT_TRUE(got.ok() && got->ok());
  EXPECT_EQ(got->body["data"]["k"], "v1");  // it was created
}

// The asynchronous form answers as the blocking one does, on another thread,
// with many requests in flight at once and the body free to go once sent.
TEST_F(RestClientKubeTest, AsyncStatusOnlyRequestsAnswerLikeBlockingOnes) {
  constexpr int kConfigMaps = 40;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::StatusOr<ApiResponse>> answers;
  std::set<std::thread::id> threads;
  auto send = [&](const nlohmann::json& cm) {
    client_->RequestStatusOnlyAsync("POST", CmPath(), &cm, [&](absl::StatusOr<ApiResponse> r) {
      std::lock_guard<std::mutex> lock(mu);
      answers.push_back(std::move(r));
      threads.insert(std::this_thread::get_id());
      cv.notify_all();
    });
  };
  for (int i = 0; i < kConfigMaps; ++i) {
    send(ConfigMap(ns_->name(), "async-" + std::to_string(i), "v"));  // a temporary
  }
  send(ConfigMap(ns_->name(), "async-0", "v"));  // already there
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                            [&] { return answers.size() == kConfigMaps + 1; }));
    EXPECT_FALSE(threads.count(std::this_thread::get_id())) << "done ran on the caller";
  }
  int created = 0, conflicts = 0;
  for (const auto& a : answers) {
    ASSERT_TRUE(a.ok()) << a.status();
    if (a->status_code == 201) {
      ++created;
      EXPECT_TRUE(a->body.is_null());
    }
    if (a->conflict()) {
      ++conflicts;
      EXPECT_EQ(a->body["reason"], "AlreadyExists");  // errors are parsed
    }
  }
  EXPECT_EQ(created, kConfigMaps);
  EXPECT_EQ(conflicts, 1);
  auto list = client_->Request("GET", CmPath());
  ASSERT_TRUE(list.ok() && list->ok());
  int listed = 0;
  for (const auto& item : list->body["items"]) {
    if (item["metadata"]["name"].get<std::string>().rfind("async-", 0) == 0) ++listed;
  }
  EXPECT_EQ(listed, kConfigMaps);
}

TEST_F(RestClientKubeTest, ClientCertificateIdentifiesTheAdmin) {
  // The control plane's admin kubeconfig authenticates with a client certificate.
  ASSERT_FALSE(admin_config_.client_cert_pem.empty());
  ASSERT_TRUE(admin_config_.bearer_token.empty());
  nlohmann::json review = {{"apiVersion", "authentication.k8s.io/v1"},
                           {"kind", "SelfSubjectReview"}};
  auto who = client_->Request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", &review);
  ASSERT_TRUE(who.ok()) << who.status();
  ASSERT_TRUE(who->ok()) << who->message();
  EXPECT_EQ(who->body["status"]["userInfo"]["username"], "distrain-admin");
}

TEST_F(RestClientKubeTest, ServiceAccountTokenAuthenticatesAndRbacDenialIs403) {
  Kubectl("create serviceaccount bot -n " + ns_->name());
  std::string token = Kubectl("create token bot --duration=10m -n " + ns_->name());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  ASSERT_FALSE(token.empty());

  RestConfig as_bot;
  as_bot.server = admin_config_.server;
  as_bot.ca_pem = admin_config_.ca_pem;
  as_bot.bearer_token = token;
  as_bot.source = "test ServiceAccount bot";
  auto bot = MakeClient(as_bot);
  ASSERT_NE(bot, nullptr);

  nlohmann::json review = {{"apiVersion", "authentication.k8s.io/v1"},
                           {"kind", "SelfSubjectReview"}};
  auto who = bot->Request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", &review);
  ASSERT_TRUE(who.ok()) << who.status();
  ASSERT_TRUE(who->ok()) << who->message();
  EXPECT_EQ(who->body["status"]["userInfo"]["username"],
            "system:serviceaccount:" + ns_->name() + ":bot");

  // No RBAC binding: listing pods is forbidden, and that is an answer, not an error.
  auto pods = bot->Request("GET", ResourcePath(PodsResource(), ns_->name()));
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ(pods->status_code, 403);
  EXPECT_THAT(pods->message(), HasSubstr("forbidden"));
}

TEST_F(RestClientKubeTest, TokenFileIsReReadAfterTheRefreshInterval) {
  Kubectl("create serviceaccount rotor -n " + ns_->name());
  std::string token = Kubectl("create token rotor --duration=10m -n " + ns_->name());
  while (!token.empty() && token.back() == '\n') token.pop_back();
  fs::path file = fs::temp_directory_path() / ("kubea-token-" + std::to_string(::getpid()));
  std::ofstream(file) << "not-a-valid-token\n";

  FakeClock clock;
  RestConfig config;
  config.server = admin_config_.server;
  config.ca_pem = admin_config_.ca_pem;
  config.bearer_token_file = file.string();
  RestClientOptions options;
  options.clock = &clock;
  options.qps = 0;  // the fake clock would never refill the bucket
  auto client = MakeClient(config, options);
  ASSERT_NE(client, nullptr);
  const std::string review_path = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
  nlohmann::json review = {{"apiVersion", "authentication.k8s.io/v1"},
                           {"kind", "SelfSubjectReview"}};

  auto before = client->Request("POST", review_path, &review);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->status_code, 401);

  std::ofstream(file) << token << "\n";  // the kubelet rotates the projected token
  auto cached = client->Request("POST", review_path, &review);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->status_code, 401) << "the file is re-read once a minute, not per request";

  clock.Advance(absl::Seconds(61));
  auto after = client->Request("POST", review_path, &review);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->status_code, 201) << after->message();
  fs::remove(file);
}

TEST_F(RestClientKubeTest, UntrustedCaAndWrongHostNameFailTls) {
  RestClientOptions no_retries;
  no_retries.max_retries = 0;
  // A real CA of the control plane, but not the one that signed the API server's certificate.
  RestConfig wrong_ca = admin_config_;
  std::ifstream in(fs::path(Env("KUBECONFIG")).parent_path() / "pki" / "front-proxy-ca.crt");
  std::stringstream pem;
  pem << in.rdbuf();
  ASSERT_FALSE(pem.str().empty());
  wrong_ca.ca_pem = pem.str();
  auto untrusting = MakeClient(wrong_ca, no_retries);
  ASSERT_NE(untrusting, nullptr);
  auto r = untrusting->Request("GET", "/version");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(wrong_ca.server));

  // The right CA, but a host name the certificate does not list: "127.1" reaches
  // 127.0.0.1, yet the certificate names only IP 127.0.0.1 and localhost.
  RestConfig wrong_name = admin_config_;
  std::string port = admin_config_.server.substr(admin_config_.server.rfind(':'));
  wrong_name.server = "https://127.1" + port;
  auto mismatched = MakeClient(wrong_name, no_retries);
  ASSERT_NE(mismatched, nullptr);
  auto m = mismatched->Request("GET", "/version");
  ASSERT_FALSE(m.ok()) << "connected although the certificate does not name 127.1";

  // ...while "localhost", which it lists, works.
  RestConfig by_name = admin_config_;
  by_name.server = "https://localhost" + port;
  auto named = MakeClient(by_name, no_retries);
  ASSERT_NE(named, nullptr);
  auto n = named->Request("GET", "/version");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->ok());
}

TEST_F(RestClientKubeTest, WatchDeliversEventsInOrderAndStopsPromptly) {
  // Only our ConfigMaps: the controller manager adds kube-root-ca.crt to every
  // new namespace whenever it gets to it.
  ListOptions by_label;
  by_label.label_selector = "app=kubea";
  auto list = client_->Request("GET", WithQuery(CmPath(), by_label));
  ASSERT_TRUE(list.ok() && list->ok());
  ListOptions watch = by_label;
  watch.watch = true;
  watch.resource_version = list->body["metadata"]["resourceVersion"].get<std::string>();
  watch.timeout_seconds = 60;

  std::mutex mu;
  std::vector<std::string> seen;
  std::stop_source stop;
  absl::Status watch_status;
  std::thread watcher([&] {
    watch_status = client_->Watch(
        WithQuery(CmPath(), watch),
        [&](const WatchEvent& e) {
          std::lock_guard lock(mu);
          seen.push_back(e.type + " " + e.object["metadata"].value("name", "") + " " +
                         e.object.value("data", nlohmann::json::object()).value("k", ""));
          return true;
        },
        stop.get_token());
  });
  nlohmann::json cm = ConfigMap(ns_->name(), "w", "1");
  ASSERT_TRUE(client_->Request("POST", CmPath(), &cm)->ok());
  nlohmann::json patch = {{"data", {{"k", "2"}}}};
  ASSERT_TRUE(client_->Request("PATCH", CmPath("w"), &patch, "application/merge-patch+json")->ok());
  ASSERT_TRUE(client_->Request("DELETE", CmPath("w"))->ok());

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(mu);
      if (seen.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto stop_at = std::chrono::steady_clock::now();
  stop.request_stop();
  watcher.join();
  EXPECT_LT(std::chrono::steady_clock::now() - stop_at, std::chrono::seconds(2))
      << "Watch did not honour the stop promptly";
  EXPECT_TRUE(watch_status.ok()) << watch_status;
  std::lock_guard lock(mu);
  EXPECT_THAT(seen, ::testing::ElementsAre("ADDED w 1", "MODIFIED w 2", "DELETED w 2"));
}

// A watch answered 410 Gone is covered by tests/kube/informer_test.cc, which
// can force one (it restarts the API server).

TEST_F(RestClientKubeTest, NonSuccessAnswerToAWatchIsAnErrorEvent) {
  ListOptions watch;
  watch.watch = true;
  std::vector<WatchEvent> events;
  absl::Status st = client_->Watch(
      WithQuery("/api/v1/namespaces/" + ns_->name() + "/nosuchresources", watch),
      [&](const WatchEvent& e) {
        events.push_back(e);
        return true;
      },
      std::stop_token());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "ERROR");
  EXPECT_EQ(events[0].object["kind"], "Status");
  EXPECT_EQ(events[0].object["code"], 404);
}

TEST_F(RestClientKubeTest, RequestsArePacedByQpsAndBurst) {
  RestClientOptions options;
  options.qps = 10;
  options.burst = 2;
  auto paced = MakeClient(admin_config_, options);
  ASSERT_NE(paced, nullptr);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(paced->Request("GET", CmPath()).ok());
  // 2 from the burst, then 5 more at 10/s: at least 0.5 s.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(480));
}

TEST_F(RestClientKubeTest, MetricsCountRequestsByCodeAndMethod) {
  RestClientOptions options;
  options.registry = std::make_shared<prometheus::Registry>();
  auto client = MakeClient(admin_config_, options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Request("GET", CmPath("missing"))->not_found());
  ASSERT_TRUE(client->Request("GET", CmPath("missing"))->not_found());
  ASSERT_TRUE(client->Request("GET", CmPath())->ok());
  std::map<std::string, double> counts;
  uint64_t latency_samples = 0;
  for (const auto& family : options.registry->Collect()) {
    for (const auto& metric : family.metric) {
      std::string labels;
      for (const auto& label : metric.label) labels += label.name + "=" + label.value + ",";
      if (family.name == "rest_client_requests_total") counts[labels] = metric.counter.value;
      if (family.name == "rest_client_request_duration_seconds") {
        latency_samples += metric.histogram.sample_count;
      }
    }
  }
  EXPECT_EQ(counts["code=404,method=GET,"], 2);
  EXPECT_EQ(counts["code=200,method=GET,"], 1);
  EXPECT_EQ(latency_samples, 3u);
}

}  // namespace
}  // namespace distrain::kube

// Informer against the real API server of scripts/control-plane.sh (run via
// tests/kube/with_control_plane.sh). Every test works in a namespace of its own.
//
// Forcing 410 Gone: a young API server's watch cache still holds every event
// since it started, so an old resourceVersion alone is not enough. Restarting
// kube-apiserver re-initialises the watch cache at etcd's current revision;
// a write the informer does not see (an unlabelled ConfigMap) first moves that
// revision past the informer's resourceVersion, so its re-watch is answered
// 410 Expired ("too old resource version") — checked directly with a raw watch
// from the same resourceVersion, and through the informer's relist counter.

#include "operator/kube/informer.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/paths.h"
#include "operator/kube/rest_client.h"
#include "tests/kube/kube_test_util.h"

namespace distrain::kube {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAreArray;
using kubetest::AdminClient;
using kubetest::Env;
using kubetest::TestNamespace;
using kubetest::WaitUntil;

Json ConfigMap(const std::string& ns, const std::string& name, const std::string& value,
               bool labelled = true) {
  Json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", name}, {"namespace", ns}}},
             {"data", {{"k", value}}}};
  if (labelled) cm["metadata"]["labels"] = {{"app", "kubea"}, {"tier", value}};
  return cm;
}

// Handler calls as "add NAME", "update NAME K", "delete NAME".
struct Recorder {
  std::mutex mu;
  std::vector<std::string> calls;
  ResourceEventHandlers Handlers() {
    auto name = [](const Json& o) { return o["metadata"]["name"].get<std::string>(); };
    return {.on_add = [this, name](const Json& o) { Push("add " + name(o)); },
            .on_update =
                [this, name](const Json&, const Json& o) {
                  Push("update " + name(o) + " " + o["data"].value("k", ""));
                },
            .on_delete = [this, name](const Json& o) { Push("delete " + name(o)); }};
  }
  void Push(std::string s) {
    std::lock_guard lock(mu);
    calls.push_back(std::move(s));
  }
  bool Saw(const std::string& call) {
    std::lock_guard lock(mu);
    return std::find(calls.begin(), calls.end(), call) != calls.end();
  }
};

class InformerKubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RestClientOptions options;
    options.qps = 0;
    options.max_retries = 10;  // ride out the API server restart
    client_ = AdminClient(options);
    ASSERT_NE(client_, nullptr);
    namespace_ = std::make_unique<TestNamespace>(*client_, "kubea-inf");
    ns_ = namespace_->name();
  }
  void TearDown() override { namespace_.reset(); }

  void Create(const Json& cm) {
    auto r = client_->Request("POST", ResourcePath(ConfigMapsResource(), ns_), &cm);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok()) << r->message();
  }

  InformerOptions Options() {
    InformerOptions options;
    options.resource = ConfigMapsResource();
    options.namespace_name = ns_;
    options.label_selector = "app=kubea";
    options.page_size = 2;  // the real server's pagination, with 3+ objects
    options.initial_backoff = std::chrono::milliseconds(100);
    options.max_backoff = std::chrono::milliseconds(1000);
    return options;
  }

  // The cache holds exactly what a LIST returns: same keys, same resourceVersions.
  void ExpectCacheMatchesList(const Informer& informer) {
    ListOptions list;
    list.label_selector = "app=kubea";
    auto r = client_->Request("GET", WithQuery(ResourcePath(ConfigMapsResource(), ns_), list));
    ASSERT_TRUE(r.ok() && r->ok());
    std::vector<std::string> expected;
    for (const auto& item : r->body["items"]) {
      expected.push_back(ObjectKey(item) + "@" + ResourceVersionOf(item));
    }
    std::sort(expected.begin(), expected.end());
    ASSERT_TRUE(WaitUntil([&] {
      std::vector<std::string> cached;
      for (const auto& object : informer.List()) {
        cached.push_back(ObjectKey(object) + "@" + ResourceVersionOf(object));
      }
      std::sort(cached.begin(), cached.end());
      return cached == expected;
    }, 20)) << "cache never matched the LIST";
  }

  std::unique_ptr<RestClient> client_;
  std::unique_ptr<TestNamespace> namespace_;
  std::string ns_;
};

TEST_F(InformerKubeTest, SeesAddsUpdatesDeletesAndMatchesList) {
  for (const char* name : {"a", "b", "c"}) Create(ConfigMap(ns_, name, "v1"));
  Create(ConfigMap(ns_, "unlabelled", "v1", /*labelled=*/false));

  Informer informer(client_.get(), Options());
  informer.AddLabelIndex("tier");
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
  EXPECT_THAT(informer.Keys(), ElementsAreArray({ns_ + "/a", ns_ + "/b", ns_ + "/c"}));
  EXPECT_EQ(informer.Get(ns_, "a")->value("kind", ""), "ConfigMap");

  Create(ConfigMap(ns_, "d", "v1"));
  Json patch = {{"data", {{"k", "v2"}}}, {"metadata", {{"labels", {{"tier", "v2"}}}}}};
  auto patched = client_->Request("PATCH", ResourcePath(ConfigMapsResource(), ns_, "a"), &patch,
                                  "application/merge-patch+json");
  ASSERT_TRUE(patched.ok() && patched->ok());
  auto deleted = client_->Request("DELETE", ResourcePath(ConfigMapsResource(), ns_, "b"));
  ASSERT_TRUE(deleted.ok() && deleted->ok());

  ASSERT_TRUE(WaitUntil([&] {
    return rec.Saw("add d") && rec.Saw("update a v2") && rec.Saw("delete b");
  }, 20));
  EXPECT_EQ(informer.ByIndex("tier", "v2").size(), 1u);
  EXPECT_EQ(informer.ByIndex("tier", "v1").size(), 2u);  // c and d
  ExpectCacheMatchesList(informer);
  EXPECT_EQ(informer.stats().lists, 1);
  informer.Stop();
}

TEST_F(InformerKubeTest, SurvivesApiServerRestartAndRelistsOn410) {
  const std::string control_plane = Env("DISTRAIN_CONTROL_PLANE");
  ASSERT_FALSE(control_plane.empty()) << "run through tests/kube/with_control_plane.sh";
  Create(ConfigMap(ns_, "before", "v1"));
  Informer informer(client_.get(), Options());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
  ASSERT_TRUE(WaitUntil([&] { return informer.stats().watches >= 1; }, 20));
  const std::string old_rv = informer.LastResourceVersion();

  // A write the informer does not see moves etcd's revision past old_rv.
  Create(ConfigMap(ns_, "unseen", "v1", /*labelled=*/false));
  ASSERT_EQ(std::system((control_plane + " restart kube-apiserver >/dev/null 2>&1").c_str()), 0);

  // The server itself answers 410 for a watch from old_rv (while its watch
  // cache initialises it may answer 429 first).
  int code = 0;
  ASSERT_TRUE(WaitUntil([&] {
    ListOptions watch;
    watch.watch = true;
    watch.resource_version = old_rv;
    watch.timeout_seconds = 1;
    code = 0;
    (void)client_->Watch(
        WithQuery(ResourcePath(ConfigMapsResource(), ns_), watch),
        [&](const WatchEvent& e) {
          if (e.type == "ERROR") code = e.object.value("code", 0);
          return false;
        },
        {});
    return code == 410;
  }, 20)) << "last ERROR code " << code;

  // The informer relisted because of it, and keeps working.
  ASSERT_TRUE(WaitUntil([&] { return informer.stats().relists_after_gone >= 1; }, 20))
      << "watch errors " << informer.stats().watch_errors << ", lists " << informer.stats().lists;
  Create(ConfigMap(ns_, "after", "v1"));
  auto deleted = client_->Request("DELETE", ResourcePath(ConfigMapsResource(), ns_, "before"));
  ASSERT_TRUE(deleted.ok() && deleted->ok());
  ASSERT_TRUE(WaitUntil([&] { return rec.Saw("add after") && rec.Saw("delete before"); }, 20));
  EXPECT_FALSE(informer.Get(ns_, "unseen").has_value());
  ExpectCacheMatchesList(informer);
  informer.Stop();
}

}  // namespace
}  // namespace distrain::kube

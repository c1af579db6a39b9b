// Informer logic against a scripted Client double (client.h allows one for
// unit tests; the real API server is exercised by tests/kube/informer_test.cc).

#include "operator/kube/informer.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Answers Request() and Watch() from scripts, in order, and records the paths.
// A Watch() with no script left blocks until stopped, like an idle stream.
class ScriptedClient : public Client {
 public:
  struct WatchScript {
    std::vector<WatchEvent> events;
    absl::Status end;
  };

  void AddResponse(ApiResponse r) {
    std::lock_guard lock(mu_);
    responses_.push_back(std::move(r));
  }
  void AddWatch(WatchScript s) {
    std::lock_guard lock(mu_);
    watches_.push_back(std::move(s));
    cv_.notify_all();
  }
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return request_paths_;
  }
  std::vector<std::string> watch_paths() {
    std::lock_guard lock(mu_);
    return watch_paths_;
  }

  absl::StatusOr<ApiResponse> Request(std::string_view method, std::string_view path,
                                      const Json*, std::string_view) override {
    std::lock_guard lock(mu_);
    request_paths_.push_back(std::string(method) + " " + std::string(path));
    if (responses_.empty()) return absl::UnavailableError("script exhausted");
    ApiResponse r = std::move(responses_.front());
    responses_.pop_front();
    return r;
  }

  absl::Status Watch(std::string_view path, const std::function<bool(const WatchEvent&)>& on_event,
                     std::stop_token stop) override {
    WatchScript script;
    {
      std::unique_lock lock(mu_);
      watch_paths_.push_back(std::string(path));
      // Idle until a script arrives or the watch is stopped.
      if (!cv_.wait(lock, stop, [&] { return !watches_.empty(); })) return absl::OkStatus();
      script = std::move(watches_.front());
      watches_.pop_front();
    }
    for (const auto& e : script.events) {
      if (!on_event(e)) return absl::OkStatus();
    }
    return script.end;
  }

  std::string server() const override { return "scripted"; }

 private:
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<ApiResponse> responses_;
  std::deque<WatchScript> watches_;
  std::vector<std::string> request_paths_;
  std::vector<std::string> watch_paths_;
};

Json Pod(const std::string& name, const std::string& rv, const std::string& job = "j1") {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", "ns"},
            {"resourceVersion", rv},
            {"labels", {{"distrain.io/job-name", job}}}}}};
}

Json ListItem(Json pod) {  // LIST items carry no apiVersion/kind
  pod.erase("apiVersion");
  pod.erase("kind");
  return pod;
}

ApiResponse PodList(std::vector<Json> items, const std::string& rv, const std::string& cont = "") {
  Json body = {{"apiVersion", "v1"},
               {"kind", "PodList"},
               {"metadata", {{"resourceVersion", rv}}},
               {"items", Json::array()}};
  if (!cont.empty()) body["metadata"]["continue"] = cont;
  for (auto& item : items) body["items"].push_back(ListItem(std::move(item)));
  return ApiResponse{200, body};
}

WatchEvent Event(const std::string& type, Json object) { return {type, std::move(object)}; }

WatchEvent Gone() {
  return {"ERROR",
          {{"kind", "Status"}, {"code", 410}, {"reason", "Expired"}, {"message", "too old"}}};
}

template <typename Pred>
bool Eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// Records handler calls as "add ns/a@1", "update ns/a@1->2", "delete ns/a@2".
struct Recorder {
  std::mutex mu;
  std::vector<std::string> calls;
  ResourceEventHandlers Handlers() {
    auto at = [](const Json& o) { return ObjectKey(o) + "@" + ResourceVersionOf(o); };
    return {
        .on_add = [this, at](const Json& o) { Push("add " + at(o)); },
        .on_update = [this, at](const Json& a, const Json& b) {
          Push("update " + at(a) + "->" + ResourceVersionOf(b));
        },
        .on_delete = [this, at](const Json& o) { Push("delete " + at(o)); },
    };
  }
  void Push(std::string s) {
    std::lock_guard lock(mu);
    calls.push_back(std::move(s));
  }
  std::vector<std::string> Calls() {
    std::lock_guard lock(mu);
    return calls;
  }
};

InformerOptions PodOptions() {
  InformerOptions options;
  options.resource = PodsResource();
  options.namespace_name = "ns";
  options.label_selector = "distrain.io/job-name";
  options.page_size = 2;
  options.initial_backoff = std::chrono::milliseconds(1);
  options.max_backoff = std::chrono::milliseconds(5);
  return options;
}

TEST(InformerTest, ListsEveryPageThenWatchesFromTheListResourceVersion) {
  ScriptedClient client;
  client.AddResponse(PodList({Pod("a", "5"), Pod("b", "6")}, "10", "token-1"));
  client.AddResponse(PodList({Pod("c", "7")}, "10"));
  Informer informer(&client, PodOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  EXPECT_THAT(client.requests(),
              ElementsAre("GET /api/v1/namespaces/ns/pods?labelSelector=distrain.io%2Fjob-name&limit=2",
                          "GET /api/v1/namespaces/ns/pods?labelSelector=distrain.io%2Fjob-name&limit=2"
                          "&continue=token-1"));
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/a", "ns/b", "ns/c"));
  EXPECT_THAT(rec.Calls(), ElementsAre("add ns/a@5", "add ns/b@6", "add ns/c@7"));
  // LIST items get the list's apiVersion and kind, like watched objects.
  EXPECT_EQ(informer.Get("ns", "a")->value("kind", ""), "Pod");
  EXPECT_EQ(informer.Get("ns", "a")->value("apiVersion", ""), "v1");
  ASSERT_TRUE(Eventually([&] { return !client.watch_paths().empty(); }));
  const std::string watch = client.watch_paths()[0];
  EXPECT_THAT(watch, HasSubstr("watch=1"));
  EXPECT_THAT(watch, HasSubstr("resourceVersion=10"));
  EXPECT_THAT(watch, HasSubstr("allowWatchBookmarks=true"));
  EXPECT_THAT(watch, HasSubstr("labelSelector=distrain.io%2Fjob-name"));
  EXPECT_THAT(watch, HasSubstr("timeoutSeconds="));
  informer.Stop();
}

TEST(InformerTest, SharedIndexReadsStayValidWhenTheCacheMovesOn) {
  ScriptedClient client;
  client.AddResponse(PodList({Pod("a", "5"), Pod("b", "6")}, "10"));
  Informer informer(&client, PodOptions());
  informer.AddLabelIndex("distrain.io/job-name");
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  std::vector<Informer::ObjectPtr> before = informer.ByIndexShared("distrain.io/job-name", "j1");
  ASSERT_EQ(before.size(), 2u);
  EXPECT_EQ(*before[0], informer.ByIndex("distrain.io/job-name", "j1")[0]);
  client.AddWatch({{Event("MODIFIED", Pod("a", "12", "j2")), Event("DELETED", Pod("b", "13"))},
                   absl::OkStatus()});
  ASSERT_TRUE(Eventually([&] { return informer.LastResourceVersion() == "13"; }));
  // The update replaced the cached object rather than changing it, so what
  // a reader holds is the version it read.
  std::set<std::string> versions;
  for (const Informer::ObjectPtr& pod : before) versions.insert(ResourceVersionOf(*pod));
  EXPECT_EQ(versions, (std::set<std::string>{"5", "6"}));
  EXPECT_TRUE(informer.ByIndexShared("distrain.io/job-name", "j1").empty());
  ASSERT_EQ(informer.ByIndexShared("distrain.io/job-name", "j2").size(), 1u);
}

TEST(InformerTest, WatchEventsUpdateCacheIndexesAndHandlersInOrder) {
  ScriptedClient client;
  client.AddResponse(PodList({Pod("a", "5")}, "10"));
  Informer informer(&client, PodOptions());
  informer.AddLabelIndex("distrain.io/job-name");
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  // A handler reading the cache sees its own event applied.
  std::vector<size_t> sizes_seen;
  ResourceEventHandlers size_probe;
  size_probe.on_add = [&](const Json&) { sizes_seen.push_back(informer.size()); };
  informer.AddHandlers(size_probe);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  client.AddWatch({{Event("ADDED", Pod("b", "11")), Event("MODIFIED", Pod("a", "12", "j2")),
                    Event("DELETED", Pod("b", "13")), Event("DELETED", Pod("never-seen", "14")),
                    Event("BOOKMARK", {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "20"}}}})},
                   absl::OkStatus()});
  ASSERT_TRUE(Eventually([&] { return informer.LastResourceVersion() == "20"; }));
  EXPECT_THAT(rec.Calls(),
              ElementsAre("add ns/a@5", "add ns/b@11", "update ns/a@5->12", "delete ns/b@13"));
  EXPECT_THAT(sizes_seen, ElementsAre(1u, 2u));
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/a"));
  EXPECT_TRUE(informer.ByIndex("distrain.io/job-name", "j1").empty());
  ASSERT_EQ(informer.ByIndex("distrain.io/job-name", "j2").size(), 1u);
  EXPECT_EQ(ResourceVersionOf(informer.ByIndex("distrain.io/job-name", "j2")[0]), "12");
  // The stream ended normally: the next watch resumes from the bookmark, no relist.
  ASSERT_TRUE(Eventually([&] { return client.watch_paths().size() >= 2; }));
  EXPECT_THAT(client.watch_paths()[1], HasSubstr("resourceVersion=20"));
  EXPECT_EQ(informer.stats().lists, 1);
  informer.Stop();
}

TEST(InformerTest, GoneRelistsAndReportsTheDifference) {
  ScriptedClient client;
  client.AddResponse(PodList({Pod("a", "5"), Pod("b", "6")}, "10"));
  Informer informer(&client, PodOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  // While the watch was away: a deleted, b changed, c created; the server says 410.
  client.AddResponse(PodList({Pod("b", "30"), Pod("c", "31")}, "40"));
  client.AddWatch({{Gone()}, absl::OkStatus()});
  ASSERT_TRUE(Eventually([&] { return informer.stats().lists == 2; }));
  EXPECT_EQ(informer.stats().relists_after_gone, 1);
  EXPECT_THAT(rec.Calls(), ElementsAre("add ns/a@5", "add ns/b@6", "update ns/b@6->30",
                                       "add ns/c@31", "delete ns/a@5"));
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/b", "ns/c"));
  ASSERT_TRUE(Eventually([&] { return client.watch_paths().size() >= 2; }));
  EXPECT_THAT(client.watch_paths()[1], HasSubstr("resourceVersion=40"));
  informer.Stop();
}

TEST(InformerTest, BrokenWatchBacksOffAndResumesWithoutRelisting) {
  ScriptedClient client;
  client.AddResponse(PodList({}, "10"));
  Informer informer(&client, PodOptions());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  client.AddWatch({{Event("ADDED", Pod("a", "11"))}, absl::UnavailableError("connection reset")});
  client.AddWatch({{}, absl::UnavailableError("connection refused")});
  client.AddWatch({{{"ERROR", {{"kind", "Status"}, {"code", 500}, {"message", "etcd down"}}}},
                   absl::OkStatus()});
  ASSERT_TRUE(Eventually([&] { return client.watch_paths().size() >= 4; }));
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_THAT(client.watch_paths()[i], HasSubstr("resourceVersion=11")) << i;
  }
  EXPECT_EQ(informer.stats().lists, 1);
  EXPECT_EQ(informer.stats().watch_errors, 3);
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/a"));
  informer.Stop();
}

TEST(InformerTest, FailedListIsRetriedAndHasSyncedWaitsForIt) {
  ScriptedClient client;
  client.AddResponse(ApiResponse{403, {{"kind", "Status"}, {"message", "pods is forbidden"}}});
  client.AddResponse(PodList({Pod("a", "5")}, "10"));
  Informer informer(&client, PodOptions());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  EXPECT_EQ(client.requests().size(), 2u);
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/a"));
  informer.Stop();
}

TEST(InformerTest, ExpiredContinueTokenRestartsTheListUnpaginated) {
  ScriptedClient client;
  client.AddResponse(PodList({Pod("a", "5"), Pod("b", "6")}, "10", "token-1"));
  client.AddResponse(ApiResponse{410, {{"kind", "Status"}, {"code", 410}}});
  client.AddResponse(PodList({Pod("a", "5"), Pod("b", "6"), Pod("c", "9")}, "12"));
  Informer informer(&client, PodOptions());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  auto requests = client.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_THAT(requests[2], ::testing::Not(HasSubstr("limit=")));
  EXPECT_THAT(informer.Keys(), ElementsAre("ns/a", "ns/b", "ns/c"));
  EXPECT_EQ(informer.LastResourceVersion(), "12");
  informer.Stop();
}

TEST(InformerTest, StopEndsAnIdleWatchPromptly) {
  ScriptedClient client;
  client.AddResponse(PodList({}, "10"));
  Informer informer(&client, PodOptions());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  ASSERT_TRUE(Eventually([&] { return !client.watch_paths().empty(); }));
  auto start = std::chrono::steady_clock::now();
  informer.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

}  // namespace
}  // namespace distrain::kube

// EventRecorder against the real API server (run via
// tests/kube/with_control_plane.sh): the events it writes are accepted by the
// events.k8s.io/v1 validation and read back by the API and kubectl.

#include "operator/kube/event_recorder.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/paths.h"
#include "tests/kube/kube_test_util.h"

namespace distrain::kube {
namespace {

using ::testing::HasSubstr;
using kubetest::AdminClient;
using kubetest::Kubectl;
using kubetest::TestNamespace;

class EventRecorderKubeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    admin_ = AdminClient();
    ASSERT_NE(admin_, nullptr);
    ns_ = std::make_unique<TestNamespace>(*admin_, "events");
    nlohmann::json cm = {{"apiVersion", "v1"},
                         {"kind", "ConfigMap"},
                         {"metadata", {{"name", "mnist-config"}, {"namespace", ns_->name()}}},
                         {"data", {{"k", "v"}}}};
    auto created = admin_->Request("POST", ResourcePath(ConfigMapsResource(), ns_->name()), &cm);
    ASSERT_TRUE(created.ok() && created->ok());
    config_map_ = created->body;
  }
  void TearDown() override { ns_.reset(); }

  // The events.k8s.io/v1 Events about the ConfigMap.
  std::vector<nlohmann::json> EventsAbout() {
    auto r = admin_->Request("GET", ResourcePath(EventsResource(), ns_->name()));
    EXPECT_TRUE(r.ok() && r->ok());
    std::vector<nlohmann::json> out;
    if (!r.ok() || !r->ok()) return out;
    for (const auto& e : r->body["items"]) {
      if (e["regarding"].value("uid", "") == config_map_["metadata"]["uid"]) out.push_back(e);
    }
    return out;
  }

  std::unique_ptr<RestClient> admin_;
  std::unique_ptr<TestNamespace> ns_;
  nlohmann::json config_map_;
};

TEST_F(EventRecorderKubeTest, EventAboutAConfigMapIsStoredAndListed) {
  EventRecorderOptions options;
  options.reporting_instance = "kube-test";
  EventRecorder recorder(admin_.get(), options);
  recorder.Event(config_map_, EventType::kWarning, "ConfigInvalid", "Validate",
                 "training.batchSize must be divisible by the number of workers");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(30)));

  const std::vector<nlohmann::json> events = EventsAbout();
  ASSERT_EQ(events.size(), 1u);
  const nlohmann::json& e = events[0];
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["reason"], "ConfigInvalid");
  EXPECT_EQ(e["action"], "Validate");
  EXPECT_EQ(e["reportingController"], "distrain.io/operator");
  EXPECT_EQ(e["reportingInstance"], "kube-test");
  EXPECT_EQ(e["regarding"]["kind"], "ConfigMap");
  EXPECT_EQ(e["regarding"]["apiVersion"], "v1");
  EXPECT_EQ(e["regarding"]["name"], "mnist-config");
  EXPECT_EQ(e["regarding"]["namespace"], ns_->name());
  EXPECT_EQ(e["regarding"]["resourceVersion"], config_map_["metadata"]["resourceVersion"]);
  EXPECT_THAT(e["eventTime"].get<std::string>(),
              ::testing::MatchesRegex("....-..-..T..:..:..\\.[0-9]{6}Z"));

  // What a user sees.
  const std::string table = Kubectl("get events -n " + ns_->name());
  EXPECT_THAT(table, HasSubstr("ConfigInvalid"));
  EXPECT_THAT(table, HasSubstr("configmap/mnist-config"));
  EXPECT_THAT(table, HasSubstr("training.batchSize must be divisible"));
}

TEST_F(EventRecorderKubeTest, RepeatsBecomeOneEventWithASeries) {
  EventRecorder recorder(admin_.get());
  for (int i = 0; i < 3; ++i) {
    recorder.Event(config_map_, EventType::kNormal, "Synced", "Sync", "config synced");
    ASSERT_TRUE(recorder.Flush(absl::Seconds(30)));
  }
  const std::vector<nlohmann::json> events = EventsAbout();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["series"]["count"], 3);
  EXPECT_TRUE(events[0]["series"].contains("lastObservedTime"));
  // A different note is another event.
  recorder.Event(config_map_, EventType::kNormal, "Synced", "Sync", "config synced again");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(30)));
  EXPECT_EQ(EventsAbout().size(), 2u);
}

}  // namespace
}  // namespace distrain::kube

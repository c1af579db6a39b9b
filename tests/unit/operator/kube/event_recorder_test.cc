#include "operator/kube/event_recorder.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/clock.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain::kube {
namespace {

using ::testing::MatchesRegex;
using testing::ScriptedClient;

constexpr char kEventsPath[] = "/apis/events.k8s.io/v1/namespaces/ns/events";

nlohmann::json Job(const std::string& name = "mnist", const std::string& rv = "42") {
  return {{"apiVersion", "distrain.io/v1alpha1"},
          {"kind", "DistributedTrainingJob"},
          {"metadata",
           {{"name", name},
            {"namespace", "ns"},
            {"uid", "0b7c2f9e-1111-2222-3333-444455556666"},
            {"resourceVersion", rv},
            {"labels", {{"a", "b"}}}}},
          {"spec", {{"strategy", "MultiWorkerMirrored"}}}};
}

EventRecorderOptions Options(FakeClock* clock) {
  EventRecorderOptions o;
  o.reporting_instance = "distrain-operator-7d9f";
  o.clock = clock;
  return o;
}

ScriptedClient::Handler Created() {
  return [](const ScriptedClient::Call& c) { return ScriptedClient::Reply(201, c.body); };
}

TEST(EventRecorderTest, FormatMicroTimeIsUtcWithMicroseconds) {
  EXPECT_EQ(FormatMicroTime(absl::FromUnixMicros(1'800'000'000'123'456)),
            "2027-01-15T08:00:00.123456Z");
  EXPECT_EQ(FormatMicroTime(absl::FromUnixSeconds(0)), "1970-01-01T00:00:00.000000Z");
}

TEST(EventRecorderTest, ObjectReferenceKeepsIdentityFieldsOnly) {
  EXPECT_EQ(ObjectReference(Job()), (nlohmann::json{{"apiVersion", "distrain.io/v1alpha1"},
                                                     {"kind", "DistributedTrainingJob"},
                                                     {"name", "mnist"},
                                                     {"namespace", "ns"},
                                                     {"uid", "0b7c2f9e-1111-2222-3333-444455556666"},
                                                     {"resourceVersion", "42"}}));
  EXPECT_EQ(ObjectReference(nlohmann::json{{"kind", "Node"}, {"metadata", {{"name", "n1"}}}}),
            (nlohmann::json{{"kind", "Node"}, {"name", "n1"}}));
}

TEST(EventRecorderTest, PostsACompleteEvent) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", kEventsPath, Created());
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job(), EventType::kWarning, "BackoffLimitExceeded", "Fail",
                 "job has failed 4 times (backoffLimit 3)");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
  const nlohmann::json e = client.calls()[0].body;
  EXPECT_EQ(e["apiVersion"], "events.k8s.io/v1");
  EXPECT_EQ(e["kind"], "Event");
  EXPECT_EQ(e["metadata"]["namespace"], "ns");
  EXPECT_THAT(e["metadata"]["name"].get<std::string>(), MatchesRegex("mnist\\.[0-9a-f]+"));
  EXPECT_EQ(e["regarding"], ObjectReference(Job()));
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(e["action"], "Fail");
  EXPECT_EQ(e["note"], "job has failed 4 times (backoffLimit 3)");
  EXPECT_EQ(e["reportingController"], "distrain.io/operator");
  EXPECT_EQ(e["reportingInstance"], "distrain-operator-7d9f");
  EXPECT_EQ(e["eventTime"], FormatMicroTime(clock.Now()));
  EXPECT_FALSE(e.contains("series"));
}

TEST(EventRecorderTest, ClusterScopedObjectsGetEventsInDefault) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", "/apis/events.k8s.io/v1/namespaces/default/events", Created());
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "n1"}}}},
                 EventType::kNormal, "Seen", "Observe", "");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
}

TEST(EventRecorderTest, ObjectWithoutNameIsRefused) {
  FakeClock clock;
  ScriptedClient client;
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event({{"kind", "Pod"}, {"metadata", {{"namespace", "ns"}}}}, EventType::kNormal, "R",
                 "A", "n");
  recorder.Event(nlohmann::json("not an object"), EventType::kNormal, "R", "A", "n");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  EXPECT_EQ(client.num_calls(), 0u);
}

TEST(EventRecorderTest, RepeatsWithinTheWindowPatchTheSeries) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", kEventsPath, Created());
  client.Expect("PATCH", std::string(kEventsPath) + "/mnist.*", ScriptedClient::Reply(200));
  client.Expect("PATCH", std::string(kEventsPath) + "/mnist.*", ScriptedClient::Reply(200));
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job("mnist", "1"), EventType::kNormal, "Restarting", "Restart", "worker 2 exited 137");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  clock.Advance(absl::Minutes(5));
  // A new resourceVersion of the same job is the same series.
  recorder.Event(Job("mnist", "2"), EventType::kNormal, "Restarting", "Restart", "worker 2 exited 137");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  clock.Advance(absl::Minutes(5));
  recorder.Event(Job("mnist", "3"), EventType::kNormal, "Restarting", "Restart", "worker 2 exited 137");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
  const auto calls = client.calls();
  const std::string name = calls[0].body["metadata"]["name"];
  EXPECT_EQ(calls[1].path, std::string(kEventsPath) + "/" + name);
  EXPECT_EQ(calls[1].content_type, "application/merge-patch+json");
  EXPECT_EQ(calls[1].body, (nlohmann::json{{"series",
                                            {{"count", 2},
                                             {"lastObservedTime",
                                              FormatMicroTime(clock.Now() - absl::Minutes(5))}}}}));
  EXPECT_EQ(calls[2].body["series"]["count"], 3);
  EXPECT_EQ(calls[2].body["series"]["lastObservedTime"], FormatMicroTime(clock.Now()));
}

TEST(EventRecorderTest, RepeatAfterTheWindowIsANewEvent) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", kEventsPath, Created());
  client.Expect("POST", kEventsPath, Created());
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job(), EventType::kNormal, "Created", "Create", "created pod mnist-worker-0");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  clock.Advance(absl::Minutes(6) + absl::Seconds(1));
  recorder.Event(Job(), EventType::kNormal, "Created", "Create", "created pod mnist-worker-0");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
  EXPECT_NE(client.calls()[0].body["metadata"]["name"], client.calls()[1].body["metadata"]["name"]);
}

struct DifferentCase {
  std::string name;
  nlohmann::json object;
  EventType type;
  std::string reason, action, note;
};

void PrintTo(const DifferentCase& c, std::ostream* os) { *os << c.name; }

class EventRecorderDifferentTest : public ::testing::TestWithParam<DifferentCase> {};

TEST_P(EventRecorderDifferentTest, IsNotFoldedIntoTheSeries) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", "/apis/events.k8s.io/v1/namespaces/*", Created());
  client.Expect("POST", "/apis/events.k8s.io/v1/namespaces/*", Created());
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job(), EventType::kNormal, "Created", "Create", "created pod mnist-worker-0");
  const DifferentCase& c = GetParam();
  recorder.Event(c.object, c.type, c.reason, c.action, c.note);
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
}

nlohmann::json WithUid(const std::string& uid) {
  nlohmann::json j = Job();
  j["metadata"]["uid"] = uid;
  return j;
}

INSTANTIATE_TEST_SUITE_P(
    Table, EventRecorderDifferentTest,
    ::testing::Values(
        DifferentCase{"OtherNote", Job(), EventType::kNormal, "Created", "Create", "created pod mnist-worker-1"},
        DifferentCase{"OtherReason", Job(), EventType::kNormal, "Made", "Create", "created pod mnist-worker-0"},
        DifferentCase{"OtherAction", Job(), EventType::kNormal, "Created", "Make", "created pod mnist-worker-0"},
        DifferentCase{"OtherType", Job(), EventType::kWarning, "Created", "Create", "created pod mnist-worker-0"},
        DifferentCase{"OtherObject", Job("cifar"), EventType::kNormal, "Created", "Create", "created pod mnist-worker-0"},
        DifferentCase{"RecreatedObject", WithUid("ffff"), EventType::kNormal, "Created", "Create",
                      "created pod mnist-worker-0"}),
    [](const ::testing::TestParamInfo<DifferentCase>& info) { return info.param.name; });

TEST(EventRecorderTest, QueuedRepeatsFoldIntoOnePatch) {
  FakeClock clock;
  ScriptedClient client;
  absl::Notification posted, release;
  client.Expect("POST", kEventsPath, [&](const ScriptedClient::Call& c) {
    posted.Notify();
    release.WaitForNotification();  // a slow API server
    return ScriptedClient::Reply(201, c.body);
  });
  client.Expect("PATCH", std::string(kEventsPath) + "/*", ScriptedClient::Reply(200));
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job(), EventType::kWarning, "Failed", "Fail", "x");
  posted.WaitForNotification();
  for (int i = 0; i < 5; ++i) {
    clock.Advance(absl::Seconds(1));
    recorder.Event(Job(), EventType::kWarning, "Failed", "Fail", "x");
  }
  release.Notify();
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  client.ExpectAllConsumed();
  ASSERT_EQ(client.num_calls(), 2u);
  EXPECT_EQ(client.calls()[1].body["series"]["count"], 6);
  EXPECT_EQ(client.calls()[1].body["series"]["lastObservedTime"], FormatMicroTime(clock.Now()));
}

TEST(EventRecorderTest, SeriesOfAnExpiredEventStartsANewEvent) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", kEventsPath, Created());
  client.Expect("PATCH", std::string(kEventsPath) + "/*", ScriptedClient::Status(404, "NotFound", "gone"));
  client.Expect("POST", kEventsPath, Created());
  client.Expect("PATCH", std::string(kEventsPath) + "/*", ScriptedClient::Reply(200));
  EventRecorder recorder(&client, Options(&clock));
  for (int i = 0; i < 3; ++i) {
    recorder.Event(Job(), EventType::kNormal, "Running", "Run", "all workers running");
    ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
    clock.Advance(absl::Seconds(1));
  }
  client.ExpectAllConsumed();
  const auto calls = client.calls();
  EXPECT_NE(calls[2].body["metadata"]["name"], calls[0].body["metadata"]["name"]);
  EXPECT_EQ(calls[3].path, std::string(kEventsPath) + "/" + calls[2].body["metadata"]["name"].get<std::string>());
  EXPECT_EQ(calls[3].body["series"]["count"], 2);
}

TEST(EventRecorderTest, FailuresAreNotFatalAndNotCachedAsSent) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", kEventsPath, absl::UnavailableError("connection refused"));
  client.Expect("POST", kEventsPath, ScriptedClient::Status(403, "Forbidden", "no RBAC"));
  client.Expect("POST", kEventsPath, Created());
  EventRecorder recorder(&client, Options(&clock));
  for (int i = 0; i < 3; ++i) {
    recorder.Event(Job(), EventType::kNormal, "Created", "Create", "n");
    ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  }
  client.ExpectAllConsumed();
}

TEST(EventRecorderTest, FullQueueDropsInsteadOfBlocking) {
  FakeClock clock;
  ScriptedClient client;
  absl::Notification posted, release;
  client.Expect("POST", kEventsPath, [&](const ScriptedClient::Call& c) {
    posted.Notify();
    release.WaitForNotification();
    return ScriptedClient::Reply(201, c.body);
  });
  client.SetFallback(Created());
  EventRecorderOptions o = Options(&clock);
  o.queue_capacity = 2;
  EventRecorder recorder(&client, o);
  recorder.Event(Job("j0"), EventType::kNormal, "R", "A", "n");
  posted.WaitForNotification();  // j0 is in flight, the queue is empty
  for (int i = 1; i <= 4; ++i) recorder.Event(Job(absl::StrCat("j", i)), EventType::kNormal, "R", "A", "n");
  EXPECT_EQ(recorder.dropped(), 2);
  release.Notify();
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  ASSERT_EQ(client.num_calls(), 3u);
  EXPECT_EQ(client.calls()[1].body["regarding"]["name"], "j1");
  EXPECT_EQ(client.calls()[2].body["regarding"]["name"], "j2");
}

TEST(EventRecorderTest, LongFieldsAreCutToTheApiLimits) {
  FakeClock clock;
  ScriptedClient client;
  client.Expect("POST", "/apis/events.k8s.io/v1/namespaces/*", Created());
  EventRecorderOptions o = Options(&clock);
  o.reporting_instance = std::string(300, 'i');
  EventRecorder recorder(&client, o);
  // "é" is two bytes: a cut must not split it.
  std::string note;
  for (int i = 0; i < 1000; ++i) note += "é";
  recorder.Event(Job(std::string(253, 'n')), EventType::kNormal, std::string(200, 'r'),
                 std::string(129, 'a'), note);
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  const nlohmann::json e = client.calls()[0].body;
  EXPECT_EQ(e["note"].get<std::string>().size(), 1024u);
  EXPECT_EQ(e["reason"].get<std::string>().size(), 128u);
  EXPECT_EQ(e["action"].get<std::string>().size(), 128u);
  EXPECT_EQ(e["reportingInstance"].get<std::string>().size(), 128u);
  EXPECT_LE(e["metadata"]["name"].get<std::string>().size(), 253u);
  EXPECT_EQ(e["regarding"]["name"].get<std::string>().size(), 253u);
}

TEST(EventRecorderTest, EventsInTheSameInstantGetDistinctNames) {
  FakeClock clock;
  ScriptedClient client;
  client.SetFallback(Created());
  EventRecorder recorder(&client, Options(&clock));
  recorder.Event(Job(), EventType::kNormal, "A", "A", "1");
  recorder.Event(Job(), EventType::kNormal, "B", "B", "2");
  ASSERT_TRUE(recorder.Flush(absl::Seconds(5)));
  ASSERT_EQ(client.num_calls(), 2u);
  EXPECT_NE(client.calls()[0].body["metadata"]["name"], client.calls()[1].body["metadata"]["name"]);
}

TEST(EventRecorderTest, DestructorDoesNotWaitForQueuedEvents) {
  FakeClock clock;
  ScriptedClient client;
  absl::Notification posted, release;
  client.Expect("POST", kEventsPath, [&](const ScriptedClient::Call& c) {
    posted.Notify();
    release.WaitForNotification();
    return ScriptedClient::Reply(201, c.body);
  });
  std::thread answer;
  {
    EventRecorder recorder(&client, Options(&clock));
    recorder.Event(Job("j0"), EventType::kNormal, "R", "A", "n");
    posted.WaitForNotification();
    for (int i = 1; i < 10; ++i) recorder.Event(Job(absl::StrCat("j", i)), EventType::kNormal, "R", "A", "n");
    // Answer the POST only once the destructor below has begun.
    answer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      release.Notify();
    });
  }
  answer.join();
  EXPECT_EQ(client.num_calls(), 1u) << "queued events are dropped at shutdown";
}

}  // namespace
}  // namespace distrain::kube

// CoordinationService + CoordinationClient over loopback: ranks are threads
// in this process, each with its own client (own channel), the service on a
// free 127.0.0.1 port.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distrain/v1/coordination.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/coordination/coordination_client.h"
#include "worker/coordination/coordination_service.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<TaskId> Tasks(int n) {
  std::vector<TaskId> tasks = {{"chief", 0}};
  for (int i = 0; i + 1 < n; ++i) tasks.push_back({"worker", i});
  return tasks;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Collects the failure callback's status and when it arrived. A client's
// watcher may call its sink until that client is destroyed (destroying the
// coordinator's client, say, reports chief:0 failed to everyone still
// watching), so sinks come from CoordinationTest::NewSink, which keeps them
// alive until after every client of the test body is gone.
struct FailureSink {
  absl::Mutex mu;
  int calls ABSL_GUARDED_BY(mu) = 0;
  absl::Status status ABSL_GUARDED_BY(mu);
  absl::Time when ABSL_GUARDED_BY(mu);
  absl::Notification fired;

  CoordinationClient::FailureCallback Callback() {
    return [this](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      if (++calls == 1) {
        status = s;
        when = absl::Now();
        fired.Notify();
      }
    };
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu);
    return status;
  }
  int Calls() {
    absl::MutexLock lock(&mu);
    return calls;
  }
};

class CoordinationTest : public ::testing::Test {
 protected:
  // () not {}: see CoordinationService::Start (a GCC 12 false warning).
  void StartService(std::vector<TaskId> members,
                    CoordinationServiceOptions options = CoordinationServiceOptions()) {
    options.coordinator = members[0];
    members_ = members;
    auto service = CoordinationService::Start("127.0.0.1:0", members, options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    address_ = absl::StrCat("127.0.0.1:", service_->port());
  }

  std::unique_ptr<CoordinationClient> NewClient(const TaskId& task,
                                                CoordinationClientOptions options = {}) {
    return std::make_unique<CoordinationClient>(address_, members_[0], task, options);
  }

  // Connects and joins every member from its own thread; returns the clients.
  std::vector<std::unique_ptr<CoordinationClient>> JoinAll(
      std::vector<absl::StatusOr<Membership>>* results = nullptr) {
    std::vector<std::unique_ptr<CoordinationClient>> clients;
    for (const auto& t : members_) clients.push_back(NewClient(t));
    std::vector<absl::StatusOr<Membership>> out(clients.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < clients.size(); ++i) {
      threads.emplace_back([&, i] {
        const absl::Time deadline = absl::Now() + absl::Seconds(5);
        absl::Status s = clients[i]->Connect(deadline);
        out[i] = s.ok() ? clients[i]->Join(deadline) : s;
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(out[i].ok()) << i << ": " << out[i].status();
    }
    if (results != nullptr) *results = std::move(out);
    return clients;
  }

  std::unique_ptr<v1::Coordination::Stub> RawStub() {
    return v1::Coordination::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  // Fixture members outlive the test body's locals, so a sink outlives the
  // clients (and their watcher threads) that may call it.
  FailureSink& NewSink() { return *sinks_.emplace_back(std::make_unique<FailureSink>()); }

  // First member: destroyed last, after the service.
  std::vector<std::unique_ptr<FailureSink>> sinks_;
  std::vector<TaskId> members_;
  std::unique_ptr<CoordinationService> service_;
  std::string address_;
};

v1::TaskRef Ref(const std::string& type, int index) {
  v1::TaskRef ref;
  ref.set_type(type);
  ref.set_index(index);
  return ref;
}

// --- Join ---------------------------------------------------------------

TEST_F(CoordinationTest, JoinGivesEveryTaskTheSameGenerationMembersAndItsRank) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    StartService(Tasks(n));
    std::vector<absl::StatusOr<Membership>> results;
    auto clients = JoinAll(&results);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(results[i].ok());
      EXPECT_EQ(results[i]->generation, 1);
      EXPECT_THAT(results[i]->members, ElementsAreArray(Tasks(n)));
      EXPECT_EQ(results[i]->rank, i);
    }
    clients.clear();
    service_.reset();
  }
}

TEST_F(CoordinationTest, UnrankedTasksJoinWithRankMinusOneAfterTheRankedOnes) {
  CoordinationServiceOptions options;
  options.unranked = {{"ps", 0}};
  StartService(Tasks(2), options);
  members_.push_back({"ps", 0});
  std::vector<absl::StatusOr<Membership>> results;
  auto clients = JoinAll(&results);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(results[0]->rank, 0);
  EXPECT_EQ(results[1]->rank, 1);
  EXPECT_EQ(results[2]->rank, -1);
  EXPECT_THAT(results[2]->members,
              ElementsAreArray(std::vector<TaskId>{{"chief", 0}, {"worker", 0}, {"ps", 0}}));
}

TEST_F(CoordinationTest, JoinOfTaskOutsideTheClusterIsInvalidArgument) {
  StartService(Tasks(2));
  auto client = NewClient({"worker", 7});
  ASSERT_TRUE(client->Connect(absl::Now() + absl::Seconds(5)).ok());
  const auto m = client->Join(absl::Now() + absl::Seconds(5));
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_THAT(std::string(m.status().message()),
              AllOf(HasSubstr("worker:7"), HasSubstr("not a member"),
                    HasSubstr("chief:0, worker:0")));
}

TEST_F(CoordinationTest, LateTaskIsWaitedFor) {
  StartService(Tasks(3));
  auto c0 = NewClient(members_[0]);
  auto c1 = NewClient(members_[1]);
  auto late = NewClient(members_[2]);
  absl::StatusOr<Membership> r0, r1;
  absl::Time done0;
  std::thread t0([&] {
    ASSERT_TRUE(c0->Connect(absl::Now() + absl::Seconds(5)).ok());
    r0 = c0->Join(absl::Now() + absl::Seconds(5));
    done0 = absl::Now();
  });
  std::thread t1([&] {
    ASSERT_TRUE(c1->Connect(absl::Now() + absl::Seconds(5)).ok());
    r1 = c1->Join(absl::Now() + absl::Seconds(5));
  });
  absl::SleepFor(absl::Seconds(1));
  const absl::Time late_start = absl::Now();
  ASSERT_TRUE(late->Connect(absl::Now() + absl::Seconds(5)).ok());
  const auto r2 = late->Join(absl::Now() + absl::Seconds(5));
  t0.join();
  t1.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_GE(done0, late_start);  // the early task really waited
  EXPECT_EQ(r0->generation, r2->generation);
  EXPECT_EQ(r2->rank, 2);
}

TEST_F(CoordinationTest, TaskThatNeverJoinsFailsOthersAtTheDeadlineNamingIt) {
  StartService(Tasks(3));
  auto c0 = NewClient(members_[0]);
  auto c1 = NewClient(members_[1]);
  absl::StatusOr<Membership> r0;
  const absl::Time start = absl::Now();
  std::thread t0([&] {
    ASSERT_TRUE(c0->Connect(absl::Now() + absl::Seconds(5)).ok());
    r0 = c0->Join(start + absl::Milliseconds(600));
  });
  ASSERT_TRUE(c1->Connect(absl::Now() + absl::Seconds(5)).ok());
  absl::StatusOr<Membership> r1 = c1->Join(start + absl::Milliseconds(600));
  t0.join();
  const absl::Duration took = absl::Now() - start;
  for (const absl::StatusOr<Membership>* r : {&r0, &r1}) {
    ASSERT_EQ(r->status().code(), absl::StatusCode::kDeadlineExceeded) << r->status();
    // Both time out together, so the other may already have withdrawn.
    EXPECT_THAT(std::string(r->status().message()),
                AllOf(HasSubstr("timed out after"), HasSubstr("still waiting for"),
                      HasSubstr("worker:1 (joined:")));
  }
  EXPECT_GE(took, absl::Milliseconds(550));
  EXPECT_LT(took, absl::Seconds(2));

  // The timed-out tasks were withdrawn: the round can still complete later.
  auto c2 = NewClient(members_[2]);
  std::thread t2([&] {
    ASSERT_TRUE(c2->Connect(absl::Now() + absl::Seconds(5)).ok());
    EXPECT_TRUE(c2->Join(absl::Now() + absl::Seconds(5)).ok());
  });
  std::thread t0b([&] { EXPECT_TRUE(c0->Join(absl::Now() + absl::Seconds(5)).ok()); });
  EXPECT_TRUE(c1->Join(absl::Now() + absl::Seconds(5)).ok());
  t2.join();
  t0b.join();
}

TEST_F(CoordinationTest, SecondLiveProcessForTheSameTaskIsRefused) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  FailureSink& sink = NewSink();
  ASSERT_TRUE(clients[1]->StartWatching(sink.Callback()).ok());
  CoordinationClientOptions options;
  options.live_predecessor_grace = absl::Seconds(1);
  auto impostor = NewClient(members_[1], options);
  ASSERT_TRUE(impostor->Connect(absl::Now() + absl::Seconds(5)).ok());
  const absl::Time start = absl::Now();
  const auto r = impostor->Join(absl::Now() + absl::Seconds(5));
  // Refused once the grace for a dying predecessor is over, not at the deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("worker:0"), HasSubstr(clients[1]->incarnation()),
                    HasSubstr("two processes")));
  EXPECT_EQ(service_->generation(), 1);
}

TEST_F(CoordinationTest, RestartAfterFailureRejoinsAndBumpsTheGeneration) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  FailureSink& sink0 = NewSink();
  FailureSink& sink1 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  ASSERT_TRUE(clients[1]->StartWatching(sink1.Callback()).ok());
  clients[1].reset();  // crash
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(3)));
  EXPECT_EQ(service_->generation(), 2);

  auto restarted = NewClient(members_[1]);
  ASSERT_NE(restarted->incarnation(), "");
  ASSERT_TRUE(restarted->Connect(absl::Now() + absl::Seconds(5)).ok());
  const auto m = restarted->Join(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->generation, 3);
  EXPECT_EQ(m->rank, 1);
  // The survivor's stream reports the new generation too.
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (clients[0]->generation() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(clients[0]->generation(), 3);
}

// In-place recovery's view (rendezvous.h R1-R2): a survivor learns that the
// group is whole again from an update of its own, and hears of the next
// failure after re-arming.
TEST_F(CoordinationTest, SurvivorSeesTheGroupWholeAgainAndHearsTheNextFailure) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  FailureSink& sink0 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  for (size_t i = 1; i < clients.size(); ++i) {
    ASSERT_TRUE(clients[i]->StartWatching(NewSink().Callback()).ok());
  }
  EXPECT_EQ(clients[0]->whole_generation(), 1);
  clients[2].reset();  // crash
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(3)));
  // Nobody replaced it yet: the wait ends at its deadline, naming the loss.
  const auto early = clients[0]->WaitForWholeGroup(1, absl::Now() + absl::Milliseconds(300), {});
  ASSERT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("worker:1"));

  // The replacement rejoins while the survivor waits.
  std::thread replacement([&] {
    absl::SleepFor(absl::Milliseconds(200));
    clients[2] = NewClient(members_[2]);
    ASSERT_TRUE(clients[2]->Connect(absl::Now() + absl::Seconds(5)).ok());
    ASSERT_TRUE(clients[2]->Join(absl::Now() + absl::Seconds(5)).ok());
    ASSERT_TRUE(clients[2]->StartWatching(NewSink().Callback()).ok());
  });
  const auto whole = clients[0]->WaitForWholeGroup(1, absl::Now() + absl::Seconds(5), {});
  replacement.join();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->generation, 3);  // failure: 2, re-admission: 3
  EXPECT_THAT(whole->members, ElementsAreArray(Tasks(3)));  // not elastic: the same set
  EXPECT_EQ(clients[2]->whole_generation(), 3);

  // Re-armed: the next loss reaches the callback again.
  ASSERT_TRUE(clients[0]->RearmFailureReport(whole->generation).ok());
  // sink0 counts calls: a second call proves the re-arm.
  clients[1].reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (sink0.Calls() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(sink0.Calls(), 2);
}

TEST_F(CoordinationTest, RearmReturnsAFailureThatArrivedWhileTheReportWasSpent) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  FailureSink& sink0 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  for (size_t i = 1; i < clients.size(); ++i) {
    ASSERT_TRUE(clients[i]->StartWatching(NewSink().Callback()).ok());
  }
  clients[2].reset();
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(3)));
  clients[1].reset();  // a second loss before the survivor re-armed
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (clients[0]->generation() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status pending = clients[0]->RearmFailureReport(1);
  EXPECT_EQ(pending.code(), absl::StatusCode::kUnavailable) << pending;
  EXPECT_THAT(std::string(pending.message()), HasSubstr("worker:0"));
}

TEST_F(CoordinationTest, WaitingForTheGroupEndsAtOnceWhenTheCoordinatorIsGone) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  ASSERT_TRUE(clients[1]->StartWatching(NewSink().Callback()).ok());
  ASSERT_TRUE(clients[0]->StartWatching(NewSink().Callback()).ok());
  service_->Shutdown();
  const absl::Time start = absl::Now();
  const auto r = clients[1]->WaitForWholeGroup(1, absl::Now() + absl::Seconds(10), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// --- Elastic membership (coordination_service.h, step E) -----------------

// Candidates chief:0, worker:0..3; a group may train with 2 or 4 members (as
// a global batch of 64 allows with 1..3 workers and a chief: not 3).
CoordinationServiceOptions ElasticTwoOrFour() {
  CoordinationServiceOptions options;
  CoordinationServiceOptions::Elastic elastic;
  elastic.candidates = {{"chief", 0}, {"worker", 0}, {"worker", 1}, {"worker", 2}, {"worker", 3}};
  elastic.allowed_size = [](int n) { return n == 2 || n == 4; };
  options.elastic = std::make_shared<const CoordinationServiceOptions::Elastic>(elastic);
  return options;
}

// A lost member shrinks the group at once when the smaller size is allowed
// (and only then); new members, including a worker index TF_CONFIG never
// listed, grow it back, with dense ranks; survivors hear of the growth.
TEST_F(CoordinationTest, ElasticGroupShrinksWithoutTheLostAndGrowsWithNewMembers) {
  StartService(Tasks(4), ElasticTwoOrFour());  // chief:0, worker:0..2
  auto clients = JoinAll();
  FailureSink& sink0 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  for (size_t i = 1; i < clients.size(); ++i) {
    ASSERT_TRUE(clients[i]->StartWatching(NewSink().Callback()).ok());
  }
  clients[3].reset();  // worker:2 lost: 3 members is not allowed, so no shrink
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(3)));
  const auto early = clients[0]->WaitForWholeGroup(1, absl::Now() + absl::Milliseconds(300), {});
  ASSERT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();

  clients[2].reset();  // worker:1 lost too: 2 members is allowed
  const auto shrunk = clients[0]->WaitForWholeGroup(1, absl::Now() + absl::Seconds(5), {});
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->generation, 4);  // two failures, then the shrink
  EXPECT_THAT(shrunk->members,
              ElementsAreArray(std::vector<TaskId>{{"chief", 0}, {"worker", 0}}));
  EXPECT_EQ(shrunk->rank, 0);
  ASSERT_TRUE(clients[0]->RearmFailureReport(shrunk->generation).ok());
  // A barrier of the shrunk group does not wait for the dropped members.
  std::thread barrier([&] { EXPECT_TRUE(clients[1]->Barrier("b", absl::Seconds(5)).ok()); });
  EXPECT_TRUE(clients[0]->Barrier("b", absl::Seconds(5)).ok());
  barrier.join();

  // Growth: worker:1 (restarted) alone would make 3, so it waits for
  // worker:3, which TF_CONFIG of the first processes never listed.
  std::vector<absl::StatusOr<Membership>> joined(2, absl::UnknownError("not run"));
  std::vector<std::unique_ptr<CoordinationClient>> fresh;
  fresh.push_back(NewClient({"worker", 1}));
  fresh.push_back(NewClient({"worker", 3}));
  std::vector<std::thread> joiners;
  for (size_t i = 0; i < fresh.size(); ++i) {
    joiners.emplace_back([&, i] {
      if (i == 1) absl::SleepFor(absl::Milliseconds(300));
      const absl::Time deadline = absl::Now() + absl::Seconds(5);
      absl::Status s = fresh[i]->Connect(deadline);
      joined[i] = s.ok() ? fresh[i]->Join(deadline) : s;
    });
  }
  for (auto& t : joiners) t.join();
  const std::vector<TaskId> four = {{"chief", 0}, {"worker", 0}, {"worker", 1}, {"worker", 3}};
  for (size_t i = 0; i < joined.size(); ++i) {
    ASSERT_TRUE(joined[i].ok()) << i << ": " << joined[i].status();
    EXPECT_EQ(joined[i]->generation, 5);
    EXPECT_THAT(joined[i]->members, ElementsAreArray(four));
    EXPECT_EQ(joined[i]->rank, static_cast<int>(i) + 2);
  }
  // The survivor was told (a second callback: the change, ABORTED) and sees the new set.
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (sink0.Calls() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(sink0.Calls(), 2);
  const auto grown = clients[0]->WaitForWholeGroup(4, absl::Now() + absl::Seconds(5), {});
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_THAT(grown->members, ElementsAreArray(four));
  EXPECT_EQ(clients[1]->whole_membership().rank, 1);
}

// A departing member (SIGTERM on an elastic worker) is dropped like a lost
// one, and a joiner that can never make an allowed size is told why.
TEST_F(CoordinationTest, ElasticDepartureShrinksAndAnImpossibleGroupIsNamedInTheTimeout) {
  StartService(Tasks(2), ElasticTwoOrFour());
  auto clients = JoinAll();
  FailureSink& sink0 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  ASSERT_TRUE(clients[1]->StartWatching(NewSink().Callback()).ok());
  // worker:1 alone would make 3 members: it waits, and its timeout says why.
  auto third = NewClient({"worker", 1});
  ASSERT_TRUE(third->Connect(absl::Now() + absl::Seconds(5)).ok());
  const auto waited = third->Join(absl::Now() + absl::Milliseconds(400));
  ASSERT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  EXPECT_THAT(std::string(waited.status().message()), HasSubstr("a group size the job allows"));
  EXPECT_EQ(sink0.Calls(), 0);  // a joiner that was not admitted changes nothing

  ASSERT_TRUE(clients[1]->Leave(/*departing=*/true).ok());
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(3)));
  EXPECT_THAT(std::string(sink0.Get().message()), HasSubstr("worker:0 departed"));
}

// --- Connect --------------------------------------------------------------

TEST(CoordinationConnectTest, RetriesUntilAServerThatStartsLateIsUp) {
  const int port = FreePort();
  CoordinationClient client(absl::StrCat("127.0.0.1:", port), {"chief", 0}, {"chief", 0});
  absl::Status status = absl::UnknownError("not run");
  absl::Time connected;
  const absl::Time start = absl::Now();
  std::thread t([&] {
    status = client.Connect(absl::Now() + absl::Seconds(6));
    connected = absl::Now();
  });
  absl::SleepFor(absl::Seconds(1));
  CoordinationServiceOptions options;
  options.coordinator = {"chief", 0};
  auto service = CoordinationService::Start(absl::StrCat("127.0.0.1:", port), {{"chief", 0}},
                                            options);
  ASSERT_TRUE(service.ok()) << service.status();
  t.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GE(connected - start, absl::Seconds(1));
  EXPECT_LT(connected - start, absl::Seconds(4));  // backoff is capped at 2 s
}

TEST(CoordinationConnectTest, UnresolvableNameFailsAtTheDeadlineNamingTheAddress) {
  CoordinationClient client("job-chief-0.does-not-exist.invalid:2222", {"chief", 0},
                            {"worker", 1});
  const absl::Time start = absl::Now();
  const absl::Status s = client.Connect(start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("could not reach the coordinator chief:0 at "
                              "job-chief-0.does-not-exist.invalid:2222 within"),
                    HasSubstr("DNS"),  // the last error says why
                    Not(HasSubstr("no attempt made"))));
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST_F(CoordinationTest, ConnectToAServiceForAnotherCoordinatorIsRefused) {
  StartService(Tasks(2));
  CoordinationClient client(address_, {"worker", 0}, {"worker", 0});
  const absl::Status s = client.Connect(absl::Now() + absl::Seconds(5));
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("same TF_CONFIG"));
}

TEST(CoordinationClientTest, CallsBeforeConnectAreFailedPrecondition) {
  CoordinationClient client("127.0.0.1:1", {"chief", 0}, {"chief", 0});
  EXPECT_EQ(client.Join(absl::Now()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.Set("k", "v").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.StartWatching([](const absl::Status&) {}).code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Key-value store and barrier ---------------------------------------------

TEST_F(CoordinationTest, SetThenGetReturnsTheValueIncludingBinaryAndLarge) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(clients[0]->Set("ring/0", binary).ok());
  EXPECT_EQ(*clients[1]->Get("ring/0", absl::Seconds(1)), binary);
  const std::string big(4 << 20, 'x');  // exactly the limit
  ASSERT_TRUE(clients[0]->Set("big", big).ok());
  const auto got = clients[1]->Get("big", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), big.size());
  ASSERT_TRUE(clients[1]->Set("ring/0", "overwritten").ok());
  EXPECT_EQ(*clients[0]->Get("ring/0", absl::ZeroDuration()), "overwritten");
}

TEST_F(CoordinationTest, GetWaitsForALaterSet) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  absl::StatusOr<std::string> got;
  absl::Time got_at;
  std::thread reader([&] {
    got = clients[1]->Get("nccl/id", absl::Seconds(5));
    got_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(clients[0]->Set("nccl/id", "unique-id").ok());
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "unique-id");
  EXPECT_GE(got_at, set_at);
  EXPECT_LT(got_at - set_at, absl::Milliseconds(500));
}

TEST_F(CoordinationTest, GetTimeoutIsDeadlineExceededNamingTheKey) {
  StartService(Tasks(1));
  auto clients = JoinAll();
  const absl::Time start = absl::Now();
  const auto got = clients[0]->Get("ring/3/address", absl::Milliseconds(300));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("'ring/3/address'"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
}

TEST_F(CoordinationTest, BarrierReleasesEveryoneOnlyWhenAllArriveAndIsReusable) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  for (int round = 0; round < 2; ++round) {
    std::atomic<int> released{0};
    std::vector<absl::Status> results(3);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        results[i] = clients[i]->Barrier("step", absl::Seconds(5));
        ++released;
      });
    }
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_EQ(released.load(), 0) << "released before the last task arrived";
    results[2] = clients[2]->Barrier("step", absl::Seconds(5));
    for (auto& t : threads) t.join();
    for (const auto& s : results) EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_F(CoordinationTest, BarrierTimeoutNamesTheTaskThatDidNotArrive) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  std::thread t([&] {
    const absl::Status s = clients[0]->Barrier("init", absl::Milliseconds(300));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("still waiting for worker:1"),
                                   Not(HasSubstr("worker:0")), HasSubstr("'init'")));
  });
  // Longer, so that the chief's answer is computed while worker:0 is still there.
  const absl::Status s = clients[1]->Barrier("init", absl::Milliseconds(600));
  t.join();
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker:1"));
}

TEST_F(CoordinationTest, BarrierDoesNotWaitForATaskThatLeft) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  ASSERT_TRUE(clients[1]->Leave().ok());
  EXPECT_TRUE(clients[0]->Barrier("final", absl::Seconds(2)).ok());
}

TEST_F(CoordinationTest, BarrierAbortsWhenAMemberFails) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  for (auto& c : clients) ASSERT_TRUE(c->StartWatching([](const absl::Status&) {}).ok());
  absl::Status s;
  const absl::Time start = absl::Now();
  std::thread t([&] { s = clients[0]->Barrier("b", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(100));
  clients[2].reset();  // crash without arriving
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker:1 failed"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// --- Failure detection ---------------------------------------------------------

TEST_F(CoordinationTest, TaskGoneWithoutLeaveIsReportedToEveryOtherWatcher) {
  StartService(Tasks(4));
  auto clients = JoinAll();
  std::vector<FailureSink*> sinks;
  for (auto& c : clients) {
    sinks.push_back(&NewSink());
    ASSERT_TRUE(c->StartWatching(sinks.back()->Callback()).ok());
  }
  const absl::Time crash = absl::Now();
  clients[2].reset();  // worker:1's stream is cancelled without Leave
  for (int i : {0, 1, 3}) {
    ASSERT_TRUE(sinks[i]->fired.WaitForNotificationWithTimeout(absl::Seconds(2))) << i;
    const absl::Status s = sinks[i]->Get();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("worker:1 lost"), HasSubstr("stream closed"),
                                   HasSubstr("generation 2")));
    absl::MutexLock lock(&sinks[i]->mu);
    EXPECT_LT(sinks[i]->when - crash, absl::Seconds(1));
  }
  EXPECT_EQ(service_->generation(), 2);
  // Reported once, not again for later events.
  clients[3].reset();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(sinks[0]->Calls(), 1);
}

TEST_F(CoordinationTest, TaskThatLeavesFirstIsNotAFailure) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  std::vector<FailureSink*> sinks;
  for (auto& c : clients) {
    sinks.push_back(&NewSink());
    ASSERT_TRUE(c->StartWatching(sinks.back()->Callback()).ok());
  }
  ASSERT_TRUE(clients[1]->Leave().ok());
  ASSERT_TRUE(clients[1]->Leave().ok());  // idempotent
  clients[1].reset();
  absl::SleepFor(absl::Milliseconds(300));
  for (int i : {0, 2}) EXPECT_EQ(sinks[i]->Calls(), 0) << sinks[i]->Get();
  EXPECT_EQ(service_->generation(), 1);
}

// The guarantee NewSink relies on: once a client's destructor returns, its
// callback has returned and never runs again, even when the destruction
// races with a report in progress.
TEST_F(CoordinationTest, DestroyingAClientWaitsForItsCallbackToReturn) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  absl::Notification entered;
  std::atomic<bool> returned{false};
  ASSERT_TRUE(clients[0]->StartWatching([](const absl::Status&) {}).ok());
  ASSERT_TRUE(clients[1]
                  ->StartWatching([&](const absl::Status&) {
                    entered.Notify();
                    absl::SleepFor(absl::Milliseconds(200));
                    returned = true;
                  })
                  .ok());
  clients[0].reset();  // chief:0 fails; worker:0's watcher runs the callback
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(2)));
  clients[1].reset();
  EXPECT_TRUE(returned);
}

TEST_F(CoordinationTest, FailureBeforeWatchingIsInTheFirstUpdate) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  FailureSink& sink2 = NewSink();
  ASSERT_TRUE(clients[2]->StartWatching(sink2.Callback()).ok());
  clients[2].reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (service_->generation() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  FailureSink& sink0 = NewSink();
  ASSERT_TRUE(clients[0]->StartWatching(sink0.Callback()).ok());
  ASSERT_TRUE(sink0.fired.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_THAT(std::string(sink0.Get().message()), HasSubstr("worker:1"));
}

TEST_F(CoordinationTest, CoordinatorLossIsReportedNamingItsAddress) {
  StartService(Tasks(2));
  auto clients = JoinAll();
  FailureSink& sink = NewSink();
  ASSERT_TRUE(clients[1]->StartWatching(sink.Callback()).ok());
  service_->Shutdown();
  ASSERT_TRUE(sink.fired.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_EQ(sink.Get().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sink.Get().message()), AllOf(HasSubstr("lost the coordinator chief:0"),
                                          HasSubstr(address_)));
}

TEST_F(CoordinationTest, ShutdownWithOpenStreamsAndBlockedCallsReturnsPromptly) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  for (auto& c : clients) ASSERT_TRUE(c->StartWatching([](const absl::Status&) {}).ok());
  absl::Status get_status, barrier_status;
  std::thread getter([&] { get_status = clients[1]->Get("never", absl::Seconds(30)).status(); });
  std::thread waiter([&] { barrier_status = clients[2]->Barrier("never", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  service_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1.5));
  getter.join();
  waiter.join();
  EXPECT_EQ(get_status.code(), absl::StatusCode::kUnavailable) << get_status;
  EXPECT_EQ(barrier_status.code(), absl::StatusCode::kUnavailable) << barrier_status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(CoordinationTest, WaitForAllToLeaveReturnsWhenTheLastMemberLeavesAndNamesStragglers) {
  StartService(Tasks(3));
  auto clients = JoinAll();
  for (auto& c : clients) ASSERT_TRUE(c->StartWatching([](const absl::Status&) {}).ok());
  ASSERT_TRUE(clients[0]->Leave().ok());
  const absl::Status early = service_->WaitForAllToLeave(absl::Milliseconds(200));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(early.message()),
              AllOf(HasSubstr("worker:0, worker:1"), Not(HasSubstr("chief"))));
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(clients[1]->Leave().ok());
    clients[2].reset();  // a failure also counts as gone
  });
  EXPECT_TRUE(service_->WaitForAllToLeave(absl::Seconds(5)).ok());
  t.join();
}

// --- Hostile input ---------------------------------------------------------------

TEST_F(CoordinationTest, HostileRequestsGetClearErrorsAndTheServerKeepsServing) {
  StartService(Tasks(2));
  auto stub = RawStub();
  const auto call_deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(5);
  };
  struct Case {
    std::string name;
    std::function<grpc::Status(grpc::ClientContext*)> call;
    grpc::StatusCode code;
    std::string message;
  };
  const std::string huge_key(5000, 'k');
  const std::vector<Case> cases = {
      {"join unknown task",
       [&](grpc::ClientContext* c) {
         v1::JoinRequest r;
         *r.mutable_task() = Ref("evaluator", 0);
         r.set_incarnation("x");
         v1::JoinResponse resp;
         return stub->Join(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "JoinRequest.task: 'evaluator:0' is not a member"},
      {"join negative index",
       [&](grpc::ClientContext* c) {
         v1::JoinRequest r;
         *r.mutable_task() = Ref("worker", -3);
         r.set_incarnation("x");
         v1::JoinResponse resp;
         return stub->Join(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "not a member"},
      {"join without incarnation",
       [&](grpc::ClientContext* c) {
         v1::JoinRequest r;
         *r.mutable_task() = Ref("chief", 0);
         v1::JoinResponse resp;
         return stub->Join(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "JoinRequest.incarnation must be"},
      {"join negative timeout",
       [&](grpc::ClientContext* c) {
         v1::JoinRequest r;
         *r.mutable_task() = Ref("chief", 0);
         r.set_incarnation("x");
         r.set_timeout_ms(-1);
         v1::JoinResponse resp;
         return stub->Join(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "JoinRequest.timeout_ms is -1"},
      {"get negative timeout",
       [&](grpc::ClientContext* c) {
         v1::KeyValueGetRequest r;
         r.set_key("k");
         r.set_timeout_ms(-5);
         v1::KeyValueGetResponse resp;
         return stub->KeyValueGet(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "KeyValueGetRequest.timeout_ms is -5"},
      {"get empty key",
       [&](grpc::ClientContext* c) {
         v1::KeyValueGetRequest r;
         v1::KeyValueGetResponse resp;
         return stub->KeyValueGet(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "KeyValueGetRequest.key must not be empty"},
      {"set huge key",
       [&](grpc::ClientContext* c) {
         v1::KeyValueSetRequest r;
         r.set_key(huge_key);
         v1::KeyValueSetResponse resp;
         return stub->KeyValueSet(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "KeyValueSetRequest.key is 5000 bytes"},
      {"set oversized value",
       [&](grpc::ClientContext* c) {
         v1::KeyValueSetRequest r;
         r.set_key("k");
         r.set_value(std::string((4 << 20) + 1, 'v'));
         v1::KeyValueSetResponse resp;
         return stub->KeyValueSet(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "is 4194305 bytes; the limit is 4194304"},
      {"set far beyond the message limit",
       [&](grpc::ClientContext* c) {
         v1::KeyValueSetRequest r;
         r.set_key("k");
         r.set_value(std::string(20 << 20, 'v'));
         v1::KeyValueSetResponse resp;
         return stub->KeyValueSet(c, r, &resp);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
      {"barrier of unknown task",
       [&](grpc::ClientContext* c) {
         v1::BarrierRequest r;
         r.set_name("b");
         *r.mutable_task() = Ref("worker", 9);
         v1::BarrierResponse resp;
         return stub->Barrier(c, r, &resp);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "BarrierRequest.task: 'worker:9'"},
      {"barrier before join",
       [&](grpc::ClientContext* c) {
         v1::BarrierRequest r;
         r.set_name("b");
         *r.mutable_task() = Ref("worker", 0);
         r.set_timeout_ms(100);
         v1::BarrierResponse resp;
         return stub->Barrier(c, r, &resp);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "not an admitted member"},
      {"watch before join",
       [&](grpc::ClientContext* c) {
         v1::WatchRequest r;
         *r.mutable_task() = Ref("chief", 0);
         r.set_incarnation("x");
         auto reader = stub->WatchMembership(c, r);
         v1::MembershipUpdate u;
         while (reader->Read(&u)) {
         }
         return reader->Finish();
       },
       grpc::StatusCode::FAILED_PRECONDITION, "call Join first"},
      {"leave before join",
       [&](grpc::ClientContext* c) {
         v1::LeaveRequest r;
         *r.mutable_task() = Ref("chief", 0);
         r.set_incarnation("x");
         v1::LeaveResponse resp;
         return stub->Leave(c, r, &resp);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "is not the current one"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::ClientContext ctx;
    ctx.set_deadline(call_deadline());
    const grpc::Status s = c.call(&ctx);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  // Still serving: a normal round works after all that.
  auto clients = JoinAll();
  ASSERT_TRUE(clients[0]->Set("k", "v").ok());
  EXPECT_EQ(*clients[1]->Get("k", absl::Seconds(1)), "v");
}

TEST_F(CoordinationTest, HugeTimeoutsAreCappedAndStillWakeOnShutdown) {
  StartService(Tasks(1));
  auto clients = JoinAll();
  absl::Status s;
  std::thread t([&] { s = clients[0]->Get("never", absl::InfiniteDuration()).status(); });
  absl::SleepFor(absl::Milliseconds(100));
  service_->Shutdown();
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(CoordinationServiceStartTest, RejectsEmptyOrDuplicatedMembersAndBusyPorts) {
  EXPECT_EQ(CoordinationService::Start("127.0.0.1:0", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto dup = CoordinationService::Start("127.0.0.1:0", {{"worker", 0}, {"worker", 0}});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("worker:0 is listed twice"));

  auto first = CoordinationService::Start("127.0.0.1:0", {{"worker", 0}});
  ASSERT_TRUE(first.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  const auto second = CoordinationService::Start(address, {{"worker", 0}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(address));
}

TEST(CoordinatorListenAddressTest, BindsLoopbackExactlyAndEverythingElseOnAllInterfaces) {
  struct Case {
    std::string in;
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {"127.0.0.1:2222", "127.0.0.1:2222"},
           {"127.0.0.3:41000", "127.0.0.3:41000"},
           {"localhost:5000", "localhost:5000"},
           {"job-chief-0.job.default.svc:2222", "0.0.0.0:2222"},
           {"10.1.2.3:2222", "0.0.0.0:2222"},
       }) {
    const auto got = CoordinatorListenAddress(c.in);
    ASSERT_TRUE(got.ok()) << c.in << ": " << got.status();
    EXPECT_EQ(*got, c.want) << c.in;
  }
  for (const std::string bad : {"no-port", "host:0", "host:70000", "host:abc"}) {
    EXPECT_EQ(CoordinatorListenAddress(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// Pods sharing one host network (the e2e test node) each listen on their own
// $POD_IP; loopback TF_CONFIG hosts are still bound exactly.
TEST(CoordinatorListenAddressTest, BindsThePodIpWhenPodIpIsSet) {
  setenv("POD_IP", "127.0.4.5", 1);
  const auto remote = CoordinatorListenAddress("job-chief-0.job.default.svc:2222");
  const auto local = CoordinatorListenAddress("127.0.0.1:2222");
  unsetenv("POD_IP");
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(*remote, "127.0.4.5:2222");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1:2222");
}

}  // namespace
}  // namespace distrain

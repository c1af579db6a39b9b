// The ParameterServer chief's dynamic worker set (worker/strategy/ps_membership.h)
// over loopback gRPC: joins, clean leaves, broken streams and restarted
// processes are reported in order; hostile requests are refused with the
// field named and change nothing; with mutual TLS a worker joins only as
// itself.
#include "worker/strategy/ps_membership.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/job_identity.h"
#include "distrain/v1/ps_membership.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/security/transport_security.h"

namespace distrain {
namespace {

using Kind = PsMembershipChange::Kind;
using ::testing::HasSubstr;

// Records what on_change reports.
class Changes {
 public:
  std::function<void(const PsMembershipChange&)> Callback() {
    return [this](const PsMembershipChange& c) {
      absl::MutexLock lock(&mu_);
      changes_.push_back(c);
    };
  }
  std::vector<PsMembershipChange> Get() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }
  // Waits up to 10 s until at least n changes were reported.
  std::vector<PsMembershipChange> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return changes_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return changes_;
  }

 private:
  absl::Mutex mu_;
  std::vector<PsMembershipChange> changes_ ABSL_GUARDED_BY(mu_);
};

PsMembershipClientOptions ClientOptions(int port, int worker, const std::string& incarnation) {
  PsMembershipClientOptions o;
  o.chief_address = absl::StrCat("127.0.0.1:", port);
  o.worker_index = worker;
  o.incarnation = incarnation;
  o.address = absl::StrCat("127.0.0.1:", 4000 + worker);
  o.initial_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(50);
  o.security = nullptr;
  return o;
}

class PsMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsMembershipServerOptions o;
    o.security = nullptr;
    o.max_workers = 16;
    o.on_change = changes_.Callback();
    auto server = PsMembershipServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  std::unique_ptr<v1::PsMembership::Stub> RawStub() {
    return v1::PsMembership::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials()));
  }
  // A Join with `req`: the status of the stream (it must end on its own).
  grpc::Status RawJoin(const v1::PsJoinRequest& req) {
    auto stub = RawStub();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto reader = stub->Join(&ctx, req);
    v1::PsMembershipEvent event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  }

  Changes changes_;
  std::unique_ptr<PsMembershipServer> server_;
};

TEST_F(PsMembershipTest, WorkerThatJoinsIsReportedWithItsAddressAndLeavesCleanly) {
  PsMembershipClient client(ClientOptions(server_->port(), 3, "inc-a"));
  client.Start();
  std::vector<PsMembershipChange> seen = changes_.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, Kind::kJoined);
  EXPECT_EQ(seen[0].worker, 3);
  EXPECT_EQ(seen[0].address, "127.0.0.1:4003");
  EXPECT_EQ(seen[0].incarnation, "inc-a");
  EXPECT_EQ(seen[0].generation, 1);
  EXPECT_EQ(server_->members(), (std::map<int, std::string>{{3, "127.0.0.1:4003"}}));
  for (int i = 0; i < 200 && !client.joined(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(client.joined());

  ASSERT_TRUE(client.Leave().ok());
  seen = changes_.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].kind, Kind::kLeft);
  EXPECT_EQ(seen[1].worker, 3);
  EXPECT_EQ(seen[1].generation, 2);
  EXPECT_TRUE(server_->members().empty());
  // Nothing more: the client does not join again after Leave, and the clean
  // end of the stream is not a failure.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(changes_.Get().size(), 2u);
  EXPECT_EQ(client.joins(), 1);
}

TEST_F(PsMembershipTest, StreamThatBreaksWithoutLeaveIsAFailure) {
  auto client = std::make_unique<PsMembershipClient>(ClientOptions(server_->port(), 1, "inc-a"));
  client->Start();
  ASSERT_EQ(changes_.WaitFor(1).size(), 1u);
  client.reset();  // as a killed process: the stream closes, no Leave
  std::vector<PsMembershipChange> seen = changes_.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].kind, Kind::kFailed);
  EXPECT_EQ(seen[1].worker, 1);
  EXPECT_THAT(seen[1].reason, HasSubstr("closed without Leave"));
  EXPECT_TRUE(server_->members().empty());
}

TEST_F(PsMembershipTest, RestartedProcessReplacesItsPredecessor) {
  PsMembershipClient old_process(ClientOptions(server_->port(), 2, "inc-old"));
  old_process.Start();
  ASSERT_EQ(changes_.WaitFor(1).size(), 1u);
  PsMembershipClient new_process(ClientOptions(server_->port(), 2, "inc-new"));
  new_process.Start();
  std::vector<PsMembershipChange> seen = changes_.WaitFor(3);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen[1].kind, Kind::kFailed);
  EXPECT_EQ(seen[1].incarnation, "inc-old");
  EXPECT_THAT(seen[1].reason, HasSubstr("replaced by a new process"));
  EXPECT_EQ(seen[2].kind, Kind::kJoined);
  EXPECT_EQ(seen[2].incarnation, "inc-new");
  // The old process's Leave (it is shutting down late) removes nothing.
  ASSERT_TRUE(old_process.Leave().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(server_->members().size(), 1u);
  new_process.Stop();
}

TEST_F(PsMembershipTest, HostileJoinsAreRefusedNamingTheFieldAndChangeNothing) {
  struct Case {
    int worker;
    std::string incarnation;
    std::string address;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {-1, "i", "127.0.0.1:1", "PsJoinRequest.worker_index is -1; it must be in [0, 16)"},
      {16, "i", "127.0.0.1:1", "PsJoinRequest.worker_index is 16"},
      {0, "", "127.0.0.1:1", "PsJoinRequest.incarnation must be 1..128 bytes"},
      {0, std::string(129, 'x'), "127.0.0.1:1", "PsJoinRequest.incarnation must be 1..128 bytes"},
      {0, "a b", "127.0.0.1:1", "printable ASCII"},
      {0, "i", "", "PsJoinRequest.address '': no host:port"},
      {0, "i", "worker-0", "no host:port"},
      {0, "i", "host:0", "the port is not a number in 1..65535"},
      {0, "i", "host:65536", "the port is not a number in 1..65535"},
      {0, "i", "host:22x", "the port is not a number in 1..65535"},
      {0, "i", "ho st:22", "the host has a character"},
      {0, "i", "[zz::1]:22", "IPv6"},
      {0, "i", std::string(300, 'a') + ":22", "longer than 253"},
  };
  for (const Case& c : cases) {
    v1::PsJoinRequest req;
    req.set_worker_index(c.worker);
    req.set_incarnation(c.incarnation);
    req.set_address(c.address);
    grpc::Status s = RawJoin(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.expect;
    EXPECT_THAT(s.error_message(), HasSubstr(c.expect));
  }
  {
    auto stub = RawStub();
    grpc::ClientContext ctx;
    v1::PsLeaveRequest req;
    req.set_worker_index(99);
    req.set_incarnation("i");
    v1::PsLeaveResponse resp;
    grpc::Status s = stub->Leave(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("PsLeaveRequest.worker_index is 99"));
  }
  {
    // A Leave for a worker that is no member is a no-op.
    auto stub = RawStub();
    grpc::ClientContext ctx;
    v1::PsLeaveRequest req;
    req.set_worker_index(1);
    req.set_incarnation("nobody");
    v1::PsLeaveResponse resp;
    EXPECT_TRUE(stub->Leave(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(changes_.Get().empty());
  EXPECT_EQ(server_->generation(), 0);
  // ... and the server still serves.
  PsMembershipClient client(ClientOptions(server_->port(), 0, "inc"));
  client.Start();
  EXPECT_EQ(changes_.WaitFor(1).size(), 1u);
}

TEST_F(PsMembershipTest, ClientRefusedForGoodStopsRetrying) {
  PsMembershipClientOptions o = ClientOptions(server_->port(), 0, "inc");
  o.address = "not an address";
  PsMembershipClient client(o);
  client.Start();
  for (int i = 0; i < 300 && client.refused().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(client.refused().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.refused().message()), HasSubstr("PsJoinRequest.address"));
  EXPECT_TRUE(changes_.Get().empty());
}

TEST_F(PsMembershipTest, ClientJoinsAgainWhenTheChiefRestarts) {
  PsMembershipClient client(ClientOptions(server_->port(), 5, "inc"));
  client.Start();
  ASSERT_EQ(changes_.WaitFor(1).size(), 1u);
  const int port = server_->port();
  server_->Shutdown();
  server_.reset();
  // A new chief on the same port learns the worker without it restarting.
  Changes second;
  PsMembershipServerOptions o;
  o.security = nullptr;
  o.on_change = second.Callback();
  auto server = PsMembershipServer::Start(absl::StrCat("127.0.0.1:", port), o);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<PsMembershipChange> seen = second.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, Kind::kJoined);
  EXPECT_EQ(seen[0].worker, 5);
  client.Stop();
  (*server)->Shutdown();
}

TEST(PsWorkerAddressTest, AcceptsWhatTfConfigHolds) {
  for (const char* ok : {"127.0.0.1:2222", "job-worker-3.ns.svc:2222", "localhost:1",
                         "[::1]:65535", "my_host.local:80"}) {
    EXPECT_TRUE(ValidatePsWorkerAddress(ok).ok()) << ok;
  }
}

// Mutual TLS: any worker index the job's CA certified may join, beyond
// TF_CONFIG, but only as itself.
TEST(PsMembershipTlsTest, WorkerJoinsOnlyAsItself) {
  absl::StatusOr<JobAuthority> authority = NewJobAuthority("ns/job");
  ASSERT_TRUE(authority.ok()) << authority.status();
  auto as = [&](const TaskId& task) {
    absl::StatusOr<TaskCredentials> creds = IssueTaskCredentials(*authority, task);
    EXPECT_TRUE(creds.ok()) << creds.status();
    absl::StatusOr<LoadedCredentials> loaded =
        CheckCredentials(authority->ca_cert_pem, *creds, authority->ring_key_hex);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return std::make_shared<const TransportSecurity>(*std::move(loaded));
  };
  Changes changes;
  PsMembershipServerOptions so;
  so.security = as(TaskId{"chief", 0});
  so.on_change = changes.Callback();
  auto server = PsMembershipServer::Start("127.0.0.1:0", so);
  ASSERT_TRUE(server.ok()) << server.status();

  PsMembershipClientOptions impostor = ClientOptions((*server)->port(), 7, "inc");
  impostor.security = as(TaskId{"worker", 6});  // worker:6 claiming worker:7
  PsMembershipClient bad(impostor);
  bad.Start();
  for (int i = 0; i < 500 && bad.refused().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(bad.refused().code(), absl::StatusCode::kPermissionDenied) << bad.refused();
  EXPECT_THAT(std::string(bad.refused().message()), HasSubstr("worker:6"));
  EXPECT_TRUE(changes.Get().empty());

  PsMembershipClientOptions real = ClientOptions((*server)->port(), 7, "inc");
  real.security = as(TaskId{"worker", 7});  // beyond any TF_CONFIG: still certified
  PsMembershipClient good(real);
  good.Start();
  std::vector<PsMembershipChange> seen = changes.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].worker, 7);
  good.Stop();
  bad.Stop();
}

}  // namespace
}  // namespace distrain

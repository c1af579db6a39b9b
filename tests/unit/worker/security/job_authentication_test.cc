// Only the job's own processes may join, push or read (docs/security.md):
// real coordination, parameter-server and PsWorker servers with mutual TLS,
// in-process on loopback, against callers without credentials, with another
// job's credentials, and with this job's credentials but the wrong task.
// Every refusal is checked for its status and message, for nothing applied,
// and for the real job still being served afterwards.

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_identity.h"
#include "distrain/v1/coordination.grpc.pb.h"
#include "distrain/v1/parameter_server.grpc.pb.h"
#include "distrain/v1/ps_worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/ps/ps_test_cluster.h"
#include "worker/coordination/coordination_client.h"
#include "worker/coordination/coordination_service.h"
#include "worker/coordination/task_ref.h"
#include "worker/model/model.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_service.h"
#include "worker/security/transport_security.h"
#include "worker/strategy/parameter_server.h"
#include "worker/strategy/ps_worker.h"

namespace distrain {
namespace {

namespace v1 = ::distrain::v1;
using ::distrain::testing_ps::MakeOptimizerConfig;
using ::distrain::testing_ps::Pattern;
using ::distrain::testing_ps::PsTestCluster;
using ::distrain::testing_ps::ScopedTempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The credentials of one job, per task, as the operator would issue them.
class TestJob {
 public:
  explicit TestJob(const std::string& name) {
    absl::StatusOr<JobAuthority> authority = NewJobAuthority(name);
    EXPECT_TRUE(authority.ok()) << authority.status();
    authority_ = *std::move(authority);
  }
  std::shared_ptr<const TransportSecurity> As(const TaskId& task) {
    auto& slot = issued_[task.ToString()];
    if (slot == nullptr) {
      absl::StatusOr<TaskCredentials> creds = IssueTaskCredentials(authority_, task);
      EXPECT_TRUE(creds.ok()) << creds.status();
      absl::StatusOr<LoadedCredentials> loaded =
          CheckCredentials(authority_.ca_cert_pem, *creds, authority_.ring_key_hex);
      EXPECT_TRUE(loaded.ok()) << loaded.status();
      slot = std::make_shared<TransportSecurity>(*std::move(loaded));
    }
    return slot;
  }

 private:
  JobAuthority authority_;
  std::map<std::string, std::shared_ptr<const TransportSecurity>> issued_;
};

grpc::ClientContext* WithDeadline(grpc::ClientContext& ctx, int seconds = 5) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return &ctx;
}

// A channel to `address` as `as` (null: plaintext) expecting to reach `server`.
std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address,
                                         const std::shared_ptr<const TransportSecurity>& as,
                                         const TaskId& server) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> creds = ChannelCredentialsFor(as.get(), server, &args);
  return grpc::CreateCustomChannel(address, creds, args);
}

// ---------------------------------------------------------------------------
// Coordination: chief:0 coordinates chief:0, worker:0, worker:1.

class CoordinationAuthenticationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    members_ = {{"chief", 0}, {"worker", 0}, {"worker", 1}};
    CoordinationServiceOptions options;
    options.coordinator = members_[0];
    options.security = job_.As(members_[0]);
    auto service = CoordinationService::Start("127.0.0.1:0", members_, options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    address_ = absl::StrCat("127.0.0.1:", service_->port());
  }

  std::unique_ptr<v1::Coordination::Stub> StubAs(const std::shared_ptr<const TransportSecurity>& as,
                                                  const TaskId& server = {"chief", 0}) {
    return v1::Coordination::NewStub(ChannelAs(address_, as, server));
  }

  std::unique_ptr<CoordinationClient> ClientAs(const TaskId& task) {
    CoordinationClientOptions options;
    options.security = job_.As(task);
    return std::make_unique<CoordinationClient>(address_, members_[0], task, options);
  }

  // Every real member connects and joins (the impostors changed nothing).
  void ExpectRealJobJoins() {
    std::vector<std::unique_ptr<CoordinationClient>> clients;
    for (const TaskId& t : members_) clients.push_back(ClientAs(t));
    std::vector<absl::Status> joined(clients.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < clients.size(); ++i) {
      threads.emplace_back([&, i] {
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        joined[i] = clients[i]->Connect(deadline);
        if (joined[i].ok()) joined[i] = clients[i]->Join(deadline).status();
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < joined.size(); ++i) {
      EXPECT_TRUE(joined[i].ok()) << members_[i].ToString() << ": " << joined[i];
    }
  }

  grpc::Status Ping(v1::Coordination::Stub& stub) {
    grpc::ClientContext ctx;
    v1::PingResponse response;
    return stub.Ping(WithDeadline(ctx, 3), v1::PingRequest(), &response);
  }

  TestJob job_{"team-a/job"};
  TestJob other_job_{"team-b/job"};
  std::vector<TaskId> members_;
  std::unique_ptr<CoordinationService> service_;
  std::string address_;
};

TEST_F(CoordinationAuthenticationTest, ACallerWithoutCredentialsIsRefusedAtTheHandshake) {
  auto stub = StubAs(nullptr);
  EXPECT_EQ(Ping(*stub).error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::JoinRequest join;
  *join.mutable_task() = ToTaskRef(members_[1]);
  join.set_incarnation("stranger");
  grpc::ClientContext ctx;
  v1::JoinResponse response;
  EXPECT_FALSE(stub->Join(WithDeadline(ctx, 3), join, &response).ok());
  ExpectRealJobJoins();
}

TEST_F(CoordinationAuthenticationTest, AnotherJobsCertificateIsRefusedAtTheHandshake) {
  auto stub = StubAs(other_job_.As(members_[1]));
  EXPECT_EQ(Ping(*stub).error_code(), grpc::StatusCode::UNAVAILABLE);
  ExpectRealJobJoins();
}

TEST_F(CoordinationAuthenticationTest, AClientRefusesAServerThatIsNotTheTaskItDialled) {
  // worker:0's certificate is of this job, but it is not the coordinator's:
  // a member listening on the coordinator's address cannot pose as it.
  CoordinationServiceOptions options;
  options.coordinator = members_[0];
  options.security = job_.As(members_[1]);
  auto impostor = CoordinationService::Start("127.0.0.1:0", members_, options);
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  grpc::ChannelArguments args;
  auto stub = v1::Coordination::NewStub(
      ChannelAs(absl::StrCat("127.0.0.1:", (*impostor)->port()), job_.As(members_[2]),
                members_[0]));
  EXPECT_EQ(Ping(*stub).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(CoordinationAuthenticationTest, AMemberCannotJoinWatchBarrierOrLeaveAsAnotherTask) {
  auto stub = StubAs(job_.As(members_[2]));  // worker:1 ...
  const v1::TaskRef victim = ToTaskRef(members_[1]);  // ... posing as worker:0
  {
    v1::JoinRequest r;
    *r.mutable_task() = victim;
    r.set_incarnation("impostor");
    grpc::ClientContext ctx;
    v1::JoinResponse response;
    grpc::Status s = stub->Join(WithDeadline(ctx), r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(),
                AllOf(HasSubstr("Join"), HasSubstr("refused for worker:1"),
                      HasSubstr("only worker:0 itself")));
  }
  {
    v1::WatchRequest r;
    *r.mutable_task() = victim;
    r.set_incarnation("impostor");
    grpc::ClientContext ctx;
    auto reader = stub->WatchMembership(WithDeadline(ctx), r);
    v1::MembershipUpdate update;
    while (reader->Read(&update)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::BarrierRequest r;
    *r.mutable_task() = victim;
    r.set_name("b");
    r.set_timeout_ms(100);
    grpc::ClientContext ctx;
    v1::BarrierResponse response;
    EXPECT_EQ(stub->Barrier(WithDeadline(ctx), r, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::LeaveRequest r;
    *r.mutable_task() = victim;
    r.set_incarnation("impostor");
    grpc::ClientContext ctx;
    v1::LeaveResponse response;
    EXPECT_EQ(stub->Leave(WithDeadline(ctx), r, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  ExpectRealJobJoins();
}

TEST_F(CoordinationAuthenticationTest, AKeyBelongsToItsFirstWriterAndTheEvaluatorCannotRead) {
  std::unique_ptr<CoordinationClient> w0 = ClientAs(members_[1]);
  std::unique_ptr<CoordinationClient> w1 = ClientAs(members_[2]);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(w0->Connect(deadline).ok());
  ASSERT_TRUE(w1->Connect(deadline).ok());
  ASSERT_TRUE(w1->Set("mwms/g1/ring/2", "10.0.0.2:4000 nonce").ok());
  // worker:0 may not redirect worker:1's ring address to itself.
  absl::Status overwrite = w0->Set("mwms/g1/ring/2", "10.6.6.6:4000 nonce");
  EXPECT_EQ(overwrite.code(), absl::StatusCode::kPermissionDenied) << overwrite;
  EXPECT_THAT(std::string(overwrite.message()),
              AllOf(HasSubstr("was set by worker:1"), HasSubstr("worker:0 may not overwrite")));
  absl::StatusOr<std::string> value = w0->Get("mwms/g1/ring/2", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "10.0.0.2:4000 nonce");
  // Its owner may (a restarted worker:1 republishing).
  EXPECT_TRUE(w1->Set("mwms/g1/ring/2", "10.0.0.3:4000 nonce").ok());
  // The evaluator holds a certificate of the job but is no member.
  auto evaluator = StubAs(job_.As(TaskId{"evaluator", 0}));
  v1::KeyValueGetRequest get;
  get.set_key("mwms/g1/ring/2");
  grpc::ClientContext ctx;
  v1::KeyValueGetResponse response;
  grpc::Status s = evaluator->KeyValueGet(WithDeadline(ctx), get, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("only the job's members"));
}

// ---------------------------------------------------------------------------
// Parameter server ps:0 of a job with chief:0, worker:0, worker:1.

class PsAuthenticationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsServiceOptions options;
    options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
    options.checkpoint_dir = dir_.path();
    options.max_step = 100;
    options.security = job_.As(TaskId{"ps", 0});
    cluster_ = std::make_unique<PsTestCluster>(1, options);
    absl::StatusOr<ShardingPlan> plan =
        ShardingPlan::Create({{"w", {6, 2}}}, *Partitioner::FixedShards(2), 1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *plan;
    PsClientOptions chief;
    chief.security = job_.As(TaskId{"chief", 0});
    chief.connect_timeout = absl::Seconds(5);
    chief_ = cluster_->Client(plan_, chief);
    ASSERT_NE(chief_, nullptr);
    init_ = Pattern({6, 2}, 3);
    ASSERT_TRUE(chief_->Initialize({{"w", &init_}}).ok());
  }

  std::unique_ptr<v1::ParameterServer::Stub> StubAs(
      const std::shared_ptr<const TransportSecurity>& as) {
    return v1::ParameterServer::NewStub(
        ChannelAs(cluster_->servers[0]->address(), as, TaskId{"ps", 0}));
  }

  // A worker's real pull and push still work, and nothing else was written.
  void ExpectWorkerServedAndNothingWritten() {
    PsClientOptions worker;
    worker.security = job_.As(TaskId{"worker", 1});
    worker.connect_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Create(cluster_->Addresses(), plan_, worker);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<PullResult> pulled = (*client)->Pull({"w"});
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_THAT(pulled->versions["w"], ::testing::Each(0)) << "something was applied";
    const Tensor g = Pattern({6, 2}, 9);
    absl::StatusOr<PushResult> pushed = (*client)->Push({{"w", &g}}, &pulled->versions);
    EXPECT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_TRUE(!std::filesystem::exists(dir_.path()) || std::filesystem::is_empty(dir_.path()))
        << "a file was written";
  }

  TestJob job_{"team-a/job"};
  TestJob other_job_{"team-b/job"};
  const ScopedTempDir dir_{"authentication"};
  std::unique_ptr<PsTestCluster> cluster_;
  ShardingPlan plan_;
  std::unique_ptr<PsClient> chief_;
  Tensor init_;
};

TEST_F(PsAuthenticationTest, NoCredentialsAndAnotherJobsAreRefusedBeforeAnyHandler) {
  for (const auto& [name, as] :
       std::vector<std::pair<std::string, std::shared_ptr<const TransportSecurity>>>{
           {"no credentials", nullptr}, {"another job", other_job_.As(TaskId{"chief", 0})}}) {
    auto stub = StubAs(as);
    v1::SaveRequest save;
    save.set_step(5);
    grpc::ClientContext ctx;
    v1::SaveResponse response;
    EXPECT_EQ(stub->Save(WithDeadline(ctx, 3), save, &response).error_code(),
              grpc::StatusCode::UNAVAILABLE)
        << name;
    grpc::ClientContext health_ctx;
    v1::HealthResponse health;
    EXPECT_EQ(
        stub->Health(WithDeadline(health_ctx, 3), v1::HealthRequest(), &health).error_code(),
        grpc::StatusCode::UNAVAILABLE)
        << name;
  }
  ExpectWorkerServedAndNothingWritten();
}

TEST_F(PsAuthenticationTest, AWorkerCannotSaveRestoreOrDeclareVariables) {
  auto stub = StubAs(job_.As(TaskId{"worker", 0}));
  {
    v1::SaveRequest r;
    r.set_step(5);
    grpc::ClientContext ctx;
    v1::SaveResponse response;
    grpc::Status s = stub->Save(WithDeadline(ctx), r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), AllOf(HasSubstr("Save"), HasSubstr("refused for worker:0"),
                                         HasSubstr("only the chief")));
  }
  {
    v1::RestoreRequest r;
    grpc::ClientContext ctx;
    v1::RestoreResponse response;
    EXPECT_EQ(stub->Restore(WithDeadline(ctx), r, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::CreateVariablesRequest r;
    auto* shard = r.add_shards();
    shard->set_variable("evil");
    shard->set_num_shards(1);
    shard->add_full_shape(4);
    shard->set_row_end(4);
    grpc::ClientContext ctx;
    v1::CreateVariablesResponse response;
    EXPECT_EQ(stub->CreateVariables(WithDeadline(ctx), r, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  ExpectWorkerServedAndNothingWritten();
}

TEST_F(PsAuthenticationTest, OnlyTheChiefAndWorkersPushAndPull) {
  for (const TaskId& task : {TaskId{"evaluator", 0}, TaskId{"ps", 1}}) {
    PsClientOptions options;
    options.security = job_.As(task);
    options.connect_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Create(cluster_->Addresses(), plan_, options);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<PullResult> pulled = (*client)->Pull({"w"});
    EXPECT_EQ(pulled.status().code(), absl::StatusCode::kPermissionDenied) << task.ToString();
    ShardVersions versions = {{"w", {0, 0}}};
    const Tensor g = Pattern({6, 2}, 9);
    absl::StatusOr<PushResult> pushed = (*client)->Push({{"w", &g}}, &versions);
    EXPECT_EQ(pushed.status().code(), absl::StatusCode::kPermissionDenied) << task.ToString();
  }
  ExpectWorkerServedAndNothingWritten();
  // The chief's own Save works (and is the only file written).
  absl::Status saved = chief_->Save(7);
  EXPECT_TRUE(saved.ok()) << saved;
}

// ---------------------------------------------------------------------------
// A worker's PsWorker service answers only the chief.

TEST(PsWorkerAuthenticationTest, AnotherWorkerCannotDriveAWorker) {
  TestJob job("team-a/job");
  JobConfig config;
  config.strategy = StrategyKind::kParameterServer;
  config.training.model.hidden_units = {8};
  config.training.dataset.num_examples = 256;
  config.training.dataset.num_features = 16;
  config.training.dataset.num_classes = 4;
  config.training.global_batch_size = 16;
  config.training.steps = 10;
  auto spec = ClusterSpec::Create(
      {{"chief", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:2", "127.0.0.1:3"}}, {"ps", {"127.0.0.1:4"}}},
      TaskId{"worker", 0});
  ASSERT_TRUE(spec.ok()) << spec.status();
  PsWorkerOptions options;
  options.config = config;
  options.cluster = *spec;
  options.security = job.As(TaskId{"worker", 0});
  PsWorkerService service(options);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartPsWorkerServer("127.0.0.1:0", service, &port);
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto stub_as = [&](const TaskId& task) {
    return v1::PsWorker::NewStub(ChannelAs(address, job.As(task), TaskId{"worker", 0}));
  };
  auto other_worker = stub_as(TaskId{"worker", 1});
  {
    grpc::ClientContext ctx;
    v1::RunStepResponse response;
    grpc::Status s = other_worker->RunStep(WithDeadline(ctx), v1::RunStepRequest(), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), AllOf(HasSubstr("RunStep"), HasSubstr("refused for worker:1")));
  }
  {
    grpc::ClientContext ctx;
    v1::FinishResponse response;
    EXPECT_EQ(other_worker->Finish(WithDeadline(ctx), v1::FinishRequest(), &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::PrepareResponse response;
    EXPECT_EQ(
        other_worker->Prepare(WithDeadline(ctx), v1::PrepareRequest(), &response).error_code(),
        grpc::StatusCode::PERMISSION_DENIED);
  }
  // The chief gets past the role check (its empty Prepare is refused for
  // what it says, not for who sent it).
  auto chief = stub_as(TaskId{"chief", 0});
  grpc::ClientContext ctx;
  v1::PrepareResponse response;
  grpc::Status s = chief->Prepare(WithDeadline(ctx), v1::PrepareRequest(), &response);
  EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace distrain

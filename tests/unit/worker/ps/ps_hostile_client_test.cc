// Hostile clients against a real parameter server and a real PsWorker
// service, in-process on loopback (issue 16 item 2, "server-side
// authority"): paths in Save/Restore, sizes beyond the PsLimits /
// PsWorkerLimits, frames that lie about their data. Every case checks the
// status and its message (field, value, limit), that nothing was applied
// (values, versions, declared shards, files), and that the real job is still
// served afterwards (a real pull and a real push).

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distrain/v1/parameter_server.grpc.pb.h"
#include "distrain/v1/ps_worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/ps/ps_test_cluster.h"
#include "worker/model/model.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_service.h"
#include "worker/strategy/parameter_server.h"
#include "worker/strategy/ps_worker.h"

namespace distrain {
namespace {

namespace v1 = ::distrain::v1;
using ::distrain::testing_ps::BitEqual;
using ::distrain::testing_ps::MakeOptimizerConfig;
using ::distrain::testing_ps::Pattern;
using ::distrain::testing_ps::PsTestCluster;
using ::distrain::testing_ps::ScopedTempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ShardingPlan Plan(const std::vector<VariableSpec>& vars, const Partitioner& p, int num_ps) {
  absl::StatusOr<ShardingPlan> plan = ShardingPlan::Create(vars, p, num_ps);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// Every regular file under `dir` (none when it does not exist).
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) out.push_back(it->path().string());
  }
  return out;
}

grpc::ClientContext* WithDeadline(grpc::ClientContext& ctx,
                                  std::chrono::seconds timeout = std::chrono::seconds(10)) {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  return &ctx;
}

// One ps (task 0 of 1) with its own checkpoint directory and small limits,
// hosting the real job's variable "w" [6, 2] and a variable "big" [16384],
// each in two shards, initialised. An upload of both of big's shards (64 KiB)
// fills most of the 80 KiB staging budget.
class PsAuthorityTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBigElements = 16384;      // 64 KiB
  static constexpr int64_t kBigShardElements = 8192;  // 32 KiB

  void SetUp() override {
    PsServiceOptions options;
    options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
    options.checkpoint_dir = own_.path();
    options.checkpoint_keep = 2;
    options.max_step = 100;
    options.limits.max_shards = 64;
    options.limits.max_hosted_bytes = 1 << 20;
    options.limits.max_staging_bytes = 80 << 10;
    cluster_ = std::make_unique<PsTestCluster>(1, options);
    client_ = cluster_->Client(
        Plan({{"w", {6, 2}}, {"big", {kBigElements}}}, *Partitioner::FixedShards(2), 1));
    ASSERT_NE(client_, nullptr);
    init_ = Pattern({6, 2}, 3);
    const Tensor big = Pattern({kBigElements}, 4);
    ASSERT_TRUE(client_->Initialize({{"w", &init_}, {"big", &big}}).ok());
    channel_ =
        grpc::CreateChannel(cluster_->servers[0]->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::ParameterServer::NewStub(channel_);
    declared_ = Health().shards();
  }

  v1::HealthResponse Health() {
    absl::StatusOr<std::vector<v1::HealthResponse>> h = client_->Health();
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? (*h)[0] : v1::HealthResponse();
  }

  // Nothing applied: "w" holds its initial values at version 0, no shard was
  // declared, no push counted, no checkpoint file written.
  void ExpectNothingApplied(const std::string& what) {
    absl::StatusOr<PullResult> pulled = client_->Pull({"w"});
    ASSERT_TRUE(pulled.ok()) << what << ": " << pulled.status();
    EXPECT_TRUE(BitEqual(pulled->values["w"], init_)) << what << ": values changed";
    EXPECT_THAT(pulled->versions["w"], ::testing::Each(0)) << what;
    const v1::HealthResponse h = Health();
    EXPECT_EQ(h.shards(), declared_) << what << ": shards were declared";
    EXPECT_EQ(h.pushes_applied(), 0) << what;
    EXPECT_THAT(FilesUnder(own_.path()), IsEmpty()) << what << ": a file was written";
  }

  // The real job goes on: a push is applied and a pull sees it.
  void ExpectRealJobServed(const std::string& what) {
    const Tensor g = Pattern({6, 2}, 9);
    absl::StatusOr<PullResult> before = client_->Pull({"w"});
    ASSERT_TRUE(before.ok()) << what << ": " << before.status();
    absl::StatusOr<PushResult> pushed = client_->Push({{"w", &g}}, &before->versions);
    ASSERT_TRUE(pushed.ok()) << what << ": " << pushed.status();
    absl::StatusOr<PullResult> after = client_->Pull({"w"});
    ASSERT_TRUE(after.ok()) << what << ": " << after.status();
    EXPECT_FALSE(BitEqual(after->values["w"], before->values["w"])) << what;
    for (size_t i = 0; i < after->versions["w"].size(); ++i) {
      EXPECT_EQ(after->versions["w"][i], before->versions["w"][i] + 1) << what;
    }
  }

  grpc::Status Create(const v1::CreateVariablesRequest& request) {
    grpc::ClientContext ctx;
    v1::CreateVariablesResponse response;
    return stub_->CreateVariables(WithDeadline(ctx), request, &response);
  }
  static v1::CreateVariablesRequest OneShard(const std::string& variable,
                                             std::vector<int64_t> shape, int shard = 0,
                                             int num_shards = 1) {
    v1::CreateVariablesRequest r;
    v1::ShardSpec* spec = r.add_shards();
    spec->set_variable(variable);
    spec->set_shard(shard);
    spec->set_num_shards(num_shards);
    for (int64_t d : shape) spec->add_full_shape(d);
    spec->set_row_begin(0);
    spec->set_row_end(shape.empty() ? 1 : shape[0] / num_shards);
    return r;
  }

  static v1::UploadMessage Header(const std::string& variable, int shard, int64_t elements) {
    v1::UploadMessage m;
    v1::UploadShard* s = m.mutable_header()->add_shards();
    s->mutable_ref()->set_variable(variable);
    s->mutable_ref()->set_shard(shard);
    s->set_num_elements(elements);
    return m;
  }
  static void AddChunk(v1::UploadMessage& m, int index, int64_t offset, size_t bytes) {
    v1::DataChunk* c = m.add_chunks();
    c->set_index(index);
    c->set_offset(offset);
    c->set_data(std::string(bytes, '\0'));
  }

  // An upload stream (Initialize or Push) of protobuf messages.
  grpc::Status Upload(bool push, const std::vector<v1::UploadMessage>& messages) {
    std::vector<std::string> bytes;
    for (const v1::UploadMessage& m : messages) bytes.push_back(m.SerializeAsString());
    return RawUpload(push, bytes);
  }
  // Upload as a Push every 20 ms until the server answers `code`, for at
  // most 20 s: what another stream's reservation makes it answer changes
  // when the server gets to that stream. Returns the last answer.
  grpc::Status PushUntil(const std::vector<v1::UploadMessage>& messages, grpc::StatusCode code) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    grpc::Status s = Upload(/*push=*/true, messages);
    while (s.error_code() != code && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      s = Upload(/*push=*/true, messages);
    }
    return s;
  }
  // The same with arbitrary bytes per message (frames that lie).
  grpc::Status RawUpload(bool push, const std::vector<std::string>& messages) {
    grpc::internal::RpcMethod method(
        push ? "/distrain.v1.ParameterServer/Push" : "/distrain.v1.ParameterServer/Initialize",
        grpc::internal::RpcMethod::CLIENT_STREAMING, channel_);
    grpc::ClientContext ctx;
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel_.get(), method, WithDeadline(ctx), &response));
    for (const std::string& m : messages) {
      grpc::Slice slice(m);
      if (!writer->Write(grpc::ByteBuffer(&slice, 1))) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Pull(const v1::PullRequest& request) {
    grpc::ClientContext ctx;
    auto reader = stub_->Pull(WithDeadline(ctx), request);
    v1::PullMessage m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  }

  const ScopedTempDir own_{"authority_own"};
  const ScopedTempDir elsewhere_{"authority_elsewhere"};
  std::unique_ptr<PsTestCluster> cluster_;
  std::unique_ptr<PsClient> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  Tensor init_;
  int declared_ = 0;
};

// --- Save / Restore: the ps's own directory only ------------------------------

TEST_F(PsAuthorityTest, SaveCarryingAPathInTheRetiredDirFieldWritesOnlyUnderItsOwnDirectory) {
  // A peer of the old protocol (or an attacker) still sends field 1: the ps
  // parses it as an unknown field and ignores it.
  v1::SaveRequest request;
  request.set_step(7);
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1, elsewhere_.path());
  grpc::ClientContext ctx;
  v1::SaveResponse response;
  const grpc::Status s = stub_->Save(WithDeadline(ctx), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string expected = CheckpointManager(PsCheckpointDir(own_.path(), 0, 1), 1)
                                   .PathForStep(7);
  EXPECT_EQ(response.path(), expected);
  EXPECT_THAT(FilesUnder(own_.path()), ::testing::ElementsAre(expected));
  EXPECT_FALSE(std::filesystem::exists(elsewhere_.path())) << "nothing written where it asked";
  ExpectRealJobServed("after a Save naming a path");
}

TEST_F(PsAuthorityTest, RestoreCarryingAPathInTheRetiredDirFieldReadsOnlyItsOwnDirectory) {
  // A checkpoint planted elsewhere, in the ps layout, with other values.
  {
    PsServiceOptions planter;
    planter.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
    planter.checkpoint_dir = elsewhere_.path();
    PsTestCluster other(1, planter);
    std::unique_ptr<PsClient> c = other.Client(client_->plan());
    ASSERT_NE(c, nullptr);
    const Tensor w = Pattern({6, 2}, 66), big = Pattern({kBigElements}, 67);
    ASSERT_TRUE(c->Initialize({{"w", &w}, {"big", &big}}).ok());
    ASSERT_TRUE(c->Save(5).ok());
    ASSERT_TRUE(LoadPsCheckpoint(elsewhere_.path()).ok());
  }
  v1::RestoreRequest request;
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1, elsewhere_.path());
  grpc::ClientContext ctx;
  v1::RestoreResponse response;
  const grpc::Status s = stub_->Restore(WithDeadline(ctx), request, &response);
  EXPECT_EQ(s.error_code(), grpc::NOT_FOUND) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(own_.path()));
  ExpectNothingApplied("after a Restore naming a planted checkpoint");
  ExpectRealJobServed("after a Restore naming a planted checkpoint");
}

TEST_F(PsAuthorityTest, SaveAndRestoreOnAPsWithoutACheckpointDirectoryAreFailedPrecondition) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster bare(1, options);  // no checkpoint_dir: DISTRAIN_CHECKPOINT_DIR unset
  std::unique_ptr<PsClient> c = bare.Client(client_->plan());
  ASSERT_NE(c, nullptr);
  const Tensor w = Pattern({6, 2}, 1), big = Pattern({kBigElements}, 2);
  ASSERT_TRUE(c->Initialize({{"w", &w}, {"big", &big}}).ok());
  const std::filesystem::path cwd = std::filesystem::current_path();
  const absl::Status saved = c->Save(3);
  EXPECT_EQ(saved.code(), absl::StatusCode::kFailedPrecondition) << saved;
  EXPECT_THAT(std::string(saved.message()),
              AllOf(HasSubstr("Save: ps:0 has no checkpoint directory"),
                    HasSubstr("DISTRAIN_CHECKPOINT_DIR"),
                    HasSubstr("spec.training.checkpoint.dir")));
  EXPECT_FALSE(std::filesystem::exists(cwd / "ps-0-of-1")) << "nothing written relative";
  const absl::Status restored = c->Restore().status();
  EXPECT_EQ(restored.code(), absl::StatusCode::kFailedPrecondition) << restored;
  EXPECT_THAT(std::string(restored.message()),
              HasSubstr("Restore: ps:0 has no checkpoint directory"));
  absl::StatusOr<PullResult> pulled = c->Pull({"w"});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["w"], w));
}

TEST_F(PsAuthorityTest, SaveBeyondTheJobsStepsOrPruningMoreThanItsRetentionWritesNothing) {
  struct Case {
    const char* name;
    int64_t step;
    int32_t keep;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a step that looks newer than every real checkpoint", int64_t{1} << 50, 0,
       "Save: step is 1125899906842624; it must be in [0, 100] (the job's steps)"},
      {"a negative step", -1, 0, "Save: step is -1"},
      {"keep below the ps's own retention", 5, 1,
       "Save: keep is 1; it must be 0 (ps:0's own retention, 2) or at least that"},
      {"a negative keep", 5, -3, "Save: keep is -3"},
  };
  for (const Case& c : cases) {
    v1::SaveRequest request;
    request.set_step(c.step);
    request.set_keep(c.keep);
    grpc::ClientContext ctx;
    v1::SaveResponse response;
    const grpc::Status s = stub_->Save(WithDeadline(ctx), request, &response);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectNothingApplied(c.name);
  }
  ExpectRealJobServed("after Saves out of bounds");
}

// --- CreateVariables: sizes, before anything is declared or allocated ---------

TEST_F(PsAuthorityTest, CreateVariablesOf2To40FloatsIsRefusedBeforeDeclaringAnything) {
  const grpc::Status s = Create(OneShard("huge", {int64_t{1} << 20, int64_t{1} << 20}));
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("shards[0] (variable \"huge\" shard 0).full_shape"),
                    HasSubstr("[1048576, 1048576] has more than 4294967296 elements"),
                    HasSubstr("PsLimits::max_variable_elements")));
  ExpectNothingApplied("2^40 floats");
  ExpectRealJobServed("2^40 floats");
}

TEST_F(PsAuthorityTest, CreateVariablesBeyondTheHostedBudgetIsResourceExhaustedAndDeclaresNone) {
  // The first shard fits; the second (1.2 MB) would take the ps past its
  // 1 MiB budget: the request declares neither.
  v1::CreateVariablesRequest request = OneShard("fits", {1000});
  *request.add_shards() = OneShard("too_big", {300000}).shards(0);
  const grpc::Status s = Create(request);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("variable \"too_big\" shard 0 (300000 elements)"),
                    HasSubstr("the limit is 1048576 (PsLimits::max_hosted_bytes)"),
                    HasSubstr("nothing declared")));
  v1::PullRequest pull;
  pull.add_variables("fits");
  EXPECT_EQ(Pull(pull).error_code(), grpc::NOT_FOUND);
  ExpectNothingApplied("beyond the hosted budget");
  ExpectRealJobServed("beyond the hosted budget");
}

TEST_F(PsAuthorityTest, CreateVariablesWithNegativeOrOverflowingDimensionsIsRefused) {
  struct Case {
    const char* name;
    std::vector<int64_t> shape;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"negative dimension", {6, -2}, "full_shape: dimension 1 is -2; dimensions must be >= 0"},
      // No rows, so zero elements, but a row of 2^80 elements: before the
      // bound covered every non-zero dimension, a row's element count
      // overflowed int64.
      {"empty variable whose rows overflow",
       {0, int64_t{1} << 40, int64_t{1} << 40},
       "PsLimits::max_variable_elements"},
      {"product that overflows int64",
       {int64_t{1} << 62, int64_t{1} << 62},
       "PsLimits::max_variable_elements"},
  };
  for (const Case& c : cases) {
    v1::CreateVariablesRequest r = OneShard("v", c.shape);
    r.mutable_shards(0)->set_row_end(0);
    const grpc::Status s = Create(r);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectNothingApplied(c.name);
  }
  ExpectRealJobServed("negative and overflowing dimensions");
}

TEST_F(PsAuthorityTest, CreateVariablesBeyondNameRankOrShardCountLimitsIsRefused) {
  const std::string long_name(2000, 'n');
  struct Case {
    const char* name;
    v1::CreateVariablesRequest request;
    const char* message;
  };
  std::vector<Case> cases = {
      {"long name", OneShard(long_name, {4}),
       "shards[0].variable \"nnnn"},
      {"rank 9", OneShard("r", {1, 1, 1, 1, 1, 1, 1, 1, 1}),
       "has 9 dimensions; the limit is 8 (PsLimits::max_rank)"},
      {"5000 shards of one variable", OneShard("s", {5000}, 0, 5000),
       "num_shards is 5000; the limit is 4096 (PsLimits::max_shards_per_variable)"},
  };
  v1::CreateVariablesRequest many;
  for (int i = 0; i < 65; ++i) *many.add_shards() = OneShard(absl::StrCat("m", i), {1}).shards(0);
  cases.push_back({"65 shards in one request", many,
                   "shards lists 65 shards; the limit is 64 (PsLimits::max_shards)"});
  for (const Case& c : cases) {
    const grpc::Status s = Create(c.request);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectNothingApplied(c.name);
  }
  EXPECT_THAT(Create(cases[0].request).error_message(),
              HasSubstr("is 2000 bytes; the limit is 1024 (PsLimits::max_name_bytes)"));
  ExpectRealJobServed("names, ranks and shard counts beyond the limits");
}

TEST_F(PsAuthorityTest, FloodOfCreateVariablesStopsAtMaxShardsAndTheJobGoesOn) {
  int accepted = 0;
  grpc::Status last;
  for (int i = 0; i < 100; ++i) {
    last = Create(OneShard(absl::StrCat("flood", i), {1}));
    if (!last.ok()) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, 64 - declared_);
  EXPECT_EQ(last.error_code(), grpc::RESOURCE_EXHAUSTED) << last.error_message();
  EXPECT_THAT(last.error_message(),
              AllOf(HasSubstr("hosts 64 shards; this request adds 1"),
                    HasSubstr("the limit of 64 (PsLimits::max_shards)")));
  EXPECT_EQ(Health().shards(), 64);
  ExpectRealJobServed("after a flood of declarations");
}

// --- Initialize / Push: sizes, staging, frames --------------------------------

TEST_F(PsAuthorityTest, InitializeAnnouncing2To40ElementsIsRefusedBeforeAllocating) {
  for (bool push : {false, true}) {
    v1::UploadMessage m = Header("w", 0, int64_t{1} << 40);
    AddChunk(m, 0, 0, 16);
    const grpc::Status s = Upload(push, {m});
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("variable \"w\" shard 0 announces 1099511627776 elements, but the "
                          "shard has 6 (shape [3, 2])"));
    ExpectNothingApplied(push ? "push of 2^40" : "initialize of 2^40");
  }
  ExpectRealJobServed("uploads of 2^40 elements");
}

TEST_F(PsAuthorityTest, UploadsWithNegativeSizesAreRefused) {
  struct Case {
    const char* name;
    v1::UploadMessage message;
    const char* expected;
  };
  std::vector<Case> cases;
  {
    v1::UploadMessage m = Header("w", 0, -6);
    cases.push_back({"negative num_elements", m, "announces -6 elements"});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    AddChunk(m, 0, -4, 8);
    cases.push_back({"negative chunk offset", m, "chunk offset -4 is negative"});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    m.mutable_header()->mutable_shards(0)->set_factor_rank(-5);
    cases.push_back({"negative factor rank", m, "factor_rank -5 must be in [1, "});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    m.mutable_header()->mutable_shards(0)->set_pulled_version(-1);
    AddChunk(m, 0, 0, 24);
    cases.push_back({"negative pulled version", m, "pulled_version -1 is negative"});
  }
  for (const Case& c : cases) {
    const grpc::Status s = Upload(/*push=*/true, {c.message});
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.expected)) << c.name;
    ExpectNothingApplied(c.name);
  }
  ExpectRealJobServed("negative sizes");
}

TEST_F(PsAuthorityTest, DataThatDisagreesWithTheAnnouncedShapeAppliesNothing) {
  struct Case {
    const char* name;
    std::vector<v1::UploadMessage> messages;
    const char* expected;
  };
  std::vector<Case> cases;
  {
    v1::UploadMessage m = Header("w", 0, 6);
    AddChunk(m, 0, 0, 28);  // 7 floats into a 6-element shard
    cases.push_back({"more data than the shape", {m}, "runs past the shard's 6 elements"});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    AddChunk(m, 0, 0, 20);  // 5 of 6, then the stream ends
    cases.push_back({"less data than the shape", {m}, "after 5 of 6 elements"});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    AddChunk(m, 0, 0, 6);  // a float and a half
    cases.push_back({"bytes that are no whole floats", {m}, "not a whole number of float32"});
  }
  {
    v1::UploadMessage m = Header("w", 0, 6);
    AddChunk(m, 1, 0, 24);
    cases.push_back({"chunk for a shard the header lacks", {m}, "chunk index 1 is out of range"});
  }
  for (const Case& c : cases) {
    for (bool push : {false, true}) {
      const grpc::Status s = Upload(push, c.messages);
      EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(c.expected)) << c.name;
      ExpectNothingApplied(c.name);
    }
  }
  ExpectRealJobServed("data disagreeing with shapes");
}

TEST_F(PsAuthorityTest, TruncatedFramesAndStreamsOfEmptyMessagesAreRejected) {
  v1::UploadMessage header = Header("w", 0, 6);
  AddChunk(header, 0, 0, 12);
  // A DataChunk that claims 1 MiB of data and carries 8 bytes.
  std::string lying("\x12\x10\x08\x00\x10\x03\x1a\x80\x80\x40", 10);
  lying.append(8, '\0');
  struct Case {
    const char* name;
    std::vector<std::string> messages;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"chunk length beyond the frame",
       {header.SerializeAsString(), lying},
       "message 1 is not an UploadMessage"},
      {"truncated varint", {std::string("\x0a\xff", 2)}, "message 0 is not an UploadMessage"},
      {"messages without data after the header",
       {header.SerializeAsString(), "", "", ""},
       "message 1 carries no element; every message after the first must carry data"},
  };
  for (const Case& c : cases) {
    const grpc::Status s = RawUpload(/*push=*/true, c.messages);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.expected)) << c.name;
    ExpectNothingApplied(c.name);
  }
  ExpectRealJobServed("truncated frames");
}

TEST_F(PsAuthorityTest, FrameLargerThanTheMessageLimitIsRefusedByTheTransport) {
  v1::UploadMessage m = Header("w", 0, 6);
  AddChunk(m, 0, 0, size_t{5} << 20);  // 5 MiB > max_message_bytes (4 MiB)
  const grpc::Status s = Upload(/*push=*/true, {m});
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectNothingApplied("5 MiB frame");
  ExpectRealJobServed("5 MiB frame");
}

TEST_F(PsAuthorityTest, UploadsBeyondTheStagingBudgetAreResourceExhaustedWhileTheJobPushes) {
  // A stream that announced both of big's shards (64 KiB of the 80 KiB
  // budget) and sent a first chunk holds its reservation while it stays open.
  grpc::ClientContext holder_ctx;
  v1::PushResponse holder_response;
  auto holder =
      stub_->Push(WithDeadline(holder_ctx, std::chrono::seconds(60)), &holder_response);
  v1::UploadMessage first = Header("big", 0, kBigShardElements);
  *first.mutable_header()->add_shards() = Header("big", 1, kBigShardElements).header().shards(0);
  AddChunk(first, 0, 0, 16);
  ASSERT_TRUE(holder->Write(first));
  // The second would need another 32 KiB: refused once the server has read
  // the holder's header, which once took over 2 s (a shuffled run of the
  // whole suite).
  v1::UploadMessage second = Header("big", 0, kBigShardElements);
  AddChunk(second, 0, 0, 16);
  grpc::Status s = PushUntil({second}, grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("Push: the header announces 32768 bytes while uploads in flight "
                              "hold 65536 bytes"),
                    HasSubstr("staging budget of 81920 (PsLimits::max_staging_bytes)")));
  // The real job's 48-byte pushes still fit beside it.
  ExpectRealJobServed("while a stream holds most of the staging budget");
  // Once the holder is gone its reservation is returned: a whole shard of
  // big (which did not fit beside it) goes through.
  holder_ctx.TryCancel();
  holder->Finish();
  v1::UploadMessage full = Header("big", 0, kBigShardElements);
  AddChunk(full, 0, 0, kBigShardElements * sizeof(float));
  s = PushUntil({full}, grpc::OK);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// --- Pull ---------------------------------------------------------------------

TEST_F(PsAuthorityTest, PullNamingMoreThanMaxShardsOrHugeNamesIsRefused) {
  v1::PullRequest many;
  for (int i = 0; i < 65; ++i) many.add_variables(absl::StrCat("x", i));
  grpc::Status s = Pull(many);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("names 65 variables and 0 shards; the limit is 64 together"));
  v1::PullRequest named;
  named.add_shards()->set_variable(std::string(100000, 'v'));
  s = Pull(named);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("is 100000 bytes; the limit is 1024 (PsLimits::max_name_bytes)"));
  ExpectNothingApplied("pulls beyond the limits");
  ExpectRealJobServed("pulls beyond the limits");
}

TEST(PsLimitsTest, ServiceRefusesLimitsThatCannotWork) {
  PsServiceOptions options;
  options.limits.max_hosted_bytes = 0;
  absl::StatusOr<std::unique_ptr<PsService>> s = PsService::Create(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("limits.max_hosted_bytes must be >= 1"));
  options = {};
  options.limits.max_message_bytes = options.chunk_bytes;  // no room for headers
  s = PsService::Create(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("limits.max_message_bytes"));
}

// --- The PsWorker service (coordinator -> worker) -----------------------------

// A worker task (worker:0 of 1) serving PsWorker as RunPsWorkerTask does,
// with one ps task behind it.
class PsWorkerAuthorityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.strategy = StrategyKind::kParameterServer;
    config_.training.model.hidden_units = {8};
    config_.training.dataset.num_examples = 256;
    config_.training.dataset.num_features = 16;
    config_.training.dataset.num_classes = 4;
    config_.training.global_batch_size = 16;
    config_.training.steps = 10;
    ps_ = std::make_unique<PsTestCluster>(1);
    auto spec = ClusterSpec::Create({{"chief", {"127.0.0.1:1"}},
                                     {"worker", {"127.0.0.1:2"}},
                                     {"ps", ps_->Addresses()}},
                                    TaskId{"worker", 0});
    ASSERT_TRUE(spec.ok()) << spec.status();
    PsWorkerOptions options;
    options.config = config_;
    options.cluster = *spec;
    options.ps_connect_timeout = absl::Seconds(5);
    service_ = std::make_unique<PsWorkerService>(options);
    int port = 0;
    server_ = StartPsWorkerServer("127.0.0.1:0", *service_, &port);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::PsWorker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                      grpc::InsecureChannelCredentials()));
    auto model = Model::Create(config_.training.model, 16, 4, config_.training.seed);
    ASSERT_TRUE(model.ok()) << model.status();
    auto plan = PsShardingPlan(**model, 1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    fingerprint_ = plan->Fingerprint();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  v1::PrepareRequest Valid() const {
    v1::PrepareRequest r;
    r.set_num_features(16);
    r.set_num_classes(4);
    r.add_example_shape(16);
    r.set_plan_fingerprint(fingerprint_);
    r.set_worker_index(0);
    return r;
  }
  grpc::Status Prepare(const v1::PrepareRequest& r) {
    grpc::ClientContext ctx;
    v1::PrepareResponse response;
    return stub_->Prepare(WithDeadline(ctx), r, &response);
  }

  JobConfig config_;
  std::unique_ptr<PsTestCluster> ps_;
  std::unique_ptr<PsWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::PsWorker::Stub> stub_;
  std::string fingerprint_;
};

TEST_F(PsWorkerAuthorityTest, PrepareWithGiantNegativeOrOverflowingShapesIsRefusedThenARealWorks) {
  struct Case {
    const char* name;
    std::function<void(v1::PrepareRequest&)> mutate;
    grpc::StatusCode code;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"2^30 features",
       [](v1::PrepareRequest& r) {
         r.set_num_features(1 << 30);
         r.clear_example_shape();
       },
       grpc::INVALID_ARGUMENT,
       "num_features is 1073741824; the limit is 16777216 (PsWorkerLimits::max_features)"},
      {"2^30 classes", [](v1::PrepareRequest& r) { r.set_num_classes(1 << 30); },
       grpc::INVALID_ARGUMENT,
       "num_classes is 1073741824; the limit is 1048576 (PsWorkerLimits::max_classes)"},
      {"negative dimension",
       [](v1::PrepareRequest& r) {
         r.clear_example_shape();
         r.add_example_shape(-4);
         r.add_example_shape(-4);
       },
       grpc::INVALID_ARGUMENT, "dimension 0 is -4; every dimension must be >= 1"},
      {"dimensions whose product overflows",
       [](v1::PrepareRequest& r) {
         r.clear_example_shape();
         r.add_example_shape(int64_t{1} << 62);
         r.add_example_shape(int64_t{1} << 62);
       },
       grpc::INVALID_ARGUMENT, "the product at most 16777216"},
      {"shape that disagrees with num_features",
       [](v1::PrepareRequest& r) {
         r.clear_example_shape();
         r.add_example_shape(3);
         r.add_example_shape(5);
       },
       grpc::INVALID_ARGUMENT, "example_shape [3, 5] does not hold 16 features"},
      {"rank 9",
       [](v1::PrepareRequest& r) {
         r.clear_example_shape();
         for (int i = 0; i < 8; ++i) r.add_example_shape(1);
         r.add_example_shape(16);
       },
       grpc::INVALID_ARGUMENT, "has 9 dimensions; the limit is 8"},
      {"unknown task id", [](v1::PrepareRequest& r) { r.set_worker_index(7); },
       grpc::FAILED_PRECONDITION, "this process is worker:0 but the coordinator expects worker:7"},
      {"message beyond 64 KiB",
       [](v1::PrepareRequest& r) { r.set_plan_fingerprint(std::string(100 << 10, 'f')); },
       grpc::RESOURCE_EXHAUSTED, ""},
      {"long fingerprint",
       [](v1::PrepareRequest& r) { r.set_plan_fingerprint(std::string(1000, 'f')); },
       grpc::INVALID_ARGUMENT, "plan_fingerprint is 1000 bytes; the limit is 256"},
  };
  for (const Case& c : cases) {
    v1::PrepareRequest r = Valid();
    c.mutate(r);
    const grpc::Status s = Prepare(r);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.expected)) << c.name;
  }
  // Nothing was built: RunStep still finds the worker unprepared.
  {
    grpc::ClientContext ctx;
    v1::RunStepResponse response;
    EXPECT_EQ(stub_->RunStep(WithDeadline(ctx), v1::RunStepRequest(), &response).error_code(),
              grpc::UNAVAILABLE);
  }
  // The real coordinator's Prepare is served.
  const grpc::Status s = Prepare(Valid());
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(PsWorkerAuthorityTest, RunStepWithNegativeClosureIdsIsRefused) {
  for (const auto& [closure, attempt] : std::vector<std::pair<int64_t, int>>{{-1, 0}, {0, -1}}) {
    v1::RunStepRequest r;
    r.set_closure_id(closure);
    r.set_attempt(attempt);
    grpc::ClientContext ctx;
    v1::RunStepResponse response;
    const grpc::Status s = stub_->RunStep(WithDeadline(ctx), r, &response);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("must be >= 0"));
  }
}

}  // namespace
}  // namespace distrain

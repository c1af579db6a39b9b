#include "worker/ps/ps_service.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/unit/worker/ps/ps_test_cluster.h"
#include "worker/model/optimizer.h"
#include "worker/ps/ps_client.h"

namespace distrain {
namespace {

namespace v1 = ::distrain::v1;
using ::distrain::testing_ps::BitEqual;
using ::distrain::testing_ps::MakeOptimizerConfig;
using ::distrain::testing_ps::Pattern;
using ::distrain::testing_ps::PsTestCluster;
using ::distrain::testing_ps::ScopedTempDir;
using ::testing::HasSubstr;

ShardingPlan Plan(const std::vector<VariableSpec>& vars, const Partitioner& p, int num_ps) {
  absl::StatusOr<ShardingPlan> plan = ShardingPlan::Create(vars, p, num_ps);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// ---------------------------------------------------------------------------
// Optimizer equivalence

struct OptimizerCase {
  const char* name;
  OptimizerConfig config;
};

class PsOptimizerTest : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(PsOptimizerTest, PushMatchesTheLocalOptimizerBitForBit) {
  const OptimizerConfig config = GetParam().config;
  PsServiceOptions options;
  options.optimizer = config;
  PsTestCluster cluster(2, options);
  // "w" is split 3,3,3,2,2 over both ps; "b" stays whole.
  const ShardingPlan plan = Plan({{"w", {13, 7}}, {"b", {7}}}, *Partitioner::FixedShards(5), 2);
  ASSERT_EQ(plan.Find("w")->shards.size(), 5u);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);

  Tensor w = Pattern({13, 7}, 1), b = Pattern({7}, 2);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
  absl::StatusOr<std::unique_ptr<Optimizer>> local = Optimizer::Create(config);
  ASSERT_TRUE(local.ok());

  constexpr int kSteps = 6;
  for (int step = 1; step <= kSteps; ++step) {
    const Tensor gw = Pattern({13, 7}, 100 + step), gb = Pattern({7}, 200 + step);
    (*local)->ApplyDense("w", w.span(), gw.span(), step);
    (*local)->ApplyDense("b", b.span(), gb.span(), step);
    absl::StatusOr<PushResult> pushed = client->Push({{"w", &gw}, {"b", &gb}});
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_THAT(pushed->versions["w"], ::testing::Each(step));
  }
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["w"], w)) << GetParam().name << ": sharded variable differs";
  EXPECT_TRUE(BitEqual(pulled->values["b"], b)) << GetParam().name;
  EXPECT_THAT(pulled->versions["w"], ::testing::Each(kSteps));
}

OptimizerConfig Nesterov() {
  OptimizerConfig c = MakeOptimizerConfig(OptimizerType::kMomentum, 0.1f);
  c.nesterov = true;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    AllOptimizers, PsOptimizerTest,
    ::testing::Values(OptimizerCase{"sgd", MakeOptimizerConfig(OptimizerType::kSgd, 0.1f)},
                      OptimizerCase{"momentum",
                                    MakeOptimizerConfig(OptimizerType::kMomentum, 0.1f)},
                      OptimizerCase{"nesterov", Nesterov()},
                      OptimizerCase{"adam", MakeOptimizerConfig(OptimizerType::kAdam, 0.01f)}),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Large tensors

TEST(PsServiceTest, TensorLargerThanTheMessageLimitRoundTripsInChunks) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(1, options);
  // 1536 x 1024 float32 = 6 MiB in one shard; gRPC's default limit is 4 MiB
  // and neither side raises it.
  const ShardingPlan plan = Plan({{"big", {1536, 1024}}}, Partitioner::None(), 1);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor init = Pattern({1536, 1024}, 7);
  ASSERT_GT(init.bytes(), 4 << 20);
  ASSERT_TRUE(client->Initialize({{"big", &init}}).ok());
  absl::StatusOr<PullResult> pulled = client->Pull({"big"});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["big"], init));

  const Tensor grad = Pattern({1536, 1024}, 8);
  ASSERT_TRUE(client->Push({{"big", &grad}}).ok());
  Tensor want = init;
  for (int64_t i = 0; i < want.size(); ++i) want[i] -= grad[i];
  pulled = client->Pull({"big"});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["big"], want));
  EXPECT_EQ(pulled->versions["big"][0], 1);
}

// PsClient and PsService move tensor bytes in hand-encoded protobuf
// (ps_wire.h); peers using the generated stubs must see the same protocol.
TEST(PsServiceTest, ZeroCopyPathsMatchTheProtobufStubs) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
  // 64-byte chunks: every shard spans many chunks and messages.
  PsClientOptions client_options;
  client_options.chunk_bytes = 64;
  const ShardingPlan plan = Plan({{"w", {300, 7}}, {"b", {7}}}, *Partitioner::FixedShards(3), 1);
  const Tensor init_w = Pattern({300, 7}, 11), init_b = Pattern({7}, 12);
  const Tensor grad_w = Pattern({300, 7}, 13), grad_b = Pattern({7}, 14);
  PsTestCluster raw_cluster(1, options), proto_cluster(1, options);
  std::unique_ptr<PsClient> raw = raw_cluster.Client(plan, client_options);
  std::unique_ptr<PsClient> proto = proto_cluster.Client(plan, client_options);
  ASSERT_NE(raw, nullptr);
  ASSERT_NE(proto, nullptr);
  ASSERT_TRUE(raw->Initialize({{"w", &init_w}, {"b", &init_b}}).ok());
  ASSERT_TRUE(proto->Initialize({{"w", &init_w}, {"b", &init_b}}).ok());

  // The same gradients: through PsClient on one ps, as protobuf messages of
  // 100-element chunks through the generated stub on the other.
  ASSERT_TRUE(raw->Push({{"w", &grad_w}, {"b", &grad_b}}).ok());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(proto_cluster.servers[0]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::PushResponse response;
  auto writer = stub->Push(&ctx, &response);
  v1::UploadMessage m;
  std::vector<std::pair<const float*, int64_t>> sources;
  for (const ShardInfo& s : plan.shards()) {
    v1::UploadShard* us = m.mutable_header()->add_shards();
    us->mutable_ref()->set_variable(s.variable);
    us->mutable_ref()->set_shard(s.index);
    us->set_num_elements(s.num_elements());
    const Tensor& g = s.variable == "w" ? grad_w : grad_b;
    sources.push_back({g.data() + s.element_offset(), s.num_elements()});
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    for (int64_t off = 0; off < sources[i].second; off += 100) {
      const int64_t n = std::min<int64_t>(100, sources[i].second - off);
      v1::DataChunk* c = m.add_chunks();
      c->set_index(static_cast<int32_t>(i));
      c->set_offset(off);
      c->set_data(
          std::string(reinterpret_cast<const char*>(sources[i].first + off), n * sizeof(float)));
      ASSERT_TRUE(writer->Write(m));
      m.Clear();
    }
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(response.shards_size(), static_cast<int>(plan.shards().size()));

  absl::StatusOr<PullResult> a = raw->Pull();
  absl::StatusOr<PullResult> b = proto->Pull();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(BitEqual(a->values["w"], b->values["w"]));
  EXPECT_TRUE(BitEqual(a->values["b"], b->values["b"]));
  EXPECT_FALSE(BitEqual(a->values["w"], init_w));
  EXPECT_EQ(a->versions, b->versions);

  // The ps's hand-encoded Pull answer parses as protobuf PullMessages.
  grpc::ClientContext pull_ctx;
  v1::PullRequest request;
  // A std::string, not "w": the generated add_variables(const char*) trips GCC 12's
  // -Wrestrict false positive here.
  request.add_variables(std::string("w"));
  request.set_max_chunk_bytes(64);
  auto reader = stub->Pull(&pull_ctx, request);
  Tensor assembled({300, 7});
  std::map<int, const ShardInfo*> by_index;
  v1::PullMessage msg;
  int messages = 0;
  while (reader->Read(&msg)) {
    ++messages;
    for (const v1::PulledShard& h : msg.shards()) {
      by_index[h.index()] = &plan.shards()[plan.Find("w")->shards[h.ref().shard()]];
      EXPECT_EQ(h.version(), 1);
    }
    for (const v1::DataChunk& c : msg.chunks()) {
      ASSERT_TRUE(by_index.contains(c.index()));
      std::memcpy(assembled.data() + by_index[c.index()]->element_offset() + c.offset(),
                  c.data().data(), c.data().size());
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GT(messages, 100);
  EXPECT_TRUE(BitEqual(assembled, b->values["w"]));
}

// ---------------------------------------------------------------------------
// Hostile RPCs, through the raw stub.

class PsHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsServiceOptions options;
    options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
    cluster_ = std::make_unique<PsTestCluster>(1, options);
    // "w" [6, 2] in two shards of 6 elements; both on ps:0.
    client_ = cluster_->Client(Plan({{"w", {6, 2}}}, *Partitioner::FixedShards(2), 1));
    ASSERT_NE(client_, nullptr);
    init_ = Pattern({6, 2}, 3);
    ASSERT_TRUE(client_->Initialize({{"w", &init_}}).ok());
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster_->servers[0]->address(), grpc::InsecureChannelCredentials()));
  }

  // The ps still serves, and nothing was applied.
  void ExpectUnchanged(const std::string& what) {
    absl::StatusOr<PullResult> pulled = client_->Pull({"w"});
    ASSERT_TRUE(pulled.ok()) << what << ": " << pulled.status();
    EXPECT_TRUE(BitEqual(pulled->values["w"], init_)) << what << ": values changed";
    EXPECT_THAT(pulled->versions["w"], ::testing::Each(0)) << what;
  }

  static v1::UploadMessage Header(std::vector<std::tuple<std::string, int, int64_t>> shards) {
    v1::UploadMessage m;
    for (const auto& [var, index, n] : shards) {
      v1::UploadShard* s = m.mutable_header()->add_shards();
      s->mutable_ref()->set_variable(var);
      s->mutable_ref()->set_shard(index);
      s->set_num_elements(n);
    }
    return m;
  }
  static void AddChunk(v1::UploadMessage& m, int index, int64_t offset, int64_t elements) {
    v1::DataChunk* c = m.add_chunks();
    c->set_index(index);
    c->set_offset(offset);
    c->set_data(std::string(elements * sizeof(float), '\0'));
  }

  grpc::Status RawPush(const std::vector<v1::UploadMessage>& messages) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PushResponse response;
    auto writer = stub_->Push(&ctx, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  std::unique_ptr<PsTestCluster> cluster_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  Tensor init_;
};

TEST_F(PsHostileTest, MalformedPushesAreRejectedAndApplyNothing) {
  struct Case {
    const char* name;
    std::function<std::vector<v1::UploadMessage>()> messages;
    grpc::StatusCode code;
    const char* message;
  };
  const int64_t kHuge = int64_t{1} << 62;
  const std::vector<Case> cases = {
      {"empty stream", [] { return std::vector<v1::UploadMessage>{}; }, grpc::INVALID_ARGUMENT,
       "empty stream"},
      {"no header",
       [] {
         v1::UploadMessage m;
         AddChunk(m, 0, 0, 6);
         return std::vector<v1::UploadMessage>{m};
       },
       grpc::INVALID_ARGUMENT, "header"},
      {"unknown variable", [] { return std::vector{Header({{"nope", 0, 6}})}; }, grpc::NOT_FOUND,
       "variable \"nope\" shard 0 is not hosted on ps:0"},
      {"unknown shard", [] { return std::vector{Header({{"w", 2, 6}})}; }, grpc::NOT_FOUND,
       "variable \"w\" shard 2"},
      {"negative shard", [] { return std::vector{Header({{"w", -1, 6}})}; }, grpc::NOT_FOUND,
       "variable \"w\" shard -1"},
      {"wrong size", [] { return std::vector{Header({{"w", 0, 5}})}; }, grpc::INVALID_ARGUMENT,
       "announces 5 elements, but the shard has 6 (shape [3, 2])"},
      {"negative size", [] { return std::vector{Header({{"w", 0, -6}})}; }, grpc::INVALID_ARGUMENT,
       "announces -6 elements"},
      {"enormous size", [=] { return std::vector{Header({{"w", 0, kHuge}})}; },
       grpc::INVALID_ARGUMENT, "announces 4611686018427387904 elements"},
      {"listed twice", [] { return std::vector{Header({{"w", 0, 6}, {"w", 0, 6}})}; },
       grpc::INVALID_ARGUMENT, "listed twice"},
      {"negative pulled version",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         m.mutable_header()->mutable_shards(0)->set_pulled_version(-3);
         AddChunk(m, 0, 0, 6);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "pulled_version -3 is negative"},
      {"pulled version from the future",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         m.mutable_header()->mutable_shards(0)->set_pulled_version(9);
         AddChunk(m, 0, 0, 6);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "pulled_version 9 is ahead"},
      {"chunk index out of range",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         AddChunk(m, 1, 0, 6);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "chunk index 1 is out of range"},
      {"negative offset",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         AddChunk(m, 0, -4, 2);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "chunk offset -4 is negative"},
      {"enormous offset",
       [=] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         AddChunk(m, 0, kHuge, 1);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "skips elements"},
      {"partial float",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         m.add_chunks()->set_data("abc");
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "not a whole number of float32"},
      {"duplicate chunk",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         AddChunk(m, 0, 0, 3);
         v1::UploadMessage again;
         AddChunk(again, 0, 0, 3);
         return std::vector{m, again};
       },
       grpc::INVALID_ARGUMENT, "duplicate or overlapping chunk"},
      {"chunk past the end",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         AddChunk(m, 0, 0, 7);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "runs past the shard's 6 elements"},
      {"fewer chunks than announced",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}, {"w", 1, 6}});
         AddChunk(m, 0, 0, 6);
         AddChunk(m, 1, 0, 4);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "ended after 4 of 6 elements of variable \"w\" shard 1 (truncated)"},
      {"header twice",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         return std::vector{m, m};
       },
       grpc::INVALID_ARGUMENT, "header arrived after the first message"},
      // Factored gradients (UploadShard.factor_rank) of a [3, 2] shard: rank 1
      // is 5 elements, rank 2 would be 10, more than the gradient's 6.
      {"factors larger than the gradient",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 10}});
         m.mutable_header()->mutable_shards(0)->set_factor_rank(2);
         AddChunk(m, 0, 0, 10);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "factor_rank 2 must be in [1, 1] for a shard of shape [3, 2]"},
      {"negative factor rank",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         m.mutable_header()->mutable_shards(0)->set_factor_rank(-1);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "factor_rank -1 must be in"},
      {"enormous factor rank",
       [=] {
         v1::UploadMessage m = Header({{"w", 0, kHuge}});
         m.mutable_header()->mutable_shards(0)->set_factor_rank(kHuge);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "factor_rank 4611686018427387904 must be in"},
      {"factors announcing the gradient's size",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 6}});
         m.mutable_header()->mutable_shards(0)->set_factor_rank(1);
         AddChunk(m, 0, 0, 6);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT,
       "announces 6 elements, but factors of rank 1 of a shard of shape [3, 2] have 5"},
      {"truncated factors",
       [] {
         v1::UploadMessage m = Header({{"w", 0, 5}});
         m.mutable_header()->mutable_shards(0)->set_factor_rank(1);
         AddChunk(m, 0, 0, 3);
         return std::vector{m};
       },
       grpc::INVALID_ARGUMENT, "ended after 3 of 5 elements"},
  };
  for (const Case& c : cases) {
    grpc::Status s = RawPush(c.messages());
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectUnchanged(c.name);
  }
}

// Bytes that no protobuf encoder would produce, sent as raw messages.
TEST_F(PsHostileTest, GarbageAndTruncatedMessagesAreRejectedAndApplyNothing) {
  auto raw_push = [&](const std::vector<std::string>& messages) {
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateChannel(cluster_->servers[0]->address(), grpc::InsecureChannelCredentials());
    grpc::internal::RpcMethod method("/distrain.v1.ParameterServer/Push",
                                     grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                      &response));
    for (const std::string& bytes : messages) {
      grpc::Slice slice(bytes);
      if (!writer->Write(grpc::ByteBuffer(&slice, 1))) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::UploadMessage header = Header({{"w", 0, 6}});
  AddChunk(header, 0, 0, 3);
  v1::UploadMessage rest;
  AddChunk(rest, 0, 3, 3);
  const std::string rest_bytes = rest.SerializeAsString();
  struct Case {
    const char* name;
    std::vector<std::string> messages;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"garbage", {std::string("\xff\xff\xff", 3)}, "message 0 is not an UploadMessage"},
      {"truncated second message",
       {header.SerializeAsString(), rest_bytes.substr(0, rest_bytes.size() - 2)},
       "message 1 is not an UploadMessage: malformed message at byte 0"},
      {"header that is no UploadHeader",
       {std::string("\x0a\x01\xff", 3)},
       "the header is not a valid UploadHeader"},
  };
  for (const Case& c : cases) {
    grpc::Status s = raw_push(c.messages);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectUnchanged(c.name);
  }
  // The same messages, untruncated, are a valid push.
  EXPECT_TRUE(raw_push({header.SerializeAsString(), rest_bytes}).ok());
}

TEST_F(PsHostileTest, CancelledPushMidStreamAppliesNothing) {
  grpc::ClientContext ctx;
  v1::PushResponse response;
  auto writer = stub_->Push(&ctx, &response);
  v1::UploadMessage m = Header({{"w", 0, 6}});
  AddChunk(m, 0, 0, 3);
  ASSERT_TRUE(writer->Write(m));
  ctx.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::CANCELLED);
  ExpectUnchanged("cancelled");
  absl::StatusOr<std::vector<v1::HealthResponse>> health = client_->Health();
  ASSERT_TRUE(health.ok());
  EXPECT_EQ((*health)[0].pushes_applied(), 0);
}

TEST_F(PsHostileTest, MalformedPullsCreatesAndCheckpointsAreRejected) {
  auto pull = [&](const v1::PullRequest& request) {
    grpc::ClientContext ctx;
    auto reader = stub_->Pull(&ctx, request);
    v1::PullMessage m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  v1::PullRequest unknown;
  unknown.add_variables("nope");
  grpc::Status s = pull(unknown);
  EXPECT_EQ(s.error_code(), grpc::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("variable \"nope\" has no shards on ps:0"));

  v1::PullRequest bad_shard;
  bad_shard.add_shards()->set_variable("w");
  bad_shard.mutable_shards(0)->set_shard(7);
  EXPECT_EQ(pull(bad_shard).error_code(), grpc::NOT_FOUND);

  EXPECT_EQ(pull(v1::PullRequest()).error_code(), grpc::INVALID_ARGUMENT);
  for (int64_t chunk : {int64_t{-1}, int64_t{1} << 40}) {
    v1::PullRequest r;
    r.add_variables("w");
    r.set_max_chunk_bytes(chunk);
    s = pull(r);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << chunk;
    EXPECT_THAT(s.error_message(), HasSubstr("max_chunk_bytes")) << chunk;
  }

  auto create = [&](std::vector<int64_t> shape, int shard, int num_shards, int64_t begin,
                    int64_t end) {
    v1::CreateVariablesRequest r;
    v1::ShardSpec* spec = r.add_shards();
    spec->set_variable("w");
    spec->set_shard(shard);
    spec->set_num_shards(num_shards);
    for (int64_t d : shape) spec->add_full_shape(d);
    spec->set_row_begin(begin);
    spec->set_row_end(end);
    grpc::ClientContext ctx;
    v1::CreateVariablesResponse response;
    return stub_->CreateVariables(&ctx, r, &response);
  };
  s = create({6, -2}, 0, 2, 0, 3);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("dimension 1 is -2"));
  s = create({int64_t{1} << 31, int64_t{1} << 31}, 0, 2, 0, 3);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("max_variable_elements"));
  EXPECT_EQ(create({6, 2}, 2, 2, 0, 3).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(create({6, 2}, 0, 2, 4, 9).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(create({6, 2}, 0, 2, -1, 3).error_code(), grpc::INVALID_ARGUMENT);
  // Same name, different shape: the model changed under a running ps.
  s = create({6, 3}, 0, 2, 0, 3);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("variable \"w\" shard 0 exists on ps:0 with shape [6, 2]"));
  // Re-declaring the same shard is fine.
  EXPECT_TRUE(create({6, 2}, 0, 2, 0, 3).ok());

  // This ps has no checkpoint directory (ps_hostile_test.cc covers one
  // that has): it writes and reads nothing, whatever the request.
  {
    grpc::ClientContext ctx;
    v1::SaveRequest r;
    r.set_step(-5);
    v1::SaveResponse response;
    s = stub_->Save(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("Save: ps:0 has no checkpoint directory"));
  }
  {
    grpc::ClientContext ctx;
    v1::RestoreRequest r;
    v1::RestoreResponse response;
    s = stub_->Restore(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("Restore: ps:0 has no checkpoint directory"));
  }
  ExpectUnchanged("after hostile pulls, creates and checkpoints");
}

TEST_F(PsHostileTest, NanIsDataNotAnError) {
  Tensor grad({6, 2}, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(client_->Push({{"w", &grad}}).ok());
  absl::StatusOr<PullResult> pulled = client_->Pull({"w"});
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(std::isnan(pulled->values["w"][0]));
}

// ---------------------------------------------------------------------------
// Create / initialise semantics

// Factors only make sense as a push of a matrix's gradient.
TEST(PsServiceTest, FactorsAreOnlyTakenForPushesOfMatrices) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(1, options);
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {4, 4}}, {"b", {16}}}, *Partitioner::FixedShards(1), 1));
  ASSERT_NE(client, nullptr);
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(cluster.servers[0]->address(), grpc::InsecureChannelCredentials()));
  auto upload = [&](bool push, const std::string& variable, int64_t elements) {
    v1::UploadMessage m;
    v1::UploadShard* s = m.mutable_header()->add_shards();
    s->mutable_ref()->set_variable(variable);
    s->set_num_elements(elements);
    s->set_factor_rank(1);
    m.add_chunks()->set_data(std::string(elements * sizeof(float), '\0'));
    grpc::ClientContext ctx;
    v1::PushResponse pushed;
    v1::InitializeResponse initialized;
    auto writer = push ? stub->Push(&ctx, &pushed) : stub->Initialize(&ctx, &initialized);
    writer->Write(m);
    writer->WritesDone();
    return writer->Finish();
  };
  grpc::Status s = upload(false, "w", 8);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("factor_rank is only for Push; Initialize takes values"));
  s = upload(true, "b", 17);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("factor_rank needs a rank-2 variable, this one has shape [16]"));
  // The ps keeps serving, and a well-formed factored push of "w" is taken
  // (it has no value yet: a precondition failure, not a protocol error).
  s = upload(true, "w", 8);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
}

TEST(PsServiceTest, PullBeforeInitializeIsAPreconditionFailure) {
  PsTestCluster cluster(1);
  std::unique_ptr<PsClient> client = cluster.Client(Plan({{"w", {2}}}, Partitioner::None(), 1));
  ASSERT_NE(client, nullptr);
  absl::Status s = client->Pull().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("ps:0 (127.0.0.1:"));
  EXPECT_THAT(s.message(), HasSubstr("has no value yet"));
}

TEST(PsServiceTest, InitializeIsFirstWriterWinsUnlessOverwrite) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(2, options);
  const ShardingPlan plan = Plan({{"w", {4, 2}}}, *Partitioner::FixedShards(2), 2);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateVariables().ok());  // idempotent
  const Tensor first = Pattern({4, 2}, 1), second = Pattern({4, 2}, 2), grad = Pattern({4, 2}, 3);
  absl::StatusOr<InitializeResult> r = client->Initialize({{"w", &first}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->initialized, 2);
  ASSERT_TRUE(client->Push({{"w", &grad}}).ok());
  r = client->Initialize({{"w", &second}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->skipped, 2);
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_FALSE(BitEqual(pulled->values["w"], second));
  EXPECT_THAT(pulled->versions["w"], ::testing::Each(1));

  r = client->Initialize({{"w", &second}}, /*overwrite=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->initialized, 2);
  pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(BitEqual(pulled->values["w"], second));
  EXPECT_THAT(pulled->versions["w"], ::testing::Each(0));
}

// ---------------------------------------------------------------------------
// Concurrency and staleness

TEST(PsServiceTest, ConcurrentPushesAreEachAppliedExactlyOnce) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(2, options);
  const ShardingPlan plan = Plan({{"w", {9, 4}}}, *Partitioner::FixedShards(3), 2);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor zero({9, 4});
  ASSERT_TRUE(client->Initialize({{"w", &zero}}).ok());

  // SGD with lr 1 and gradient -1 adds exactly 1 per update.
  constexpr int kThreads = 4, kPushes = 40;
  const Tensor minus_one({9, 4}, -1.0f);
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPushes; ++i) {
        absl::StatusOr<PushResult> r = client->Push({{"w", &minus_one}});
        ASSERT_TRUE(r.ok()) << r.status();
        seen[t].push_back(r->versions["w"][0]);
        ASSERT_TRUE(client->Pull({"w"}).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_THAT(pulled->values["w"].span(), ::testing::Each(float{kThreads * kPushes}));
  EXPECT_THAT(pulled->versions["w"], ::testing::Each(kThreads * kPushes));
  // Every version 1..N was handed out exactly once.
  std::set<int64_t> versions;
  for (const auto& v : seen) versions.insert(v.begin(), v.end());
  EXPECT_EQ(versions.size(), size_t{kThreads * kPushes});
  EXPECT_EQ(*versions.begin(), 1);
  EXPECT_EQ(*versions.rbegin(), kThreads * kPushes);
}

TEST(PsServiceTest, StalenessIsReportedAndBounded) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  options.max_staleness = 1;
  prometheus::Registry registry;
  options.registry = &registry;
  PsTestCluster cluster(1, options);
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {4}}, {"b", {2}}}, Partitioner::None(), 1));
  ASSERT_NE(client, nullptr);
  const Tensor w({4}, 0.0f), b({2}, 0.0f), gw({4}, -1.0f), gb({2}, -1.0f);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  const ShardVersions at_zero = pulled->versions;

  absl::StatusOr<PushResult> r = client->Push({{"w", &gw}, {"b", &gb}}, &at_zero);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_staleness, 0);
  r = client->Push({{"w", &gw}}, &at_zero);  // w is now 1 update ahead
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_staleness, 1);
  // w would be 2 stale: the whole push (b included) is rejected.
  absl::Status s = client->Push({{"w", &gw}, {"b", &gb}}, &at_zero).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("variable \"w\" shard 0 is 2 updates stale"));
  pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->versions["w"][0], 2);
  EXPECT_EQ(pulled->versions["b"][0], 1);
  // With a bound, the ps needs to know what the worker pulled.
  EXPECT_EQ(client->Push({{"w", &gw}}).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("distrain_ps_staleness_count{side=\"server\"} 3"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "distrain_ps_bytes_total{direction=\"pushed\",shard=\"w/part_0\",side=\"server\"} 32"));
  EXPECT_THAT(text, HasSubstr("distrain_ps_rpc_seconds_count{method=\"Push\",side=\"server\"} 4"));
  EXPECT_THAT(text, HasSubstr("distrain_ps_rpc_seconds_count{method=\"Pull\",side=\"server\"} 2"));
}

// ---------------------------------------------------------------------------
// Checkpoints

TEST(PsServiceTest, CheckpointRestoresValuesSlotsAndVersions) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
  const ScopedTempDir tmp("roundtrip");
  const std::string& dir = tmp.path();
  options.checkpoint_dir = dir;
  PsTestCluster cluster(2, options);
  const ShardingPlan plan =
      Plan({{"w", {7, 3}}, {"b", {3}}, {"s", {}}}, *Partitioner::FixedShards(3), 2);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({7, 3}, 1), b = Pattern({3}, 2), sc = Pattern({}, 3);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}, {"s", &sc}}).ok());
  auto push = [&](uint32_t seed) {
    const Tensor gw = Pattern({7, 3}, seed), gb = Pattern({3}, seed + 1),
                 gs = Pattern({}, seed + 2);
    ASSERT_TRUE(client->Push({{"w", &gw}, {"b", &gb}, {"s", &gs}}).ok());
  };
  for (uint32_t step = 1; step <= 3; ++step) push(10 * step);
  ASSERT_TRUE(client->Save(3).ok());
  absl::StatusOr<PullResult> saved = client->Pull();
  ASSERT_TRUE(saved.ok());
  push(40);  // step 4 from the saved state, for reference
  absl::StatusOr<PullResult> after4 = client->Pull();
  ASSERT_TRUE(after4.ok());
  push(50);
  push(60);

  absl::StatusOr<int64_t> restored = client->Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 3);
  absl::StatusOr<PullResult> now = client->Pull();
  ASSERT_TRUE(now.ok());
  for (const char* name : {"w", "b", "s"}) {
    EXPECT_TRUE(BitEqual(now->values[name], saved->values[name])) << name;
    EXPECT_THAT(now->versions[name], ::testing::Each(3)) << name;
  }
  // Adam's m, v and t came back too: the next step is bit-identical.
  push(40);
  now = client->Pull();
  ASSERT_TRUE(now.ok());
  for (const char* name : {"w", "b", "s"}) {
    EXPECT_TRUE(BitEqual(now->values[name], after4->values[name])) << name;
  }

  // The assembled view holds full variables in the single-process layout.
  absl::StatusOr<PsCheckpoint> ckpt = LoadPsCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->saved_num_ps, 2);
  const CheckpointState state = ckpt->ToCheckpointState();
  EXPECT_TRUE(BitEqual(state.tensors.at("variables/w"), saved->values["w"]));
  EXPECT_EQ(state.tensors.at("optimizer/w/m").size(), 21);
  EXPECT_EQ(state.metadata.at("optimizer_iterations"), "3");
}

TEST(PsServiceTest, SaveWithTwoPsRestoresWithThreeAndADifferentPartition) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kMomentum, 0.1f);
  const std::vector<VariableSpec> vars = {{"w", {13, 5}}, {"b", {5}}};
  const ScopedTempDir tmp("reshard");
  const std::string& dir = tmp.path();
  options.checkpoint_dir = dir;  // both layouts share one directory, as ps pods share a volume
  PullResult saved, continued;
  const Tensor gw = Pattern({13, 5}, 77), gb = Pattern({5}, 78);
  {
    PsTestCluster two(2, options);
    std::unique_ptr<PsClient> client = two.Client(Plan(vars, *Partitioner::FixedShards(3), 2));
    ASSERT_NE(client, nullptr);
    const Tensor w = Pattern({13, 5}, 1), b = Pattern({5}, 2);
    ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
    for (uint32_t s = 1; s <= 2; ++s) {
      const Tensor g1 = Pattern({13, 5}, s), g2 = Pattern({5}, 100 + s);
      ASSERT_TRUE(client->Push({{"w", &g1}, {"b", &g2}}).ok());
    }
    ASSERT_TRUE(client->Save(2).ok());
    saved = *client->Pull();
    ASSERT_TRUE(client->Push({{"w", &gw}, {"b", &gb}}).ok());
    continued = *client->Pull();
  }
  PsTestCluster three(3, options);
  std::unique_ptr<PsClient> client = three.Client(Plan(vars, *Partitioner::FixedShards(5), 3));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int64_t> step = client->Restore();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  absl::StatusOr<PullResult> now = client->Pull();
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(BitEqual(now->values["w"], saved.values["w"]));
  EXPECT_TRUE(BitEqual(now->values["b"], saved.values["b"]));
  EXPECT_THAT(now->versions["w"], ::testing::Each(2));
  // Momentum slots were re-sharded with the values.
  ASSERT_TRUE(client->Push({{"w", &gw}, {"b", &gb}}).ok());
  now = client->Pull();
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(BitEqual(now->values["w"], continued.values["w"]));
  EXPECT_TRUE(BitEqual(now->values["b"], continued.values["b"]));
}

TEST(PsServiceTest, CheckpointKeepsVariablesWhoseNamesLookLikeShardKeys) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
  const ScopedTempDir tmp("prefix");
  const std::string& dir = tmp.path();
  options.checkpoint_dir = dir;
  PsTestCluster cluster(1, options);
  // Shard keys "w/part_0" and "w/part_0/part_0": one is a prefix of the other.
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {2}}, {"w/part_0", {3}}}, Partitioner::None(), 1));
  ASSERT_NE(client, nullptr);
  const Tensor a = Pattern({2}, 1), b = Pattern({3}, 2);
  ASSERT_TRUE(client->Initialize({{"w", &a}, {"w/part_0", &b}}).ok());
  ASSERT_TRUE(client->Push({{"w", &a}, {"w/part_0", &b}}).ok());
  ASSERT_TRUE(client->Save(1).ok());
  absl::StatusOr<PsCheckpoint> ckpt = LoadPsCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->variables.at("w").slots.at("m").size(), 2);
  EXPECT_EQ(ckpt->variables.at("w/part_0").slots.at("m").size(), 3);
}

TEST(PsServiceTest, RestoreSkipsAStepThatNotEveryPsWrote) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  const ScopedTempDir tmp("partial");
  const std::string& dir = tmp.path();
  options.checkpoint_dir = dir;
  PsTestCluster cluster(2, options);
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {4, 2}}}, *Partitioner::FixedShards(2), 2));
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({4, 2}, 1), g = Pattern({4, 2}, 2);
  ASSERT_TRUE(client->Initialize({{"w", &w}}).ok());
  ASSERT_TRUE(client->Save(1).ok());
  ASSERT_TRUE(client->Push({{"w", &g}}).ok());
  ASSERT_TRUE(client->Save(2).ok());
  // ps:1 died before writing step 2: only ps:0's file remains.
  std::filesystem::remove(CheckpointManager(PsCheckpointDir(dir, 1, 2), 1).PathForStep(2));
  absl::StatusOr<int64_t> step = client->Restore();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  absl::StatusOr<PullResult> now = client->Pull();
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(BitEqual(now->values["w"], w));
  EXPECT_EQ(client->Restore(2).status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Non-trainable shards (BatchNormalization's moving statistics)

// x + d in float, element by element: what the ps's `value += delta` gives.
Tensor Plus(const Tensor& x, const Tensor& d) {
  Tensor out = x;
  for (int64_t i = 0; i < out.size(); ++i) out[i] += d[i];
  return out;
}

// A push to a non-trainable shard adds the delta exactly (no optimizer: Adam
// here would move the value by about lr per element whatever the delta),
// bumps the version, is never rejected by the staleness bound (reported as
// 0) and creates no optimizer slot; a push that a ps rejects for a stale
// gradient applies the deltas it sent that ps neither.
TEST(PsServiceTest, NonTrainableShardAddsDeltasOutsideTheOptimizerAndTheBound) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
  options.max_staleness = 0;
  prometheus::Registry registry;
  options.registry = &registry;
  const ScopedTempDir tmp("non_trainable");
  const std::string& dir = tmp.path();
  options.checkpoint_dir = dir;
  PsTestCluster cluster(2, options);
  std::vector<VariableSpec> vars = {{"w", {4, 3}}, {"mm", {3}}, {"mv", {3}}};
  vars[1].trainable = false;
  vars[2].trainable = false;
  const ShardingPlan plan = Plan(vars, Partitioner::None(), 2);
  EXPECT_FALSE(plan.Find("mm")->trainable);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({4, 3}, 1), mm({3}, 0.0f), mv({3}, 1.0f);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"mm", &mm}, {"mv", &mv}}).ok());
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  const ShardVersions at_zero = pulled->versions;

  const Tensor gw = Pattern({4, 3}, 2), dm1 = Pattern({3}, 3), dv1 = Pattern({3}, 4);
  absl::StatusOr<PushResult> r =
      client->Push({{"w", &gw}, {"mm", &dm1}, {"mv", &dv1}}, &at_zero);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->versions["mm"][0], 1);
  // Two more deltas computed from version 0: 1 and 2 updates stale, beyond
  // max_staleness 0, and still taken.
  const Tensor dm2 = Pattern({3}, 5), dm3 = Pattern({3}, 6);
  r = client->Push({{"mm", &dm2}}, &at_zero);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_staleness, 0);
  r = client->Push({{"mm", &dm3}}, &at_zero);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->versions["mm"][0], 3);
  // A stale gradient in the same push: all of it is rejected, the delta of
  // mv (on the same ps as w: all-or-nothing holds per ps task) too.
  ASSERT_EQ(plan.shards()[plan.Find("mv")->shards[0]].ps_task,
            plan.shards()[plan.Find("w")->shards[0]].ps_task);
  absl::Status s = client->Push({{"w", &gw}, {"mv", &dm3}}, &at_zero).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("variable \"w\" shard 0 is 1 updates stale"));
  // Without pulled versions too (the bound needs them for gradients only).
  ASSERT_TRUE(client->Push({{"mv", &dv1}}).ok());

  pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  const Tensor want_mm = Plus(Plus(Plus(mm, dm1), dm2), dm3);
  EXPECT_TRUE(BitEqual(pulled->values["mm"], want_mm));
  EXPECT_TRUE(BitEqual(pulled->values["mv"], Plus(Plus(mv, dv1), dv1)));
  EXPECT_EQ(pulled->versions["mm"][0], 3);
  EXPECT_EQ(pulled->versions["mv"][0], 2);
  EXPECT_EQ(pulled->versions["w"][0], 1);
  // Only the gradient's staleness is observed.
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("distrain_ps_staleness_count{side=\"server\"} 1"));

  // Save: no optimizer slot for mm/mv, trainability recorded, iterations
  // counted over trainable shards only (mm's version is 3, w's 1).
  ASSERT_TRUE(client->Save(7).ok());
  absl::StatusOr<PsCheckpoint> ckpt = LoadPsCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->variables.at("w").trainable);
  EXPECT_FALSE(ckpt->variables.at("mm").trainable);
  EXPECT_TRUE(ckpt->variables.at("mm").slots.empty());
  EXPECT_TRUE(ckpt->variables.at("mv").slots.empty());
  EXPECT_EQ(ckpt->variables.at("w").slots.size(), 2u);  // Adam's m, v
  const CheckpointState state = ckpt->ToCheckpointState();
  EXPECT_TRUE(BitEqual(state.tensors.at("variables/mm"), want_mm));
  for (const auto& [name, tensor] : state.tensors) {
    EXPECT_FALSE(absl::StartsWith(name, "optimizer/mm") || absl::StartsWith(name, "optimizer/mv"))
        << name;
  }
  EXPECT_EQ(state.metadata.at("optimizer_iterations"), "1");

  // Restore round-trips value and version; deltas apply on top again.
  ASSERT_TRUE(client->Push({{"mm", &dm1}}).ok());
  absl::StatusOr<int64_t> step = client->Restore();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 7);
  pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["mm"], want_mm));
  EXPECT_EQ(pulled->versions["mm"][0], 3);
  ASSERT_TRUE(client->Push({{"mm", &dm2}}).ok());
  pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["mm"], Plus(want_mm, dm2)));
  EXPECT_EQ(pulled->versions["mm"][0], 4);
}

TEST(PsServiceTest, NonTrainableShardsRefuseFactorsAndAChangeOfTrainability) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(1, options);
  std::vector<VariableSpec> vars = {{"s", {4, 4}}};
  vars[0].trainable = false;
  const ShardingPlan plan = Plan(vars, Partitioner::None(), 1);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor init = Pattern({4, 4}, 1);
  ASSERT_TRUE(client->Initialize({{"s", &init}}).ok());
  // The client refuses factors for it...
  const Tensor left = Pattern({1, 4}, 2), right = Pattern({1, 4}, 3);
  absl::Status s = client->Push({}, nullptr, {{"s", &left, &right}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"s\" is non-trainable"));
  // ...and so does the ps.
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(cluster.servers[0]->address(), grpc::InsecureChannelCredentials()));
  v1::UploadMessage m;
  v1::UploadShard* us = m.mutable_header()->add_shards();
  us->mutable_ref()->set_variable("s");
  us->set_num_elements(8);
  us->set_factor_rank(1);
  m.add_chunks()->set_data(std::string(8 * sizeof(float), '\0'));
  {
    grpc::ClientContext ctx;
    v1::PushResponse response;
    auto writer = stub->Push(&ctx, &response);
    writer->Write(m);
    writer->WritesDone();
    grpc::Status g = writer->Finish();
    EXPECT_EQ(g.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_THAT(g.error_message(), HasSubstr("a non-trainable shard takes its delta dense"));
  }
  // Re-declaring "s" as trainable is a different plan.
  vars[0].trainable = true;
  absl::StatusOr<std::unique_ptr<PsClient>> other =
      PsClient::Create(cluster.Addresses(), Plan(vars, Partitioner::None(), 1));
  ASSERT_TRUE(other.ok());
  s = (*other)->CreateVariables();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("of 1 shards (non-trainable); the request asks for"));
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(BitEqual(pulled->values["s"], init));
  EXPECT_EQ(pulled->versions["s"][0], 0);
}

// Restoring a checkpoint into shards whose trainability differs is a model
// change, refused like a changed shape.
TEST(PsServiceTest, RestoreRefusesACheckpointOfOtherTrainability) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  const ScopedTempDir tmp("trainability");
  options.checkpoint_dir = tmp.path();
  std::vector<VariableSpec> vars = {{"v", {3}}};
  {
    PsTestCluster cluster(1, options);
    std::unique_ptr<PsClient> client = cluster.Client(Plan(vars, Partitioner::None(), 1));
    ASSERT_NE(client, nullptr);
    const Tensor v = Pattern({3}, 1);
    ASSERT_TRUE(client->Initialize({{"v", &v}}).ok());
    ASSERT_TRUE(client->Save(1).ok());
  }
  vars[0].trainable = false;
  PsTestCluster cluster(1, options);
  std::unique_ptr<PsClient> client = cluster.Client(Plan(vars, Partitioner::None(), 1));
  ASSERT_NE(client, nullptr);
  absl::Status s = client->Restore().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("\"v\" is trainable in the checkpoint at step 1 but "
                                     "non-trainable in the model"));
}

// A gradient of thousands of elements pushed in chunks of 13 floats (message
// and chunk boundaries at odd element offsets, none aligned to a SIMD width)
// updates the shard exactly like the local optimizer on the whole tensor.
TEST(PsServiceTest, PushInOddSizedChunksMatchesTheLocalOptimizer) {
  const OptimizerConfig config = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
  PsServiceOptions options;
  options.optimizer = config;
  PsTestCluster cluster(1, options);
  PsClientOptions client_options;
  client_options.chunk_bytes = 13 * sizeof(float);
  const int64_t n = 4873;
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {n}}}, Partitioner::None(), 1), client_options);
  ASSERT_NE(client, nullptr);
  Tensor w = Pattern({n}, 3);
  ASSERT_TRUE(client->Initialize({{"w", &w}}).ok());
  absl::StatusOr<std::unique_ptr<Optimizer>> local = Optimizer::Create(config);
  ASSERT_TRUE(local.ok());
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = Pattern({n}, 40 + step);
    (*local)->ApplyDense("w", w.span(), g.span(), step);
    ASSERT_TRUE(client->Push({{"w", &g}}).ok());
  }
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(BitEqual(pulled->values["w"], w));
}

// A pull that is still streaming when a push lands sends the value of the
// version in its header, not a mix: the messages reference a snapshot, not
// the shard's live value. Three rounds, so the ps's second buffer (left to
// the first pull) is reused once that pull is done, and must then hold the
// current values, not the ones it was sent with.
TEST(PsServiceTest, PullStreamingDuringAPushSendsOneConsistentVersion) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(1, options);
  // 16 MiB in 4 KiB messages: far more than the flow-control windows, so the
  // ps is still writing this pull while the push below is applied.
  const int64_t n = 4 << 20;
  const ShardingPlan plan = Plan({{"w", {n}}}, Partitioner::None(), 1);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor init = Pattern({n}, 5), grad = Pattern({n}, 6);
  ASSERT_TRUE(client->Initialize({{"w", &init}}).ok());

  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(cluster.servers[0]->address(), grpc::InsecureChannelCredentials()));
  Tensor expected = init;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    grpc::ClientContext pull_ctx;
    v1::PullRequest request;
    request.add_variables("w");
    request.set_max_chunk_bytes(4096);
    auto reader = stub->Pull(&pull_ctx, request);
    Tensor assembled({n});
    v1::PullMessage msg;
    auto take = [&] {
      for (const v1::PulledShard& h : msg.shards()) EXPECT_EQ(h.version(), round);
      for (const v1::DataChunk& c : msg.chunks()) {
        ASSERT_LE(c.offset() * 4 + static_cast<int64_t>(c.data().size()), n * 4);
        std::memcpy(assembled.data() + c.offset(), c.data().data(), c.data().size());
      }
    };
    ASSERT_TRUE(reader->Read(&msg));
    take();
    absl::StatusOr<PushResult> pushed = client->Push({{"w", &grad}});
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_THAT(pushed->versions["w"], ::testing::Each(round + 1));
    int messages = 1;
    while (reader->Read(&msg)) {
      ++messages;
      take();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_GT(messages, 1000);
    EXPECT_TRUE(BitEqual(assembled, expected)) << "the pull mixed in the pushed update";

    absl::StatusOr<PullResult> after = client->Pull();
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->values["w"].data()[0], expected.data()[0] - grad.data()[0]);
    EXPECT_EQ(after->values["w"].data()[n - 1], expected.data()[n - 1] - grad.data()[n - 1]);
    EXPECT_FALSE(BitEqual(after->values["w"], expected));
    expected = after->values["w"];
  }
}

}  // namespace
}  // namespace distrain

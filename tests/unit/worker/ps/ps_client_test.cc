#include "worker/ps/ps_client.h"

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/unit/worker/ps/ps_test_cluster.h"
#include "worker/model/optimizer.h"

namespace distrain {
namespace {

using ::distrain::testing_ps::BitEqual;
using ::distrain::testing_ps::MakeOptimizerConfig;
using ::distrain::testing_ps::Pattern;
using ::distrain::testing_ps::PsTestCluster;
using ::testing::HasSubstr;

ShardingPlan Plan(const std::vector<VariableSpec>& vars, const Partitioner& p, int num_ps) {
  absl::StatusOr<ShardingPlan> plan = ShardingPlan::Create(vars, p, num_ps);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// A loopback port nobody listens on (a server bound it, then went away).
int UnusedPort() {
  absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start("127.0.0.1:0", {});
  EXPECT_TRUE(s.ok());
  return (*s)->port();
}

// A dense layer's kernel gradient sent as its factors (x^T dy) lands on the ps
// as the gradient itself: the optimizer state after several pushes equals a
// local optimizer fed the formed gradients. Shards whose factors would be
// larger than their gradient get the gradient, formed by the client.
TEST(PsClientTest, FactoredPushesApplyTheProductOfTheFactors) {
  struct Case {
    std::vector<int64_t> shape;
    int shards;
    int64_t rank;
  };
  // [13, 7] over 5 shards (3,3,3,2,2 rows), rank 2: the 3-row shards take
  // factors (2 * (3 + 7) = 20 <= 21), the 2-row shards the gradient
  // (18 > 14). [64, 48] over 2 shards, rank 8: factors on both. [300, 1024]:
  // the ps forms and applies each 150-row shard's gradient in blocks of 16
  // rows (64 KiB), the last one short.
  for (const Case& c : {Case{{13, 7}, 5, 2}, Case{{64, 48}, 2, 8}, Case{{5, 3}, 1, 4},
                        Case{{300, 1024}, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "[" << c.shape[0] << ", " << c.shape[1] << "] in "
                                      << c.shards << " shards, rank " << c.rank);
    PsServiceOptions options;
    options.optimizer = MakeOptimizerConfig(OptimizerType::kAdam, 0.01f);
    PsTestCluster cluster(2, options);
    const ShardingPlan plan =
        Plan({{"w", c.shape}, {"b", {c.shape[1]}}}, *Partitioner::FixedShards(c.shards), 2);
    std::unique_ptr<PsClient> client = cluster.Client(plan);
    ASSERT_NE(client, nullptr);
    Tensor w = Pattern(c.shape, 1), b = Pattern({c.shape[1]}, 2);
    ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
    absl::StatusOr<std::unique_ptr<Optimizer>> local =
        Optimizer::Create(MakeOptimizerConfig(OptimizerType::kAdam, 0.01f));
    ASSERT_TRUE(local.ok());
    ShardVersions pulled;
    for (int step = 1; step <= 4; ++step) {
      const Tensor left = Pattern({c.rank, c.shape[0]}, 10 + step);
      const Tensor right = Pattern({c.rank, c.shape[1]}, 20 + step);
      const Tensor gb = Pattern({c.shape[1]}, 30 + step);
      Tensor gw(c.shape);
      for (int64_t i = 0; i < c.shape[0]; ++i) {
        for (int64_t j = 0; j < c.shape[1]; ++j) {
          double g = 0;
          for (int64_t k = 0; k < c.rank; ++k) g += double{left.at(k, i)} * right.at(k, j);
          gw.at(i, j) = static_cast<float>(g);
        }
      }
      (*local)->ApplyDense("w", w.span(), gw.span(), step);
      (*local)->ApplyDense("b", b.span(), gb.span(), step);
      absl::StatusOr<PushResult> pushed =
          client->Push({{"b", &gb}}, step > 1 ? &pulled : nullptr, {{"w", &left, &right}});
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_THAT(pushed->versions["w"], ::testing::Each(step));
      EXPECT_THAT(pushed->versions["b"], ::testing::Each(step));
      pulled = pushed->versions;
    }
    absl::StatusOr<PullResult> result = client->Pull();
    ASSERT_TRUE(result.ok()) << result.status();
    const Tensor& got = result->values["w"];
    for (int64_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(got[i], w[i], 1e-5f * (1.0f + std::abs(w[i]))) << "w[" << i << "]";
    }
    EXPECT_TRUE(BitEqual(result->values["b"], b));
  }
}

// The asynchronous pull delivers what a blocking one does: every shard
// announced once through on_shard before `done`, the values and versions in
// place when `done` runs, on a thread other than the caller's.
TEST(PsClientTest, PullIntoAsyncMatchesPullIntoAndReportsOnce) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 0.5f);
  PsTestCluster cluster(2, options);
  const ShardingPlan plan =
      Plan({{"w", {40, 8}}, {"b", {8}}}, *Partitioner::FixedShards(3), 2);
  std::unique_ptr<PsClient> client = cluster.Client(plan);
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({40, 8}, 1), b = Pattern({8}, 2), gw = Pattern({40, 8}, 3);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
  ASSERT_TRUE(client->Push({{"w", &gw}}).ok());
  for (int round = 0; round < 3; ++round) {  // the client's threads are reused
    Tensor w_async({40, 8}), b_async({8}), w_sync({40, 8}), b_sync({8});
    ShardVersions v_async, v_sync;
    const std::vector<MutableTensorRef> async_targets = {{"w", &w_async}, {"b", &b_async}};
    absl::Mutex mu;
    int shards_seen = 0, done_calls = 0;
    bool done_on_caller = false;
    absl::Status status = absl::UnknownError("not done");
    const std::thread::id caller = std::this_thread::get_id();
    client->PullIntoAsync(
        async_targets, &v_async,
        [&](const ShardInfo&) {
          absl::MutexLock lock(&mu);
          ++shards_seen;
        },
        [&](absl::Status s) {
          absl::MutexLock lock(&mu);
          status = std::move(s);
          ++done_calls;
          done_on_caller = std::this_thread::get_id() == caller;
        });
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* n) { return *n > 0; }, &done_calls));
    }
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(client->PullInto({{"w", &w_sync}, {"b", &b_sync}}, &v_sync).ok());
    absl::MutexLock lock(&mu);
    EXPECT_EQ(done_calls, 1);
    EXPECT_FALSE(done_on_caller);
    EXPECT_EQ(shards_seen, 6);  // w and b in 3 shards each
    EXPECT_TRUE(BitEqual(w_async, w_sync));
    EXPECT_TRUE(BitEqual(b_async, b_sync));
    EXPECT_FALSE(BitEqual(w_async, w));
    EXPECT_EQ(v_async, v_sync);
  }
}

TEST(PsClientTest, RejectsFactorsThatDoNotMatchTheVariable) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(1, options);
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {6, 4}}, {"b", {4}}}, *Partitioner::FixedShards(2), 1));
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({6, 4}, 1), b = Pattern({4}, 2);
  ASSERT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}).ok());
  const Tensor left = Pattern({2, 6}, 3), right = Pattern({2, 4}, 4);
  const Tensor short_left = Pattern({2, 5}, 3), other_rank = Pattern({3, 4}, 4);
  const Tensor grad = Pattern({6, 4}, 5);
  struct Case {
    const char* name;
    std::vector<TensorRef> dense;
    std::vector<FactoredGradRef> factored;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown variable", {}, {{"nope", &left, &right}}, "\"nope\" is not a variable"},
      {"left of the wrong width", {}, {{"w", &short_left, &right}}, "needs [rank, 6] and [rank, 4]"},
      {"ranks differ", {}, {{"w", &left, &other_rank}}, "are [2, 6] and [3, 4]"},
      {"a rank-1 variable", {}, {{"b", &left, &right}}, "of shape [4] needs"},
      {"given twice", {{"w", &grad}}, {{"w", &left, &right}}, "\"w\" is given twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PushResult> r = client->Push(c.dense, nullptr, c.factored);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.name;
  }
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(BitEqual(pulled->values["w"], w)) << "nothing was pushed";
}

TEST(PsClientTest, NamesTheDeadPsQuickly) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(2, options);
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {4, 2}}}, *Partitioner::FixedShards(2), 2));
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({4, 2}, 1);
  ASSERT_TRUE(client->Initialize({{"w", &w}}).ok());
  ASSERT_TRUE(client->Pull().ok());

  const std::string dead = cluster.servers[1]->address();
  cluster.servers[1]->Shutdown();
  const auto start = std::chrono::steady_clock::now();
  absl::Status pull = client->Pull().status();
  absl::Status push = client->Push({{"w", &w}}).status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const absl::Status& s : {pull, push}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("ps:1 (" + dead + ")"));
  }
  EXPECT_LT(seconds, 5.0);
}

TEST(PsClientTest, WaitForReadyRetriesUntilThePsComesUp) {
  const int port = UnusedPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Create({address}, Plan({{"w", {2}}}, Partitioner::None(), 1));
  ASSERT_TRUE(client.ok());
  std::unique_ptr<PsServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start(address, {});
    ASSERT_TRUE(s.ok()) << s.status();
    late = std::move(*s);
  });
  absl::Status ready = (*client)->WaitForReady();
  starter.join();
  EXPECT_TRUE(ready.ok()) << ready;
}

TEST(PsClientTest, WaitForReadyGivesUpNamingThePs) {
  const std::string address = "127.0.0.1:" + std::to_string(UnusedPort());
  PsClientOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Create({address}, Plan({{"w", {2}}}, Partitioner::None(), 1), options);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->WaitForReady();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("ps:0 (" + address + ") is not reachable"));
}

TEST(PsClientTest, WaitForReadyRejectsAClusterInTheWrongOrder) {
  PsTestCluster cluster(2);
  std::vector<std::string> swapped = {cluster.servers[1]->address(), cluster.servers[0]->address()};
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Create(swapped, Plan({{"w", {2}}}, Partitioner::None(), 2));
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->WaitForReady();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("says it is ps task 1 of 2"));
}

TEST(PsClientTest, RejectsTensorsThatDoNotMatchThePlan) {
  PsTestCluster cluster(1);
  std::unique_ptr<PsClient> client = cluster.Client(Plan({{"w", {4, 2}}}, Partitioner::None(), 1));
  ASSERT_NE(client, nullptr);
  const Tensor wrong({2, 4}), right({4, 2});
  absl::Status s = client->Push({{"w", &wrong}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"w\" has shape [2, 4]; the variable is [4, 2]"));
  s = client->Push({{"v", &right}}).status();
  EXPECT_THAT(s.message(), HasSubstr("\"v\" is not a variable of the sharding plan"));
  EXPECT_EQ(client->Pull({"v"}).status().code(), absl::StatusCode::kInvalidArgument);
  const ShardVersions bad_versions = {{"w", {0, 0, 0}}};
  s = client->Push({{"w", &right}}, &bad_versions).status();
  EXPECT_THAT(s.message(), HasSubstr("list 3 shards; the variable has 1"));
  EXPECT_EQ(
      PsClient::Create({"a:1", "b:2"}, Plan({{"w", {2}}}, Partitioner::None(), 1)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(PsClientTest, RecordsClientSideMetrics) {
  PsTestCluster cluster(1);
  prometheus::Registry registry;
  PsClientOptions options;
  options.registry = &registry;
  std::unique_ptr<PsClient> client =
      cluster.Client(Plan({{"w", {4, 2}}}, Partitioner::None(), 1), options);
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({4, 2}, 1);
  ASSERT_TRUE(client->Initialize({{"w", &w}}).ok());
  ASSERT_TRUE(client->Push({{"w", &w}}).ok());
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("distrain_ps_rpc_seconds_count{method=\"Pull\",side=\"client\"} 1"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "distrain_ps_bytes_total{direction=\"pulled\",shard=\"w/part_0\",side=\"client\"} 32"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "distrain_ps_bytes_total{direction=\"pushed\",shard=\"w/part_0\",side=\"client\"} 32"));
}

TEST(PsClientTest, PsWithoutShardsStillTakesPartInCheckpoints) {
  // Three ps, one single-shard variable: ps:1 and ps:2 host nothing but must
  // still write their (empty) part so the step counts as consistent.
  const testing_ps::ScopedTempDir tmp("empty");
  PsServiceOptions options;
  options.checkpoint_dir = tmp.path();
  PsTestCluster cluster(3, options);
  std::unique_ptr<PsClient> client = cluster.Client(Plan({{"w", {3}}}, Partitioner::None(), 3));
  ASSERT_NE(client, nullptr);
  const Tensor w = Pattern({3}, 4);
  ASSERT_TRUE(client->Initialize({{"w", &w}}).ok());
  ASSERT_TRUE(client->Save(5).ok());
  absl::StatusOr<int64_t> step = client->Restore();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  absl::StatusOr<PullResult> pulled = client->Pull();
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(BitEqual(pulled->values["w"], w));
}

// The ParameterServer worker starts a layer's forward pass when PullInto
// reports that layer's shards: each must be reported exactly once, after
// its values are in place, and before the call returns.
TEST(PsClientTest, PullIntoReportsEachShardOnceWithItsValuesInPlace) {
  PsServiceOptions options;
  options.optimizer = MakeOptimizerConfig(OptimizerType::kSgd, 1.0f);
  PsTestCluster cluster(2, options);
  PsClientOptions client_options;
  client_options.chunk_bytes = 256;  // shards span several messages
  const ShardingPlan plan = Plan({{"w0", {40, 9}}, {"b0", {9}}, {"w1", {9, 3}}, {"empty", {0, 3}}},
                                 *Partitioner::FixedShards(3), 2);
  std::unique_ptr<PsClient> client = cluster.Client(plan, client_options);
  ASSERT_NE(client, nullptr);
  std::map<std::string, Tensor> init;
  std::vector<TensorRef> refs;
  uint32_t seed = 20;
  for (const VariablePlan& v : plan.variables()) init.emplace(v.name, Pattern(v.shape, seed++));
  for (const auto& [name, t] : init) refs.push_back(TensorRef{name, &t});
  ASSERT_TRUE(client->Initialize(refs).ok());

  std::map<std::string, Tensor> out;
  std::vector<MutableTensorRef> targets;
  for (const VariablePlan& v : plan.variables()) {
    auto [it, _] = out.emplace(v.name, Tensor(v.shape));
    targets.push_back(MutableTensorRef{v.name, &it->second});
  }
  absl::Mutex mu;
  std::map<std::string, int> reported;  // shard key -> times
  bool all_in_place = true;
  ShardVersions versions;
  absl::Status s = client->PullInto(targets, &versions, [&](const ShardInfo& shard) {
    const float* got = out.at(shard.variable).data() + shard.element_offset();
    const float* want = init.at(shard.variable).data() + shard.element_offset();
    const bool same = std::memcmp(got, want, shard.num_elements() * sizeof(float)) == 0;
    absl::MutexLock lock(&mu);
    ++reported[shard.key()];
    all_in_place = all_in_place && same;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(all_in_place);
  ASSERT_EQ(reported.size(), plan.shards().size());
  for (const ShardInfo& shard : plan.shards()) EXPECT_EQ(reported[shard.key()], 1) << shard.key();
  for (const auto& [name, t] : init) EXPECT_TRUE(BitEqual(out.at(name), t)) << name;
  EXPECT_EQ(versions.size(), init.size());
}

}  // namespace
}  // namespace distrain

#include "worker/strategy/gradient_buckets.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "worker/collective/in_process.h"

namespace distrain {
namespace {

struct PlanCase {
  std::string name;
  std::vector<std::vector<int64_t>> sizes;
  int64_t bytes_per_pack;
  std::vector<GradientBucket> want;
};

GradientBucket Bucket(std::vector<BucketSlice> slices, int ready_layer) {
  GradientBucket b;
  for (const BucketSlice& s : slices) b.elements += s.count;
  b.slices = std::move(slices);
  b.ready_layer = ready_layer;
  return b;
}

class PlanGradientBucketsTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanGradientBucketsTest, PacksInReverseLayerOrderWithinTheLimit) {
  const PlanCase& c = GetParam();
  EXPECT_EQ(PlanGradientBuckets(c.sizes, c.bytes_per_pack), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Table, PlanGradientBucketsTest,
    ::testing::Values(
        PlanCase{"NoParameters", {{}, {}}, 64, {}},
        PlanCase{"EverythingFitsInOneBucket",
                 {{6, 2}, {}, {4, 1}},
                 1000,
                 {Bucket({{2, 0, 0, 4}, {2, 1, 0, 1}, {0, 0, 0, 6}, {0, 1, 0, 2}}, 0)}},
        // 20 bytes = 5 floats: the last layer fills bucket 0; layer 0's kernel
        // is split across buckets 1 and 2.
        PlanCase{"SplitsAGradientThatDoesNotFit",
                 {{6, 2}, {}, {4, 1}},
                 20,
                 {Bucket({{2, 0, 0, 4}, {2, 1, 0, 1}}, 2), Bucket({{0, 0, 0, 5}}, 0),
                  Bucket({{0, 0, 5, 1}, {0, 1, 0, 2}}, 0)}},
        PlanCase{
            "BucketSpansLayersAndIsReadyWithItsLowestLayer",
            {{3}, {2}, {1}},
            16,
            {Bucket({{2, 0, 0, 1}, {1, 0, 0, 2}, {0, 0, 0, 1}}, 0), Bucket({{0, 0, 1, 2}}, 0)}},
        PlanCase{"PackSmallerThanAFloatHoldsOneFloat",
                 {{2}},
                 3,
                 {Bucket({{0, 0, 0, 1}}, 0), Bucket({{0, 0, 1, 1}}, 0)}},
        PlanCase{"ZeroSizedParametersAreSkipped", {{0, 3}}, 400, {Bucket({{0, 1, 0, 3}}, 0)}}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return info.param.name; });

// On a real model and many pack sizes: every element of every gradient is in
// exactly one bucket, no bucket exceeds the limit, slices follow reverse layer
// order, and ready_layer is the lowest layer of the bucket.
TEST(PlanGradientBucketsPropertyTest, CoversEveryGradientOnceInReverseLayerOrder) {
  ModelConfig mc;
  mc.hidden_units = {32, 16};
  auto model = Model::Create(mc, 20, 10, 1);
  ASSERT_TRUE(model.ok());
  const auto sizes = LayerParameterSizes(**model);
  for (int64_t pack : {4, 40, 100, 1000, 2560, 2564, 4096, 1 << 20}) {
    SCOPED_TRACE(pack);
    auto buckets = PlanGradientBuckets(sizes, pack);
    std::vector<std::vector<std::vector<int>>> seen(sizes.size());
    for (size_t l = 0; l < sizes.size(); ++l) {
      for (int64_t n : sizes[l]) seen[l].emplace_back(n, 0);
    }
    int last_layer = static_cast<int>(sizes.size());
    for (const GradientBucket& b : buckets) {
      ASSERT_FALSE(b.slices.empty());
      EXPECT_LE(b.elements * 4, std::max<int64_t>(pack, 4));
      int64_t elements = 0;
      int lowest = b.slices.front().layer;
      for (const BucketSlice& s : b.slices) {
        EXPECT_LE(s.layer, last_layer) << "slices must follow reverse layer order";
        last_layer = s.layer;
        lowest = std::min(lowest, s.layer);
        elements += s.count;
        for (int64_t i = s.offset; i < s.offset + s.count; ++i) ++seen[s.layer][s.param][i];
      }
      EXPECT_EQ(elements, b.elements);
      EXPECT_EQ(b.ready_layer, lowest);
    }
    for (const auto& layer : seen) {
      for (const auto& param : layer) {
        for (int count : param) ASSERT_EQ(count, 1);
      }
    }
  }
}

// A collective that records every AllReduce (how many elements) and can fail.
class RecordingCollective : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op,
                         const CollectiveOptions& options) override {
    int64_t n = 0;
    for (auto b : buffers) n += static_cast<int64_t>(b.size());
    absl::MutexLock lock(&mu_);
    calls_.push_back(n);
    return fail_with_;
  }
  using Collective::AllReduce;
  absl::Status Broadcast(absl::Span<float>, int, const CollectiveOptions&) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(absl::Span<const float>, absl::Span<float>,
                         const CollectiveOptions&) override {
    return absl::OkStatus();
  }
  absl::Status Barrier(const CollectiveOptions&) override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}
  CollectiveStats stats() const override { return {}; }

  std::vector<int64_t> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  bool WaitForCalls(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  void FailWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(s);
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> calls_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Model> SmallModel(uint64_t seed = 7) {
  ModelConfig mc;
  mc.hidden_units = {32, 16};
  auto model = Model::Create(mc, 20, 5, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

TEST(OverlappedGradientReducerTest, StartsReducingTheLastLayerBeforeBackwardReachesTheFirst) {
  auto model = SmallModel();
  RecordingCollective collective;
  // The 16 -> 5 layer (layer 4) has 85 floats: a 340-byte pack holds exactly it.
  OverlappedGradientReducer reducer(model.get(), &collective, 340, {}, nullptr);
  ASSERT_GE(reducer.buckets().size(), 3u);
  ASSERT_EQ(reducer.buckets()[0].ready_layer, 4);
  reducer.BeginStep();
  reducer.OnLayerGradsReady(4);
  // Nothing else has been reported: the first bucket is reduced while the
  // rest of "backward" has not happened yet.
  ASSERT_TRUE(collective.WaitForCalls(1, absl::Seconds(10)));
  EXPECT_EQ(collective.calls().size(), 1u);
  EXPECT_EQ(collective.calls()[0], reducer.buckets()[0].elements);
  reducer.OnLayerGradsReady(2);
  ASSERT_TRUE(reducer.FinishStep().ok());
  EXPECT_EQ(collective.calls().size(), reducer.buckets().size());
}

TEST(OverlappedGradientReducerTest, FailureIsReportedOnceAndSkipsTheRemainingBuckets) {
  auto model = SmallModel();
  RecordingCollective collective;
  collective.FailWith(absl::UnavailableError("worker:2 (127.0.0.1:4000) died"));
  std::atomic<int> errors{0};
  OverlappedGradientReducer reducer(model.get(), &collective, 400, {}, nullptr,
                                    [&](const absl::Status&) { ++errors; });
  ASSERT_GE(reducer.buckets().size(), 2u);
  reducer.BeginStep();
  absl::Status s = reducer.FinishStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("worker:2"), std::string::npos) << s;
  EXPECT_EQ(errors.load(), 1);
  EXPECT_EQ(collective.calls().size(), 1u) << "buckets after a failure must not be reduced";
  // The error sticks: the group is unusable after a failure.
  reducer.BeginStep();
  EXPECT_FALSE(reducer.FinishStep().ok());
}

// Four replicas as threads, each with its own batch: reducing bucket by
// bucket during backward gives bit-for-bit the gradients of one all-reduce
// over every gradient after backward, and both are the mean of the replicas'
// gradients.
TEST(OverlappedGradientReducerTest, OverlappedReductionEqualsOneReductionAtTheEnd) {
  constexpr int kReplicas = 4;
  constexpr int kBatch = 8;
  std::vector<Tensor> features;
  std::vector<std::vector<int32_t>> labels;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int r = 0; r < kReplicas; ++r) {
    Tensor f({kBatch, 20});
    for (int64_t i = 0; i < f.size(); ++i) f[i] = normal(rng);
    features.push_back(std::move(f));
    std::vector<int32_t> l(kBatch);
    for (auto& x : l) x = static_cast<int32_t>(rng() % 5);
    labels.push_back(std::move(l));
  }
  auto run = [&](bool overlap) {
    auto group = InProcessCollective::CreateGroup(kReplicas);
    std::vector<std::unique_ptr<Model>> models;
    std::vector<std::unique_ptr<OverlappedGradientReducer>> reducers;
    for (int r = 0; r < kReplicas; ++r) {
      models.push_back(SmallModel());
      reducers.push_back(std::make_unique<OverlappedGradientReducer>(
          models[r].get(), group[r].get(), overlap ? 256 : (1 << 30), CollectiveOptions{},
          nullptr));
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(kReplicas);
    for (int r = 0; r < kReplicas; ++r) {
      threads.emplace_back([&, r] {
        reducers[r]->BeginStep();
        models[r]->TrainStep(features[r], labels[r], [&, r](int layer) {
          if (overlap) reducers[r]->OnLayerGradsReady(layer);
        });
        status[r] = reducers[r]->FinishStep();
      });
    }
    for (auto& t : threads) t.join();
    for (auto& s : status) EXPECT_TRUE(s.ok()) << s;
    std::vector<std::vector<float>> grads(kReplicas);
    for (int r = 0; r < kReplicas; ++r) {
      for (Parameter* p : models[r]->parameters()) {
        grads[r].insert(grads[r].end(), p->grad.data(), p->grad.data() + p->grad.size());
      }
    }
    return grads;
  };
  auto overlapped = run(true);
  auto at_end = run(false);
  for (int r = 0; r < kReplicas; ++r) {
    ASSERT_EQ(overlapped[r].size(), at_end[r].size());
    EXPECT_EQ(std::memcmp(overlapped[r].data(), at_end[r].data(), overlapped[r].size() * 4), 0)
        << "replica " << r;
    EXPECT_EQ(std::memcmp(overlapped[r].data(), overlapped[0].data(), overlapped[r].size() * 4), 0)
        << "replica " << r << " differs from replica 0";
  }
  // The mean, computed independently.
  std::vector<float> mean;
  for (int r = 0; r < kReplicas; ++r) {
    auto model = SmallModel();
    model->TrainStep(features[r], labels[r]);
    std::vector<float> g;
    for (Parameter* p : model->parameters())
      g.insert(g.end(), p->grad.data(), p->grad.data() + p->grad.size());
    if (mean.empty()) mean.assign(g.size(), 0.0f);
    for (size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
  }
  for (size_t i = 0; i < mean.size(); ++i) {
    ASSERT_NEAR(overlapped[0][i], mean[i] / kReplicas, 1e-6f) << "element " << i;
  }
}

}  // namespace
}  // namespace distrain

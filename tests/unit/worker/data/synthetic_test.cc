#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

using ::testing::HasSubstr;

DatasetConfig SmallConfig() {
  DatasetConfig config;
  config.num_examples = 600;
  config.num_eval_examples = 300;
  config.num_features = 17;  // odd: exercises the unpaired Box-Muller tail
  config.num_classes = 5;
  config.noise = 1.0f;
  return config;
}

std::unique_ptr<Dataset> Make(const DatasetConfig& config, uint64_t seed, bool eval) {
  auto dataset = MakeSyntheticDataset(config, seed, eval);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return *std::move(dataset);
}

struct Example {
  std::vector<float> features;
  int32_t label;
};

Example GetExample(const Dataset& dataset, int64_t i) {
  Example e{std::vector<float>(dataset.num_features()), -1};
  dataset.Get(i, e.features.data(), &e.label);
  return e;
}

TEST(PortableRngTest, MatchesReferenceSplitMix64) {
  // Reference outputs of Vigna's splitmix64.c seeded with 1234567.
  PortableRng rng(1234567);
  EXPECT_EQ(rng.NextU64(), 6457827717110365317ULL);
  EXPECT_EQ(rng.NextU64(), 3203168211198807973ULL);
  EXPECT_EQ(rng.NextU64(), 9817491932198370423ULL);
  EXPECT_EQ(rng.NextU64(), 4593380528125082431ULL);
  EXPECT_EQ(rng.NextU64(), 16408922859458223821ULL);
}

TEST(PortableRngTest, NextBelowStaysInRangeAndCoversIt) {
  PortableRng rng(7);
  std::vector<int> counts(6);
  for (int i = 0; i < 6000; ++i) {
    const uint64_t v = rng.NextBelow(6);
    ASSERT_LT(v, 6u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(PortableRngTest, NormalPairsHaveUnitMomentsAndKeysDiffer) {
  PortableRng rng(PortableRng::MixKey(1, 2));
  double sum = 0, sum_sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double a, b;
    rng.NextNormalPair(&a, &b);
    sum += a + b;
    sum_sq += a * a + b * b;
  }
  EXPECT_NEAR(sum / (2 * n), 0.0, 0.03);
  EXPECT_NEAR(sum_sq / (2 * n), 1.0, 0.03);
  EXPECT_NE(PortableRng::MixKey(1, 2), PortableRng::MixKey(2, 1));
  EXPECT_NE(PortableRng::MixKey(0, 0), PortableRng::MixKey(0, 1));
}

TEST(SyntheticDatasetTest, SameSeedGivesBitIdenticalExamples) {
  auto a = Make(SmallConfig(), 42, false);
  auto b = Make(SmallConfig(), 42, false);
  ASSERT_EQ(a->size(), 600);
  ASSERT_EQ(a->num_features(), 17);
  ASSERT_EQ(a->num_classes(), 5);
  for (int64_t i = 0; i < a->size(); ++i) {
    Example x = GetExample(*a, i), y = GetExample(*b, i);
    ASSERT_EQ(x.label, y.label) << i;
    ASSERT_EQ(0,
              std::memcmp(x.features.data(), y.features.data(), x.features.size() * sizeof(float)))
        << i;
  }
}

// Rows are generated on first read and kept: the order and the threads that
// read them first change nothing, and a second read returns the same bytes.
TEST(SyntheticDatasetTest, RowsReadConcurrentlyInAnyOrderMatchSequentialReads) {
  const DatasetConfig config = SmallConfig();
  auto reference = Make(config, 7, false);
  std::vector<Example> want;
  for (int64_t i = 0; i < reference->size(); ++i) want.push_back(GetExample(*reference, i));

  auto shared = Make(config, 7, false);
  constexpr int kThreads = 8;
  std::vector<std::vector<Example>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Every thread reads every row, each in its own order (backwards for odd t).
      for (int64_t k = 0; k < shared->size(); ++k) {
        const int64_t i = t % 2 == 0 ? k : shared->size() - 1 - k;
        got[t].push_back(GetExample(*shared, i));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t k = 0; k < shared->size(); ++k) {
      const int64_t i = t % 2 == 0 ? k : shared->size() - 1 - k;
      ASSERT_EQ(got[t][k].label, want[i].label) << "thread " << t << " row " << i;
      ASSERT_EQ(0, std::memcmp(got[t][k].features.data(), want[i].features.data(),
                               sizeof(float) * want[i].features.size()))
          << "thread " << t << " row " << i;
    }
  }
  const Example again = GetExample(*shared, 3);
  EXPECT_EQ(0, std::memcmp(again.features.data(), want[3].features.data(),
                           sizeof(float) * want[3].features.size()));
}

TEST(SyntheticDatasetTest, ExampleDependsOnlyOnSeedAndIndexNotOnSize) {
  DatasetConfig bigger = SmallConfig();
  bigger.num_examples = 900;
  auto a = Make(SmallConfig(), 42, false);
  auto b = Make(bigger, 42, false);
  for (int64_t i : {0, 1, 299, 599}) {
    Example x = GetExample(*a, i), y = GetExample(*b, i);
    EXPECT_EQ(x.label, y.label);
    EXPECT_EQ(x.features, y.features);
  }
}

TEST(SyntheticDatasetTest, DifferentSeedGivesDifferentExamples) {
  auto a = Make(SmallConfig(), 42, false);
  auto b = Make(SmallConfig(), 43, false);
  int same_labels = 0;
  for (int64_t i = 0; i < a->size(); ++i) {
    Example x = GetExample(*a, i), y = GetExample(*b, i);
    EXPECT_NE(x.features, y.features) << i;
    same_labels += x.label == y.label;
  }
  EXPECT_LT(same_labels, 200);  // ~1/5 by chance
}

TEST(SyntheticDatasetTest, EvalSplitIsDisjointFromTrain) {
  auto train = Make(SmallConfig(), 42, false);
  auto eval = Make(SmallConfig(), 42, true);
  ASSERT_EQ(eval->size(), 300);
  std::set<std::vector<float>> train_rows;
  for (int64_t i = 0; i < train->size(); ++i) train_rows.insert(GetExample(*train, i).features);
  for (int64_t i = 0; i < eval->size(); ++i) {
    EXPECT_EQ(train_rows.count(GetExample(*eval, i).features), 0u) << "eval example " << i;
  }
}

// Per-class feature means: the class centres, up to noise / sqrt(count).
std::vector<std::vector<double>> ClassMeans(const Dataset& dataset) {
  std::vector<std::vector<double>> means(dataset.num_classes(),
                                         std::vector<double>(dataset.num_features()));
  std::vector<int> counts(dataset.num_classes());
  for (int64_t i = 0; i < dataset.size(); ++i) {
    Example e = GetExample(dataset, i);
    ++counts[e.label];
    for (int j = 0; j < dataset.num_features(); ++j) means[e.label][j] += e.features[j];
  }
  for (int c = 0; c < dataset.num_classes(); ++c) {
    for (double& m : means[c]) m /= std::max(counts[c], 1);
  }
  return means;
}

double Distance(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t j = 0; j < a.size(); ++j) d += (a[j] - b[j]) * (a[j] - b[j]);
  return std::sqrt(d);
}

TEST(SyntheticDatasetTest, EvalSplitSharesTheClassCentres) {
  DatasetConfig config = SmallConfig();
  config.num_examples = 5000;
  config.num_eval_examples = 5000;
  auto train_means = ClassMeans(*Make(config, 42, false));
  auto eval_means = ClassMeans(*Make(config, 42, true));
  auto other_seed_means = ClassMeans(*Make(config, 7, false));
  for (int c = 0; c < config.num_classes; ++c) {
    // ~1000 examples per class: the mean is within ~sqrt(17/1000) = 0.13 of the centre.
    EXPECT_LT(Distance(train_means[c], eval_means[c]), 0.4) << "class " << c;
    EXPECT_GT(Distance(train_means[c], other_seed_means[c]), 2.0) << "class " << c;
  }
}

TEST(SyntheticDatasetTest, ClassesAreRoughlyBalanced) {
  DatasetConfig config = SmallConfig();
  config.num_examples = 10000;
  config.num_classes = 10;
  config.num_features = 2;
  auto dataset = Make(config, 3, false);
  std::map<int32_t, int> counts;
  for (int64_t i = 0; i < dataset->size(); ++i) ++counts[GetExample(*dataset, i).label];
  ASSERT_EQ(counts.size(), 10u);
  for (const auto& [label, count] : counts) {
    EXPECT_GE(label, 0);
    EXPECT_LT(label, 10);
    EXPECT_NEAR(count, 1000, 130) << "label " << label;
  }
}

TEST(SyntheticDatasetTest, NoiseIsTheSpreadAroundTheCentre) {
  DatasetConfig config = SmallConfig();
  config.num_examples = 4000;
  config.noise = 2.5f;
  auto dataset = Make(config, 11, false);
  auto means = ClassMeans(*dataset);
  double sum_sq = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < dataset->size(); ++i) {
    Example e = GetExample(*dataset, i);
    for (int j = 0; j < dataset->num_features(); ++j, ++n) {
      sum_sq += std::pow(e.features[j] - means[e.label][j], 2);
    }
  }
  EXPECT_NEAR(std::sqrt(sum_sq / n), 2.5, 0.06);
}

// Nearest-class-mean accuracy on the eval split (close to the Bayes rate for
// isotropic clusters): the data must be learnable to >= 95% at the reference
// size, yet not trivially separable.
double NearestMeanAccuracy(const DatasetConfig& config) {
  auto means = ClassMeans(*Make(config, 42, false));
  auto eval = Make(config, 42, true);
  int correct = 0;
  for (int64_t i = 0; i < eval->size(); ++i) {
    Example e = GetExample(*eval, i);
    std::vector<double> x(e.features.begin(), e.features.end());
    int best = 0;
    for (int c = 1; c < config.num_classes; ++c) {
      if (Distance(x, means[c]) < Distance(x, means[best])) best = c;
    }
    correct += best == e.label;
  }
  return static_cast<double>(correct) / eval->size();
}

TEST(SyntheticDatasetTest, ReferenceSizeIsLearnableButNotTrivial) {
  DatasetConfig config;
  config.num_examples = 5000;
  config.num_eval_examples = 2000;
  config.num_features = 64;
  config.num_classes = 10;
  config.noise = 1.0f;
  const double accuracy = NearestMeanAccuracy(config);
  EXPECT_GE(accuracy, 0.95);
  config.noise = 2.0f;
  EXPECT_LT(NearestMeanAccuracy(config), 0.9)
      << "doubling the noise should make the task clearly harder";
}

TEST(SyntheticDatasetTest, InvalidConfigNamesTheField) {
  struct Case {
    void (*mutate)(DatasetConfig&);
    bool eval;
    const char* field;
  };
  const Case cases[] = {
      {[](DatasetConfig& c) { c.num_examples = 0; }, false, "spec.training.dataset.numExamples"},
      {[](DatasetConfig& c) { c.num_eval_examples = -1; }, true,
       "spec.training.dataset.numEvalExamples"},
      {[](DatasetConfig& c) { c.num_features = 0; }, false, "spec.training.dataset.numFeatures"},
      {[](DatasetConfig& c) { c.num_classes = 1; }, false, "spec.training.dataset.numClasses"},
      {[](DatasetConfig& c) { c.noise = -1; }, false, "spec.training.dataset.noise"},
      {[](DatasetConfig& c) { c.noise = NAN; }, false, "spec.training.dataset.noise"},
      {[](DatasetConfig& c) { c.num_examples = int64_t{1} << 40; }, false,
       "spec.training.dataset.numExamples"},
  };
  for (const Case& c : cases) {
    DatasetConfig config = SmallConfig();
    c.mutate(config);
    auto dataset = MakeSyntheticDataset(config, 1, c.eval);
    ASSERT_FALSE(dataset.ok()) << c.field;
    EXPECT_THAT(std::string(dataset.status().message()), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace distrain

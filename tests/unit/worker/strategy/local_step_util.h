#ifndef DISTRAIN_TESTS_UNIT_WORKER_STRATEGY_LOCAL_STEP_UTIL_H_
#define DISTRAIN_TESTS_UNIT_WORKER_STRATEGY_LOCAL_STEP_UTIL_H_

// Helpers shared by the tests of strategies with local replicas (Mirrored,
// CentralStorage): a deterministic learnable dataset, one training step fed
// the way the Trainer feeds it, and the distance between two models'
// parameters.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/model.h"
#include "worker/strategy/strategy.h"
#include "worker/tensor/tensor.h"

namespace distrain::testing {

inline constexpr int kLocalStepFeatures = 24;
inline constexpr int kLocalStepClasses = 6;

// Deterministic batches of a learnable problem (label = argmax of a fixed
// projection), the same for every strategy under test.
struct Batches {
  Batches(int64_t batch_size, int steps) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> w(kLocalStepFeatures * kLocalStepClasses);
    for (float& x : w) x = normal(rng);
    for (int s = 0; s < steps; ++s) {
      Tensor f({batch_size, kLocalStepFeatures});
      std::vector<int32_t> l(batch_size);
      for (int64_t i = 0; i < batch_size; ++i) {
        for (int j = 0; j < kLocalStepFeatures; ++j) f.at(i, j) = normal(rng);
        int best = 0;
        float best_score = -1e30f;
        for (int c = 0; c < kLocalStepClasses; ++c) {
          float score = 0;
          for (int j = 0; j < kLocalStepFeatures; ++j) {
            score += f.at(i, j) * w[j * kLocalStepClasses + c];
          }
          if (score > best_score) best_score = score, best = c;
        }
        l[i] = best;
      }
      features.push_back(std::move(f));
      labels.push_back(std::move(l));
    }
  }
  std::vector<Tensor> features;
  std::vector<std::vector<int32_t>> labels;
};

// One step the way the Trainer runs it: replica r takes rows
// [r * b / n, (r + 1) * b / n) of the batch.
inline absl::StatusOr<StepOutput> LocalReplicaStep(Strategy& s, const Tensor& features,
                                                   const std::vector<int32_t>& labels) {
  const int n = s.num_local_replicas();
  const int64_t b = features.dim(0);
  const int64_t width = features.dim(1);
  std::vector<Tensor> f(n);
  std::vector<std::vector<int32_t>> l(n);
  StepFn fn = [&](ReplicaContext& ctx) {
    const int r = ctx.local_replica;
    const int64_t per = b / n;
    f[r].Resize({per, width});
    std::memcpy(f[r].data(), features.data() + r * per * width, per * width * sizeof(float));
    l[r].assign(labels.begin() + r * per, labels.begin() + (r + 1) * per);
    return ctx.model->TrainStep(f[r], l[r], ctx.on_layer_grads_ready);
  };
  return s.Run(fn, b);
}

inline float MaxAbsParameterDiff(Model& a, Model& b) {
  float worst = 0;
  auto pa = a.parameters();
  auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    for (int64_t j = 0; j < pa[i]->value.size(); ++j) {
      worst = std::max(worst, std::fabs(pa[i]->value[j] - pb[i]->value[j]));
    }
  }
  return worst;
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_STRATEGY_LOCAL_STEP_UTIL_H_

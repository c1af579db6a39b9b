#ifndef DISTRAIN_TESTS_UNIT_WORKER_STRATEGY_LOCAL_STEP_UTIL_H_
#define DISTRAIN_TESTS_UNIT_WORKER_STRATEGY_LOCAL_STEP_UTIL_H_

// Helpers shared by the tests of strategies with local replicas (Mirrored,
// CentralStorage): one training step fed the way the Trainer feeds it, and
// the distance between two models' parameters.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/model.h"
#include "worker/strategy/strategy.h"
#include "worker/tensor/tensor.h"

namespace distrain::testing {

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

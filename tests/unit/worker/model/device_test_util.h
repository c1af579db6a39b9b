#ifndef DISTRAIN_TESTS_UNIT_WORKER_MODEL_DEVICE_TEST_UTIL_H_
#define DISTRAIN_TESTS_UNIT_WORKER_MODEL_DEVICE_TEST_UTIL_H_

// Shared by the GPU-versus-CPU tests (model_device_test.cc,
// strategy/gpu_strategies_test.cc, tensor/ops_device_test.cc): the
// TensorFlow guide's CNN on 28x28x1 images, deterministic random batches for
// it, the 1e-4 comparison of variables that a GPU must meet against the CPU
// (docs/architecture.md §6a), and every activation function to sweep.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "common/job_config.h"
#include "worker/tensor/tensor.h"

namespace distrain::testing {

// Every activation Keras names (Keras' defaults), then ELU and leaky ReLU
// with the other alphas their layers take.
inline std::vector<ActivationFunction> AllActivationFunctions() {
  std::vector<ActivationFunction> all;
  for (const std::string& name : ActivationNames()) all.push_back(*ParseActivationName(name));
  all.push_back({ActivationKind::kElu, 0.5f});
  all.push_back({ActivationKind::kLeakyRelu, 0.01f});
  return all;
}

inline LayerConfig LayerOf(LayerKind kind) {
  LayerConfig l;
  l.kind = kind;
  return l;
}
inline LayerConfig ConvLayer(int64_t filters, int64_t k, ActivationKind act, PaddingKind padding) {
  LayerConfig l = LayerOf(LayerKind::kConv2D);
  l.filters = filters;
  l.kernel_size = {k, k};
  l.activation = act;
  l.padding = padding;
  return l;
}
inline LayerConfig DenseLayer(int64_t units, ActivationKind act) {
  LayerConfig l = LayerOf(LayerKind::kDense);
  l.units = units;
  l.activation = act;
  return l;
}
inline LayerConfig PoolLayer(LayerKind kind) {
  LayerConfig l = LayerOf(kind);
  l.pool_size = {2, 2};
  return l;
}

// The CNN of TensorFlow's distributed-training guide, for 28x28x1 inputs and
// 10 classes.
inline ModelConfig GuideCnn() {
  ModelConfig c;
  c.type = "sequential";
  c.layers = {ConvLayer(32, 3, ActivationKind::kRelu, PaddingKind::kValid),
              PoolLayer(LayerKind::kMaxPooling2D),
              ConvLayer(64, 3, ActivationKind::kRelu, PaddingKind::kValid),
              LayerOf(LayerKind::kFlatten),
              DenseLayer(64, ActivationKind::kRelu),
              DenseLayer(10, ActivationKind::kSoftmax)};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

struct ImageBatch {
  Tensor features;  // [n, 28 * 28], host
  std::vector<int32_t> labels;
};

// `steps` batches of `n` uniform images and labels in [0, 10), from `seed`.
inline std::vector<ImageBatch> ImageBatches(int steps, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<ImageBatch> out;
  for (int s = 0; s < steps; ++s) {
    ImageBatch b{Tensor({n, 28 * 28}), std::vector<int32_t>(n)};
    for (int64_t i = 0; i < b.features.size(); ++i) b.features[i] = u(gen);
    for (int32_t& l : b.labels) l = static_cast<int32_t>(gen() % 10);
    out.push_back(std::move(b));
  }
  return out;
}

// |a - b| <= tol * max(1, |a|) everywhere (host tensors); the first
// violation otherwise.
inline ::testing::AssertionResult AllClose(const std::vector<Tensor>& want,
                                           const std::vector<Tensor>& got, double tol) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "variable count differs";
  for (size_t v = 0; v < want.size(); ++v) {
    if (!want[v].SameShape(got[v])) {
      return ::testing::AssertionFailure() << "variable " << v << " shape "
                                           << want[v].ShapeString() << " vs "
                                           << got[v].ShapeString();
    }
    for (int64_t i = 0; i < want[v].size(); ++i) {
      const double a = want[v][i], b = got[v][i];
      if (!(std::abs(a - b) <= tol * std::max(1.0, std::abs(a)))) {
        return ::testing::AssertionFailure()
               << "variable " << v << " element " << i << ": want " << a << ", got " << b;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_MODEL_DEVICE_TEST_UTIL_H_

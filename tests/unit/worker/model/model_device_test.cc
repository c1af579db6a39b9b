// A model trained on a GPU equals the same model trained on the CPU: the
// guide's CNN after 100 Adam steps, and a CNN with every other layer kind
// (batch norm, dropout, 'same' padding, average and global pooling, GELU)
// under momentum, every variable within 1e-4. Runs on every visible GPU of
// a CUDA build; skips elsewhere (docs/architecture.md §6a).

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/tensor/ops.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain {
namespace {

int VisibleGpus() {
#ifdef DISTRAIN_HAVE_CUDA
  return cuda::VisibleDeviceCount();
#else
  return 0;
#endif
}

LayerConfig L(LayerKind kind) {
  LayerConfig l;
  l.kind = kind;
  return l;
}
LayerConfig Conv(int64_t filters, int64_t k, ActivationKind act, PaddingKind padding) {
  LayerConfig l = L(LayerKind::kConv2D);
  l.filters = filters;
  l.kernel_size = {k, k};
  l.activation = act;
  l.padding = padding;
  return l;
}
LayerConfig DenseL(int64_t units, ActivationKind act) {
  LayerConfig l = L(LayerKind::kDense);
  l.units = units;
  l.activation = act;
  return l;
}
LayerConfig Pool(LayerKind kind) {
  LayerConfig l = L(kind);
  l.pool_size = {2, 2};
  return l;
}

ModelConfig GuideCnn() {
  ModelConfig c;
  c.type = "sequential";
  c.layers = {Conv(32, 3, ActivationKind::kRelu, PaddingKind::kValid),
              Pool(LayerKind::kMaxPooling2D),
              Conv(64, 3, ActivationKind::kRelu, PaddingKind::kValid),
              L(LayerKind::kFlatten),
              DenseL(64, ActivationKind::kRelu),
              DenseL(10, ActivationKind::kSoftmax)};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

ModelConfig EveryLayerCnn() {
  ModelConfig c;
  c.type = "sequential";
  LayerConfig dropout = L(LayerKind::kDropout);
  dropout.rate = 0.25;
  c.layers = {Conv(16, 3, ActivationKind::kLinear, PaddingKind::kSame),
              L(LayerKind::kBatchNormalization),
              [] {
                LayerConfig a = L(LayerKind::kActivation);
                a.activation = ActivationKind::kGelu;
                return a;
              }(),
              Pool(LayerKind::kAveragePooling2D),
              Conv(24, 2, ActivationKind::kTanh, PaddingKind::kSame),
              Pool(LayerKind::kMaxPooling2D),
              dropout,
              L(LayerKind::kGlobalAveragePooling2D),
              DenseL(32, ActivationKind::kSigmoid),
              DenseL(10, ActivationKind::kLinear)};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

struct Batch {
  Tensor features;
  std::vector<int32_t> labels;
};

std::vector<Batch> Batches(int steps, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    Batch b{Tensor({n, 28 * 28}), std::vector<int32_t>(n)};
    for (int64_t i = 0; i < b.features.size(); ++i) b.features[i] = u(gen);
    for (int32_t& l : b.labels) l = static_cast<int32_t>(gen() % 10);
    out.push_back(std::move(b));
  }
  return out;
}

// Trains `config` for batches.size() steps on `device` and returns every
// variable (parameters, then state variables) copied to the host.
std::vector<Tensor> Train(const ModelConfig& config, const OptimizerConfig& optimizer_config,
                          const std::vector<Batch>& batches, DeviceId device,
                          std::vector<double>* losses) {
  auto model = Model::Create(config, {28, 28, 1}, 10, /*seed=*/7);
  EXPECT_TRUE(model.ok()) << model.status();
  (*model)->MoveTo(device);
  auto optimizer = Optimizer::Create(optimizer_config);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  int64_t step = 0;
  for (const Batch& b : batches) {
    Tensor features(b.features.shape(), device);
    ops::Copy(b.features, &features);
    StepContext ctx;
    ctx.step = step++;
    const LossResult r = (*model)->TrainStep(features, b.labels, {}, {}, ctx);
    losses->push_back(r.loss);
    (*optimizer)->Apply((*model)->parameters());
  }
  std::vector<Tensor> out;
  for (const std::vector<Parameter*>& group :
       {(*model)->parameters(), (*model)->state_variables()}) {
    for (Parameter* p : group) {
      Tensor host;
      ops::Copy(p->value, &host);
      out.push_back(std::move(host));
    }
  }
  return out;
}

// |a - b| <= tol * max(1, |a|) everywhere; the first violation otherwise.
::testing::AssertionResult AllClose(const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                                    double tol) {
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
               << "variable " << v << " element " << i << ": CPU " << a << ", GPU " << b;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ModelDeviceTest, AllCloseFailsOnAPerturbedVariable) {
  std::vector<Tensor> a = {Tensor({3}, {1.0f, -2.0f, 3.0f})};
  std::vector<Tensor> b = a;
  EXPECT_TRUE(AllClose(a, b, 1e-4));
  b[0][1] = -2.001f;
  EXPECT_FALSE(AllClose(a, b, 1e-4));
}

void ExpectGpuTrainsLikeCpu(const ModelConfig& config, OptimizerType type, int steps) {
  const int gpus = VisibleGpus();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  OptimizerConfig optimizer;
  optimizer.type = type;
  optimizer.learning_rate = type == OptimizerType::kAdam ? 1e-3f : 0.05f;
  optimizer.momentum = 0.9f;
  const std::vector<Batch> batches = Batches(steps, 32, 11);
  std::vector<double> cpu_losses;
  const std::vector<Tensor> cpu = Train(config, optimizer, batches, DeviceId::Cpu(), &cpu_losses);
  for (int g = 0; g < gpus; ++g) {
    std::vector<double> gpu_losses;
    const std::vector<Tensor> gpu =
        Train(config, optimizer, batches, DeviceId::Cuda(g), &gpu_losses);
    EXPECT_TRUE(AllClose(cpu, gpu, 1e-4)) << "GPU:" << g << " after " << steps << " steps";
    ASSERT_EQ(gpu_losses.size(), cpu_losses.size());
    EXPECT_NEAR(gpu_losses.back(), cpu_losses.back(), 1e-4 * std::max(1.0, cpu_losses.back()))
        << "GPU:" << g;
  }
}

TEST(ModelDeviceTest, TheGuidesCnnTrainsOnEveryGpuLikeOnTheCpuFor100AdamSteps) {
  ExpectGpuTrainsLikeCpu(GuideCnn(), OptimizerType::kAdam, 100);
}

TEST(ModelDeviceTest, ACnnWithEveryLayerKindTrainsOnEveryGpuLikeOnTheCpu) {
  ExpectGpuTrainsLikeCpu(EveryLayerCnn(), OptimizerType::kMomentum, 30);
}

}  // namespace
}  // namespace distrain

// A model trained on a GPU equals the same model trained on the CPU: the
// guide's CNN after 100 Adam steps, and a CNN with every other layer kind
// (batch norm, dropout, 'same' padding, average and global pooling, GELU)
// under momentum, the 1-D layers, layer and RMS normalisation, every
// variable within 1e-4. Runs on every visible GPU of
// a CUDA build; skips elsewhere (docs/architecture.md §6a).

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/model/device_test_util.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

using testing::AllClose;
using testing::GuideCnn;
LayerConfig L(LayerKind kind) { return testing::LayerOf(kind); }
LayerConfig Conv(int64_t filters, int64_t k, ActivationKind act, PaddingKind padding) {
  return testing::ConvLayer(filters, k, act, padding);
}
LayerConfig DenseL(int64_t units, ActivationKind act) { return testing::DenseLayer(units, act); }
LayerConfig Pool(LayerKind kind) { return testing::PoolLayer(kind); }

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

// Each digit's rows as a sequence, through the 1-D layers (the 2-D ops on
// [steps, 1, channels] images) and some of the newer activation layers.
ModelConfig SequenceModel() {
  ModelConfig c;
  c.type = "sequential";
  LayerConfig reshape = L(LayerKind::kReshape);
  reshape.shape = {28, 28};
  LayerConfig conv = L(LayerKind::kConv1D);
  conv.filters = 16;
  conv.kernel_size = {3, 1};
  conv.activation = ActivationKind::kRelu;
  LayerConfig max_pool = L(LayerKind::kMaxPooling1D);
  max_pool.pool_size = {2, 1};
  LayerConfig conv2 = conv;
  conv2.filters = 12;
  conv2.strides = std::array<int64_t, 2>{2, 1};
  conv2.padding = PaddingKind::kSame;
  conv2.activation = ActivationKind::kLinear;
  LayerConfig leaky = L(LayerKind::kLeakyReLU);
  LayerConfig avg_pool = L(LayerKind::kAveragePooling1D);
  avg_pool.pool_size = {3, 1};
  avg_pool.strides = std::array<int64_t, 2>{1, 1};
  avg_pool.padding = PaddingKind::kSame;
  c.layers = {reshape, conv, max_pool, conv2, leaky, avg_pool,
              L(LayerKind::kGlobalMaxPooling1D), DenseL(32, ActivationKind::kSilu),
              DenseL(10, ActivationKind::kLinear)};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

// A CNN and an MLP head normalised per example: LayerNormalization on the
// feature maps (each center/scale choice) and RMSNormalization on rows.
ModelConfig NormalizedModel() {
  ModelConfig c;
  c.type = "sequential";
  LayerConfig ln = L(LayerKind::kLayerNormalization);
  LayerConfig ln_no_center = ln;
  ln_no_center.center = false;
  ln_no_center.epsilon = 1e-5;
  LayerConfig ln_no_scale = ln;
  ln_no_scale.scale_output = false;
  LayerConfig rms = L(LayerKind::kRMSNormalization);
  rms.epsilon = DefaultEpsilon(LayerKind::kRMSNormalization);
  c.layers = {Conv(16, 3, ActivationKind::kLinear, PaddingKind::kValid),
              ln,
              [] {
                LayerConfig a = L(LayerKind::kActivation);
                a.activation = ActivationKind::kRelu;
                return a;
              }(),
              Pool(LayerKind::kMaxPooling2D),
              L(LayerKind::kFlatten),
              DenseL(64, ActivationKind::kLinear),
              ln_no_center,
              DenseL(32, ActivationKind::kGelu),
              rms,
              DenseL(10, ActivationKind::kLinear),
              ln_no_scale};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

// Each digit's pixels quantised to 16 levels as token ids: Embedding, then
// the vectors convolved as a sequence (causally first: padding before only).
ModelConfig TokenModel() {
  ModelConfig c;
  c.type = "sequential";
  LayerConfig embedding = L(LayerKind::kEmbedding);
  embedding.input_dim = 16;
  embedding.output_dim = 8;
  LayerConfig reshape = L(LayerKind::kReshape);
  reshape.shape = {784, 8};
  LayerConfig causal = L(LayerKind::kConv1D);
  causal.filters = 8;
  causal.kernel_size = {3, 1};
  causal.padding = PaddingKind::kCausal;
  LayerConfig conv = L(LayerKind::kConv1D);
  conv.filters = 16;
  conv.kernel_size = {28, 1};
  conv.strides = std::array<int64_t, 2>{28, 1};
  conv.activation = ActivationKind::kRelu;
  c.layers = {embedding, reshape, causal, conv, L(LayerKind::kGlobalAveragePooling1D),
              DenseL(10, ActivationKind::kLinear)};
  c.loss.kind = LossKind::kSparseCategoricalCrossentropy;
  c.loss.from_logits = true;
  return c;
}

using Batch = testing::ImageBatch;
std::vector<Batch> Batches(int steps, int64_t n, uint32_t seed) {
  return testing::ImageBatches(steps, n, seed);
}
// The same images as token ids 0-15.
std::vector<Batch> TokenBatches(int steps, int64_t n, uint32_t seed) {
  std::vector<Batch> batches = Batches(steps, n, seed);
  for (Batch& b : batches) {
    for (float& v : b.features.span()) v = std::floor(v * 16.0f);  // v < 1: at most 15
  }
  return batches;
}

// Trains `config` for batches.size() steps on `device` and returns every
// variable (parameters, then state variables) copied to the host.
std::vector<Tensor> Train(const ModelConfig& config, const OptimizerConfig& optimizer_config,
                          const std::vector<Batch>& batches, DeviceId device,
                          std::vector<double>* losses) {
  auto model = Model::Create(config, {28, 28, 1}, 10, /*seed=*/7);
  EXPECT_TRUE(model.ok()) << model.status();
  (*model)->MoveTo(device);
  auto optimizer = Optimizer::Create(optimizer_config, config.precision);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  int64_t step = 0;
  for (const Batch& b : batches) {
    Tensor features(b.features.shape(), device);
    ops::Copy(b.features, &features);
    StepContext ctx;
    ctx.step = step++;
    (*model)->set_loss_scale((*optimizer)->loss_scale());
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

TEST(ModelDeviceTest, AllCloseFailsOnAPerturbedVariable) {
  std::vector<Tensor> a = {Tensor({3}, {1.0f, -2.0f, 3.0f})};
  std::vector<Tensor> b = a;
  EXPECT_TRUE(AllClose(a, b, 1e-4));
  b[0][1] = -2.001f;
  EXPECT_FALSE(AllClose(a, b, 1e-4));
}

// Trains `config` from `batches` on the CPU and on every GPU: every variable
// within `variable_tol` and the last loss within `loss_tol` (both relative,
// at least absolute).
void ExpectGpuTrainsLikeCpu(const ModelConfig& config, const OptimizerConfig& optimizer,
                            const std::vector<Batch>& batches, double variable_tol,
                            double loss_tol) {
  const int gpus = VisibleGpus();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  std::vector<double> cpu_losses;
  const std::vector<Tensor> cpu = Train(config, optimizer, batches, DeviceId::Cpu(), &cpu_losses);
  for (int g = 0; g < gpus; ++g) {
    std::vector<double> gpu_losses;
    const std::vector<Tensor> gpu =
        Train(config, optimizer, batches, DeviceId::Cuda(g), &gpu_losses);
    EXPECT_TRUE(AllClose(cpu, gpu, variable_tol))
        << "GPU:" << g << " after " << batches.size() << " steps";
    ASSERT_EQ(gpu_losses.size(), cpu_losses.size());
    EXPECT_NEAR(gpu_losses.back(), cpu_losses.back(),
                loss_tol * std::max(1.0, cpu_losses.back()))
        << "GPU:" << g;
  }
}

// Float32 training: within 1e-4.
void ExpectGpuTrainsLikeCpu(const ModelConfig& config, OptimizerType type, int steps) {
  OptimizerConfig optimizer;
  optimizer.type = type;
  optimizer.learning_rate = type == OptimizerType::kAdam ? 1e-3f : 0.05f;
  optimizer.momentum = 0.9f;
  ExpectGpuTrainsLikeCpu(config, optimizer, Batches(steps, 32, 11), 1e-4, 1e-4);
}

// Model::TrainStep copies a host batch to the model's device (the one place
// features reach a replica's GPU): the same steps fed from the host equal,
// bit for bit, the steps fed from device memory.
TEST(ModelDeviceTest, AHostBatchReachesAGpuModelAsADeviceBatchWould) {
  if (VisibleGpus() == 0) GTEST_SKIP() << "no GPU visible (or a CPU-only build)";
  const std::vector<Batch> batches = Batches(5, 16, 3);
  std::vector<std::vector<float>> results;
  for (bool host_fed : {false, true}) {
    auto model = Model::Create(GuideCnn(), {28, 28, 1}, 10, /*seed=*/7);
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->MoveTo(DeviceId::Cuda(0));
    auto optimizer = Optimizer::Create(OptimizerConfig{});
    ASSERT_TRUE(optimizer.ok());
    for (const Batch& b : batches) {
      Tensor on_device(b.features.shape(), DeviceId::Cuda(0));
      ops::Copy(b.features, &on_device);
      (*model)->TrainStep(host_fed ? b.features : on_device, b.labels);
      (*optimizer)->Apply((*model)->parameters());
    }
    EXPECT_EQ((*model)->device(), DeviceId::Cuda(0));
    std::vector<float>& flat = results.emplace_back();
    for (Parameter* p : (*model)->parameters()) {
      Tensor host;
      ops::Copy(p->value, &host);
      flat.insert(flat.end(), host.span().begin(), host.span().end());
    }
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(ModelDeviceTest, TheGuidesCnnTrainsOnEveryGpuLikeOnTheCpuFor100AdamSteps) {
  ExpectGpuTrainsLikeCpu(GuideCnn(), OptimizerType::kAdam, 100);
}

TEST(ModelDeviceTest, ACnnWithEveryLayerKindTrainsOnEveryGpuLikeOnTheCpu) {
  ExpectGpuTrainsLikeCpu(EveryLayerCnn(), OptimizerType::kMomentum, 30);
}

// The GPU tests' models build and step on the CPU here, so a GPU session
// finds no mistake in them.
TEST(ModelDeviceTest, TheModelsTheGpuTestsTrainAreValidOnTheCpu) {
  for (const ModelConfig& config :
       {GuideCnn(), EveryLayerCnn(), SequenceModel(), NormalizedModel(), TokenModel()}) {
    auto model = Model::Create(config, {28, 28, 1}, 10, /*seed=*/7);
    ASSERT_TRUE(model.ok()) << model.status();
    const Batch batch = TokenBatches(1, 8, 5)[0];
    const LossResult result = (*model)->TrainStep(batch.features, batch.labels);
    EXPECT_TRUE(std::isfinite(result.loss)) << (*model)->Summary();
  }
}

TEST(ModelDeviceTest, ASequenceModelOfTheOneDimensionalLayersTrainsOnEveryGpuLikeOnTheCpu) {
  ExpectGpuTrainsLikeCpu(SequenceModel(), OptimizerType::kAdam, 30);
}

TEST(ModelDeviceTest, LayerAndRmsNormalizationTrainOnEveryGpuLikeOnTheCpu) {
  ExpectGpuTrainsLikeCpu(NormalizedModel(), OptimizerType::kAdam, 30);
}

TEST(ModelDeviceTest, AnEmbeddingModelTrainsOnEveryGpuLikeOnTheCpu) {
  OptimizerConfig adam;
  adam.type = OptimizerType::kAdam;
  adam.learning_rate = 1e-3f;
  ExpectGpuTrainsLikeCpu(TokenModel(), adam, TokenBatches(30, 32, 14), 1e-4, 1e-4);
}

// RMSprop's and the weight decay's own kernels against cpu_math's.
TEST(ModelDeviceTest, CenteredRmspropWithWeightDecayTrainsOnEveryGpuLikeOnTheCpu) {
  OptimizerConfig optimizer;
  optimizer.type = OptimizerType::kRmsprop;
  optimizer.learning_rate = 1e-3f;
  optimizer.centered = true;
  optimizer.weight_decay = 0.01f;
  ExpectGpuTrainsLikeCpu(GuideCnn(), optimizer, Batches(30, 32, 13), 1e-4, 1e-4);
}

// Mixed precision on a GPU (tensor-core products) trains as on the CPU
// (float32 products of the same 16-bit values). Not within 1e-4: the two
// sum the products in different orders, and a sum that lands near a
// rounding boundary of the 16-bit type then rounds one ulp apart (2^-8
// relative for bfloat16), so the bound is the 16-bit types' own scale.
TEST(ModelDeviceTest, MixedPrecisionTrainsOnEveryGpuLikeOnTheCpu) {
  for (Precision precision : {Precision::kMixedBfloat16, Precision::kMixedFloat16}) {
    SCOPED_TRACE(PrecisionName(precision));
    ModelConfig config = GuideCnn();
    config.precision = precision;
    ExpectGpuTrainsLikeCpu(config, OptimizerConfig{}, Batches(30, 32, 12), 1e-2, 2e-2);
  }
}

}  // namespace
}  // namespace distrain

#include "worker/model/model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace distrain {
namespace {

// Per-layer seed: SplitMix64 of (seed, layer index), so layers of one model
// differ and every replica built with the same seed is bit-identical.
uint64_t LayerSeed(uint64_t seed, int layer_index) {
  uint64_t x = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(layer_index) + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config,
                                                     const std::vector<int64_t>& example_shape,
                                                     int num_classes, uint64_t seed) {
  const int input_dim = example_shape.size() == 1 ? static_cast<int>(example_shape[0]) : 0;
  if (config.type != "mlp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.model.type: unsupported model type \"", config.type,
        "\"; the only supported type is \"mlp\""));
  }
  if (config.activation != "relu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.model.activation: unsupported activation \"", config.activation,
        "\"; the only supported activation is \"relu\""));
  }
  for (size_t i = 0; i < config.hidden_units.size(); ++i) {
    if (config.hidden_units[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.training.model.hiddenUnits[", i,
          "]: every hidden layer needs at least 1 unit, got ", config.hidden_units[i]));
    }
  }
  if (input_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.numFeatures: the model needs at least 1 input feature, got ",
        input_dim));
  }
  if (num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.numClasses: softmax classification needs at least 2 classes, got ",
        num_classes));
  }

  std::unique_ptr<Model> model(new Model());
  std::vector<int> widths = {input_dim};
  widths.insert(widths.end(), config.hidden_units.begin(), config.hidden_units.end());
  widths.push_back(num_classes);
  const int num_dense = static_cast<int>(widths.size()) - 1;
  for (int d = 0; d < num_dense; ++d) {
    const int layer_index = static_cast<int>(model->layers_.size());
    model->layers_.push_back(std::make_unique<Dense>(absl::StrCat("dense_", d), widths[d],
                                                     widths[d + 1], LayerSeed(seed, layer_index)));
    if (d + 1 < num_dense) {
      model->layers_.push_back(std::make_unique<ReLU>(absl::StrCat("relu_", d)));
    }
  }
  model->activations_.resize(model->layers_.size());
  model->grads_.resize(model->layers_.size());
  for (auto& layer : model->layers_) {
    model->has_parameters_.push_back(!layer->parameters().empty());
  }
  model->summary_ =
      absl::StrCat("mlp ", absl::StrJoin(widths, "-"), " (", model->num_parameters(), " params)");
  return model;
}

LossResult Model::TrainStep(const Tensor& features, absl::Span<const int32_t> labels,
                            const std::function<void(int layer_index)>& on_layer_grads_ready,
                            const std::function<void(int layer_index)>& before_layer_forward,
                            const StepContext& step) {
  const Tensor* x = &features;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (before_layer_forward) before_layer_forward(static_cast<int>(i));
    layers_[i]->Forward(*x, &activations_[i]);
    x = &activations_[i];
  }
  const LossResult result = SoftmaxCrossEntropy(*x, labels, &grad_logits_);
  const Tensor* grad = &grad_logits_;
  for (int i = num_layers() - 1; i >= 0; --i) {
    // grads_[i] = dL/d(input of layer i); layer 0's is never needed, so its
    // Dense skips the dx GEMM (the largest one for a 784-wide input).
    Tensor* grad_input = i > 0 ? &grads_[i] : nullptr;
    layers_[i]->Backward(*grad, grad_input);
    if (on_layer_grads_ready && has_parameters_[i]) on_layer_grads_ready(i);
    grad = grad_input;
  }
  return result;
}

void Model::set_factored_kernel_grads(bool factored) {
  for (auto& layer : layers_) layer->SetFactoredKernelGrad(factored);
}

std::optional<GradFactors> Model::kernel_grad_factors(int layer) const {
  if (layer < 0 || layer >= num_layers()) return std::nullopt;
  return layers_[layer]->KernelGradFactors();
}

LossResult Model::Evaluate(const Tensor& features, absl::Span<const int32_t> labels) {
  const Tensor* x = &features;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(*x, &activations_[i]);
    x = &activations_[i];
  }
  return SoftmaxCrossEntropy(*x, labels, nullptr);
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> out;
  for (auto& layer : layers_) {
    for (Parameter* p : layer->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<Parameter*> Model::state_variables() {
  std::vector<Parameter*> out;
  for (auto& layer : layers_) {
    for (Parameter* p : layer->state_variables()) out.push_back(p);
  }
  return out;
}

std::vector<std::vector<Parameter*>> Model::parameters_by_layer() {
  std::vector<std::vector<Parameter*>> out;
  out.reserve(layers_.size());
  for (auto& layer : layers_) out.push_back(layer->parameters());
  return out;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const auto& layer : layers_) {
    for (const Parameter* p : layer->parameters()) n += p->value.size();
  }
  return n;
}

std::string Model::Summary() const { return summary_; }

}  // namespace distrain

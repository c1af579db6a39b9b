#include "worker/model/model.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/model_spec.h"
#include "spdlog/spdlog.h"
#include "worker/model/activation_layer.h"
#include "worker/model/initializers.h"
#include "worker/model/layer_factory.h"
#include "worker/model/reshape_layers.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

// Per-layer seed: SplitMix64 of (seed, layer index), so layers of one model
// differ and every replica built with the same seed is bit-identical.
uint64_t LayerSeed(uint64_t seed, int layer_index) {
  return init::Mix(seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(layer_index));
}

int64_t Elements(const std::vector<int64_t>& shape) {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1) return 0;
    n *= d;
  }
  return n;
}

// Every replica builds its own Model, but the user compiled one model: each
// distinct warning is logged once per process, as Keras warns once.
void WarnOnce(const std::string& warning) {
  static std::mutex mu;
  static std::set<std::string>* const seen = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (seen->insert(warning).second) spdlog::warn("model: {}", warning);
}

bool IsCrossentropy(LossKind kind) {
  return kind == LossKind::kSparseCategoricalCrossentropy ||
         kind == LossKind::kCategoricalCrossentropy || kind == LossKind::kBinaryCrossentropy;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config,
                                                     const std::vector<int64_t>& example_shape,
                                                     int num_classes, uint64_t seed) {
  const bool sequential =
      config.type == "sequential" || (config.type == "mlp" && !config.layers.empty());
  if (config.type != "mlp" && config.type != "sequential") {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.training.model.type: unsupported model type \"", config.type,
                     "\"; the supported types are \"sequential\" (a list of layers) and \"mlp\""));
  }
  if (num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.numClasses: classification needs at least 2 classes, got ",
        num_classes));
  }
  std::unique_ptr<Model> model(new Model());
  model->example_shape_ = example_shape;
  model->num_classes_ = num_classes;
  model->seed_ = seed;
  model->loss_ = config.loss;
  model->precision_ = config.precision;

  if (!sequential) {
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
    // The mlp reads every example as one row of features (images too).
    const int64_t input_dim = Elements(example_shape);
    if (input_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.training.dataset.numFeatures: the model needs at least 1 input feature, got ",
          input_dim));
    }
    if (absl::Status s = CheckModelOutput({num_classes}, num_classes, config.loss); !s.ok()) {
      return s;
    }
    // Its last Dense has no activation: the outputs are logits.
    model->from_logits_ = config.loss.from_logits.value_or(true);
    std::vector<int64_t> widths = {input_dim};
    widths.insert(widths.end(), config.hidden_units.begin(), config.hidden_units.end());
    widths.push_back(num_classes);
    const int num_dense = static_cast<int>(widths.size()) - 1;
    for (int d = 0; d < num_dense; ++d) {
      const int layer_index = static_cast<int>(model->layers_.size());
      model->layers_.push_back(std::make_unique<Dense>(
          absl::StrCat("dense_", d), widths[d], widths[d + 1], LayerSeed(seed, layer_index)));
      if (d + 1 < num_dense) {
        model->layers_.push_back(
            std::make_unique<Activation>(absl::StrCat("relu_", d), ActivationKind::kRelu));
      }
    }
    model->largest_activation_ = *std::max_element(widths.begin(), widths.end());
    model->Finalize(absl::StrCat("mlp ", absl::StrJoin(widths, "-")));
    return model;
  }

  if (config.layers.empty()) {
    return absl::InvalidArgumentError(
        "spec.training.model.layers: a sequential model needs at least one layer");
  }
  std::vector<LayerConfig> layers = config.layers;
  AssignLayerNames(&layers);
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(layers, example_shape);
  if (!shapes.ok()) return shapes.status();
  if (absl::Status s = CheckModelOutput(layers, example_shape, *shapes, num_classes, config.loss);
      !s.ok()) {
    return s;
  }
  for (const std::string& warning : ModelWarnings(layers, config.loss)) WarnOnce(warning);
  model->from_logits_ = config.loss.from_logits.value_or(false);
  LayerConfig& last = layers.back();
  const ActivationKind last_activation = last.Activation().kind;
  if (IsCrossentropy(config.loss.kind) && (last_activation == ActivationKind::kSoftmax ||
                                           last_activation == ActivationKind::kSigmoid)) {
    model->output_activation_ = last_activation;
    model->from_logits_ = true;
    // The last layer now outputs logits: a Softmax layer becomes a linear
    // Activation (which copies), the others lose their activation argument.
    if (last.kind == LayerKind::kSoftmax) last.kind = LayerKind::kActivation;
    last.activation = ActivationKind::kLinear;
  }
  model->largest_activation_ = Tensor::NumElements(example_shape);
  for (const std::vector<int64_t>& shape : *shapes) {
    model->largest_activation_ = std::max(model->largest_activation_, Tensor::NumElements(shape));
  }
  std::vector<int64_t> in_shape = example_shape;
  std::vector<std::string> parts;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int layer_index = static_cast<int>(model->layers_.size());
    std::unique_ptr<Layer> layer = MakeLayer(layers[i], in_shape, LayerSeed(seed, layer_index));
    in_shape = (*shapes)[i];
    if (layer == nullptr) continue;  // Input
    parts.push_back(absl::StrCat(layer->name(), "[", absl::StrJoin(in_shape, ","), "]"));
    model->layers_.push_back(std::move(layer));
  }
  if (model->layers_.empty()) {
    return absl::InvalidArgumentError(
        "spec.training.model.layers: the model has no layer besides Input");
  }
  model->reshape_input_ = example_shape.size() > 1;
  model->Finalize(absl::StrCat("sequential ", absl::StrJoin(parts, " ")));
  return model;
}

ComputeType ComputeTypeOf(Precision precision) {
  switch (precision) {
    case Precision::kMixedBfloat16:
      return ComputeType::kBfloat16;
    case Precision::kMixedFloat16:
      return ComputeType::kFloat16;
    case Precision::kFloat32:
      break;
  }
  return ComputeType::kFloat32;
}

void Model::Finalize(std::string summary) {
  activations_.resize(layers_.size());
  grads_.resize(layers_.size());
  first_parameter_layer_ = num_layers();
  compute_ = ComputeTypeOf(precision_);
  for (int i = 0; i < num_layers(); ++i) {
    const bool has = !layers_[i]->parameters().empty();
    has_parameters_.push_back(has);
    if (has && first_parameter_layer_ == num_layers()) first_parameter_layer_ = i;
    layers_[i]->set_compute_type(compute_);
    // Layers that only rearrange or select values pass rounded ones on.
    const bool mixed = compute_ != ComputeType::kFloat32;
    rounds_output_.push_back(mixed && !layers_[i]->OutputKeepsInputValues() &&
                             !layers_[i]->RoundsOwnOutput());
    rounds_grad_input_.push_back(mixed && !layers_[i]->InputGradKeepsOutputGradValues());
  }
  // A ReLU followed by a max pooling: the pooling applies ReLU's gradient on
  // its smaller tensor (Layer::ApplyPrecedingReluGradient). Layers before the
  // first one with parameters run no backward pass, but a pooling that does
  // always follows a layer that does too.
  for (int i = 0; i + 1 < num_layers(); ++i) {
    ActivationState* activation = layers_[i]->output_activation();
    if (activation != nullptr && activation->kind() == ActivationKind::kRelu &&
        layers_[i + 1]->ApplyPrecedingReluGradient()) {
      activation->set_gradient_applied_downstream();
    }
  }
  summary_ = absl::StrCat(summary, " (", num_parameters(), " params)");
}

const Tensor& Model::LayerInput(const Tensor& features) {
  const bool elsewhere = features.device_id() != device_;
  const bool token_ids = !layers_.empty() && layers_[0]->ReadsTokenIds();
  if (compute_ != ComputeType::kFloat32 && !token_ids) {
    // Keras casts a mixed-precision model's input to the compute type.
    if (elsewhere) {
      input_.Resize(features.shape(), device_);
      ops::Copy(features, &input_);
      ops::RoundTo(compute_, input_, &input_);
    } else {
      ops::RoundTo(compute_, features, &input_);
    }
    if (reshape_input_) {
      std::vector<int64_t> shape = {features.rank() == 0 ? 0 : features.dim(0)};
      shape.insert(shape.end(), example_shape_.begin(), example_shape_.end());
      input_.Resize(std::move(shape));
    }
    return input_;
  }
  if (!reshape_input_ && !elsewhere) return features;
  // Batches arrive flat, [batch, prod(example_shape)]; image layers take
  // [batch, rows, cols, channels], the same elements in the same order.
  std::vector<int64_t> shape = features.shape();
  if (reshape_input_) {
    shape = {features.rank() == 0 ? 0 : features.dim(0)};
    shape.insert(shape.end(), example_shape_.begin(), example_shape_.end());
  }
  if (features.shape() == shape && !elsewhere) return features;
  // One copy, to the model's device (the batch arrives in host memory: every
  // strategy and the evaluator feed host tensors; the labels stay there).
  input_.Resize(features.shape(), device_);
  ops::Copy(features, &input_);
  // Resize to the same element count keeps the storage and the elements.
  input_.Resize(std::move(shape));
  return input_;
}

uint64_t Model::StepStream(const StepContext& step) const {
  uint64_t x = init::Mix(seed_ ^ 0x6a09e667f3bcc908ULL);
  x = init::Mix(x ^ static_cast<uint64_t>(step.step));
  return init::Mix(x ^ static_cast<uint64_t>(step.replica_id_in_sync));
}

const Tensor& Model::RunForward(const Tensor& features, const ForwardContext& ctx,
                                const std::function<void(int layer_index)>& before_layer_forward) {
  const Tensor* x = &LayerInput(features);
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (before_layer_forward) before_layer_forward(static_cast<int>(i));
    layers_[i]->Forward(*x, &activations_[i], ctx);
    if (rounds_output_[i]) ops::RoundTo(compute_, activations_[i], &activations_[i]);
    x = &activations_[i];
  }
  return *x;
}

LossResult Model::ComputeLoss(const Tensor& output, absl::Span<const int32_t> labels,
                              Tensor* grad) {
  const int64_t batch = output.rank() == 0 ? 0 : output.dim(0);
  // The batch mean: every row's gradient carries 1 / batch (times the loss
  // scale of mixed_float16).
  const float scale = batch > 0 ? loss_scale_ / static_cast<float>(batch) : 0.0f;
  ops::LossSums sums = ops::Loss(loss_.kind, from_logits_, output, labels, scale, grad);
  if (output_activation_ != ActivationKind::kLinear) {
    ops::ActivationForward(output_activation_, output, &activated_output_);
    sums.correct = ops::Loss(loss_.kind, false, activated_output_, labels, 0.0f, nullptr).correct;
  }
  LossResult result;
  result.loss = batch > 0 ? sums.loss_sum / static_cast<double>(batch) : 0.0;
  result.correct = sums.correct;
  return result;
}

LossResult Model::TrainStep(const Tensor& features, absl::Span<const int32_t> labels,
                            const std::function<void(int layer_index)>& on_layer_grads_ready,
                            const std::function<void(int layer_index)>& before_layer_forward,
                            const StepContext& step) {
  ForwardContext ctx;
  ctx.training = true;
  ctx.rng_stream = StepStream(step);
  const Tensor& output = RunForward(features, ctx, before_layer_forward);
  const LossResult result = ComputeLoss(output, labels, &grad_logits_);
  last_train_loss_ = result;
  const bool mixed = compute_ != ComputeType::kFloat32;
  // Under mixed precision every gradient is a 16-bit value, as Keras' cast
  // ops make them: the loss's float32 gradient enters the model rounded.
  if (mixed) ops::RoundTo(compute_, grad_logits_, &grad_logits_);
  const Tensor* grad = &grad_logits_;
  for (int i = num_layers() - 1; i >= first_parameter_layer_; --i) {
    // grads_[i] = dL/d(input of layer i); not needed from the first layer
    // with parameters down, so e.g. the mlp's first Dense skips the dx GEMM
    // (the largest one for a 784-wide input).
    Tensor* grad_input = i > first_parameter_layer_ ? &grads_[i] : nullptr;
    layers_[i]->Backward(*grad, grad_input);
    if (mixed) {
      if (grad_input != nullptr && rounds_grad_input_[i]) {
        ops::RoundTo(compute_, *grad_input, grad_input);
      }
      if (!layers_[i]->ComputesInFloat32()) {
        for (Parameter* p : layers_[i]->parameters()) ops::RoundTo(compute_, p->grad, &p->grad);
      }
    }
    if (on_layer_grads_ready && has_parameters_[i]) on_layer_grads_ready(i);
    grad = grad_input;
  }
  return result;
}

void Model::MoveTo(DeviceId device) {
  for (std::unique_ptr<Layer>& layer : layers_) layer->MoveTo(device);
  device_ = device;
}

void Model::set_factored_kernel_grads(bool factored) {
  for (auto& layer : layers_) layer->SetFactoredKernelGrad(factored);
}

std::optional<GradFactors> Model::kernel_grad_factors(int layer) const {
  if (layer < 0 || layer >= num_layers()) return std::nullopt;
  return layers_[layer]->KernelGradFactors();
}

LossResult Model::Evaluate(const Tensor& features, absl::Span<const int32_t> labels) {
  ForwardContext ctx;
  ctx.training = false;
  return ComputeLoss(RunForward(features, ctx, {}), labels, nullptr);
}

const Tensor& Model::Predict(const Tensor& features) {
  ForwardContext ctx;
  ctx.training = false;
  const Tensor& output = RunForward(features, ctx, {});
  // The last layer was built without the output activation (see
  // output_activation_); apply it as Keras' model would.
  if (output_activation_ == ActivationKind::kLinear) return output;
  ops::ActivationForward(output_activation_, output, &activated_output_);
  return activated_output_;
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
    for (const Parameter* p : layer->state_variables()) n += p->value.size();
  }
  return n;
}

std::string Model::Summary() const { return summary_; }

}  // namespace distrain

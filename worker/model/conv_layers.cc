#include "worker/model/conv_layers.h"

#include "common/check.h"
#include "worker/model/initializers.h"

namespace distrain {
namespace {

void CheckImage(const std::string& name, const std::vector<int64_t>& shape) {
  DISTRAIN_CHECK_EQ(shape.size(), 4u) << name << " expects [batch, rows, cols, channels], got "
                                      << shape.size() << " dimensions";
}

}  // namespace

// ---- Conv2D ---------------------------------------------------------------

Conv2D::Conv2D(std::string name, int64_t in_channels, int64_t filters,
               std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
               PaddingKind padding, ActivationFunction activation, bool use_bias, uint64_t seed)
    : name_(std::move(name)),
      in_channels_(in_channels),
      filters_(filters),
      kernel_size_(kernel),
      strides_(strides),
      padding_(padding),
      use_bias_(use_bias),
      activation_(activation) {
  DISTRAIN_CHECK(in_channels >= 1 && filters >= 1 && kernel[0] >= 1 && kernel[1] >= 1 &&
                 strides[0] >= 1 && strides[1] >= 1)
      << name_ << ": in_channels=" << in_channels << " filters=" << filters;
  const std::vector<int64_t> shape = {kernel[0], kernel[1], in_channels, filters};
  kernel_.name = name_ + "/kernel";
  kernel_.value = Tensor(shape);
  kernel_.grad = Tensor(shape);
  if (use_bias_) {
    bias_.name = name_ + "/bias";
    bias_.value = Tensor({filters});
    bias_.grad = Tensor({filters});
  }
  // Keras' compute_fans for a conv kernel: receptive field times channels.
  const int64_t receptive = kernel[0] * kernel[1];
  init::GlorotUniform(init::Mix(seed ^ init::StableHash(name_)), receptive * in_channels,
                      receptive * filters, &kernel_.value);
}

std::vector<Parameter*> Conv2D::parameters() {
  if (use_bias_) return {&kernel_, &bias_};
  return {&kernel_};
}

ops::Window2D Conv2D::Window(const std::vector<int64_t>& s) const {
  CheckImage(name_, s);
  DISTRAIN_CHECK_EQ(s[3], in_channels_) << name_ << " input channels";
  return ops::KerasWindow2D(s[0], s[1], s[2], s[3], filters_, kernel_size_, strides_, padding_);
}

std::vector<int64_t> Conv2D::OutputShape(const std::vector<int64_t>& input_shape) const {
  const ops::Window2D w = Window(input_shape);
  return {w.batch, w.out_h, w.out_w, w.out_c};
}

void Conv2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  window_ = Window(input.shape());
  const Tensor& kernel = ComputeKernel(kernel_.value, &kernel_compute_);
  ops::Conv2DForward(window_, input, kernel, use_bias_ ? &bias_.value : nullptr, output, compute_);
  if (!activation_.is_linear()) activation_.Forward(*output, output, compute_);
  input_ = &input;
}

void Conv2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward before Forward";
  DISTRAIN_CHECK(grad_output.shape() == (std::vector<int64_t>{window_.batch, window_.out_h,
                                                              window_.out_w, window_.out_c}))
      << name_ << ": grad_output " << grad_output.ShapeString();
  const Tensor* dz = &grad_output;
  const Tensor* relu_output = nullptr;
  if (activation_.kind() == ActivationKind::kRelu && !activation_.backward_is_identity()) {
    // The op applies ReLU's gradient in the pass that reads dy anyway (a
    // CPU under mixed_bfloat16), or into grad_pre_activation_ first.
    relu_output = &activation_.relu_output();
  } else if (!activation_.backward_is_identity()) {
    activation_.Backward(grad_output, &grad_pre_activation_);
    // The others' gradients need rounding (ReLU's keeps the rounded values).
    RoundToComputeType(&grad_pre_activation_);
    dz = &grad_pre_activation_;
  }
  // The rounded kernel of this step's Forward (the variable has not changed since).
  const Tensor& kernel = compute_ == ComputeType::kFloat32 ? kernel_.value : kernel_compute_;
  ops::Conv2DBackward(window_, *input_, *dz, kernel, &kernel_.grad,
                      use_bias_ ? &bias_.grad : nullptr, grad_input, compute_, relu_output,
                      &grad_pre_activation_);
}

// ---- Pooling2D ------------------------------------------------------------

Pooling2D::Pooling2D(std::string name, ops::PoolKind kind, std::array<int64_t, 2> pool_size,
                     std::array<int64_t, 2> strides, PaddingKind padding)
    : name_(std::move(name)),
      kind_(kind),
      pool_size_(pool_size),
      strides_(strides),
      padding_(padding) {
  DISTRAIN_CHECK(pool_size[0] >= 1 && pool_size[1] >= 1 && strides[0] >= 1 && strides[1] >= 1)
      << name_ << ": pool size and strides must be positive";
}

ops::Window2D Pooling2D::Window(const std::vector<int64_t>& s) const {
  CheckImage(name_, s);
  return ops::KerasWindow2D(s[0], s[1], s[2], s[3], s[3], pool_size_, strides_, padding_);
}

std::vector<int64_t> Pooling2D::OutputShape(const std::vector<int64_t>& input_shape) const {
  const ops::Window2D w = Window(input_shape);
  return {w.batch, w.out_h, w.out_w, w.out_c};
}

void Pooling2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  window_ = Window(input.shape());
  ops::Pool2DForward(kind_, window_, input, output, &workspace_);
  input_ = &input;
  output_ = output;
}

void Pooling2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr && output_ != nullptr) << name_ << ": Backward before Forward";
  DISTRAIN_CHECK(grad_output.SameShape(*output_))
      << name_ << ": grad_output " << grad_output.ShapeString() << " vs output "
      << output_->ShapeString();
  if (grad_input == nullptr) return;
  const Tensor* dy = &grad_output;
  if (applies_relu_gradient_) {
    // ReLU's gradient for the layer before (Layer::ApplyPrecedingReluGradient):
    // relu'(input) at the input a window routes to is (pooled output > 0).
    ops::ActivationBackward(ActivationKind::kRelu, *output_, *output_, grad_output,
                            &relu_masked_grad_);
    dy = &relu_masked_grad_;
  }
  ops::Pool2DBackward(kind_, window_, *input_, *output_, *dy, workspace_, grad_input);
}

bool Pooling2D::ApplyPrecedingReluGradient() {
  // Average pooling spreads a gradient over inputs of different signs.
  if (kind_ != ops::PoolKind::kMax) return false;
  applies_relu_gradient_ = true;
  return true;
}

// ---- GlobalAveragePooling2D -------------------------------------------------

std::vector<int64_t> GlobalAveragePooling2D::OutputShape(
    const std::vector<int64_t>& input_shape) const {
  CheckImage(name_, input_shape);
  return {input_shape[0], input_shape[3]};
}

void GlobalAveragePooling2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  CheckImage(name_, input.shape());
  height_ = input.dim(1);
  width_ = input.dim(2);
  ops::GlobalAveragePool2DForward(input, output);
}

void GlobalAveragePooling2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  ops::GlobalAveragePool2DBackward(grad_output, height_, width_, grad_input);
}

}  // namespace distrain

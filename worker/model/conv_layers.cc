#include "worker/model/conv_layers.h"

#include "common/check.h"
#include "worker/model/initializers.h"

namespace distrain {
namespace {

void CheckImage(const std::string& name, const std::vector<int64_t>& shape) {
  DISTRAIN_CHECK_EQ(shape.size(), 4u) << name << " expects [batch, rows, cols, channels], got "
                                      << shape.size() << " dimensions";
}

// A 1-D layer's [batch, steps, channels] as the [batch, steps, 1, channels]
// image the 2-D ops take; the 2-D layers' shapes as they are.
std::vector<int64_t> ImageShape(bool one_d, const std::string& name,
                                const std::vector<int64_t>& shape) {
  if (!one_d) return shape;
  DISTRAIN_CHECK_EQ(shape.size(), 3u) << name << " expects [batch, steps, channels], got "
                                      << shape.size() << " dimensions";
  return {shape[0], shape[1], 1, shape[2]};
}

// `t` itself, or (1-D) `alias` made the image view of it.
const Tensor& AsImage(bool one_d, const std::string& name, const Tensor& t, Tensor* alias) {
  if (!one_d) return t;
  *alias = Tensor::Alias(t, ImageShape(true, name, t.shape()));
  return *alias;
}

// An image-shaped result of a 1-D layer back to [batch, steps, channels]
// (same elements, so Resize keeps them).
void ToSequence(bool one_d, Tensor* t) {
  if (one_d && t != nullptr) t->Resize({t->dim(0), t->dim(1), t->dim(3)});
}

}  // namespace

// ---- Conv2D ---------------------------------------------------------------

Conv2D::Conv2D(std::string name, int64_t in_channels, int64_t filters,
               std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
               PaddingKind padding, ActivationFunction activation, bool use_bias, uint64_t seed,
               bool one_d)
    : name_(std::move(name)),
      in_channels_(in_channels),
      filters_(filters),
      kernel_size_(kernel),
      strides_(strides),
      padding_(padding),
      use_bias_(use_bias),
      one_d_(one_d),
      activation_(activation) {
  DISTRAIN_CHECK(in_channels >= 1 && filters >= 1 && kernel[0] >= 1 && kernel[1] >= 1 &&
                 strides[0] >= 1 && strides[1] >= 1)
      << name_ << ": in_channels=" << in_channels << " filters=" << filters;
  DISTRAIN_CHECK(!one_d || (kernel[1] == 1 && strides[1] == 1))
      << name_ << ": a 1-D kernel and stride are {length, 1}";
  const std::vector<int64_t> shape =
      one_d ? std::vector<int64_t>{kernel[0], in_channels, filters}
            : std::vector<int64_t>{kernel[0], kernel[1], in_channels, filters};
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

ops::Window2D Conv2D::Window(const std::vector<int64_t>& shape) const {
  const std::vector<int64_t> s = ImageShape(one_d_, name_, shape);
  CheckImage(name_, s);
  DISTRAIN_CHECK_EQ(s[3], in_channels_) << name_ << " input channels";
  return ops::KerasWindow2D(s[0], s[1], s[2], s[3], filters_, kernel_size_, strides_, padding_);
}

std::vector<int64_t> Conv2D::OutputShape(const std::vector<int64_t>& input_shape) const {
  const ops::Window2D w = Window(input_shape);
  if (one_d_) return {w.batch, w.out_h, w.out_c};
  return {w.batch, w.out_h, w.out_w, w.out_c};
}

const Tensor& Conv2D::KernelImage(const Tensor& kernel) {
  if (!one_d_) return kernel;
  kernel_image_ = Tensor::Alias(kernel, {kernel_size_[0], 1, in_channels_, filters_});
  return kernel_image_;
}

void Conv2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  window_ = Window(input.shape());
  const Tensor& x = AsImage(one_d_, name_, input, &input_image_);
  const Tensor& kernel = KernelImage(ComputeKernel(kernel_.value, &kernel_compute_));
  ops::Conv2DForward(window_, x, kernel, use_bias_ ? &bias_.value : nullptr, output, compute_);
  if (!activation_.is_linear()) activation_.Forward(*output, output, compute_);
  ToSequence(one_d_, output);
  input_ = &x;
}

void Conv2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward before Forward";
  const Tensor& dy = AsImage(one_d_, name_, grad_output, &grad_output_image_);
  DISTRAIN_CHECK(dy.shape() == (std::vector<int64_t>{window_.batch, window_.out_h, window_.out_w,
                                                     window_.out_c}))
      << name_ << ": grad_output " << grad_output.ShapeString();
  const Tensor* dz = &dy;
  const Tensor* relu_output = nullptr;
  if (activation_.kind() == ActivationKind::kRelu && !activation_.backward_is_identity()) {
    // The op applies ReLU's gradient in the pass that reads dy anyway (a
    // CPU under mixed_bfloat16), or into grad_pre_activation_ first.
    relu_output = &AsImage(one_d_, name_, activation_.relu_output(), &relu_output_image_);
  } else if (!activation_.backward_is_identity()) {
    activation_.Backward(dy, &grad_pre_activation_);
    // The others' gradients need rounding (ReLU's keeps the rounded values).
    RoundToComputeType(&grad_pre_activation_);
    dz = &grad_pre_activation_;
  }
  // The rounded kernel of this step's Forward (the variable has not changed since).
  const Tensor& kernel =
      KernelImage(compute_ == ComputeType::kFloat32 ? kernel_.value : kernel_compute_);
  ops::Conv2DBackward(window_, *input_, *dz, kernel, &kernel_.grad,
                      use_bias_ ? &bias_.grad : nullptr, grad_input, compute_, relu_output,
                      &grad_pre_activation_);
  if (one_d_) kernel_.grad.Resize(kernel_.value.shape());  // the op wrote it as an image
  ToSequence(one_d_, grad_input);
}

// ---- Pooling2D ------------------------------------------------------------

Pooling2D::Pooling2D(std::string name, ops::PoolKind kind, std::array<int64_t, 2> pool_size,
                     std::array<int64_t, 2> strides, PaddingKind padding, bool one_d)
    : name_(std::move(name)),
      kind_(kind),
      pool_size_(pool_size),
      strides_(strides),
      padding_(padding),
      one_d_(one_d) {
  DISTRAIN_CHECK(pool_size[0] >= 1 && pool_size[1] >= 1 && strides[0] >= 1 && strides[1] >= 1)
      << name_ << ": pool size and strides must be positive";
}

std::unique_ptr<Pooling2D> Pooling2D::GlobalMax(std::string name, bool one_d) {
  auto layer = std::make_unique<Pooling2D>(std::move(name), ops::PoolKind::kMax,
                                           std::array<int64_t, 2>{1, 1},
                                           std::array<int64_t, 2>{1, 1}, PaddingKind::kValid,
                                           one_d);
  layer->global_ = true;
  return layer;
}

ops::Window2D Pooling2D::Window(const std::vector<int64_t>& shape) const {
  const std::vector<int64_t> s = ImageShape(one_d_, name_, shape);
  CheckImage(name_, s);
  if (global_) {
    const std::array<int64_t, 2> whole = {s[1], s[2]};
    return ops::KerasWindow2D(s[0], s[1], s[2], s[3], s[3], whole, whole, PaddingKind::kValid);
  }
  return ops::KerasWindow2D(s[0], s[1], s[2], s[3], s[3], pool_size_, strides_, padding_);
}

std::vector<int64_t> Pooling2D::OutputShape(const std::vector<int64_t>& input_shape) const {
  const ops::Window2D w = Window(input_shape);
  if (global_) return {w.batch, w.out_c};
  if (one_d_) return {w.batch, w.out_h, w.out_c};
  return {w.batch, w.out_h, w.out_w, w.out_c};
}

void Pooling2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  window_ = Window(input.shape());
  const Tensor& x = AsImage(one_d_, name_, input, &input_image_);
  ops::Pool2DForward(kind_, window_, x, output, &workspace_);
  // The op's [batch, out_h, out_w, C] as the layer's output shape (same
  // elements, so Resize keeps them).
  if (one_d_ || global_) output->Resize(OutputShape(input.shape()));
  input_ = &x;
  output_ = output;
}

void Pooling2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr && output_ != nullptr) << name_ << ": Backward before Forward";
  DISTRAIN_CHECK(grad_output.SameShape(*output_))
      << name_ << ": grad_output " << grad_output.ShapeString() << " vs output "
      << output_->ShapeString();
  if (grad_input == nullptr) return;
  // The output and its gradient as the op's images.
  const std::vector<int64_t> image = {window_.batch, window_.out_h, window_.out_w, window_.out_c};
  const bool reshaped = one_d_ || global_;
  if (reshaped) {
    output_image_ = Tensor::Alias(*output_, image);
    grad_output_image_ = Tensor::Alias(grad_output, image);
  }
  const Tensor& y = reshaped ? output_image_ : *output_;
  const Tensor* dy = reshaped ? &grad_output_image_ : &grad_output;
  if (applies_relu_gradient_) {
    // ReLU's gradient for the layer before (Layer::ApplyPrecedingReluGradient):
    // relu'(input) at the input a window routes to is (pooled output > 0).
    ops::ActivationBackward(ActivationKind::kRelu, y, y, *dy, &relu_masked_grad_);
    dy = &relu_masked_grad_;
  }
  ops::Pool2DBackward(kind_, window_, *input_, y, *dy, workspace_, grad_input);
  ToSequence(one_d_, grad_input);
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
  const std::vector<int64_t> s = ImageShape(one_d_, name_, input_shape);
  CheckImage(name_, s);
  return {s[0], s[3]};
}

void GlobalAveragePooling2D::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  const Tensor& x = AsImage(one_d_, name_, input, &input_image_);
  CheckImage(name_, x.shape());
  height_ = x.dim(1);
  width_ = x.dim(2);
  ops::GlobalAveragePool2DForward(x, output);
}

void GlobalAveragePooling2D::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  ops::GlobalAveragePool2DBackward(grad_output, height_, width_, grad_input);
  ToSequence(one_d_, grad_input);
}

}  // namespace distrain

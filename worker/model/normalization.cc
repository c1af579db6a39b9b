#include "worker/model/normalization.h"

#include "common/check.h"
#include "worker/tensor/ops.h"

namespace distrain {
namespace {

Parameter Variable(const std::string& name, int64_t channels, float value) {
  Parameter p;
  p.name = name;
  p.value = Tensor({channels}, value);
  p.grad = Tensor({channels});
  return p;
}

}  // namespace

BatchNormalization::BatchNormalization(std::string name, int64_t channels, double momentum,
                                       double epsilon)
    : name_(std::move(name)),
      // Keras keeps momentum and epsilon as Python floats and rounds each
      // term to float32 where it meets the float32 variables, 1 - momentum
      // included (computed in double first).
      momentum_(static_cast<float>(momentum)),
      one_minus_momentum_(static_cast<float>(1.0 - momentum)),
      epsilon_(static_cast<float>(epsilon)),
      gamma_(Variable(name_ + "/gamma", channels, 1.0f)),
      beta_(Variable(name_ + "/beta", channels, 0.0f)),
      moving_mean_(Variable(name_ + "/moving_mean", channels, 0.0f)),
      moving_variance_(Variable(name_ + "/moving_variance", channels, 1.0f)),
      one_({1}, 1.0f) {
  DISTRAIN_CHECK_GE(channels, 1) << name_;
  DISTRAIN_CHECK(epsilon > 0) << name_ << ": epsilon " << epsilon;
}

std::vector<int64_t> BatchNormalization::OutputShape(const std::vector<int64_t>& s) const {
  DISTRAIN_CHECK(s.size() >= 2 && s.back() == gamma_.value.size())
      << name_ << ": expects " << gamma_.value.size() << " channels on the last axis";
  return s;
}

void BatchNormalization::Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) {
  OutputShape(input.shape());
  if (!ctx.training) {
    ops::BatchNormForwardInference(input, gamma_.value, beta_.value, moving_mean_.value,
                                   moving_variance_.value, epsilon_, output);
    input_ = nullptr;
    return;
  }
  ops::BatchNormForwardTraining(input, gamma_.value, beta_.value, epsilon_, output, &batch_mean_,
                                &batch_var_);
  // moving = batch * (1 - momentum) + moving * momentum, as a rank-1 GEMM
  // with beta = momentum (ops.h has no axpby; this is the same two products
  // and one sum).
  const int64_t c = gamma_.value.size();
  ops::MatMul(false, false, 1, c, 1, one_minus_momentum_, one_, batch_mean_, momentum_,
              &moving_mean_.value);
  ops::MatMul(false, false, 1, c, 1, one_minus_momentum_, one_, batch_var_, momentum_,
              &moving_variance_.value);
  input_ = &input;
}

void BatchNormalization::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward without a training Forward";
  DISTRAIN_CHECK(grad_output.SameShape(*input_))
      << name_ << ": grad_output " << grad_output.ShapeString() << " vs input "
      << input_->ShapeString();
  Tensor* dx = grad_input != nullptr ? grad_input : &scratch_grad_;
  ops::BatchNormBackward(*input_, grad_output, gamma_.value, batch_mean_, batch_var_, epsilon_,
                         dx, &gamma_.grad, &beta_.grad);
}

LayerNormalization::LayerNormalization(std::string name, int64_t features, double epsilon,
                                       bool center, bool scale, bool rms)
    : name_(std::move(name)),
      features_(features),
      // Keras adds the Python float to the float32 variance: rounded once.
      epsilon_(static_cast<float>(epsilon)),
      center_(center && !rms),
      scale_(scale),
      rms_(rms) {
  DISTRAIN_CHECK_GE(features, 1) << name_;
  DISTRAIN_CHECK(epsilon > 0) << name_ << ": epsilon " << epsilon;
  if (scale_) gamma_ = Variable(name_ + (rms ? "/scale" : "/gamma"), features, 1.0f);
  if (center_) beta_ = Variable(name_ + "/beta", features, 0.0f);
}

std::vector<int64_t> LayerNormalization::OutputShape(const std::vector<int64_t>& s) const {
  DISTRAIN_CHECK(s.size() >= 2 && s.back() == features_)
      << name_ << ": expects " << features_ << " features on the last axis";
  return s;
}

std::vector<Parameter*> LayerNormalization::parameters() {
  std::vector<Parameter*> out;
  if (scale_) out.push_back(&gamma_);
  if (center_) out.push_back(&beta_);
  return out;
}

void LayerNormalization::Forward(const Tensor& input, Tensor* output,
                                 const ForwardContext& ctx) {
  OutputShape(input.shape());
  ops::LayerNormForward(input, scale_ ? &gamma_.value : nullptr,
                        center_ ? &beta_.value : nullptr, epsilon_, rms_, output, &row_mean_,
                        &row_rstd_);
  input_ = ctx.training ? &input : nullptr;
}

void LayerNormalization::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward without a training Forward";
  DISTRAIN_CHECK(grad_output.SameShape(*input_))
      << name_ << ": grad_output " << grad_output.ShapeString() << " vs input "
      << input_->ShapeString();
  Tensor* dx = grad_input != nullptr ? grad_input : &scratch_grad_;
  ops::LayerNormBackward(*input_, grad_output, scale_ ? &gamma_.value : nullptr, row_mean_,
                         row_rstd_, rms_, dx, scale_ ? &gamma_.grad : nullptr,
                         center_ ? &beta_.grad : nullptr);
}

void BatchNormalization::MoveTo(DeviceId device) {
  Layer::MoveTo(device);
  ops::MoveTo(device, &one_);
}

}  // namespace distrain

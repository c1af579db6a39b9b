#include "worker/model/layer.h"

#include "common/check.h"
#include "worker/model/initializers.h"
#include "worker/tensor/ops.h"

namespace distrain {

void Layer::MoveTo(DeviceId device) {
  for (const std::vector<Parameter*>& group : {parameters(), state_variables()}) {
    for (Parameter* p : group) {
      ops::MoveTo(device, &p->value);
      ops::MoveTo(device, &p->grad);
    }
  }
}

Dense::Dense(std::string name, int64_t in_features, int64_t out_features, uint64_t seed,
             ActivationFunction activation, bool use_bias)
    : name_(std::move(name)), use_bias_(use_bias), activation_(activation) {
  DISTRAIN_CHECK(in_features >= 1 && out_features >= 1)
      << name_ << ": in=" << in_features << " out=" << out_features;
  kernel_.name = name_ + "/kernel";
  kernel_.value = Tensor({in_features, out_features});
  kernel_.grad = Tensor({in_features, out_features});
  if (use_bias_) {
    bias_.name = name_ + "/bias";
    bias_.value = Tensor({out_features});
    bias_.grad = Tensor({out_features});
  }
  init::GlorotUniform(init::Mix(seed ^ init::StableHash(name_)), in_features, out_features,
                      &kernel_.value);
}

const Tensor& Layer::ComputeKernel(const Tensor& kernel, Tensor* copy) const {
  if (compute_ == ComputeType::kFloat32) return kernel;
  ops::RoundTo(compute_, kernel, copy);
  return *copy;
}

void Layer::RoundToComputeType(Tensor* t) const {
  if (compute_ != ComputeType::kFloat32) ops::RoundTo(compute_, *t, t);
}

std::vector<Parameter*> Dense::parameters() {
  if (use_bias_) return {&kernel_, &bias_};
  return {&kernel_};
}

std::vector<int64_t> Dense::OutputShape(const std::vector<int64_t>& input_shape) const {
  DISTRAIN_CHECK_GE(input_shape.size(), 2u) << name_ << " expects [batch, ..., features]";
  DISTRAIN_CHECK_EQ(input_shape.back(), kernel_.value.dim(0)) << name_ << " input features";
  std::vector<int64_t> out = input_shape;
  out.back() = kernel_.value.dim(1);
  return out;
}

void Dense::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  // Every position of every example is one row of the product.
  const int64_t batch = input.size() / kernel_.value.dim(0);
  const int64_t in = kernel_.value.dim(0);
  const int64_t out = kernel_.value.dim(1);
  output->Resize(OutputShape(input.shape()), input.device_id());
  // Bias first, then one GEMM accumulating onto it (beta = 1): a single pass
  // over the output instead of GEMM + a separate bias pass.
  if (use_bias_) ops::BroadcastBias(bias_.value, output);
  const Tensor& kernel = ComputeKernel(kernel_.value, &kernel_compute_);
  ops::MatMul(false, false, batch, out, in, 1.0f, input, kernel, use_bias_ ? 1.0f : 0.0f, output,
              compute_);
  if (!activation_.is_linear()) activation_.Forward(*output, output, compute_);
  input_ = &input;
  grad_output_ = nullptr;
}

void Dense::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward before Forward";
  const Tensor& input = *input_;
  const int64_t in = kernel_.value.dim(0);
  const int64_t out = kernel_.value.dim(1);
  const int64_t batch = input.size() / in;  // rows: every position of every example
  DISTRAIN_CHECK(grad_output.shape() == OutputShape(input.shape()))
      << name_ << ": grad_output " << grad_output.ShapeString();
  // dz = dL/d(x W + b); then dW = x^T dz, db = sum over the batch of dz,
  // dx = dz W^T.
  const Tensor* dz = &grad_output;
  if (!activation_.backward_is_identity()) {
    activation_.Backward(grad_output, &grad_pre_activation_);
    // ReLU's gradient keeps the rounded values; the others' need rounding.
    if (!activation_.keeps_values()) RoundToComputeType(&grad_pre_activation_);
    dz = &grad_pre_activation_;
  }
  grad_output_ = dz;
  if (factored_ && input.rank() > 2) {
    input_rows_ = Tensor::Alias(input, {batch, in});
    grad_output_rows_ = Tensor::Alias(*dz, {batch, out});
  }
  if (!factored_) {
    ops::MatMul(true, false, in, out, batch, 1.0f, input, *dz, 0.0f, &kernel_.grad, compute_);
  }
  if (use_bias_) ops::BiasGrad(*dz, &bias_.grad);
  if (grad_input != nullptr) {
    grad_input->Resize(input.shape(), dz->device_id());
    // The rounded kernel of this step's Forward (the variable has not changed since).
    const Tensor& kernel = compute_ == ComputeType::kFloat32 ? kernel_.value : kernel_compute_;
    ops::MatMul(false, true, batch, in, out, 1.0f, *dz, kernel, 0.0f, grad_input, compute_);
  }
}

std::optional<GradFactors> Dense::KernelGradFactors() const {
  if (!factored_ || input_ == nullptr || grad_output_ == nullptr) return std::nullopt;
  if (input_->rank() == 2) return GradFactors{&kernel_, input_, grad_output_};
  return GradFactors{&kernel_, &input_rows_, &grad_output_rows_};
}

}  // namespace distrain

#include "worker/model/activation_layer.h"

#include "common/check.h"
#include "worker/tensor/elementwise.h"
#include "worker/tensor/ops.h"

namespace distrain {

void ActivationState::Forward(const Tensor& x, Tensor* y, ComputeType round_to) {
  if (is_linear()) {
    ops::RoundTo(round_to, x, y);  // float32: a copy, a no-op in place
    return;
  }
  if (elementwise::GradientReadsInput(kind())) {
    if (y == &x) {
      ops::Copy(x, &input_copy_);  // before the in-place forward overwrites x
      saved_ = &input_copy_;
    } else {
      saved_ = &x;
    }
  } else {
    saved_ = y;
  }
  ops::ActivationForward(function_, x, y, round_to);
}

void ActivationState::Backward(const Tensor& dy, Tensor* dx) const {
  if (backward_is_identity()) {
    ops::Copy(dy, dx);
    return;
  }
  DISTRAIN_CHECK(saved_ != nullptr && saved_->size() == dy.size())
      << ActivationName(kind()) << ": Backward without a matching Forward (dy "
      << dy.ShapeString() << ")";
  // Each kind reads only the tensor it saved (ops.h), passed as both.
  ops::ActivationBackward(function_, *saved_, *saved_, dy, dx);
}

const Tensor& ActivationState::relu_output() const {
  DISTRAIN_CHECK(kind() == ActivationKind::kRelu && saved_ != nullptr)
      << ActivationName(kind()) << ": relu_output without a ReLU Forward";
  return *saved_;
}

void Activation::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  state_.Forward(input, output);
}

void Activation::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  state_.Backward(grad_output, grad_input);
}

}  // namespace distrain

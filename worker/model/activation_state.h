#ifndef DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_
#define DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_

#include "common/model_spec.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// An activation function and what its backward pass needs from the forward
// one — the forward output for ReLU, sigmoid, tanh, softmax and the others
// whose derivative is cheapest in it, the input for GELU, SiLU, softplus,
// softsign, hard SiLU and mish (elementwise::GradientReadsInput), nothing
// for linear. Shared by Activation (and the ReLU, LeakyReLU, ELU and
// Softmax layers), Dense and Conv2D (Keras' `activation` argument, applied
// after the bias).
//
// Ownership: Forward borrows that tensor (Model keeps every layer's input
// and output unchanged until the step's backward pass, as Dense's borrowed
// input already relies on); only a kind that reads its input, run in place,
// where the forward overwrites that input, keeps a private copy. Copying instead cost the guide's CNN a
// 5.5 MB memcpy per step at batch 64 (a third of its memmove time).
// Not thread-safe.
class ActivationState {
 public:
  explicit ActivationState(ActivationFunction function) : function_(function) {}
  ActivationFunction function() const { return function_; }
  ActivationKind kind() const { return function_.kind; }
  bool is_linear() const { return kind() == ActivationKind::kLinear; }
  // Whether f keeps its input's values (or gives 0) both ways: linear and
  // ReLU, whose gradient is dy or 0. Mixed precision skips rounding there.
  bool keeps_values() const {
    return kind() == ActivationKind::kLinear || kind() == ActivationKind::kRelu;
  }
  // A following max pooling applies ReLU's gradient (Layer::
  // ApplyPrecedingReluGradient): from now on Backward is the identity.
  void set_gradient_applied_downstream() { applied_downstream_ = true; }
  // Whether Backward only copies dy: linear, or ReLU's gradient applied
  // downstream. Layers then use dy as dL/d(pre-activation) directly.
  bool backward_is_identity() const { return is_linear() || applied_downstream_; }
  // y = f(x), remembering what Backward reads. y may be &x (in place). The
  // caller keeps x and y unchanged until Backward. Under mixed precision the
  // layer passes its compute type and y comes out rounded to it: for ReLU in
  // the activation's own pass (ops::ActivationForward), not in a second one.
  void Forward(const Tensor& x, Tensor* y, ComputeType round_to = ComputeType::kFloat32);
  // dx = dy * f'(x) for the last Forward. dx may be &dy.
  void Backward(const Tensor& dy, Tensor* dx) const;
  // ReLU's output of the last Forward, for a layer whose op applies ReLU's
  // gradient itself (Conv2D: ops::Conv2DBackward); CHECKs the kind.
  const Tensor& relu_output() const;

 private:
  ActivationFunction function_;
  bool applied_downstream_ = false;
  const Tensor* saved_ = nullptr;  // borrowed, or &input_copy_
  Tensor input_copy_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_

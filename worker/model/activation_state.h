#ifndef DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_
#define DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_

#include "common/model_spec.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// An activation function and what its backward pass needs from the forward
// one — the forward output for ReLU, sigmoid, tanh and softmax, the input
// for GELU, nothing for linear — kept as a private copy so the caller may
// reuse its tensors before Backward. Shared by Activation, Dense and Conv2D
// (Keras' `activation` argument, applied after the bias). Owns its copy;
// not thread-safe.
class ActivationState {
 public:
  explicit ActivationState(ActivationKind kind) : kind_(kind) {}
  ActivationKind kind() const { return kind_; }
  bool is_linear() const { return kind_ == ActivationKind::kLinear; }
  // y = f(x), saving what Backward reads. y may be &x (in place).
  void Forward(const Tensor& x, Tensor* y);
  // dx = dy * f'(x) for the last Forward. dx may be &dy.
  void Backward(const Tensor& dy, Tensor* dx) const;

 private:
  ActivationKind kind_;
  Tensor saved_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_ACTIVATION_STATE_H_

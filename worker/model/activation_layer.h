#ifndef DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_
#define DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_

#include <string>
#include <vector>

#include "common/model_spec.h"
#include "worker/model/activation_state.h"
#include "worker/model/layer.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// Keras' Activation layer: relu, sigmoid, tanh, softmax (last axis), gelu
// (exact), linear. No variables. The mlp shorthand's "relu_<i>" layers are
// Activation(relu). Not thread-safe (one replica at a time).
class Activation : public Layer {
 public:
  Activation(std::string name, ActivationKind kind) : name_(std::move(name)), state_(kind) {}
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "Activation"; }
  ActivationKind kind() const { return state_.kind(); }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override { return s; }
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  bool OutputKeepsInputValues() const override { return state_.keeps_values(); }
  bool InputGradKeepsOutputGradValues() const override { return state_.keeps_values(); }
  ActivationState* output_activation() override { return &state_; }

 private:
  std::string name_;
  ActivationState state_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_

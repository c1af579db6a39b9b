#ifndef DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_
#define DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_

#include <string>
#include <vector>

#include "common/model_spec.h"
#include "worker/model/activation_state.h"
#include "worker/model/layer.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// Keras' Activation layer (every activation of common/model_spec.h, softmax
// over the last axis) and the layers that are one activation under a class
// name of their own: ReLU, LeakyReLU, ELU and Softmax (`keras_class`). No
// variables. The mlp shorthand's "relu_<i>" layers are Activation(relu).
// Not thread-safe (one replica at a time).
class Activation : public Layer {
 public:
  Activation(std::string name, ActivationFunction function,
             LayerKind keras_class = LayerKind::kActivation)
      : name_(std::move(name)), keras_class_(keras_class), state_(function) {}
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return LayerKindName(keras_class_); }
  ActivationKind kind() const { return state_.kind(); }
  ActivationFunction function() const { return state_.function(); }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override { return s; }
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  bool OutputKeepsInputValues() const override { return state_.keeps_values(); }
  bool InputGradKeepsOutputGradValues() const override { return state_.keeps_values(); }
  ActivationState* output_activation() override { return &state_; }

 private:
  std::string name_;
  LayerKind keras_class_;
  ActivationState state_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_ACTIVATION_LAYER_H_

#ifndef DISTRAIN_WORKER_MODEL_RESHAPE_LAYERS_H_
#define DISTRAIN_WORKER_MODEL_RESHAPE_LAYERS_H_

// Keras' reshaping layers: Flatten and Reshape. No variables; each passes its
// input on under the new shape as an alias of it (Tensor::Alias; row-major
// order is unchanged, so nothing is copied), and its output gradient back
// the same way. Not thread-safe (one replica at a time).

#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace distrain {

// A layer whose output is its input's elements under another per-example
// shape, and whose gradient is the output gradient under the input's.
class ReshapeBase : public Layer {
 public:
  const std::string& name() const override { return name_; }
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  bool OutputKeepsInputValues() const override { return true; }
  bool InputGradKeepsOutputGradValues() const override { return true; }

 protected:
  explicit ReshapeBase(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
  std::vector<int64_t> input_shape_;  // of the last Forward, for Backward
};

// [batch, d1, d2, ...] -> [batch, d1 * d2 * ...].
class Flatten : public ReshapeBase {
 public:
  explicit Flatten(std::string name) : ReshapeBase(std::move(name)) {}
  const char* class_name() const override { return "Flatten"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
};

// [batch, ...] -> [batch, target_shape...]; one target entry may be -1
// (inferred from the element count, as Keras).
class Reshape : public ReshapeBase {
 public:
  Reshape(std::string name, std::vector<int64_t> target_shape)
      : ReshapeBase(std::move(name)), target_shape_(std::move(target_shape)) {}
  const char* class_name() const override { return "Reshape"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;

 private:
  std::vector<int64_t> target_shape_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_RESHAPE_LAYERS_H_

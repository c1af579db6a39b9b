#ifndef DISTRAIN_WORKER_MODEL_RESCALING_H_
#define DISTRAIN_WORKER_MODEL_RESCALING_H_

#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace distrain {

// Keras' Rescaling(scale, offset): y = x * scale + offset, element-wise, the
// same in training and evaluation; typically scale = 1/255 in front of an
// image model. No variables. Under a 16-bit policy Keras casts scale and
// offset to the compute type before multiplying, and so does this layer
// (1/255 is 0.0039368 in bfloat16), so the model's numbers match Keras'.
// Not thread-safe (one replica at a time).
class Rescaling : public Layer {
 public:
  Rescaling(std::string name, double scale, double offset);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "Rescaling"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override { return s; }
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  // dx = dy * scale.
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;

 private:
  // scale or offset as the compute type holds it.
  float InComputeType(double value) const;

  std::string name_;
  double scale_;
  double offset_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_RESCALING_H_

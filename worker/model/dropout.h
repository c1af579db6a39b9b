#ifndef DISTRAIN_WORKER_MODEL_DROPOUT_H_
#define DISTRAIN_WORKER_MODEL_DROPOUT_H_

#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace distrain {

// Keras' Dropout(rate): while training, zeroes each element with
// probability `rate` and scales the survivors by 1 / (1 - rate); the
// identity at evaluation. The mask is a pure function of the step's stream
// (ForwardContext::rng_stream) mixed with the layer's name and of the
// element's index, so it is reproducible and identical on every device. No
// variables; owns its last mask. Not thread-safe (one replica at a time).
class Dropout : public Layer {
 public:
  Dropout(std::string name, double rate);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "Dropout"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override { return s; }
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  // The stream this layer draws its mask from for a step's context stream.
  uint64_t MaskStream(uint64_t rng_stream) const;

 private:
  std::string name_;
  double rate_;
  uint64_t name_hash_;
  bool dropped_ = false;  // the last Forward applied a mask
  Tensor mask_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_DROPOUT_H_

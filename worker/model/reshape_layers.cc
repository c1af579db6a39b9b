#include "worker/model/reshape_layers.h"

#include "common/check.h"

namespace distrain {

// Both directions pass the tensor on as an alias (Tensor::Alias): the same
// elements in the same row-major order, so nothing is copied. Model keeps
// every layer's input and output gradient until the step's backward pass
// is through, which is as long as the alias is read. A copy here was 2 x
// 7.9 MB of memcpy per step for the guide CNN at batch 256.
void ReshapeBase::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  input_shape_ = input.shape();
  *output = Tensor::Alias(input, OutputShape(input.shape()));
}

void ReshapeBase::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  *grad_input = Tensor::Alias(grad_output, input_shape_);
}

std::vector<int64_t> Flatten::OutputShape(const std::vector<int64_t>& input_shape) const {
  DISTRAIN_CHECK_GE(input_shape.size(), 1u) << name() << " needs a batch dimension";
  int64_t n = 1;
  for (size_t d = 1; d < input_shape.size(); ++d) n *= input_shape[d];
  return {input_shape[0], n};
}

std::vector<int64_t> Reshape::OutputShape(const std::vector<int64_t>& input_shape) const {
  DISTRAIN_CHECK_GE(input_shape.size(), 1u) << name() << " needs a batch dimension";
  int64_t in = 1;
  for (size_t d = 1; d < input_shape.size(); ++d) in *= input_shape[d];
  std::vector<int64_t> out = {input_shape[0]};
  int64_t known = 1;
  int unknown = -1;
  for (size_t d = 0; d < target_shape_.size(); ++d) {
    if (target_shape_[d] == -1) {
      DISTRAIN_CHECK_EQ(unknown, -1) << name() << ": more than one -1 in targetShape";
      unknown = static_cast<int>(out.size());
      out.push_back(0);
    } else {
      known *= target_shape_[d];
      out.push_back(target_shape_[d]);
    }
  }
  if (unknown >= 0) {
    DISTRAIN_CHECK(known > 0 && in % known == 0) << name() << ": cannot infer -1 from " << in;
    out[unknown] = in / known;
  } else {
    DISTRAIN_CHECK_EQ(known, in) << name() << ": element count";
  }
  return out;
}

}  // namespace distrain

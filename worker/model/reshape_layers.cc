#include "worker/model/reshape_layers.h"

#include "common/check.h"
#include "worker/tensor/ops.h"

namespace distrain {

void CopyReshaped(const Tensor& src, std::vector<int64_t> shape, Tensor* dst) {
  DISTRAIN_CHECK_EQ(Tensor::NumElements(shape), src.size())
      << "reshape " << src.ShapeString() << " to " << Tensor(shape).ShapeString();
  dst->Resize(src.shape(), src.device_id());  // the copy stays on src's device
  ops::Copy(src, dst);
  // Tensor::Resize to the same element count keeps the storage, and with it
  // the elements (Tensor has no separate reshape yet).
  dst->Resize(std::move(shape));
}

void ReshapeBase::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  input_shape_ = input.shape();
  CopyReshaped(input, OutputShape(input.shape()), output);
}

void ReshapeBase::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  CopyReshaped(grad_output, input_shape_, grad_input);
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

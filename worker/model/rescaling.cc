#include "worker/model/rescaling.h"

#include "worker/tensor/elementwise.h"
#include "worker/tensor/ops.h"

namespace distrain {

Rescaling::Rescaling(std::string name, double scale, double offset)
    : name_(std::move(name)), scale_(scale), offset_(offset) {}

float Rescaling::InComputeType(double value) const {
  const float f = static_cast<float>(value);
  switch (compute_type()) {
    case ComputeType::kBfloat16:
      return elementwise::RoundToBfloat16()(f);
    case ComputeType::kFloat16:
      return elementwise::RoundToFloat16()(f);
    case ComputeType::kFloat32:
      break;
  }
  return f;
}

void Rescaling::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  ops::ScaleShift(InComputeType(scale_), InComputeType(offset_), input, output);
}

void Rescaling::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  ops::ScaleShift(InComputeType(scale_), 0.0f, grad_output, grad_input);
}

}  // namespace distrain

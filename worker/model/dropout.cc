#include "worker/model/dropout.h"

#include "common/check.h"
#include "worker/model/initializers.h"
#include "worker/tensor/ops.h"

namespace distrain {

Dropout::Dropout(std::string name, double rate)
    : name_(std::move(name)), rate_(rate), name_hash_(init::StableHash(name_)) {
  DISTRAIN_CHECK(rate >= 0 && rate < 1) << name_ << ": rate " << rate;
}

uint64_t Dropout::MaskStream(uint64_t rng_stream) const {
  return init::Mix(rng_stream ^ name_hash_);
}

void Dropout::Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) {
  dropped_ = ctx.training && rate_ > 0;
  if (!dropped_) {
    ops::Copy(input, output);
    return;
  }
  ops::DropoutForward(rate_, MaskStream(ctx.rng_stream), input, output, &mask_);
}

void Dropout::Backward(const Tensor& grad_output, Tensor* grad_input) {
  if (grad_input == nullptr) return;
  if (!dropped_) {
    ops::Copy(grad_output, grad_input);
    return;
  }
  ops::DropoutBackward(mask_, grad_output, grad_input);
}

}  // namespace distrain

#include "worker/model/embedding.h"

#include "common/check.h"
#include "worker/model/initializers.h"
#include "worker/tensor/ops.h"

namespace distrain {

Embedding::Embedding(std::string name, int64_t input_dim, int64_t output_dim, uint64_t seed)
    : name_(std::move(name)) {
  DISTRAIN_CHECK(input_dim >= 1 && output_dim >= 1) << name_;
  embeddings_.name = name_ + "/embeddings";
  embeddings_.value = Tensor({input_dim, output_dim});
  embeddings_.grad = Tensor({input_dim, output_dim});
  init::RandomUniform(init::Mix(seed ^ init::StableHash(name_)), -0.05, 0.05,
                      &embeddings_.value);
}

std::vector<int64_t> Embedding::OutputShape(const std::vector<int64_t>& input_shape) const {
  DISTRAIN_CHECK(input_shape.size() >= 2) << name_ << ": expects [batch, ids...]";
  std::vector<int64_t> out = input_shape;
  out.push_back(embeddings_.value.dim(1));
  return out;
}

void Embedding::Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) {
  ops::EmbeddingForward(embeddings_.value, input, output);
  input_ = ctx.training ? &input : nullptr;
}

void Embedding::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward without a training Forward";
  DISTRAIN_CHECK(grad_input == nullptr) << name_ << ": token ids have no gradient";
  ops::EmbeddingBackward(*input_, grad_output, &embeddings_.grad);
}

}  // namespace distrain

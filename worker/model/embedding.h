#ifndef DISTRAIN_WORKER_MODEL_EMBEDDING_H_
#define DISTRAIN_WORKER_MODEL_EMBEDDING_H_

#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace distrain {

// Keras' Embedding(input_dim, output_dim): each token id of the input (a
// whole number in [0, input_dim), held as a float like every feature) becomes
// its row of the trained table "<name>/embeddings" [input_dim, output_dim],
// initialised as Keras' "uniform" (U(-0.05, 0.05)). The output shape is the
// input's plus output_dim. The model's first layer only (model_spec.h says
// why), so it takes no input gradient; the table's gradient is dense, the
// sum of the output gradient's rows per id, which is what Keras' optimizers
// apply to Embedding's sparse gradient. Under a mixed policy the table stays
// float32 and the rows are rounded like any layer's output, as Keras' cast.
// Owns its table; borrows its input until Backward. Not thread-safe (one
// replica at a time).
class Embedding : public Layer {
 public:
  Embedding(std::string name, int64_t input_dim, int64_t output_dim, uint64_t seed);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "Embedding"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  // Ids have no gradient: grad_input must be null.
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  std::vector<Parameter*> parameters() override { return {&embeddings_}; }
  bool ReadsTokenIds() const override { return true; }
  // The rows are the table's values; rounding them is the model's job.
  bool OutputKeepsInputValues() const override { return false; }

 private:
  std::string name_;
  Parameter embeddings_;
  const Tensor* input_ = nullptr;  // borrowed until Backward
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_EMBEDDING_H_

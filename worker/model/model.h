#ifndef DISTRAIN_WORKER_MODEL_MODEL_H_
#define DISTRAIN_WORKER_MODEL_MODEL_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_config.h"
#include "worker/model/layer.h"
#include "worker/model/loss.h"

namespace distrain {

// A sequential model + softmax cross-entropy, built from spec.training.model.
// Owns its layers and parameters; one instance per replica. Not thread-safe.
class Model {
 public:
  // MLP: Dense(input_dim -> h0), ReLU, ..., Dense(h_last -> num_classes).
  // Parameter values depend only on (config, input_dim, num_classes, seed),
  // so every replica that builds with the same seed starts identical.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, int input_dim,
                                                       int num_classes, uint64_t seed);

  // Forward + backward on one batch; overwrites every parameter's grad with
  // the gradient of the batch-mean loss. After the parameter grads of a layer
  // are final, calls on_layer_grads_ready(layer_index) — last layer first —
  // so a strategy can start reducing while backward continues. Before layer i
  // reads its parameters in the forward pass, calls before_layer_forward(i),
  // so a strategy can fetch them layer by layer while earlier layers compute.
  LossResult TrainStep(const Tensor& features, absl::Span<const int32_t> labels,
                       const std::function<void(int layer_index)>& on_layer_grads_ready = {},
                       const std::function<void(int layer_index)>& before_layer_forward = {});
  LossResult Evaluate(const Tensor& features, absl::Span<const int32_t> labels);

  // Stable order: layers first to last, kernel before bias.
  std::vector<Parameter*> parameters();
  // parameters() grouped by layer index (empty for parameter-free layers).
  std::vector<std::vector<Parameter*>> parameters_by_layer();
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // With `factored`, TrainStep leaves each Dense kernel's gradient as its
  // factors (input^T d(output), see GradFactors) instead of forming it: the
  // kernel's grad field is then stale, and kernel_grad_factors(i) is what a
  // strategy sends (a parameter server forms the product itself).
  void set_factored_kernel_grads(bool factored);
  // Layer i's kernel-gradient factors, valid from on_layer_grads_ready(i)
  // until the next TrainStep; nullopt when not factored or no such layer.
  std::optional<GradFactors> kernel_grad_factors(int layer) const;
  int64_t num_parameters() const;  // scalar count
  std::string Summary() const;     // "mlp 784-128-10 (101770 params)"

 private:
  Model() = default;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> activations_;  // activations_[i] = input of layer i+1
  std::vector<Tensor> grads_;        // scratch for backward
  Tensor grad_logits_;
  std::vector<bool> has_parameters_;  // per layer; saves a vector per layer per step
  std::string summary_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_MODEL_H_

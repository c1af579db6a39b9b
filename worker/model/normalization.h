#ifndef DISTRAIN_WORKER_MODEL_NORMALIZATION_H_
#define DISTRAIN_WORKER_MODEL_NORMALIZATION_H_

#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace distrain {

// Keras' BatchNormalization(axis=-1, momentum, epsilon) over the last axis
// (channels for NHWC images, features for rows). Trainable gamma (ones) and
// beta (zeros); non-trainable moving_mean (zeros) and moving_variance (ones),
// exposed through state_variables(). Training: normalises with the batch's
// mean and biased variance and updates moving = moving * momentum + batch *
// (1 - momentum), as Keras 3; evaluation: normalises with the moving
// statistics and changes nothing. Owns its variables and batch statistics,
// borrows its input until Backward. Not thread-safe (one replica at a time).
class BatchNormalization : public Layer {
 public:
  BatchNormalization(std::string name, int64_t channels, double momentum, double epsilon);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "BatchNormalization"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  // Gradients of the training forward pass (Backward after an evaluation
  // Forward is a bug).
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  std::vector<Parameter*> parameters() override { return {&gamma_, &beta_}; }
  bool ComputesInFloat32() const override { return true; }
  std::vector<Parameter*> state_variables() override { return {&moving_mean_, &moving_variance_}; }
  void MoveTo(DeviceId device) override;

 private:
  std::string name_;
  float momentum_, one_minus_momentum_, epsilon_;
  Parameter gamma_, beta_, moving_mean_, moving_variance_;
  const Tensor* input_ = nullptr;  // borrowed until Backward; null after evaluation
  Tensor batch_mean_, batch_var_;
  Tensor one_;           // [1] = 1: the left factor of the moving-average update
  Tensor scratch_grad_;  // dx when the caller does not want it
};

// Keras' LayerNormalization(axis=-1, epsilon, center, scale) and, with
// `rms`, RMSNormalization(axis=-1, epsilon): each example's last axis is
// normalised on its own, with the same arithmetic in training and
// evaluation (no batch statistics, no moving averages, so nothing to
// synchronise across replicas). Trainable gamma (ones; RMSNormalization
// calls it "scale") unless scale is false, and beta (zeros) unless center
// is false or rms. Computes in float32 under mixed precision, as Keras
// does. Owns its variables and the rows' statistics; borrows its input
// until Backward. Not thread-safe (one replica at a time).
class LayerNormalization : public Layer {
 public:
  LayerNormalization(std::string name, int64_t features, double epsilon, bool center,
                     bool scale, bool rms);
  const std::string& name() const override { return name_; }
  const char* class_name() const override {
    return rms_ ? "RMSNormalization" : "LayerNormalization";
  }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& s) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  std::vector<Parameter*> parameters() override;
  bool ComputesInFloat32() const override { return true; }

 private:
  std::string name_;
  int64_t features_;
  float epsilon_;
  bool center_, scale_, rms_;
  Parameter gamma_, beta_;  // each only when the layer learns it
  const Tensor* input_ = nullptr;  // borrowed until Backward
  Tensor row_mean_, row_rstd_;
  Tensor scratch_grad_;  // dx when the caller does not want it
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_NORMALIZATION_H_

#ifndef DISTRAIN_WORKER_MODEL_CONV_LAYERS_H_
#define DISTRAIN_WORKER_MODEL_CONV_LAYERS_H_

// Keras' convolution and pooling layers over NHWC images: Conv2D,
// MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D — and, with
// `one_d`, their 1-D forms over sequences [batch, steps, channels] (Conv1D,
// MaxPooling1D, AveragePooling1D, GlobalAveragePooling1D), which run the
// same ops on the [batch, steps, 1, channels] image those bytes already are
// (aliases, no copies; window {length, 1}). Geometry is Keras'
// (ops::KerasWindow2D: padding valid|same, the odd padding element at the
// bottom/right). Each layer owns its variables and backward caches and
// borrows its input until Backward. Not thread-safe (one replica at a time).

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "worker/model/activation_state.h"
#include "worker/model/layer.h"
#include "worker/tensor/ops.h"

namespace distrain {

// Conv2D(filters, kernel_size, strides, padding, activation, use_bias) on
// [batch, H, W, C]: y = activation(conv(x, kernel) + bias), kernel [KH, KW,
// C, filters] ("<name>/kernel", HWIO as Keras stores it), bias [filters]
// ("<name>/bias"). Glorot-uniform kernel with Keras' fans (receptive field
// times channels), zero bias. Conv1D (one_d, kernel and strides {k, 1}): the
// kernel variable is [k, C, filters], Keras' Conv1D layout.
class Conv2D : public Layer {
 public:
  Conv2D(std::string name, int64_t in_channels, int64_t filters, std::array<int64_t, 2> kernel,
         std::array<int64_t, 2> strides, PaddingKind padding, ActivationFunction activation,
         bool use_bias, uint64_t seed, bool one_d = false);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return one_d_ ? "Conv1D" : "Conv2D"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  std::vector<Parameter*> parameters() override;
  ActivationState* output_activation() override { return &activation_; }
  bool RoundsOwnOutput() const override { return !activation_.is_linear(); }

 private:
  ops::Window2D Window(const std::vector<int64_t>& input_shape) const;

  // The kernel (or its rounded copy) as the [KH, KW, C, F] the ops take.
  const Tensor& KernelImage(const Tensor& kernel);

  std::string name_;
  int64_t in_channels_, filters_;
  std::array<int64_t, 2> kernel_size_, strides_;
  PaddingKind padding_;
  bool use_bias_;
  bool one_d_;
  Parameter kernel_;
  Parameter bias_;
  ActivationState activation_;
  const Tensor* input_ = nullptr;  // borrowed until Backward (1-D: &input_image_)
  ops::Window2D window_;           // of the last Forward
  Tensor grad_pre_activation_;
  Tensor kernel_compute_;  // the kernel rounded, under mixed precision
  // 1-D: aliases of the sequences as images (Tensor::Alias).
  Tensor input_image_, grad_output_image_, relu_output_image_, kernel_image_;
};

// MaxPooling2D / AveragePooling2D(pool_size, strides, padding). Average
// pooling with padding 'same' divides by the real inputs in each window, as
// TensorFlow does. No variables.
class Pooling2D : public Layer {
 public:
  Pooling2D(std::string name, ops::PoolKind kind, std::array<int64_t, 2> pool_size,
            std::array<int64_t, 2> strides, PaddingKind padding, bool one_d = false);
  // GlobalMaxPooling2D (1D): max pooling whose window is the whole input,
  // [batch, H, W, C] (or [batch, steps, C]) -> [batch, C]. Its gradient goes
  // to one maximum per channel where TensorFlow's reduce_max splits it
  // among tied maxima; ties need equal inputs, and the common ones, a
  // ReLU's zeros, get no gradient either way.
  static std::unique_ptr<Pooling2D> GlobalMax(std::string name, bool one_d);
  const std::string& name() const override { return name_; }
  const char* class_name() const override {
    if (global_) return one_d_ ? "GlobalMaxPooling1D" : "GlobalMaxPooling2D";
    if (one_d_) return kind_ == ops::PoolKind::kMax ? "MaxPooling1D" : "AveragePooling1D";
    return kind_ == ops::PoolKind::kMax ? "MaxPooling2D" : "AveragePooling2D";
  }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  // Max pooling selects; its gradient goes to one input per window, so it
  // keeps the values unless windows overlap (stride < pool size), where an
  // input may collect the sum of several.
  bool OutputKeepsInputValues() const override { return kind_ == ops::PoolKind::kMax; }
  bool InputGradKeepsOutputGradValues() const override {
    return kind_ == ops::PoolKind::kMax &&
           (global_ || (strides_[0] >= pool_size_[0] && strides_[1] >= pool_size_[1]));
  }
  bool ApplyPrecedingReluGradient() override;

 private:
  ops::Window2D Window(const std::vector<int64_t>& input_shape) const;

  std::string name_;
  ops::PoolKind kind_;
  std::array<int64_t, 2> pool_size_, strides_;
  PaddingKind padding_;
  bool one_d_;
  bool global_ = false;  // the window is the whole input (GlobalMax)
  // 1-D and global: aliases of the tensors as images; input_ is then
  // &input_image_.
  Tensor input_image_, output_image_, grad_output_image_;
  // Both borrowed until Backward, as every layer's: Model keeps each layer's
  // input and output unchanged until the step's backward pass (a copy of the
  // output cost the guide's CNN 5.5 MB of memcpy per step at batch 256).
  const Tensor* input_ = nullptr;
  const Tensor* output_ = nullptr;
  Tensor workspace_;
  bool applies_relu_gradient_ = false;
  Tensor relu_masked_grad_;  // grad_output times (*output_ > 0), when it applies
  ops::Window2D window_;
};

// GlobalAveragePooling2D: [batch, H, W, C] -> [batch, C]; 1-D: [batch,
// steps, C] -> [batch, C]. No variables.
class GlobalAveragePooling2D : public Layer {
 public:
  explicit GlobalAveragePooling2D(std::string name, bool one_d = false)
      : name_(std::move(name)), one_d_(one_d) {}
  const std::string& name() const override { return name_; }
  const char* class_name() const override {
    return one_d_ ? "GlobalAveragePooling1D" : "GlobalAveragePooling2D";
  }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;

 private:
  std::string name_;
  bool one_d_;
  int64_t height_ = 0, width_ = 0;  // of the last Forward
  Tensor input_image_;              // 1-D: the sequence as an image
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_CONV_LAYERS_H_

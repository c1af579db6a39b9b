#ifndef DISTRAIN_WORKER_MODEL_LAYER_H_
#define DISTRAIN_WORKER_MODEL_LAYER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "worker/model/activation_state.h"
#include "worker/tensor/tensor.h"

namespace distrain {

// A trainable variable and its gradient. `name` is stable across runs and
// processes ("dense_0/kernel") — checkpoints, collectives and parameter
// servers key on it.
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // same shape as value; written by Layer::Backward
};

// A kernel gradient left as two factors, dL/dkernel = left^T right: for a
// Dense layer, left is the batch's input [batch, in] and right dL/d(output)
// [batch, out]. Both are borrowed from the layer and its model; valid from
// the layer's Backward until the model's next forward pass.
struct GradFactors {
  const Parameter* kernel;
  const Tensor* left;
  const Tensor* right;
};

// What a forward pass needs besides its input.
struct ForwardContext {
  // Training: Dropout drops, BatchNormalization uses and updates batch
  // statistics. Evaluation: Dropout is the identity, BatchNormalization uses
  // its moving statistics.
  bool training = false;
  // This step's random stream for this replica (Model derives it from the
  // seed, the step and replica_id_in_sync); a layer mixes in its own name.
  uint64_t rng_stream = 0;
};

// One layer of a sequential model (Keras' class names, arguments and
// variable names). Inputs are [batch, example shape...] (images NHWC).
//
// Forward caches what Backward needs: it may borrow `input` (the caller
// keeps it alive and unchanged until Backward — Model's activations are) but
// never `output`, which the caller may reuse. So a Layer instance serves one
// replica at a time (replicas own separate Model copies). Not thread-safe.
// Layers compute through worker/tensor/ops.h only, so one layer serves every
// device. Families: layer.h (this base, Dense), activation_layer.h,
// reshape_layers.h, dropout.h, conv_layers.h, normalization.h, rescaling.h,
// embedding.h;
// layer_factory.h builds one from a LayerConfig.
class Layer {
 public:
  virtual ~Layer() = default;
  virtual const std::string& name() const = 0;
  // Keras' class name ("Conv2D").
  virtual const char* class_name() const = 0;
  // Output shape for an input shape, both with the batch dimension.
  virtual std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const = 0;
  virtual void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) = 0;
  void Forward(const Tensor& input, Tensor* output) { Forward(input, output, ForwardContext{}); }
  // Given dL/d(output) of the last training Forward, overwrites each
  // parameter's grad with dL/d(param) and, when grad_input is not null,
  // writes dL/d(input).
  virtual void Backward(const Tensor& grad_output, Tensor* grad_input) = 0;
  // Trainable variables (kernel before bias; gamma before beta).
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Non-trainable variables the layer updates itself while training
  // (BatchNormalization's moving_mean, moving_variance). Checkpointed with
  // the parameters; synchronous strategies average them over the replicas
  // after every step (TensorFlow's ON_READ/MEAN variables, which read as the
  // replicas' mean). Their `grad` is unused.
  virtual std::vector<Parameter*> state_variables() { return {}; }
  // Layers whose kernel gradient is a product of two batch matrices can
  // leave it as its factors: with `factored`, Backward does not form the
  // kernel's grad (it keeps its old contents) and KernelGradFactors returns
  // them. Returns whether the layer supports it.
  virtual bool SetFactoredKernelGrad(bool /*factored*/) { return false; }
  // Moves the layer's variables (and any constant it computes with) to
  // `device`; its activations then follow its inputs there, since ops size
  // outputs on their inputs' device.
  virtual void MoveTo(DeviceId device);
  virtual std::optional<GradFactors> KernelGradFactors() const { return std::nullopt; }

  // What mixed precision may skip (Model rounds every other layer's output
  // and input gradient): whether each output element is one of the input's
  // (or 0) — a layer that only rearranges or selects values — and whether
  // each input-gradient element is one of the output gradient's (or 0).
  virtual bool OutputKeepsInputValues() const { return false; }
  virtual bool InputGradKeepsOutputGradValues() const { return false; }
  // Whether Forward rounds its output to the compute type itself: Dense's
  // and Conv2D's non-linear activations round in their own pass.
  virtual bool RoundsOwnOutput() const { return false; }
  // ReLU's gradient, applied by a following max pooling instead (Model::
  // Finalize pairs adjacent layers; docs/architecture.md §6a "Fused ReLU
  // gradient"). Max pooling passes each window's gradient to an input that
  // holds the window's maximum, and that input is > 0 exactly where the
  // pooled output is, so masking the pooled gradient by (pooled > 0) before
  // routing it gives ReLU's gradient bit for bit, on a tensor pool-size
  // times smaller, and saves the ReLU layer a pass over its full output.
  // The activation the layer's output comes from (its `activation`
  // argument, or the Activation layer's own), or null: Model::Finalize hands
  // a ReLU's gradient to the next layer through it.
  virtual ActivationState* output_activation() { return nullptr; }
  // Asks the layer to apply ReLU's gradient for the layer before it: to mask
  // the gradient it passes down by (its output > 0). Returns whether it does
  // (max pooling does; the default refuses).
  virtual bool ApplyPrecedingReluGradient() { return false; }
  // Whether the layer computes in float32 whatever the policy, as Keras'
  // BatchNormalization does: its output is still rounded, its parameter
  // gradients are not.
  virtual bool ComputesInFloat32() const { return false; }
  // Whether the layer's input is token ids (Embedding), which the model
  // must pass on exactly: a mixed policy does not round them.
  virtual bool ReadsTokenIds() const { return false; }

  // The type the layer's matrix products and convolutions compute in (the
  // model's precision, ComputeType). Under a 16-bit type the model hands
  // every layer inputs and output gradients already rounded to it, and a
  // layer with a kernel multiplies by a rounded copy of it — Keras' cast of
  // the float32 variable — and rounds any other operand it forms itself.
  void set_compute_type(ComputeType type) { compute_ = type; }
  ComputeType compute_type() const { return compute_; }

 protected:
  // The kernel as the products read it: the variable itself under float32,
  // else `copy` rounded to the compute type.
  const Tensor& ComputeKernel(const Tensor& kernel, Tensor* copy) const;
  // Rounds a tensor the layer formed itself to the compute type (a no-op
  // under float32).
  void RoundToComputeType(Tensor* t) const;

  ComputeType compute_ = ComputeType::kFloat32;
};

// Keras' Dense on [batch, ..., in]: y = activation(x W + b) over the last
// axis, W: [in, out] ("<name>/kernel"), b: [out] ("<name>/bias", absent
// without use_bias); every leading position on its own, as Keras ([batch,
// steps, in] -> [batch, steps, out]), one matrix product over all of them.
// Initialised like Keras: Glorot-uniform kernel, zero bias, from `seed` and
// the name. Supports factored kernel gradients (the parameter server's
// pushes): the factors are the input and dL/d(x W + b), each viewed as a
// matrix of rows [positions, features].
class Dense : public Layer {
 public:
  Dense(std::string name, int64_t in_features, int64_t out_features, uint64_t seed,
        ActivationFunction activation = ActivationKind::kLinear, bool use_bias = true);
  const std::string& name() const override { return name_; }
  const char* class_name() const override { return "Dense"; }
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape) const override;
  using Layer::Forward;
  void Forward(const Tensor& input, Tensor* output, const ForwardContext& ctx) override;
  void Backward(const Tensor& grad_output, Tensor* grad_input) override;
  std::vector<Parameter*> parameters() override;
  bool SetFactoredKernelGrad(bool factored) override {
    factored_ = factored;
    return true;
  }
  std::optional<GradFactors> KernelGradFactors() const override;
  ActivationState* output_activation() override { return &activation_; }
  bool RoundsOwnOutput() const override { return !activation_.is_linear(); }

 private:
  std::string name_;
  bool use_bias_;
  Parameter kernel_;
  Parameter bias_;
  ActivationState activation_;
  const Tensor* input_ = nullptr;        // borrowed from the caller until Backward
  const Tensor* grad_output_ = nullptr;  // dL/d(x W + b) of the last Backward, for the factors
  // The factors as [rows, features] matrices when the input has more than
  // two axes (aliases of input_ and grad_output_).
  Tensor input_rows_, grad_output_rows_;
  Tensor grad_pre_activation_;           // dL/d(x W + b) when there is an activation
  Tensor kernel_compute_;                // the kernel rounded, under mixed precision
  bool factored_ = false;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_LAYER_H_

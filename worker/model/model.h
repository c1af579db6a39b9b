#ifndef DISTRAIN_WORKER_MODEL_MODEL_H_
#define DISTRAIN_WORKER_MODEL_MODEL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_config.h"
#include "worker/model/layer.h"
#include "worker/model/loss.h"

namespace distrain {

// Which step and replica a training step is, for the layers' random streams
// (Dropout): the stream is a pure function of (seed, step, replica), so a
// resumed job draws the same masks and replicas draw different ones.
struct StepContext {
  int64_t step = 0;
  int replica_id_in_sync = 0;
};

// A sequential model and its loss, built from spec.training.model
// (common/model_spec.h): Keras layers, or the mlp shorthand. Owns its layers
// and variables; one instance per replica. Not thread-safe.
class Model {
 public:
  // `example_shape` is one example's shape as the dataset yields it (IDX:
  // {28, 28, 1}; CSV, synthetic: {features}); batches arrive flat, [batch,
  // product of example_shape], which for images is exactly NHWC. mlp:
  // Dense(features -> h0), ReLU, ..., Dense(h_last -> num_classes).
  // Variable values depend only on (config, example_shape, num_classes,
  // seed), so every replica that builds with the same seed starts identical.
  // Logs ModelWarnings (a Softmax output with fromLogits: true) once per
  // process. The loss follows Keras 3: a cross-entropy after a softmax or
  // sigmoid output reads the logits behind it, whatever fromLogits says;
  // "accuracy" is Keras' metric for the loss, on the activated output.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config,
                                                       const std::vector<int64_t>& example_shape,
                                                       int num_classes, uint64_t seed);
  // Flat examples of `input_dim` features.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, int input_dim,
                                                       int num_classes, uint64_t seed) {
    return Create(config, std::vector<int64_t>{input_dim}, num_classes, seed);
  }

  // `features` may be on any device: a batch elsewhere than the model (the
  // host batch of a model on a GPU) is copied to the model's device first,
  // here and in Evaluate / Predict — the one place inputs reach a replica's
  // device. Labels are always host memory (the loss reads them there).
  //
  // Forward + backward on one batch; overwrites every parameter's grad with
  // the gradient of the batch-mean loss. After the parameter grads of a layer
  // are final, calls on_layer_grads_ready(layer_index) — last layer first —
  // so a strategy can start reducing while backward continues. Before layer i
  // reads its parameters in the forward pass, calls before_layer_forward(i),
  // so a strategy can fetch them layer by layer while earlier layers compute.
  // `step` seeds the layers' random streams (Dropout); BatchNormalization
  // layers update their moving statistics from this batch.
  LossResult TrainStep(const Tensor& features, absl::Span<const int32_t> labels,
                       const std::function<void(int layer_index)>& on_layer_grads_ready = {},
                       const std::function<void(int layer_index)>& before_layer_forward = {},
                       const StepContext& step = {});
  // The loss of the running or last TrainStep, set before backward starts: a
  // strategy reading it from on_layer_grads_ready can reduce it with the
  // gradients.
  const LossResult& last_train_loss() const { return last_train_loss_; }
  // Inference mode (no Dropout, moving statistics); changes no variable.
  LossResult Evaluate(const Tensor& features, absl::Span<const int32_t> labels);
  // The model's output in inference mode, as Keras' model.predict returns it
  // (the output layer's activation applied: probabilities after a softmax),
  // [batch, output...], on the model's device. Valid until the next call on
  // this model.
  const Tensor& Predict(const Tensor& features);

  // Trainable variables. Stable order: layers first to last, kernel before bias.
  std::vector<Parameter*> parameters();
  // Non-trainable variables (BatchNormalization's moving statistics), same
  // order rules; see Layer::state_variables for how strategies treat them.
  std::vector<Parameter*> state_variables();
  // The per-example input shape the model was built for.
  const std::vector<int64_t>& example_shape() const { return example_shape_; }
  // Number of classes (the label range) the model was built for.
  int num_classes() const { return num_classes_; }
  // Elements of the largest layer output for one example (the input
  // included): what a batch of B examples costs in activations, ~B x this.
  int64_t largest_activation_per_example() const { return largest_activation_; }
  // parameters() grouped by layer index (empty for parameter-free layers).
  std::vector<std::vector<Parameter*>> parameters_by_layer();
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // Moves every variable to `device` (a new model is on the host). Features
  // may stay on the host (TrainStep copies them); labels stay on the host.
  void MoveTo(DeviceId device);
  DeviceId device() const { return device_; }
  // With `factored`, TrainStep leaves each Dense kernel's gradient as its
  // factors (input^T d(output), see GradFactors) instead of forming it: the
  // kernel's grad field is then stale, and kernel_grad_factors(i) is what a
  // strategy sends (a parameter server forms the product itself).
  void set_factored_kernel_grads(bool factored);
  // Layer i's kernel-gradient factors, valid from on_layer_grads_ready(i)
  // until the next TrainStep; nullopt when not factored or no such layer.
  std::optional<GradFactors> kernel_grad_factors(int layer) const;
  // spec.training.precision, and the type it computes in (float32 for the
  // float32 policy; bfloat16 / float16 for the mixed ones, whose variables
  // stay float32 while every activation and gradient holds 16-bit values).
  Precision precision() const { return precision_; }
  ComputeType compute_type() const { return compute_; }
  // The factor TrainStep multiplies the loss gradient by (mixed_float16's
  // dynamic loss scale, Optimizer::loss_scale; 1 otherwise). The parameter
  // grads TrainStep leaves are scaled by it; the optimizer unscales them.
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }
  // Scalar count of every variable, trainable and not (Keras' count_params).
  int64_t num_parameters() const;
  // One line: "mlp 784-128-10 (101770 params)" or "sequential conv2d[26,26,32]
  // max_pooling2d[13,13,32] ... dense[10] (225034 params)".
  std::string Summary() const;

 private:
  Model() = default;
  // Finishes construction once layers_ is built.
  void Finalize(std::string summary);
  // The batch as the first layer takes it: [batch, example_shape...].
  const Tensor& LayerInput(const Tensor& features);
  // Forward through every layer; returns the last activation.
  const Tensor& RunForward(const Tensor& features, const ForwardContext& ctx,
                           const std::function<void(int layer_index)>& before_layer_forward);
  // The loss and metric of the model's output; grad (when not null)
  // receives d(mean loss)/d(output).
  LossResult ComputeLoss(const Tensor& output, absl::Span<const int32_t> labels, Tensor* grad);
  uint64_t StepStream(const StepContext& step) const;

  std::vector<int64_t> example_shape_;
  int num_classes_ = 0;
  int64_t largest_activation_ = 0;
  uint64_t seed_ = 0;
  LossConfig loss_;
  LossResult last_train_loss_;
  bool from_logits_ = true;
  // Keras hands a cross-entropy the logits behind a softmax or sigmoid
  // output whatever from_logits says (keras' _get_logits; from_logits: true
  // only adds the warning). Then the last layer is built without that
  // activation, the loss reads its output as logits, and output_activation_
  // is applied only for the accuracy metric, which Keras computes on the
  // activated output.
  ActivationKind output_activation_ = ActivationKind::kLinear;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> activations_;  // activations_[i] = output of layer i
  std::vector<Tensor> grads_;        // grads_[i] = dL/d(input of layer i)
  bool reshape_input_ = false;       // image models take [batch, rows, cols, channels]
  DeviceId device_;                  // where the variables live
  Tensor input_;                     // the batch reshaped for them, on device_
  Tensor grad_logits_;
  Tensor activated_output_;           // output_activation_ applied, for the metric
  std::vector<bool> has_parameters_;  // per layer; saves a vector per layer per step
  // Layers before the first one with parameters need no dL/d(input): for
  // them (and it) backward passes no grad_input (the mlp's first Dense skips
  // its largest GEMM this way).
  int first_parameter_layer_ = 0;
  std::string summary_;
  Precision precision_ = Precision::kFloat32;
  ComputeType compute_ = ComputeType::kFloat32;
  // Per layer: whether its output / the gradient of its input is rounded to
  // compute_ — under mixed precision every layer's but those that only
  // rearrange or select values (Layer::OutputKeepsInputValues).
  std::vector<bool> rounds_output_;
  std::vector<bool> rounds_grad_input_;
  float loss_scale_ = 1.0f;
};

// The type a precision policy computes in.
ComputeType ComputeTypeOf(Precision precision);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_MODEL_H_

#ifndef DISTRAIN_COMMON_MODEL_SPEC_H_
#define DISTRAIN_COMMON_MODEL_SPEC_H_

// The model a job trains, as spec.training.model describes it: a Keras
// Sequential stack (layer class names, arguments, defaults and padding
// arithmetic are Keras') and its loss. Pure data plus the shape arithmetic
// that validation (distrain run, the worker) and the runtime's layers share,
// so a model that validates is a model the worker can build.
//
// YAML (one spelling for arguments: Keras' names in camelCase, as every other
// field of the CRD):
//   model:
//     layers:
//       - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}
//       - MaxPooling2D: {poolSize: [2, 2]}
//       - Flatten: {}
//       - Dense: {units: 10, activation: softmax}
//     loss: {type: SparseCategoricalCrossentropy, fromLogits: false}
// `{type: mlp, hiddenUnits: [...]}` is a shorthand for Dense+ReLU stacks.
// docs/models.md lists every layer and argument.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace distrain {

enum class LayerKind {
  kInput,                   // {shape}: checked against the dataset's example shape
  kReshape,                 // {targetShape}: one entry may be -1
  kConv2D,                  // {filters, kernelSize, strides, padding, activation, useBias}
  kMaxPooling2D,            // {poolSize, strides, padding}
  kAveragePooling2D,        // {poolSize, strides, padding}
  kGlobalAveragePooling2D,  // {}
  kFlatten,                 // {}
  kDense,                   // {units, activation, useBias}
  kDropout,                 // {rate}
  kBatchNormalization,      // {axis, momentum, epsilon}
  kActivation,              // {activation}
  kReLU,                    // {maxValue, negativeSlope, threshold}
  kLeakyReLU,               // {negativeSlope}
  kELU,                     // {alpha}
  kSoftmax,                 // {axis}: the last axis only
  kRescaling,               // {scale, offset}
  // Keras' 1-D layers over sequences [steps, channels]: the 2-D layers on a
  // [steps, 1, channels] image; their kernelSize, poolSize and strides are
  // one length, stored as {length, 1}.
  kConv1D,                  // {filters, kernelSize, strides, padding, activation, useBias}
  kMaxPooling1D,            // {poolSize, strides, padding}
  kAveragePooling1D,        // {poolSize, strides, padding}
  kGlobalAveragePooling1D,  // {}
  kGlobalMaxPooling2D,      // {}: [rows, cols, channels] -> [channels]
  kGlobalMaxPooling1D,      // {}: [steps, channels] -> [channels]
  // Per-example normalisation over the last axis (Keras' layer_normalization
  // and rms_normalization).
  kLayerNormalization,      // {axis, epsilon, center, scale}
  kRMSNormalization,        // {axis, epsilon}
  // Integer token ids in [0, inputDim) -> rows of a trained [inputDim,
  // outputDim] table; the first layer (after Input) only.
  kEmbedding,               // {inputDim, outputDim}
};
// Whether the class is one of the 1-D layers above.
bool IsOneDimensional(LayerKind kind);
// Keras' default epsilon of a normalisation layer.
double DefaultEpsilon(LayerKind kind);
// Keras' class name ("Conv2D") and its inverse.
const char* LayerKindName(LayerKind kind);
std::optional<LayerKind> ParseLayerKind(const std::string& class_name);
// Every class name, in the order of the enum (for "did you mean" and docs).
std::vector<std::string> LayerKindNames();
// Keras' snake_case of the class ("max_pooling2d"): its automatic layer name
// and the key of the layer's weights in a .keras file.
const char* LayerKindSnakeName(LayerKind kind);

// Activations by Keras' string name (keras.activations). Gelu is Keras'
// default, the exact (erf) form; silu is also spelled swish, hard_silu
// hard_swish (Keras writes silu and hard_silu into its files).
enum class ActivationKind {
  kLinear,
  kRelu,
  kSigmoid,
  kTanh,
  kSoftmax,
  kGelu,
  kElu,          // alpha (1.0 by name, the ELU layer's own)
  kSelu,
  kSoftplus,
  kSoftsign,
  kSilu,
  kHardSigmoid,  // relu6(x + 3) / 6
  kHardSilu,     // x * hard_sigmoid(x)
  kLeakyRelu,    // alpha is the negative slope (0.2 by name, the layers' own)
  kRelu6,
  kExponential,
  kMish,         // x * tanh(softplus(x))
};
const char* ActivationName(ActivationKind kind);  // "relu"
std::optional<ActivationKind> ParseActivationName(const std::string& name);
// Every name Keras writes, in the order of the enum (for messages and
// docs); with_aliases adds swish and hard_swish, which parse too.
std::vector<std::string> ActivationNames(bool with_aliases = false);

// An activation with its one parameter: `alpha` is ELU's alpha and leaky
// ReLU's negative slope; the other kinds ignore it. Made from a kind, alpha
// is Keras' default for that name (elu 1.0, leaky_relu 0.2), so the string
// form `activation: elu` needs nothing else; the ELU, LeakyReLU and ReLU
// layers set their own.
struct ActivationFunction {
  ActivationKind kind = ActivationKind::kLinear;
  float alpha = 0.0f;

  constexpr ActivationFunction() = default;
  // Implicit: every place that names a kind means it with Keras' default.
  constexpr ActivationFunction(ActivationKind k)  // NOLINT(google-explicit-constructor)
      : kind(k), alpha(DefaultAlpha(k)) {}
  constexpr ActivationFunction(ActivationKind k, float a) : kind(k), alpha(a) {}
  bool operator==(const ActivationFunction&) const = default;

  static constexpr float DefaultAlpha(ActivationKind k) {
    return k == ActivationKind::kElu ? 1.0f : k == ActivationKind::kLeakyRelu ? 0.2f : 0.0f;
  }
};

// kCausal (Conv1D only, as in Keras): all the padding before, k - 1 steps,
// so output step t sees input steps <= t.
enum class PaddingKind { kValid, kSame, kCausal };
const char* PaddingName(PaddingKind padding);  // "valid", "same", "causal"

// One entry of spec.training.model.layers. Fields a layer kind does not use
// keep their defaults (the parser rejects them as unknown arguments).
struct LayerConfig {
  LayerKind kind = LayerKind::kDense;
  // Keras' `name`; empty: Keras' automatic name (conv2d, conv2d_1, dense, ...),
  // assigned by AssignLayerNames. Variable names are "<name>/kernel" etc.
  std::string name;
  std::vector<int64_t> shape;         // Input: shape; Reshape: targetShape
  int64_t filters = 0;                // Conv2D
  int64_t units = 0;                  // Dense
  int64_t input_dim = 0;              // Embedding: the vocabulary size
  int64_t output_dim = 0;             // Embedding: each token's vector length
  std::array<int64_t, 2> kernel_size = {0, 0};  // Conv2D (a scalar means both); Conv1D {k, 1}
  std::array<int64_t, 2> pool_size = {2, 2};    // pooling (1-D: {p, 1})
  // Conv2D: (1, 1) when unset; pooling: pool_size when unset (Keras).
  std::optional<std::array<int64_t, 2>> strides;
  PaddingKind padding = PaddingKind::kValid;
  ActivationKind activation = ActivationKind::kLinear;  // Conv2D, Conv1D, Dense, Activation
  bool use_bias = true;
  double rate = 0;           // Dropout: fraction of inputs dropped, in [0, 1)
  double momentum = 0.99;    // BatchNormalization (Keras defaults)
  // BatchNormalization, LayerNormalization: 1e-3; RMSNormalization: 1e-6
  // (DefaultEpsilon).
  double epsilon = 1e-3;
  bool center = true;        // LayerNormalization: learn beta (Keras' `center`)
  bool scale_output = true;  // LayerNormalization: learn gamma (Keras' `scale`)
  // ReLU and LeakyReLU; unset: 0 for ReLU, 0.3 for LeakyReLU (Keras).
  std::optional<double> negative_slope;
  std::optional<double> max_value;  // ReLU: unset (no ceiling) or 6
  double threshold = 0;             // ReLU: only 0
  double alpha = 1.0;               // ELU
  // Softmax and the normalisation layers: -1 or the last axis' index
  // (counting the batch as axis 0, as Keras does).
  int64_t axis = -1;
  double scale = 1.0;               // Rescaling: y = x * scale + offset
  double offset = 0.0;
  bool operator==(const LayerConfig&) const = default;

  std::array<int64_t, 2> EffectiveStrides() const;
  // The activation the layer applies: its `activation` argument (Dense,
  // Conv2D, Activation), the activation layers' own function, else linear.
  ActivationFunction Activation() const;
};

enum class LossKind {
  kSparseCategoricalCrossentropy,  // integer labels, output [classes]
  kCategoricalCrossentropy,        // integer labels one-hot encoded, output [classes]
  kBinaryCrossentropy,             // labels 0/1, output [1]
  kMeanSquaredError,               // output [classes]: one-hot targets; [1]: the label value
};
const char* LossKindName(LossKind kind);  // "SparseCategoricalCrossentropy"
std::optional<LossKind> ParseLossKindName(const std::string& name);

// spec.training.model.loss. Metrics: "accuracy" as Keras resolves it for the
// loss (sparse_categorical_accuracy, categorical_accuracy, binary_accuracy).
struct LossConfig {
  LossKind kind = LossKind::kSparseCategoricalCrossentropy;
  // Unset: true for the mlp shorthand (its last Dense has no activation),
  // false for a layers model (Keras' default).
  std::optional<bool> from_logits;
  bool operator==(const LossConfig&) const = default;
};

// Keras' padding arithmetic along one spatial axis. valid: out =
// floor((in - k) / s) + 1, no padding; same: out = ceil(in / s), total
// padding max((out - 1) s + k - in, 0), the odd element at the end (bottom /
// right), as TensorFlow does; causal: k - 1 before, none after, out =
// floor((in - 1) / s) + 1. out <= 0 means the window does not fit.
struct AxisWindow {
  int64_t out = 0;
  int64_t pad_before = 0;
  int64_t pad_after = 0;
};
AxisWindow KerasAxisWindow(int64_t in, int64_t kernel, int64_t stride, PaddingKind padding);

// Gives every layer without a name Keras' automatic one: the snake_case of
// the class name, then _1, _2, ... for repeats (conv2d, conv2d_1, ...).
void AssignLayerNames(std::vector<LayerConfig>* layers);

// The shape after each layer, per example (no batch dimension), from the
// dataset's example shape (IDX images: {28, 28, 1}; CSV and synthetic rows:
// {features}). Every mistake is reported, each naming the layer —
// "spec.training.model.layers[2] (Conv2D): kernelSize [5, 5] is larger than
// its input's spatial size [3, 3] ..." — in one InvalidArgument status.
// Dense applies to the last axis, as in Keras: [13, 13, 32] -> [13, 13, units].
absl::StatusOr<std::vector<std::vector<int64_t>>> InferLayerShapes(
    const std::vector<LayerConfig>& layers, const std::vector<int64_t>& example_shape);

// Checks the model's output against the data and the loss: the last shape
// must be [num_classes] for the categorical losses and MeanSquaredError, or
// [1] for BinaryCrossentropy (num_classes must then be 2) or MeanSquaredError.
// `shapes` (InferLayerShapes' result, for `layers` on `example_shape`)
// lets the error name the usual cause of an output with several axes: a
// Dense layer that got an image or a sequence where a Flatten was meant.
absl::Status CheckModelOutput(const std::vector<LayerConfig>& layers,
                              const std::vector<int64_t>& example_shape,
                              const std::vector<std::vector<int64_t>>& shapes, int num_classes,
                              const LossConfig& loss);
// The output check alone (the mlp shorthand, whose output is [num_classes]).
absl::Status CheckModelOutput(const std::vector<int64_t>& output_shape, int num_classes,
                              const LossConfig& loss);

// What Keras would warn about at compile time, e.g. a Softmax output with
// fromLogits: true ("... was produced by a Softmax activation and thus does
// not represent logits. Was this intended?"). Empty when nothing to say.
std::vector<std::string> ModelWarnings(const std::vector<LayerConfig>& layers,
                                       const LossConfig& loss);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_MODEL_SPEC_H_

#include "common/model_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace distrain {
namespace {

struct LayerKindEntry {
  LayerKind kind;
  const char* class_name;  // Keras' class
  const char* auto_name;   // Keras' automatic layer name (snake_case of the class)
};

// In the order of the enum.
constexpr LayerKindEntry kLayerKinds[] = {
    // Keras 3 names an Input's layer "input_layer" (Keras 2 said "input_1").
    {LayerKind::kInput, "Input", "input_layer"},
    {LayerKind::kReshape, "Reshape", "reshape"},
    {LayerKind::kConv2D, "Conv2D", "conv2d"},
    {LayerKind::kMaxPooling2D, "MaxPooling2D", "max_pooling2d"},
    {LayerKind::kAveragePooling2D, "AveragePooling2D", "average_pooling2d"},
    {LayerKind::kGlobalAveragePooling2D, "GlobalAveragePooling2D", "global_average_pooling2d"},
    {LayerKind::kFlatten, "Flatten", "flatten"},
    {LayerKind::kDense, "Dense", "dense"},
    {LayerKind::kDropout, "Dropout", "dropout"},
    {LayerKind::kBatchNormalization, "BatchNormalization", "batch_normalization"},
    {LayerKind::kActivation, "Activation", "activation"},
    {LayerKind::kReLU, "ReLU", "re_lu"},
    {LayerKind::kLeakyReLU, "LeakyReLU", "leaky_re_lu"},
    {LayerKind::kELU, "ELU", "elu"},
    {LayerKind::kSoftmax, "Softmax", "softmax"},
    {LayerKind::kRescaling, "Rescaling", "rescaling"},
    {LayerKind::kConv1D, "Conv1D", "conv1d"},
    {LayerKind::kMaxPooling1D, "MaxPooling1D", "max_pooling1d"},
    {LayerKind::kAveragePooling1D, "AveragePooling1D", "average_pooling1d"},
    {LayerKind::kGlobalAveragePooling1D, "GlobalAveragePooling1D", "global_average_pooling1d"},
    {LayerKind::kGlobalMaxPooling2D, "GlobalMaxPooling2D", "global_max_pooling2d"},
    {LayerKind::kGlobalMaxPooling1D, "GlobalMaxPooling1D", "global_max_pooling1d"},
    {LayerKind::kLayerNormalization, "LayerNormalization", "layer_normalization"},
    {LayerKind::kRMSNormalization, "RMSNormalization", "rms_normalization"},
    {LayerKind::kEmbedding, "Embedding", "embedding"},
};

// In the order of the enum; each kind's first entry is the name Keras
// writes (keras.activations.serialize), the later ones its aliases.
constexpr std::pair<ActivationKind, const char*> kActivations[] = {
    {ActivationKind::kLinear, "linear"},
    {ActivationKind::kRelu, "relu"},
    {ActivationKind::kSigmoid, "sigmoid"},
    {ActivationKind::kTanh, "tanh"},
    {ActivationKind::kSoftmax, "softmax"},
    {ActivationKind::kGelu, "gelu"},
    {ActivationKind::kElu, "elu"},
    {ActivationKind::kSelu, "selu"},
    {ActivationKind::kSoftplus, "softplus"},
    {ActivationKind::kSoftsign, "softsign"},
    {ActivationKind::kSilu, "silu"},
    {ActivationKind::kSilu, "swish"},
    {ActivationKind::kHardSigmoid, "hard_sigmoid"},
    {ActivationKind::kHardSilu, "hard_silu"},
    {ActivationKind::kHardSilu, "hard_swish"},
    {ActivationKind::kLeakyRelu, "leaky_relu"},
    {ActivationKind::kRelu6, "relu6"},
    {ActivationKind::kExponential, "exponential"},
    {ActivationKind::kMish, "mish"},
};

constexpr std::pair<LossKind, const char*> kLosses[] = {
    {LossKind::kSparseCategoricalCrossentropy, "SparseCategoricalCrossentropy"},
    {LossKind::kCategoricalCrossentropy, "CategoricalCrossentropy"},
    {LossKind::kBinaryCrossentropy, "BinaryCrossentropy"},
    {LossKind::kMeanSquaredError, "MeanSquaredError"},
};


std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string PairString(const std::array<int64_t, 2>& pair) {
  return absl::StrCat("[", pair[0], ", ", pair[1], "]");
}

// The most elements one variable or one example's activation may have.
constexpr int64_t kMaxTensorElements = (int64_t{1} << 31) - 1;

// Product of the dimensions, saturating so that absurd shapes compare as
// "too many" instead of wrapping.
int64_t Elements(const std::vector<int64_t>& shape) {
  constexpr int64_t kCap = int64_t{1} << 62;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    if (n > kCap / d) return kCap;
    n *= d;
  }
  return n;
}

}  // namespace

const char* PaddingName(PaddingKind padding) {
  switch (padding) {
    case PaddingKind::kSame:
      return "same";
    case PaddingKind::kCausal:
      return "causal";
    case PaddingKind::kValid:
      break;
  }
  return "valid";
}

namespace {

// Collects the problems of one model; every message starts with the layer.
class ModelIssues {
 public:
  void Add(size_t index, LayerKind kind, const std::string& message) {
    lines_.push_back(absl::StrCat("spec.training.model.layers[", index, "] (",
                                  LayerKindName(kind), "): ", message));
  }
  void AddGeneral(const std::string& message) { lines_.push_back(message); }
  bool empty() const { return lines_.empty(); }
  size_t size() const { return lines_.size(); }
  absl::Status ToStatus() const { return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n")); }

 private:
  std::vector<std::string> lines_;
};

// Convolution and pooling: the 2-D window along both spatial axes (a 1-D
// layer's along [steps, 1]). Returns the
// output's spatial size, or nullopt after reporting why there is none.
std::optional<std::array<int64_t, 2>> SpatialOutput(const LayerConfig& layer, size_t index,
                                                    const std::vector<int64_t>& in,
                                                    const std::array<int64_t, 2>& window,
                                                    const char* window_field,
                                                    ModelIssues* issues) {
  const std::array<int64_t, 2> strides = layer.EffectiveStrides();
  const AxisWindow rows = KerasAxisWindow(in[0], window[0], strides[0], layer.padding);
  const AxisWindow cols = KerasAxisWindow(in[1], window[1], strides[1], layer.padding);
  if (rows.out > 0 && cols.out > 0) return std::array<int64_t, 2>{rows.out, cols.out};
  // A 1-D layer's [steps, 1, channels] said as the user wrote it.
  const bool one_d = IsOneDimensional(layer.kind);
  const std::string size = one_d ? absl::StrCat(window[0]) : PairString(window);
  const std::string spatial =
      one_d ? absl::StrCat("length ", in[0]) : absl::StrCat("spatial size [", in[0], ", ", in[1], "]");
  const std::string input = one_d ? ShapeString({in[0], in[2]}) : ShapeString(in);
  issues->Add(index, layer.kind,
              absl::StrCat(window_field, " ", size, " is larger than its input's ", spatial,
                           " (input ", input, ", padding ", PaddingName(layer.padding),
                           "); use a smaller ", window_field,
                           layer.padding == PaddingKind::kValid ? ", padding: same," : "",
                           " or remove a downsampling layer before it"));
  return std::nullopt;
}

// Argument checks that need no shape; true when the layer's own arguments
// are fine.
bool CheckArguments(const LayerConfig& layer, size_t index, ModelIssues* issues) {
  const size_t before = issues->size();
  auto positive_pair = [&](const std::array<int64_t, 2>& pair, const char* field) {
    if (pair[0] < 1 || pair[1] < 1) {
      issues->Add(index, layer.kind,
                  absl::StrCat(field, " must be positive integers, got ", PairString(pair)));
    }
  };
  if (layer.padding == PaddingKind::kCausal && layer.kind != LayerKind::kConv1D) {
    issues->Add(index, layer.kind,
                "padding causal is Conv1D's only (as in Keras); use valid or same");
  }
  switch (layer.kind) {
    case LayerKind::kInput:
      if (layer.shape.empty() || Elements(layer.shape) == 0) {
        issues->Add(index, layer.kind,
                    absl::StrCat("shape must be a non-empty list of positive integers (the "
                                 "example's shape without the batch), got ",
                                 ShapeString(layer.shape)));
      }
      break;
    case LayerKind::kReshape: {
      int unknowns = 0;
      bool bad = layer.shape.empty();
      for (int64_t d : layer.shape) {
        if (d == -1) {
          ++unknowns;
        } else if (d < 1) {
          bad = true;
        }
      }
      if (bad) {
        issues->Add(index, layer.kind,
                    absl::StrCat("targetShape must be a non-empty list of positive integers (one "
                                 "may be -1), got ",
                                 ShapeString(layer.shape)));
      }
      if (unknowns > 1) {
        issues->Add(index, layer.kind,
                    absl::StrCat("targetShape ", ShapeString(layer.shape), " has ", unknowns,
                                 " entries of -1; at most one dimension can be inferred"));
      }
      break;
    }
    case LayerKind::kConv2D:
    case LayerKind::kConv1D:
      if (layer.filters < 1) {
        issues->Add(index, layer.kind,
                    absl::StrCat("filters must be a positive integer, got ", layer.filters));
      }
      positive_pair(layer.kernel_size, "kernelSize");
      if (layer.strides) positive_pair(*layer.strides, "strides");
      break;
    case LayerKind::kMaxPooling2D:
    case LayerKind::kAveragePooling2D:
    case LayerKind::kMaxPooling1D:
    case LayerKind::kAveragePooling1D:
      positive_pair(layer.pool_size, "poolSize");
      if (layer.strides) positive_pair(*layer.strides, "strides");
      break;
    case LayerKind::kEmbedding:
      if (layer.input_dim < 1) {
        issues->Add(index, layer.kind,
                    absl::StrCat("inputDim (the vocabulary size) must be a positive integer, got ",
                                 layer.input_dim));
      }
      if (layer.output_dim < 1) {
        issues->Add(index, layer.kind,
                    absl::StrCat("outputDim must be a positive integer, got ", layer.output_dim));
      }
      break;
    case LayerKind::kDense:
      if (layer.units < 1) {
        issues->Add(index, layer.kind,
                    absl::StrCat("units must be a positive integer, got ", layer.units));
      }
      break;
    case LayerKind::kDropout:
      if (!(layer.rate >= 0 && layer.rate < 1)) {
        issues->Add(index, layer.kind,
                    absl::StrCat("rate must be in [0, 1) (the fraction of inputs dropped), got ",
                                 layer.rate));
      }
      break;
    case LayerKind::kBatchNormalization:
      if (!(layer.momentum >= 0 && layer.momentum <= 1)) {
        issues->Add(index, layer.kind,
                    absl::StrCat("momentum must be in [0, 1], got ", layer.momentum));
      }
      [[fallthrough]];
    case LayerKind::kLayerNormalization:
    case LayerKind::kRMSNormalization:
      if (!(layer.epsilon > 0 && std::isfinite(layer.epsilon))) {
        issues->Add(index, layer.kind,
                    absl::StrCat("epsilon must be a positive number, got ", layer.epsilon));
      }
      break;
    case LayerKind::kReLU:
      if (layer.threshold != 0) {
        issues->Add(index, layer.kind,
                    absl::StrCat("threshold ", layer.threshold,
                                 " is not supported; distrain's ReLU has threshold 0"));
      }
      if (layer.max_value && *layer.max_value != 6) {
        issues->Add(index, layer.kind,
                    absl::StrCat("maxValue ", *layer.max_value,
                                 " is not supported; use maxValue: 6 (relu6) or leave it unset"));
      }
      if (layer.max_value && layer.negative_slope.value_or(0) != 0) {
        issues->Add(index, layer.kind,
                    "maxValue and negativeSlope together are not supported; use ReLU: "
                    "{maxValue: 6} or LeakyReLU: {negativeSlope: ...}");
      }
      [[fallthrough]];
    case LayerKind::kLeakyReLU:
      if (layer.negative_slope &&
          !(*layer.negative_slope >= 0 && std::isfinite(*layer.negative_slope))) {
        issues->Add(index, layer.kind,
                    absl::StrCat("negativeSlope must be a number >= 0, got ",
                                 *layer.negative_slope));
      }
      break;
    case LayerKind::kELU:
      // ELU's gradient is read off its output, which a negative alpha would
      // make positive below 0 too.
      if (!(std::isfinite(layer.alpha) && layer.alpha >= 0)) {
        issues->Add(index, layer.kind,
                    absl::StrCat("alpha must be a finite number >= 0, got ", layer.alpha));
      }
      break;
    case LayerKind::kRescaling:
      if (!std::isfinite(layer.scale) || !std::isfinite(layer.offset)) {
        issues->Add(index, layer.kind,
                    absl::StrCat("scale and offset must be finite numbers, got scale ",
                                 layer.scale, ", offset ", layer.offset));
      }
      break;
    case LayerKind::kGlobalAveragePooling2D:
    case LayerKind::kGlobalAveragePooling1D:
    case LayerKind::kGlobalMaxPooling2D:
    case LayerKind::kGlobalMaxPooling1D:
    case LayerKind::kFlatten:
    case LayerKind::kActivation:
    case LayerKind::kSoftmax:
      break;
  }
  if (layer.name.find('/') != std::string::npos) {
    issues->Add(index, layer.kind,
                absl::StrCat("name \"", layer.name,
                             "\" contains '/', which separates a layer's name from its variables' "
                             "(\"<name>/kernel\"); choose a name without '/'"));
  }
  return issues->size() == before;
}

}  // namespace

// ---------------------------------------------------------------------------

const char* LayerKindName(LayerKind kind) {
  for (const LayerKindEntry& e : kLayerKinds) {
    if (e.kind == kind) return e.class_name;
  }
  return "Unknown";
}

double DefaultEpsilon(LayerKind kind) {
  return kind == LayerKind::kRMSNormalization ? 1e-6 : 1e-3;
}

bool IsOneDimensional(LayerKind kind) {
  return kind == LayerKind::kConv1D || kind == LayerKind::kMaxPooling1D ||
         kind == LayerKind::kAveragePooling1D || kind == LayerKind::kGlobalAveragePooling1D ||
         kind == LayerKind::kGlobalMaxPooling1D;
}

std::optional<LayerKind> ParseLayerKind(const std::string& class_name) {
  for (const LayerKindEntry& e : kLayerKinds) {
    if (class_name == e.class_name) return e.kind;
  }
  return std::nullopt;
}

std::vector<std::string> LayerKindNames() {
  std::vector<std::string> names;
  for (const LayerKindEntry& e : kLayerKinds) names.push_back(e.class_name);
  return names;
}

const char* ActivationName(ActivationKind kind) {
  for (const auto& [k, name] : kActivations) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::optional<ActivationKind> ParseActivationName(const std::string& name) {
  for (const auto& [k, n] : kActivations) {
    if (name == n) return k;
  }
  return std::nullopt;
}

std::vector<std::string> ActivationNames(bool with_aliases) {
  std::vector<std::string> names;
  for (const auto& [k, n] : kActivations) {
    if (with_aliases || names.empty() || ParseActivationName(names.back()) != k) {
      names.push_back(n);
    }
  }
  return names;
}

const char* LossKindName(LossKind kind) {
  for (const auto& [k, name] : kLosses) {
    if (k == kind) return name;
  }
  return "Unknown";
}

std::optional<LossKind> ParseLossKindName(const std::string& name) {
  for (const auto& [k, n] : kLosses) {
    if (name == n) return k;
  }
  return std::nullopt;
}

ActivationFunction LayerConfig::Activation() const {
  switch (kind) {
    case LayerKind::kDense:
    case LayerKind::kConv2D:
    case LayerKind::kConv1D:
    case LayerKind::kActivation:
      return activation;
    case LayerKind::kReLU:
      // Keras' ReLU(max_value, negative_slope, threshold) in the forms
      // CheckArguments accepts: relu, relu6, or a leaky ReLU.
      if (max_value) return ActivationKind::kRelu6;
      if (negative_slope.value_or(0.0) > 0) {
        return {ActivationKind::kLeakyRelu, static_cast<float>(*negative_slope)};
      }
      return ActivationKind::kRelu;
    case LayerKind::kLeakyReLU:
      return {ActivationKind::kLeakyRelu, static_cast<float>(negative_slope.value_or(0.3))};
    case LayerKind::kELU:
      return {ActivationKind::kElu, static_cast<float>(alpha)};
    case LayerKind::kSoftmax:
      return ActivationKind::kSoftmax;
    default:
      return ActivationKind::kLinear;
  }
}

std::array<int64_t, 2> LayerConfig::EffectiveStrides() const {
  if (strides) return *strides;
  // Keras: pooling layers stride by their window unless told otherwise.
  if (kind == LayerKind::kMaxPooling2D || kind == LayerKind::kAveragePooling2D ||
      kind == LayerKind::kMaxPooling1D || kind == LayerKind::kAveragePooling1D) {
    return pool_size;
  }
  return {1, 1};
}

AxisWindow KerasAxisWindow(int64_t in, int64_t kernel, int64_t stride, PaddingKind padding) {
  AxisWindow w;
  if (in <= 0 || kernel <= 0 || stride <= 0) return w;
  if (padding == PaddingKind::kValid) {
    // floor((in - k) / s) + 1 with a true floor: a kernel larger than the
    // input gives out <= 0 rather than C++'s truncation towards zero.
    const int64_t span = in - kernel;
    const int64_t q = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
    w.out = q + 1;
    return w;
  }
  if (padding == PaddingKind::kCausal) {
    w.out = (in - 1) / stride + 1;
    w.pad_before = kernel - 1;
    return w;
  }
  w.out = (in + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((w.out - 1) * stride + kernel - in, 0);
  // TensorFlow puts the odd element of padding after (bottom / right).
  w.pad_before = total / 2;
  w.pad_after = total - w.pad_before;
  return w;
}

const char* LayerKindSnakeName(LayerKind kind) {
  for (const LayerKindEntry& e : kLayerKinds) {
    if (e.kind == kind) return e.auto_name;
  }
  return "layer";
}

void AssignLayerNames(std::vector<LayerConfig>* layers) {
  // Names the user chose stay, and automatic names step around them, so a
  // user's "dense_1" and an unnamed Dense never collide.
  std::set<std::string> taken;
  for (const LayerConfig& layer : *layers) {
    if (!layer.name.empty()) taken.insert(layer.name);
  }
  std::map<LayerKind, int> next;  // per class, like Keras' per-prefix counter
  for (LayerConfig& layer : *layers) {
    if (!layer.name.empty()) continue;
    const std::string base = LayerKindSnakeName(layer.kind);
    int& n = next[layer.kind];
    std::string name;
    do {
      name = n == 0 ? base : absl::StrCat(base, "_", n);
      ++n;
    } while (taken.count(name));
    taken.insert(name);
    layer.name = std::move(name);
  }
}

absl::StatusOr<std::vector<std::vector<int64_t>>> InferLayerShapes(
    const std::vector<LayerConfig>& layers, const std::vector<int64_t>& example_shape) {
  ModelIssues issues;
  std::optional<std::vector<int64_t>> current;  // nullopt: unknown after an error
  if (example_shape.empty() || Elements(example_shape) == 0) {
    issues.AddGeneral(absl::StrCat("spec.training.dataset: the example shape ",
                                   ShapeString(example_shape),
                                   " is not a list of positive sizes; check the dataset"));
  } else {
    current = example_shape;
  }

  std::vector<std::vector<int64_t>> shapes;
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& layer = layers[i];
    if (!layer.name.empty()) {
      auto [it, inserted] = names.emplace(layer.name, i);
      if (!inserted) {
        issues.Add(i, layer.kind,
                   absl::StrCat("name \"", layer.name, "\" is already used by layers[",
                                it->second, "]; layer names must be unique (they name the "
                                            "variables in checkpoints)"));
      }
    }
    const bool arguments_ok = CheckArguments(layer, i, &issues);
    std::optional<std::vector<int64_t>> out;
    const std::string in_text = current ? ShapeString(*current) : "";
    switch (layer.kind) {
      case LayerKind::kInput:
        if (i != 0) {
          issues.Add(i, layer.kind,
                     "Input must be the first layer (it declares the example's shape); move it "
                     "to layers[0] or remove it");
        }
        if (arguments_ok) {
          out = layer.shape;
          if (i == 0 && current && *current != layer.shape) {
            issues.Add(i, layer.kind,
                       absl::StrCat("shape ", ShapeString(layer.shape),
                                    " differs from the dataset's example shape ", in_text,
                                    "; set shape: ", in_text,
                                    ", or add a Reshape after the Input"));
          }
        }
        break;
      case LayerKind::kReshape: {
        if (!arguments_ok || !current) break;
        const int64_t in_elements = Elements(*current);
        int64_t known = 1;
        int unknown_at = -1;
        for (size_t d = 0; d < layer.shape.size(); ++d) {
          if (layer.shape[d] == -1) {
            unknown_at = static_cast<int>(d);
          } else {
            known = Elements({known, layer.shape[d]});
          }
        }
        if (unknown_at < 0 && known != in_elements) {
          issues.Add(i, layer.kind,
                     absl::StrCat("targetShape ", ShapeString(layer.shape), " has ", known,
                                  " elements but its input ", in_text, " has ", in_elements,
                                  "; the element counts must match"));
        } else if (unknown_at >= 0 && in_elements % known != 0) {
          issues.Add(i, layer.kind,
                     absl::StrCat("targetShape ", ShapeString(layer.shape), ": its input ",
                                  in_text, " has ", in_elements,
                                  " elements, which is not a multiple of ", known,
                                  ", so the -1 dimension cannot be inferred"));
        } else {
          out = layer.shape;
          if (unknown_at >= 0) (*out)[unknown_at] = in_elements / known;
        }
        break;
      }
      case LayerKind::kConv2D:
      case LayerKind::kMaxPooling2D:
      case LayerKind::kAveragePooling2D:
      case LayerKind::kGlobalAveragePooling2D:
      case LayerKind::kGlobalMaxPooling2D:
      case LayerKind::kConv1D:
      case LayerKind::kMaxPooling1D:
      case LayerKind::kAveragePooling1D:
      case LayerKind::kGlobalAveragePooling1D:
      case LayerKind::kGlobalMaxPooling1D: {
        if (!current) break;
        // A 1-D layer is the 2-D arithmetic on [steps, 1, channels]; its
        // window's second axis is 1, so only the steps can be too short.
        const bool one_d = IsOneDimensional(layer.kind);
        if (current->size() != (one_d ? 2u : 3u)) {
          std::string fix;
          if (one_d) {
            fix = current->size() == 1 ? absl::StrCat("add Reshape: {targetShape: [",
                                                      (*current)[0], ", 1]} before it")
                                       : "add a Reshape to [steps, channels] before it";
          } else if (current->size() == 1) {
            // A row of features: suggest the square image it may be.
            const int64_t n = (*current)[0];
            int64_t side = 1;
            while ((side + 1) * (side + 1) <= n) ++side;
            fix = side * side == n && side > 1
                      ? absl::StrCat("add Reshape: {targetShape: [", side, ", ", side,
                                     ", 1]} before it")
                      : "add a Reshape to [rows, cols, channels] before it";
          } else {
            fix = "add Flatten and Dense layers instead";
          }
          issues.Add(i, layer.kind,
                     absl::StrCat(one_d ? "expects a 2-D input [steps, channels] but gets "
                                        : "expects a 3-D input [rows, cols, channels] but gets ",
                                  in_text, "; ", fix));
          break;
        }
        if (!arguments_ok) break;
        const std::vector<int64_t> image =
            one_d ? std::vector<int64_t>{(*current)[0], 1, (*current)[1]} : *current;
        const int64_t channels = image[2];
        const bool global = layer.kind == LayerKind::kGlobalAveragePooling2D ||
                            layer.kind == LayerKind::kGlobalMaxPooling2D ||
                            layer.kind == LayerKind::kGlobalAveragePooling1D ||
                            layer.kind == LayerKind::kGlobalMaxPooling1D;
        if (global) {
          out = std::vector<int64_t>{channels};
          break;
        }
        const bool conv = layer.kind == LayerKind::kConv2D || layer.kind == LayerKind::kConv1D;
        std::optional<std::array<int64_t, 2>> spatial =
            SpatialOutput(layer, i, image, conv ? layer.kernel_size : layer.pool_size,
                          conv ? "kernelSize" : "poolSize", &issues);
        if (spatial) {
          const int64_t out_channels = conv ? layer.filters : channels;
          out = one_d ? std::vector<int64_t>{(*spatial)[0], out_channels}
                      : std::vector<int64_t>{(*spatial)[0], (*spatial)[1], out_channels};
        }
        break;
      }
      case LayerKind::kFlatten:
        if (current) out = std::vector<int64_t>{Elements(*current)};
        break;
      case LayerKind::kEmbedding:
        // Token ids are the model's input itself: a layer before would hand
        // it real numbers, and nothing could pass a gradient through ids.
        if (i != 0 && !(i == 1 && layers[0].kind == LayerKind::kInput)) {
          issues.Add(i, layer.kind,
                     "Embedding reads the integer token ids the dataset holds, so it must be "
                     "the first layer (after Input); move it to layers[0]");
        }
        if (current && arguments_ok) {
          out = *current;
          out->push_back(layer.output_dim);
        }
        break;
      case LayerKind::kDense:
        // As Keras: the last axis only, each position on its own ([steps,
        // features] -> [steps, units]; on an image, a 1x1 convolution).
        if (arguments_ok && current) {
          out = *current;
          out->back() = layer.units;
        }
        break;
      case LayerKind::kSoftmax:
      case LayerKind::kBatchNormalization:
      case LayerKind::kLayerNormalization:
      case LayerKind::kRMSNormalization:
        // Keras counts the batch as axis 0, so the last axis is the rank.
        if (current && layer.axis != -1 && layer.axis != static_cast<int64_t>(current->size())) {
          const char* what = layer.kind == LayerKind::kSoftmax
                                 ? "distrain's softmax is over the last axis"
                                 : "distrain normalises the last axis (features, or channels)";
          issues.Add(i, layer.kind,
                     absl::StrCat("axis ", layer.axis, " is not supported; ", what,
                                  ": use axis: -1 (here also ", current->size(),
                                  ", for the input ", in_text, ")"));
        }
        out = current;
        break;
      case LayerKind::kDropout:
      case LayerKind::kActivation:
      case LayerKind::kReLU:
      case LayerKind::kLeakyReLU:
      case LayerKind::kELU:
      case LayerKind::kRescaling:
        out = current;
        break;
    }
    // Sizes a process can hold: every variable and every example's output
    // within int32 indexing (what BLAS, oneDNN and cuDNN's extents take),
    // so an absurd kernelSize, filters or units is refused here by name
    // instead of failing an allocation when the model is built.
    if (out && current) {
      std::optional<std::pair<int64_t, std::string>> kernel;
      if (layer.kind == LayerKind::kConv2D && current->size() == 3) {
        kernel = {{Elements({layer.kernel_size[0], layer.kernel_size[1], (*current)[2],
                             layer.filters}),
                   "kernelSize x input channels x filters"}};
      } else if (layer.kind == LayerKind::kConv1D && current->size() == 2) {
        kernel = {{Elements({layer.kernel_size[0], (*current)[1], layer.filters}),
                   "kernelSize x input channels x filters"}};
      } else if (layer.kind == LayerKind::kDense) {
        kernel = {{Elements({current->back(), layer.units}), "input features x units"}};
      } else if (layer.kind == LayerKind::kEmbedding) {
        kernel = {{Elements({layer.input_dim, layer.output_dim}), "inputDim x outputDim"}};
      }
      if (kernel && kernel->first > kMaxTensorElements) {
        issues.Add(i, layer.kind,
                   absl::StrCat("its kernel would hold ", kernel->first, " floats (",
                                kernel->second, "), more than the ", kMaxTensorElements,
                                " one variable may hold; make it smaller"));
      } else if (Elements(*out) > kMaxTensorElements) {
        issues.Add(i, layer.kind,
                   absl::StrCat("its output ", ShapeString(*out), " would hold ",
                                Elements(*out), " floats per example, more than the ",
                                kMaxTensorElements, " a tensor may hold; make it smaller"));
      }
    }
    current = out;
    shapes.push_back(out.value_or(std::vector<int64_t>{}));
  }
  if (!issues.empty()) return issues.ToStatus();
  return shapes;
}

namespace {

// CheckModelOutput's rule. `multi_axis_advice`, when not empty, replaces the
// advice ("end the model with ...") for an output of several axes.
absl::Status CheckOutput(const std::vector<int64_t>& output_shape, int num_classes,
                         const LossConfig& loss, const std::string& multi_axis_advice) {
  const std::string got = ShapeString(output_shape);
  const char* loss_name = LossKindName(loss.kind);
  const bool rank1 = output_shape.size() == 1;
  const std::string classes =
      num_classes > 0 ? absl::StrCat(num_classes) : std::string("the number of classes");
  auto advice = [&](const std::string& usual) {
    return !rank1 && !multi_axis_advice.empty() ? multi_axis_advice : usual;
  };
  switch (loss.kind) {
    case LossKind::kSparseCategoricalCrossentropy:
    case LossKind::kCategoricalCrossentropy:
      if (!rank1 || (num_classes > 0 && output_shape[0] != num_classes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.training.model.layers: the model's output is ", got, " but ", loss_name,
            " needs one value per class, [", classes, "]; ",
            advice(absl::StrCat("end the model with Dense: {units: ", classes, "}",
                                rank1 ? "" : " after a Flatten"))));
      }
      break;
    case LossKind::kBinaryCrossentropy:
      if (num_classes > 0 && num_classes != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.training.model.loss.type: BinaryCrossentropy needs labels 0 and 1, but the "
            "dataset has ",
            num_classes,
            " classes; use SparseCategoricalCrossentropy or set spec.training.dataset.numClasses: "
            "2"));
      }
      if (!rank1 || output_shape[0] != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.training.model.layers: the model's output is ", got,
            " but BinaryCrossentropy needs [1] (the probability, or logit, of class 1); ",
            advice("end the model with Dense: {units: 1}")));
      }
      break;
    case LossKind::kMeanSquaredError:
      if (!rank1 || (output_shape[0] != 1 && num_classes > 0 && output_shape[0] != num_classes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.training.model.layers: the model's output is ", got,
            " but MeanSquaredError needs [", classes, "] (one-hot targets) or [1] (the label's "
            "value); ",
            advice(absl::StrCat("end the model with Dense: {units: ", classes,
                                "} or Dense: {units: 1}"))));
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckModelOutput(const std::vector<LayerConfig>& layers,
                              const std::vector<int64_t>& example_shape,
                              const std::vector<std::vector<int64_t>>& shapes, int num_classes,
                              const LossConfig& loss) {
  // An output of several axes usually comes from a Dense layer given an
  // image or a sequence where a Flatten was meant; the advice to end the
  // model with a Dense layer would then be moot: it has one.
  std::string dense_advice;
  for (size_t i = 0; i < layers.size() && i < shapes.size(); ++i) {
    const std::vector<int64_t>& in = i == 0 ? example_shape : shapes[i - 1];
    if (layers[i].kind != LayerKind::kDense || in.size() < 2) continue;
    dense_advice = absl::StrCat("layers[", i, "] (Dense) gets ", ShapeString(in),
                                " and, as in Keras, applies to its last axis only: add Flatten "
                                "(or a global pooling) before it");
    break;
  }
  return CheckOutput(shapes.empty() ? example_shape : shapes.back(), num_classes, loss,
                     dense_advice);
}

absl::Status CheckModelOutput(const std::vector<int64_t>& output_shape, int num_classes,
                              const LossConfig& loss) {
  return CheckOutput(output_shape, num_classes, loss, "");
}

std::vector<std::string> ModelWarnings(const std::vector<LayerConfig>& layers,
                                       const LossConfig& loss) {
  std::vector<std::string> warnings;
  if (layers.empty() || !loss.from_logits.value_or(false)) return warnings;
  // Keras looks at the op that produced the output tensor, so only the last
  // layer counts: a Flatten or Dropout after a softmax hides it from Keras too.
  const LayerConfig& last = layers.back();
  const char* fn = nullptr;
  const char* op = nullptr;
  switch (loss.kind) {
    case LossKind::kSparseCategoricalCrossentropy:
      fn = "sparse_categorical_crossentropy";
      op = "Softmax";
      break;
    case LossKind::kCategoricalCrossentropy:
      fn = "categorical_crossentropy";
      op = "Softmax";
      break;
    case LossKind::kBinaryCrossentropy:
      fn = "binary_crossentropy";
      op = "Sigmoid";
      break;
    case LossKind::kMeanSquaredError:
      return warnings;
  }
  // Keras 3 marks the output of either activation with its logits and every
  // cross-entropy then reads those and warns — naming the loss's own op
  // (a sigmoid before sparse_categorical_crossentropy is "a Softmax"), as
  // the loss computed in model.cc does too.
  const ActivationKind activation = last.Activation().kind;
  if (activation != ActivationKind::kSoftmax && activation != ActivationKind::kSigmoid) {
    return warnings;
  }
  // Keras' own wording, so a Keras user recognises it, then where and the fix.
  warnings.push_back(absl::StrCat(
      "`", fn, "` received `from_logits=True`, but the `output` argument was produced by a ", op,
      " activation and thus does not represent logits. Was this intended? "
      "(spec.training.model.layers[",
      layers.size() - 1, "] (", LayerKindName(last.kind), ") has activation: ",
      ActivationName(activation),
      " and spec.training.model.loss.fromLogits is true; remove the activation or set "
      "fromLogits: false)"));
  return warnings;
}

}  // namespace distrain

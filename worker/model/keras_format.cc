#include "worker/model/keras_format.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "worker/model/keras_archive.h"
#include "worker/model/model.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

// What the checkpoint names a variable and an optimizer slot
// (worker/strategy/variable_state.h).
std::string CheckpointVariable(const std::string& name) { return "variables/" + name; }
std::string CheckpointSlot(const std::string& name, const char* slot) {
  return absl::StrCat("optimizer/", name, "/", slot);
}
constexpr char kIterationsKey[] = "optimizer_iterations";

// ---------------------------------------------------------------------------
// Export: the Sequential Keras would have built.

// The model's layers as Keras layers: a layers model as written (names
// assigned); the mlp shorthand spelled out as the Sequential it is —
// [Flatten,] Dense(h, relu)..., Dense(classes) — named after its variables
// ("dense_0/kernel"), so the checkpoint's tensors map by name either way.
std::vector<LayerConfig> KerasLayersOf(const KerasModelSpec& spec) {
  if (spec.model.type != "mlp" || !spec.model.layers.empty()) {
    std::vector<LayerConfig> layers = spec.model.layers;
    AssignLayerNames(&layers);
    return layers;
  }
  std::vector<LayerConfig> layers;
  if (spec.example_shape.size() > 1) {
    LayerConfig flatten;
    flatten.kind = LayerKind::kFlatten;
    flatten.name = "flatten";
    layers.push_back(flatten);
  }
  std::vector<int64_t> units(spec.model.hidden_units.begin(), spec.model.hidden_units.end());
  units.push_back(spec.num_classes);
  for (size_t d = 0; d < units.size(); ++d) {
    LayerConfig dense;
    dense.kind = LayerKind::kDense;
    dense.name = absl::StrCat("dense_", d);
    dense.units = units[d];
    dense.activation = d + 1 < units.size() ? ActivationKind::kRelu : ActivationKind::kLinear;
    layers.push_back(dense);
  }
  return layers;
}

// The loss's from_logits as the model trains it (LossConfig: unset means
// true for the mlp, whose output is logits, false for a layers model).
bool ResolvedFromLogits(const KerasModelSpec& spec) {
  const bool mlp = spec.model.type == "mlp" && spec.model.layers.empty();
  return spec.model.loss.from_logits.value_or(mlp);
}

Json Pair(const std::array<int64_t, 2>& v) { return Json::array({v[0], v[1]}); }

Json BatchShape(const std::vector<int64_t>& shape) {
  Json out = Json::array({nullptr});
  for (int64_t d : shape) out.push_back(d);
  return out;
}

// spec.training.precision as Keras 3 serializes a layer's dtype policy:
// mixed policies are plain DTypePolicy objects carrying the mixed name
// (variables float32, compute in the 16-bit type), exactly what
// keras.config.set_dtype_policy("mixed_bfloat16") makes every layer write.
Json DTypePolicy(Precision precision) {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", PrecisionName(precision)}}},
          {"registered_name", nullptr}};
}

Json Serialized(const char* module, const char* class_name, Json config) {
  return {{"module", module},
          {"class_name", class_name},
          {"config", std::move(config)},
          {"registered_name", nullptr}};
}

Json Initializer(const char* class_name) {
  // Keras' defaults, which distrain's initialisers follow (initializers.h).
  Json config = Json::object();
  if (std::string(class_name) == "GlorotUniform") config["seed"] = nullptr;
  if (std::string(class_name) == "RandomUniform") {  // Embedding's "uniform"
    config = {{"seed", nullptr}, {"minval", -0.05}, {"maxval", 0.05}};
  }
  return Serialized("keras.initializers", class_name, std::move(config));
}

// What Conv2D and Dense share: the bias switch and Keras' default
// initialisers (what distrain's initializers.h follows), no regularizers or
// constraints.
void AddKernelArguments(const LayerConfig& layer, Json* c) {
  (*c)["use_bias"] = layer.use_bias;
  (*c)["kernel_initializer"] = Initializer("GlorotUniform");
  (*c)["bias_initializer"] = Initializer("Zeros");
  for (const char* key :
       {"kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint"}) {
    (*c)[key] = nullptr;
  }
}

// A size or stride as Keras writes it: a pair, or a 1-D layer's [length].
Json KerasSize(const LayerConfig& layer, const std::array<int64_t, 2>& size) {
  if (IsOneDimensional(layer.kind)) return Json::array({size[0]});
  return Pair(size);
}

// One layer's config as Keras' get_config() writes it, restricted to keys
// every Keras 3 release accepts (from_config rejects unknown keywords). The
// InputLayer's "dtype" is the input tensor's type, not a policy: float32
// under every policy, as Keras writes it.
Json KerasLayerConfig(const LayerConfig& layer, Precision precision) {
  Json c = {{"name", layer.name}, {"trainable", true}, {"dtype", DTypePolicy(precision)}};
  switch (layer.kind) {
    case LayerKind::kInput:
      return {{"batch_shape", BatchShape(layer.shape)},
              {"dtype", "float32"},
              {"sparse", false},
              {"name", layer.name}};
    case LayerKind::kReshape:
      c["target_shape"] = layer.shape;
      break;
    case LayerKind::kConv2D:
    case LayerKind::kConv1D:
      c["filters"] = layer.filters;
      c["kernel_size"] = KerasSize(layer, layer.kernel_size);
      c["strides"] = KerasSize(layer, layer.EffectiveStrides());
      c["padding"] = PaddingName(layer.padding);
      c["data_format"] = "channels_last";
      c["dilation_rate"] = KerasSize(layer, {1, 1});
      c["groups"] = 1;
      c["activation"] = ActivationName(layer.activation);
      AddKernelArguments(layer, &c);
      c["activity_regularizer"] = nullptr;
      break;
    case LayerKind::kMaxPooling2D:
    case LayerKind::kAveragePooling2D:
    case LayerKind::kMaxPooling1D:
    case LayerKind::kAveragePooling1D:
      c["pool_size"] = KerasSize(layer, layer.pool_size);
      c["padding"] = layer.padding == PaddingKind::kSame ? "same" : "valid";
      c["strides"] = KerasSize(layer, layer.EffectiveStrides());
      c["data_format"] = "channels_last";
      break;
    case LayerKind::kGlobalAveragePooling2D:
    case LayerKind::kGlobalAveragePooling1D:
    case LayerKind::kGlobalMaxPooling2D:
    case LayerKind::kGlobalMaxPooling1D:
      c["data_format"] = "channels_last";
      c["keepdims"] = false;
      break;
    case LayerKind::kFlatten:
      c["data_format"] = "channels_last";
      break;
    case LayerKind::kDense:
      c["units"] = layer.units;
      c["activation"] = ActivationName(layer.activation);
      AddKernelArguments(layer, &c);
      break;
    case LayerKind::kDropout:
      c["rate"] = layer.rate;
      c["seed"] = nullptr;
      c["noise_shape"] = nullptr;
      break;
    case LayerKind::kBatchNormalization:
      c["axis"] = -1;
      c["momentum"] = layer.momentum;
      c["epsilon"] = layer.epsilon;
      c["center"] = true;
      c["scale"] = true;
      c["beta_initializer"] = Initializer("Zeros");
      c["gamma_initializer"] = Initializer("Ones");
      c["moving_mean_initializer"] = Initializer("Zeros");
      c["moving_variance_initializer"] = Initializer("Ones");
      c["beta_regularizer"] = nullptr;
      c["gamma_regularizer"] = nullptr;
      c["beta_constraint"] = nullptr;
      c["gamma_constraint"] = nullptr;
      c["synchronized"] = false;
      break;
    case LayerKind::kLayerNormalization:
      c["axis"] = Json::array({-1});
      c["epsilon"] = layer.epsilon;
      c["center"] = layer.center;
      c["scale"] = layer.scale_output;
      c["rms_scaling"] = false;
      c["beta_initializer"] = Initializer("Zeros");
      c["gamma_initializer"] = Initializer("Ones");
      c["beta_regularizer"] = nullptr;
      c["gamma_regularizer"] = nullptr;
      c["beta_constraint"] = nullptr;
      c["gamma_constraint"] = nullptr;
      break;
    case LayerKind::kRMSNormalization:
      c["axis"] = Json::array({-1});
      c["epsilon"] = layer.epsilon;
      break;
    case LayerKind::kEmbedding:
      c["input_dim"] = layer.input_dim;
      c["output_dim"] = layer.output_dim;
      c["embeddings_initializer"] = Initializer("RandomUniform");
      c["embeddings_regularizer"] = nullptr;
      c["activity_regularizer"] = nullptr;
      c["embeddings_constraint"] = nullptr;
      c["mask_zero"] = false;
      break;
    case LayerKind::kActivation:
      c["activation"] = ActivationName(layer.activation);
      break;
    case LayerKind::kReLU:
      c["max_value"] = layer.max_value ? Json(*layer.max_value) : Json(nullptr);
      c["negative_slope"] = layer.negative_slope.value_or(0.0);
      c["threshold"] = layer.threshold;
      break;
    case LayerKind::kLeakyReLU:
      c["negative_slope"] = layer.Activation().alpha;
      break;
    case LayerKind::kELU:
      c["alpha"] = layer.alpha;
      break;
    case LayerKind::kSoftmax:
      c["axis"] = layer.axis;
      break;
    case LayerKind::kRescaling:
      c["scale"] = layer.scale;
      c["offset"] = layer.offset;
      break;
  }
  return c;
}

const char* KerasClassName(LayerKind kind) {
  return kind == LayerKind::kInput ? "InputLayer" : LayerKindName(kind);
}

Json KerasLoss(const KerasModelSpec& spec) {
  const bool from_logits = ResolvedFromLogits(spec);
  Json config = {{"reduction", "sum_over_batch_size"}};
  switch (spec.model.loss.kind) {
    case LossKind::kSparseCategoricalCrossentropy:
      config["name"] = "sparse_categorical_crossentropy";
      config["from_logits"] = from_logits;
      config["ignore_class"] = nullptr;
      break;
    case LossKind::kCategoricalCrossentropy:
      config["name"] = "categorical_crossentropy";
      config["from_logits"] = from_logits;
      config["label_smoothing"] = 0.0;
      config["axis"] = -1;
      break;
    case LossKind::kBinaryCrossentropy:
      config["name"] = "binary_crossentropy";
      config["from_logits"] = from_logits;
      config["label_smoothing"] = 0.0;
      config["axis"] = -1;
      break;
    case LossKind::kMeanSquaredError:
      config["name"] = "mean_squared_error";
      break;
  }
  return Serialized("keras.losses", LossKindName(spec.model.loss.kind), std::move(config));
}

// Keras' optimizer name (the optimizer group's "name" attribute too).
const char* KerasOptimizerName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kRmsprop:
      return "rmsprop";
    case OptimizerType::kSgd:
    case OptimizerType::kMomentum:
      break;
  }
  return "SGD";
}

// spec.training.optimizer.schedule's Keras class names, in the order of the
// enum (Constant is no schedule: a plain learning_rate).
constexpr const char* kScheduleClasses[] = {"Constant",       "ExponentialDecay",
                                            "InverseTimeDecay", "PolynomialDecay",
                                            "PiecewiseConstantDecay", "CosineDecay"};

// The optimizer's learning_rate as Keras serializes it: a number, or the
// schedule object (keras.optimizers.schedules.serialize).
Json KerasLearningRate(const OptimizerConfig& o) {
  const LearningRateScheduleConfig& s = o.schedule;
  using T = LearningRateScheduleType;
  Json c = Json::object();
  switch (s.type) {
    case T::kConstant:
      return o.learning_rate;
    case T::kExponentialDecay:
    case T::kInverseTimeDecay:
      c = {{"initial_learning_rate", o.learning_rate}, {"decay_steps", s.decay_steps},
           {"decay_rate", s.decay_rate}, {"staircase", s.staircase}};
      break;
    case T::kPolynomialDecay:
      c = {{"initial_learning_rate", o.learning_rate}, {"decay_steps", s.decay_steps},
           {"end_learning_rate", s.end_learning_rate}, {"power", s.power}, {"cycle", s.cycle}};
      break;
    case T::kPiecewiseConstantDecay:
      c = {{"boundaries", s.boundaries}, {"values", s.values}};
      break;
    case T::kCosineDecay:
      c = {{"initial_learning_rate", o.learning_rate}, {"decay_steps", s.decay_steps},
           {"alpha", s.alpha},
           {"warmup_target", s.warmup_target ? Json(*s.warmup_target) : Json(nullptr)},
           {"warmup_steps", s.warmup_steps}};
      break;
  }
  const char* class_name = kScheduleClasses[static_cast<int>(s.type)];
  c["name"] = class_name;
  return Serialized("keras.optimizers.schedules", class_name, std::move(c));
}

Json KerasOptimizer(const OptimizerConfig& o) {
  // Keras' weight_decay: null for none, as Keras writes it.
  const float decay = o.EffectiveWeightDecay();
  const Json weight_decay = decay == 0.0f ? Json(nullptr) : Json(decay);
  const Json learning_rate = KerasLearningRate(o);
  switch (o.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return Serialized("keras.optimizers", o.type == OptimizerType::kAdam ? "Adam" : "AdamW",
                        {{"name", KerasOptimizerName(o.type)},
                         {"learning_rate", learning_rate},
                         {"weight_decay", weight_decay},
                         {"beta_1", o.beta1},
                         {"beta_2", o.beta2},
                         {"epsilon", o.epsilon},
                         {"amsgrad", false}});
    case OptimizerType::kRmsprop:
      return Serialized("keras.optimizers", "RMSprop",
                        {{"name", "rmsprop"},
                         {"learning_rate", learning_rate},
                         {"weight_decay", weight_decay},
                         {"rho", o.rho},
                         {"momentum", 0.0f},
                         {"epsilon", o.epsilon},
                         {"centered", o.centered}});
    case OptimizerType::kSgd:
    case OptimizerType::kMomentum:
      break;
  }
  // distrain's sgd is Keras' SGD without momentum; momentum is SGD with it.
  const bool momentum = o.type == OptimizerType::kMomentum;
  return Serialized("keras.optimizers", "SGD",
                    {{"name", "SGD"},
                     {"learning_rate", learning_rate},
                     {"weight_decay", weight_decay},
                     {"momentum", momentum ? o.momentum : 0.0f},
                     {"nesterov", momentum && o.nesterov}});
}

// The checkpoint slots of the trainable variables in Keras' optimizer order:
// Adam and AdamW build (momentum, velocity) per variable, one variable after
// another; RMSprop builds every variable's velocity, then every variable's
// average gradient (centered), so its slots come slot by slot.
struct KerasSlotOrder {
  std::vector<const char*> names;
  bool variable_major = true;
};
KerasSlotOrder SlotOrder(const OptimizerConfig& o) {
  switch (o.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return {{"m", "v"}, true};
    case OptimizerType::kMomentum:
      return {{"momentum"}, true};
    case OptimizerType::kRmsprop:
      if (o.centered) return {{"velocity", "average_gradient"}, false};
      return {{"velocity"}, false};
    case OptimizerType::kSgd:
      break;
  }
  return {};
}

// Variables of one Keras layer, in Keras' order, by distrain's names; the
// first `trainable` of them are trainable.
struct LayerVariables {
  std::vector<std::string> names;
  size_t trainable = 0;
};
LayerVariables VariablesOf(const LayerConfig& layer) {
  const std::string& n = layer.name;
  switch (layer.kind) {
    case LayerKind::kConv2D:
    case LayerKind::kConv1D:
    case LayerKind::kDense:
      if (layer.use_bias) return {{n + "/kernel", n + "/bias"}, 2};
      return {{n + "/kernel"}, 1};
    case LayerKind::kBatchNormalization:
      return {{n + "/gamma", n + "/beta", n + "/moving_mean", n + "/moving_variance"}, 2};
    case LayerKind::kLayerNormalization: {
      LayerVariables v;
      if (layer.scale_output) v.names.push_back(n + "/gamma");
      if (layer.center) v.names.push_back(n + "/beta");
      v.trainable = v.names.size();
      return v;
    }
    case LayerKind::kRMSNormalization:
      return {{n + "/scale"}, 1};
    case LayerKind::kEmbedding:
      return {{n + "/embeddings"}, 1};
    default:
      return {};
  }
}

const Tensor* FindTensor(const CheckpointState& state, const std::string& key) {
  auto it = state.tensors.find(key);
  return it == state.tensors.end() ? nullptr : &it->second;
}

}  // namespace

absl::StatusOr<std::string> KerasConfigJson(const KerasModelSpec& spec) {
  const std::vector<LayerConfig> layers = KerasLayersOf(spec);
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(layers, spec.example_shape);
  if (!shapes.ok()) return shapes.status();

  const Precision precision = spec.model.precision;
  Json keras_layers = Json::array();
  if (layers.empty() || layers.front().kind != LayerKind::kInput) {
    LayerConfig input;
    input.kind = LayerKind::kInput;
    input.name = "input_layer";
    input.shape = spec.example_shape;
    keras_layers.push_back(
        Serialized("keras.layers", "InputLayer", KerasLayerConfig(input, precision)));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    Json entry = Serialized("keras.layers", KerasClassName(layers[i].kind),
                            KerasLayerConfig(layers[i], precision));
    if (layers[i].kind != LayerKind::kInput) {
      entry["build_config"] = {
          {"input_shape", BatchShape(i == 0 ? spec.example_shape : (*shapes)[i - 1])}};
    }
    keras_layers.push_back(std::move(entry));
  }
  Json model = {
      {"module", "keras"},
      {"class_name", "Sequential"},
      {"config",
       {{"name", "sequential"},
        {"trainable", true},
        {"dtype", DTypePolicy(precision)},  // as under Keras' global policy
        {"layers", std::move(keras_layers)}}},
      {"registered_name", nullptr},
      {"build_config", {{"input_shape", BatchShape(spec.example_shape)}}},
      {"compile_config",
       {{"optimizer", KerasOptimizer(spec.optimizer)},
        {"loss", KerasLoss(spec)},
        {"loss_weights", nullptr},
        {"metrics", Json::array({"accuracy"})},
        {"weighted_metrics", nullptr},
        {"run_eagerly", false},
        {"steps_per_execution", 1},
        {"jit_compile", false}}},
  };
  return model.dump();
}

absl::Status ExportKerasModel(const KerasModelSpec& spec, const CheckpointState& state,
                              const std::string& path) {
  if (!absl::EndsWith(path, ".keras")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the export path '", path, "' must end in .keras (Keras 3 loads no other name)"));
  }
  absl::StatusOr<std::string> config = KerasConfigJson(spec);
  if (!config.ok()) return config.status();
  const std::vector<LayerConfig> layers = KerasLayersOf(spec);

  absl::StatusOr<Hdf5Image> h5 = Hdf5Image::Create();
  if (!h5.ok()) return h5.status();
  // 1. Layer weights: /layers/<snake class name, _1, _2 ... in order>/vars/<i>,
  //    Keras' own addressing (it deliberately ignores layer names there).
  std::map<std::string, int> used_keys;
  // Keras' model.trainable_variables order, with each variable's shape
  // (optimizer slots are stored flat in checkpoints).
  std::vector<std::pair<std::string, std::vector<int64_t>>> trainable;
  for (const LayerConfig& layer : layers) {
    if (layer.kind == LayerKind::kInput) continue;
    std::string key = LayerKindSnakeName(layer.kind);
    if (auto [it, inserted] = used_keys.try_emplace(key, 0); !inserted) {
      key = absl::StrCat(key, "_", ++it->second);
    }
    const std::string group = absl::StrCat("/layers/", key, "/vars");
    if (absl::Status s = h5->AddGroup(group, layer.name); !s.ok()) return s;
    const LayerVariables vars = VariablesOf(layer);
    for (size_t v = 0; v < vars.names.size(); ++v) {
      const Tensor* value = FindTensor(state, CheckpointVariable(vars.names[v]));
      if (value == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the checkpoint has no variable '", vars.names[v], "' (layer '", layer.name,
            "'): it was written for another model; export with the job that trained it"));
      }
      if (absl::Status s = h5->AddFloats(absl::StrCat(group, "/", v), value->shape(),
                                         value->data());
          !s.ok()) {
        return s;
      }
      if (v < vars.trainable) trainable.emplace_back(vars.names[v], value->shape());
    }
  }
  if (absl::Status s = h5->AddGroup("/vars", "sequential"); !s.ok()) return s;

  // 2. The optimizer: iterations, the learning rate (unless scheduled), then each trainable
  //    variable's slots. A checkpoint without slots (a parameter-server job
  //    whose chief could not read the ps files) exports the model without
  //    optimizer state; Keras then starts its optimizer from zero.
  const KerasSlotOrder order = SlotOrder(spec.optimizer);
  const std::vector<const char*>& slots = order.names;
  bool have_slots = true;
  for (const auto& [name, shape] : trainable) {
    for (const char* slot : slots) {
      const Tensor* t = FindTensor(state, CheckpointSlot(name, slot));
      if (t == nullptr) {
        have_slots = false;
      } else if (t->size() != Tensor::NumElements(shape)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the checkpoint's optimizer slot '", name, "/", slot, "' has ", t->size(),
            " values but the variable has ", Tensor::NumElements(shape), ": the checkpoint is inconsistent"));
      }
    }
  }
  int64_t iterations = 0;
  if (auto it = state.metadata.find(kIterationsKey); it != state.metadata.end()) {
    if (!absl::SimpleAtoi(it->second, &iterations) || iterations < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's ", kIterationsKey, " '", it->second, "' is not a count"));
    }
  } else {
    have_slots = false;
  }
  if (have_slots) {
    const std::string group = "/optimizer/vars";
    if (absl::Status s = h5->AddGroup(group, KerasOptimizerName(spec.optimizer.type)); !s.ok()) {
      return s;
    }
    if (absl::Status s = h5->AddInt64Scalar(group + "/0", iterations); !s.ok()) return s;
    int index = 1;
    // A constant rate is a variable of Keras' optimizer; a schedule is not.
    if (spec.optimizer.schedule.type == LearningRateScheduleType::kConstant) {
      const float lr = spec.optimizer.learning_rate;
      if (absl::Status s = h5->AddFloats(group + "/1", {}, &lr); !s.ok()) return s;
      index = 2;
    }
    auto add = [&](const std::string& name, const std::vector<int64_t>& shape,
                   const char* slot) {
      const Tensor* t = FindTensor(state, CheckpointSlot(name, slot));
      return h5->AddFloats(absl::StrCat(group, "/", index++), shape, t->data());
    };
    if (order.variable_major) {
      for (const auto& [name, shape] : trainable) {
        for (const char* slot : slots) {
          if (absl::Status s = add(name, shape, slot); !s.ok()) return s;
        }
      }
    } else {
      for (const char* slot : slots) {
        for (const auto& [name, shape] : trainable) {
          if (absl::Status s = add(name, shape, slot); !s.ok()) return s;
        }
      }
    }
  }
  absl::StatusOr<std::string> weights = h5->Bytes();
  if (!weights.ok()) return weights.status();

  // 3. metadata.json and the zip, in the order Keras writes them.
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &local);
  const Json metadata = {{"keras_version", kKerasFormatVersion},
                         {"date_saved", date},
                         {"producer", "distrain"},
                         {"step", state.step}};
  absl::StatusOr<std::string> zip = StoredZip({{"metadata.json", metadata.dump()},
                                               {"config.json", *config},
                                               {"model.weights.h5", *std::move(weights)}});
  if (!zip.ok()) return zip.status();
  return WriteFileAtomically(path, *zip);
}

absl::StatusOr<KerasModelSpec> KerasModelSpecFromCheckpoint(const CheckpointState& state) {
  auto get = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = state.metadata.find(key);
    if (it == state.metadata.end()) {
      return absl::NotFoundError(absl::StrCat(
          "the checkpoint (step ", state.step, ") does not record '", key,
          "' (written by an older distrain): pass the job's YAML with --job"));
    }
    return it->second;
  };
  absl::StatusOr<std::string> job = get(kCheckpointJobConfigKey);
  if (!job.ok()) return job.status();
  absl::StatusOr<std::string> shape = get(kCheckpointExampleShapeKey);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<std::string> classes = get(kCheckpointNumClassesKey);
  if (!classes.ok()) return classes.status();
  absl::StatusOr<JobConfig> config = ParseJobConfigJson(*job);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint's recorded job does not parse: ",
                                                   config.status().message()));
  }
  KerasModelSpec spec;
  spec.model = config->training.model;
  spec.optimizer = config->training.optimizer;
  for (absl::string_view d : absl::StrSplit(*shape, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's example shape '", *shape, "' is not a list of sizes"));
    }
    spec.example_shape.push_back(v);
  }
  if (!absl::SimpleAtoi(*classes, &spec.num_classes) || spec.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's class count '", *classes, "' is not a number >= 2"));
  }
  return spec;
}

// ---------------------------------------------------------------------------
// Import: a Keras Sequential's JSON -> LayerConfigs.

namespace {

// Collects every problem of one import, each naming the layer.
class ImportIssues {
 public:
  void Add(std::string problem) { problems_.push_back(std::move(problem)); }
  bool empty() const { return problems_.empty(); }
  absl::Status ToStatus() const {
    return absl::InvalidArgumentError(absl::StrJoin(problems_, "\n"));
  }

 private:
  std::vector<std::string> problems_;
};

std::string SupportedLayerList() {
  std::vector<std::string> names;
  for (const std::string& n : LayerKindNames()) names.push_back(n == "Input" ? "InputLayer" : n);
  return absl::StrJoin(names, ", ");
}

// Reads Keras' config keys for one layer, reporting each unsupported value.
class LayerReader {
 public:
  LayerReader(const Json& config, std::string where, ImportIssues* issues,
              std::vector<std::string>* warnings)
      : config_(config), where_(std::move(where)), issues_(issues), warnings_(warnings) {}

  const Json* Get(const char* key) const {
    auto it = config_.find(key);
    return it == config_.end() || it->is_null() ? nullptr : &*it;
  }
  // The value at `key` when it has the JSON type `is` checks; else the
  // fallback, and a problem saying what it must be.
  template <typename T>
  T Typed(const char* key, T fallback, bool (Json::*is)() const noexcept, const char* what) {
    const Json* v = Get(key);
    if (v == nullptr) return fallback;
    if (!(v->*is)()) {
      Bad(key, absl::StrCat("must be ", what, ", got ", v->dump()));
      return fallback;
    }
    return v->get<T>();
  }
  int64_t Int(const char* key, int64_t fallback) {
    return Typed(key, fallback, &Json::is_number_integer, "an integer");
  }
  double Number(const char* key, double fallback) {
    return Typed(key, fallback, &Json::is_number, "a number");
  }
  bool Bool(const char* key, bool fallback) {
    return Typed(key, fallback, &Json::is_boolean, "true or false");
  }
  // An int or a pair of ints (Keras accepts both for sizes and strides).
  std::optional<std::array<int64_t, 2>> Pair(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer()) return std::array<int64_t, 2>{v->get<int64_t>(), v->get<int64_t>()};
    if (v->is_array() && v->size() == 2 && (*v)[0].is_number_integer() &&
        (*v)[1].is_number_integer()) {
      return std::array<int64_t, 2>{(*v)[0].get<int64_t>(), (*v)[1].get<int64_t>()};
    }
    Bad(key, absl::StrCat("must be an integer or a pair of integers, got ", v->dump()));
    return std::nullopt;
  }
  // A 1-D layer's size or stride: an int or a list of one, as {length, 1}.
  std::optional<std::array<int64_t, 2>> Length(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer()) return std::array<int64_t, 2>{v->get<int64_t>(), 1};
    if (v->is_array() && v->size() == 1 && (*v)[0].is_number_integer()) {
      return std::array<int64_t, 2>{(*v)[0].get<int64_t>(), 1};
    }
    Bad(key, absl::StrCat("must be an integer or a list of one integer, got ", v->dump()));
    return std::nullopt;
  }
  // A normalisation's axis: an int, or the list of one that Keras writes
  // once the layer is built ([-1]); several axes are refused.
  int64_t Axis(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return -1;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_array() && v->size() == 1 && (*v)[0].is_number_integer()) {
      return (*v)[0].get<int64_t>();
    }
    Bad(key, absl::StrCat("is ", v->dump(), "; distrain normalises one axis, the last: use -1"));
    return -1;
  }
  std::vector<int64_t> Shape(const char* key, bool drop_batch) {
    const Json* v = Get(key);
    std::vector<int64_t> out;
    if (v == nullptr || !v->is_array()) return out;
    for (size_t i = drop_batch ? 1 : 0; i < v->size(); ++i) {
      if (!(*v)[i].is_number_integer()) {
        Bad(key, absl::StrCat("has an unknown dimension (", v->dump(),
                              "); distrain needs every example dimension"));
        return {};
      }
      out.push_back((*v)[i].get<int64_t>());
    }
    return out;
  }
  std::string String(const char* key, const std::string& fallback) {
    return Typed(key, fallback, &Json::is_string, "a string");
  }
  ActivationKind Activation(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return ActivationKind::kLinear;
    std::string name;
    if (v->is_string()) {
      name = v->get<std::string>();
    } else if (v->is_object() && v->contains("config") && (*v)["config"].is_object() &&
               (*v)["config"].contains("name") && (*v)["config"]["name"].is_string()) {
      name = (*v)["config"]["name"].get<std::string>();  // a serialized activation
    } else {
      Bad(key, absl::StrCat("must name an activation, got ", v->dump()));
      return ActivationKind::kLinear;
    }
    std::optional<ActivationKind> kind = ParseActivationName(name);
    if (!kind) {
      Bad(key, absl::StrCat("'", name, "' is not supported; use one of ",
                            absl::StrJoin(ActivationNames(), ", ")));
      return ActivationKind::kLinear;
    }
    return *kind;
  }
  // Keras allows causal on Conv1D only.
  PaddingKind Padding(bool causal_allowed = false) {
    const std::string padding = String("padding", "valid");
    if (padding == "same") return PaddingKind::kSame;
    if (padding == "causal" && causal_allowed) return PaddingKind::kCausal;
    if (padding != "valid") {
      Bad("padding", absl::StrCat("'", padding, "' is not supported; use valid",
                                  causal_allowed ? ", same or causal" : " or same"));
    }
    return PaddingKind::kValid;
  }
  // Keys whose non-default values change what the layer computes.
  void RequireNull(const char* key) {
    if (const Json* v = Get(key)) {
      Bad(key, absl::StrCat("is set (", v->dump(), "); distrain supports only null here"));
    }
  }
  void RequireEqual(const char* key, const Json& expected) {
    const Json* v = Get(key);
    if (v != nullptr && *v != expected) {
      Bad(key, absl::StrCat("is ", v->dump(), "; distrain supports only ", expected.dump()));
    }
  }
  void RequireChannelsLast() {
    const std::string format = String("data_format", "channels_last");
    if (format != "channels_last") {
      Bad("data_format", absl::StrCat("is ", format,
                                      "; distrain's images are NHWC, use channels_last"));
    }
  }
  // Initialisers change where training starts, not what the model is: a
  // warning, since distrain always initialises as Keras' defaults do.
  void ExpectInitializer(const char* key, const char* keras_default) {
    const Json* v = Get(key);
    if (v == nullptr) return;
    std::string name = v->is_string() ? v->get<std::string>() : v->value("class_name", "");
    std::string lowered = absl::AsciiStrToLower(name);
    lowered.erase(std::remove(lowered.begin(), lowered.end(), '_'), lowered.end());
    if (lowered != absl::AsciiStrToLower(keras_default)) {
      warnings_->push_back(absl::StrCat(where_, ": ", key, " ", name,
                                        " is not supported; distrain initialises with Keras' "
                                        "default ",
                                        keras_default));
    }
  }
  void Bad(const char* key, const std::string& problem) {
    issues_->Add(absl::StrCat(where_, ": ", key, " ", problem));
  }
  const std::string& where() const { return where_; }

 private:
  const Json& config_;
  std::string where_;
  ImportIssues* issues_;
  std::vector<std::string>* warnings_;
};

void ReadLayer(LayerKind kind, LayerReader& r, LayerConfig* layer) {
  switch (kind) {
    case LayerKind::kInput:
      layer->shape = r.Get("batch_shape") ? r.Shape("batch_shape", true)
                                          : r.Shape("batch_input_shape", true);
      if (layer->shape.empty() && r.Get("shape")) layer->shape = r.Shape("shape", false);
      r.RequireEqual("sparse", false);
      r.RequireEqual("ragged", false);
      break;
    case LayerKind::kReshape:
      layer->shape = r.Shape("target_shape", false);
      break;
    case LayerKind::kConv2D:
    case LayerKind::kConv1D: {
      // Sizes are pairs, or a 1-D layer's one length as {length, 1}.
      const bool one_d = kind == LayerKind::kConv1D;
      auto size = [&](const char* key) { return one_d ? r.Length(key) : r.Pair(key); };
      const std::array<int64_t, 2> unit = {1, 1};
      layer->filters = r.Int("filters", 0);
      if (auto k = size("kernel_size")) layer->kernel_size = *k;
      if (auto s = size("strides"); s && *s != unit) layer->strides = *s;
      layer->padding = r.Padding(/*causal_allowed=*/one_d);
      r.RequireChannelsLast();
      if (auto d = size("dilation_rate"); d && *d != unit) {
        r.Bad("dilation_rate", absl::StrCat("is not ", one_d ? "1" : "[1, 1]",
                                            "; dilated convolutions are not supported"));
      }
      r.RequireEqual("groups", 1);
      layer->activation = r.Activation("activation");
      layer->use_bias = r.Bool("use_bias", true);
      r.ExpectInitializer("kernel_initializer", "GlorotUniform");
      r.ExpectInitializer("bias_initializer", "Zeros");
      for (const char* key : {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                              "kernel_constraint", "bias_constraint"}) {
        r.RequireNull(key);
      }
      break;
    }
    case LayerKind::kMaxPooling2D:
    case LayerKind::kAveragePooling2D:
    case LayerKind::kMaxPooling1D:
    case LayerKind::kAveragePooling1D: {
      const bool one_d = IsOneDimensional(kind);
      auto size = [&](const char* key) { return one_d ? r.Length(key) : r.Pair(key); };
      if (one_d) layer->pool_size = {2, 1};  // Keras' pool_size=2 of a 1-D layer
      if (auto p = size("pool_size")) layer->pool_size = *p;
      if (auto s = size("strides"); s && *s != layer->pool_size) layer->strides = *s;
      layer->padding = r.Padding();
      r.RequireChannelsLast();
      break;
    }
    case LayerKind::kGlobalAveragePooling2D:
    case LayerKind::kGlobalAveragePooling1D:
    case LayerKind::kGlobalMaxPooling2D:
    case LayerKind::kGlobalMaxPooling1D:
      r.RequireChannelsLast();
      r.RequireEqual("keepdims", false);
      break;
    case LayerKind::kFlatten:
      r.RequireChannelsLast();
      break;
    case LayerKind::kDense:
      layer->units = r.Int("units", 0);
      layer->activation = r.Activation("activation");
      layer->use_bias = r.Bool("use_bias", true);
      r.ExpectInitializer("kernel_initializer", "GlorotUniform");
      r.ExpectInitializer("bias_initializer", "Zeros");
      for (const char* key : {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                              "kernel_constraint", "bias_constraint", "lora_rank",
                              "quantization_config"}) {
        r.RequireNull(key);
      }
      break;
    case LayerKind::kDropout:
      layer->rate = r.Number("rate", 0);
      r.RequireNull("noise_shape");
      break;
    case LayerKind::kBatchNormalization: {
      // Checked against the input's rank with the shapes (InferLayerShapes).
      layer->axis = r.Axis("axis");
      layer->momentum = r.Number("momentum", 0.99);
      layer->epsilon = r.Number("epsilon", 1e-3);
      r.RequireEqual("center", true);
      r.RequireEqual("scale", true);
      r.RequireEqual("renorm", false);
      for (const char* key : {"beta_regularizer", "gamma_regularizer", "beta_constraint",
                              "gamma_constraint"}) {
        r.RequireNull(key);
      }
      r.ExpectInitializer("beta_initializer", "Zeros");
      r.ExpectInitializer("gamma_initializer", "Ones");
      r.ExpectInitializer("moving_mean_initializer", "Zeros");
      r.ExpectInitializer("moving_variance_initializer", "Ones");
      break;
    }
    case LayerKind::kLayerNormalization:
    case LayerKind::kRMSNormalization:
      layer->axis = r.Axis("axis");
      layer->epsilon = r.Number("epsilon", DefaultEpsilon(layer->kind));
      if (layer->kind == LayerKind::kRMSNormalization) break;
      layer->center = r.Bool("center", true);
      layer->scale_output = r.Bool("scale", true);
      if (r.Bool("rms_scaling", false)) {
        r.Bad("rms_scaling", "is true (deprecated in Keras, and it scales by the variance); "
                             "use RMSNormalization instead");
      }
      for (const char* key : {"beta_regularizer", "gamma_regularizer", "beta_constraint",
                              "gamma_constraint"}) {
        r.RequireNull(key);
      }
      r.ExpectInitializer("beta_initializer", "Zeros");
      r.ExpectInitializer("gamma_initializer", "Ones");
      break;
    case LayerKind::kEmbedding: {
      layer->input_dim = r.Int("input_dim", 0);
      layer->output_dim = r.Int("output_dim", 0);
      if (r.Bool("mask_zero", false)) {
        r.Bad("mask_zero", "is true; distrain has no masks (id 0 is a token like any other): "
                           "set mask_zero=False");
      }
      if (r.Get("input_length") != nullptr) {
        r.Bad("input_length", "is set (a Keras 2 argument): declare the sequence length with "
                              "the Input layer's shape instead");
      }
      for (const char* key : {"embeddings_regularizer", "activity_regularizer",
                              "embeddings_constraint", "quantization_config"}) {
        r.RequireNull(key);
      }
      if (r.Bool("sparse", false)) r.Bad("sparse", "is true; distrain's gradients are dense");
      const Json* init = r.Get("embeddings_initializer");
      if (!(init != nullptr && init->is_string() && init->get<std::string>() == "uniform")) {
        r.ExpectInitializer("embeddings_initializer", "RandomUniform");
      }
      break;
    }
    case LayerKind::kActivation:
      layer->activation = r.Activation("activation");
      break;
    case LayerKind::kReLU:
      // Each argument kept only where it differs from Keras' default, so a
      // file written from `ReLU: {}` reads back as `ReLU: {}`.
      if (r.Get("max_value")) layer->max_value = r.Number("max_value", 0);
      if (const double slope = r.Number("negative_slope", 0); slope != 0) {
        layer->negative_slope = slope;
      }
      layer->threshold = r.Number("threshold", 0);
      break;
    case LayerKind::kLeakyReLU:
      if (const double slope = r.Number("negative_slope", 0.3);
          static_cast<float>(slope) != static_cast<float>(0.3)) {
        layer->negative_slope = slope;
      }
      break;
    case LayerKind::kELU:
      layer->alpha = r.Number("alpha", 1.0);
      break;
    case LayerKind::kSoftmax:
      layer->axis = r.Int("axis", -1);
      break;
    case LayerKind::kRescaling:
      if (const Json* scale = r.Get("scale"); scale != nullptr && scale->is_array()) {
        r.Bad("scale", absl::StrCat("is a list (", scale->dump(),
                                    "); distrain supports one scale for every channel"));
      } else {
        layer->scale = r.Number("scale", 1.0);
      }
      layer->offset = r.Number("offset", 0.0);
      break;
  }
}

// One layer's dtype policy, as the JSON spells it.
struct LayerPolicy {
  size_t index = 0;         // in config.layers
  std::string field;        // "layers[3].dtype (Dense 'dense_1')"
  Precision precision = Precision::kFloat32;
  bool output_activation = false;  // an Activation whose float32 output distrain's loss matches
};

std::string AcceptedPolicyNames() { return "float32, mixed_bfloat16 or mixed_float16"; }

// A layer's "dtype" in each form Keras writes it: Keras 3's serialized
// DTypePolicy ({"class_name": "DTypePolicy", "config": {"name": ...}}; early
// 3.x releases call it FloatDTypePolicy), Keras 2's bare name ("float32")
// or its Policy object for mixed policies. nullopt when the layer names
// none (Keras then applies its global policy, float32 unless set) or when
// the policy is one distrain cannot train (a problem is recorded).
std::optional<Precision> ReadDTypePolicy(const Json& config, const std::string& field,
                                         ImportIssues* issues) {
  auto it = config.find("dtype");
  if (it == config.end() || it->is_null()) return std::nullopt;
  std::string name;
  if (it->is_string()) {
    name = it->get<std::string>();
  } else if (it->is_object()) {
    auto cls = it->find("class_name");
    const std::string class_name =
        cls != it->end() && cls->is_string() ? cls->get<std::string>() : "";
    auto policy_config = it->find("config");
    const bool named = policy_config != it->end() && policy_config->is_object() &&
                       policy_config->contains("name") && (*policy_config)["name"].is_string();
    if ((class_name == "DTypePolicy" || class_name == "FloatDTypePolicy" ||
         class_name == "Policy") &&
        named) {
      name = (*policy_config)["name"].get<std::string>();
    } else if (absl::StrContains(class_name, "Quantized") || class_name == "DTypePolicyMap") {
      issues->Add(absl::StrCat(field, " is a quantized policy (", class_name,
                               "); distrain trains float32 variables only: import the model "
                               "before keras' model.quantize(), with dtype ",
                               AcceptedPolicyNames()));
      return std::nullopt;
    } else {
      issues->Add(absl::StrCat(field, " must be a Keras dtype policy (a name, or {\"class_name\": "
                               "\"DTypePolicy\", \"config\": {\"name\": ...}}), got ",
                               it->dump()));
      return std::nullopt;
    }
  } else {
    issues->Add(absl::StrCat(field, " must be a Keras dtype policy name, got ", it->dump()));
    return std::nullopt;
  }
  if (std::optional<Precision> precision = ParsePrecisionName(name)) return precision;
  if (name == "bfloat16" || name == "float16") {
    // Keras' plain 16-bit policies store the variables in 16 bits too;
    // distrain's keep float32 master copies, which is Keras' mixed_ policy.
    issues->Add(absl::StrCat(
        field, " is ", name, ", which keeps the variables in ", name,
        " as well; distrain keeps float32 variables and computes in ", name,
        ", which is Keras' mixed_", name, ": build the layer with dtype=\"mixed_", name,
        "\" (or keras.config.set_dtype_policy(\"mixed_", name, "\")) and import again"));
  } else {
    issues->Add(absl::StrCat(field, " is ", name, "; distrain supports the dtype policies ",
                             AcceptedPolicyNames()));
  }
  return std::nullopt;
}

// spec.training.precision from the layers' policies. distrain trains a model
// under one policy, so the layers must agree, with the exception Keras'
// mixed-precision guide makes itself: a float32 Activation (softmax, sigmoid
// or linear) after the last mixed layer, which keeps the output in float32.
// distrain computes the loss in float32 from the 16-bit outputs anyway, so
// that model trains the same way under the mixed policy.
Precision ResolvePrecision(const std::vector<LayerPolicy>& policies, ImportIssues* issues) {
  const LayerPolicy* mixed = nullptr;
  size_t last_mixed = 0;
  for (const LayerPolicy& p : policies) {
    if (p.precision == Precision::kFloat32) continue;
    if (mixed == nullptr) mixed = &p;
    last_mixed = p.index;
  }
  if (mixed == nullptr) return Precision::kFloat32;
  const std::string want = PrecisionName(mixed->precision);
  bool agree = true;
  for (const LayerPolicy& p : policies) {
    if (p.precision == mixed->precision) continue;
    if (p.precision == Precision::kFloat32 && p.output_activation && p.index > last_mixed) continue;
    agree = false;
    issues->Add(absl::StrCat(
        p.field, " is ", PrecisionName(p.precision), " but ", mixed->field, " is ", want,
        "; distrain trains the whole model under one policy (spec.training.precision), and only a "
        "float32 Activation (softmax, sigmoid or linear) after the last mixed layer may differ: "
        "build this layer with dtype=\"", want, "\" (or the whole model under "
        "keras.config.set_dtype_policy(\"", want, "\")) and import again"));
  }
  return agree ? mixed->precision : Precision::kFloat32;
}

// A serialized keras.optimizers.schedules object into o.schedule (and
// o.learning_rate, its initial rate).
void ReadSchedule(const Json& schedule, OptimizerConfig* o, ImportIssues* issues) {
  const std::string class_name = schedule.value("class_name", std::string());
  const Json config = schedule.contains("config") && schedule["config"].is_object()
                          ? schedule["config"]
                          : Json::object();
  auto number = [&](const char* key, double fallback) {
    auto v = config.find(key);
    return v != config.end() && v->is_number() ? v->get<double>() : fallback;
  };
  // Step counts as Keras writes them, integers; anything else reads as 0,
  // which validation then refuses by name.
  auto steps = [&](const char* key) -> int64_t {
    auto v = config.find(key);
    return v != config.end() && v->is_number_integer() ? v->get<int64_t>() : 0;
  };
  LearningRateScheduleConfig& s = o->schedule;
  using T = LearningRateScheduleType;
  const auto* known = std::find(std::begin(kScheduleClasses), std::end(kScheduleClasses),
                                class_name);
  if (known == std::begin(kScheduleClasses) || known == std::end(kScheduleClasses)) {
    issues->Add(absl::StrCat("compile_config.optimizer.learning_rate: the schedule '", class_name,
                             "' is not supported; distrain has ExponentialDecay, "
                             "InverseTimeDecay, PolynomialDecay, PiecewiseConstantDecay and "
                             "CosineDecay"));
    return;
  }
  s.type = static_cast<T>(known - std::begin(kScheduleClasses));
  o->learning_rate = static_cast<float>(number("initial_learning_rate", o->learning_rate));
  s.decay_steps = steps("decay_steps");
  s.decay_rate = static_cast<float>(number("decay_rate", 0));
  s.staircase = config.value("staircase", false);
  s.end_learning_rate = static_cast<float>(number("end_learning_rate", 1e-4));
  s.power = static_cast<float>(number("power", 1.0));
  s.cycle = config.value("cycle", false);
  s.alpha = static_cast<float>(number("alpha", 0.0));
  s.warmup_steps = steps("warmup_steps");
  if (auto t = config.find("warmup_target"); t != config.end() && t->is_number()) {
    s.warmup_target = static_cast<float>(t->get<double>());
  }
  if (s.type == T::kPiecewiseConstantDecay) {
    s.boundaries = config.value("boundaries", std::vector<int>{});
    s.values = config.value("values", std::vector<float>{});
    if (!s.values.empty()) o->learning_rate = s.values[0];
  }
}

std::optional<OptimizerConfig> ReadOptimizer(const Json& compile, ImportIssues* issues,
                                             std::vector<std::string>* warnings) {
  auto it = compile.find("optimizer");
  if (it == compile.end() || it->is_null()) return std::nullopt;
  const std::string class_name =
      it->is_string() ? it->get<std::string>() : it->value("class_name", std::string());
  const Json config =
      it->is_object() && it->contains("config") ? (*it)["config"] : Json::object();
  auto number = [&](const char* key, double fallback) {
    auto v = config.find(key);
    return v != config.end() && v->is_number() ? v->get<double>() : fallback;
  };
  OptimizerConfig o;
  const std::string lowered = absl::AsciiStrToLower(class_name);
  if (lowered == "adam" || lowered == "adamw") {
    o.type = lowered == "adam" ? OptimizerType::kAdam : OptimizerType::kAdamW;
    o.learning_rate = static_cast<float>(number("learning_rate", 0.001));
    o.beta1 = static_cast<float>(number("beta_1", 0.9));
    o.beta2 = static_cast<float>(number("beta_2", 0.999));
    o.epsilon = static_cast<float>(number("epsilon", 1e-7));
    if (config.value("amsgrad", false)) {
      issues->Add(absl::StrCat("compile_config.optimizer: ", class_name,
                               " with amsgrad is not supported"));
    }
  } else if (lowered == "rmsprop") {
    o.type = OptimizerType::kRmsprop;
    o.learning_rate = static_cast<float>(number("learning_rate", 0.001));
    o.rho = static_cast<float>(number("rho", 0.9));
    o.epsilon = static_cast<float>(number("epsilon", 1e-7));
    o.centered = config.value("centered", false);
    if (const double momentum = number("momentum", 0); momentum != 0) {
      issues->Add(absl::StrCat("compile_config.optimizer: RMSprop with momentum ", momentum,
                               " is not supported; distrain's rmsprop has no momentum"));
    }
  } else if (lowered == "sgd") {
    o.learning_rate = static_cast<float>(number("learning_rate", 0.01));
    o.momentum = static_cast<float>(number("momentum", 0));
    o.nesterov = config.value("nesterov", false);
    o.type = o.momentum > 0 ? OptimizerType::kMomentum : OptimizerType::kSgd;
    if (o.type == OptimizerType::kSgd) o.momentum = OptimizerConfig().momentum;
  } else {
    issues->Add(absl::StrCat("compile_config.optimizer: ", class_name,
                             " is not supported; distrain has Adam, AdamW, RMSprop and SGD (with "
                             "or without momentum)"));
    return std::nullopt;
  }
  // Keras' weight_decay: null is none; AdamW writes its own (0.004 by default).
  if (auto decay = config.find("weight_decay"); decay != config.end() && decay->is_number()) {
    o.weight_decay = static_cast<float>(decay->get<double>());
  } else if (o.type == OptimizerType::kAdamW) {
    o.weight_decay = 0.0f;  // AdamW(weight_decay=None): no decay after all
  }
  if (o.type == OptimizerType::kAdamW && o.weight_decay == 0.004f) {
    o.weight_decay.reset();  // adamw's own default: the YAML need not say it
  }
  if (config.contains("learning_rate") && config["learning_rate"].is_object()) {
    ReadSchedule(config["learning_rate"], &o, issues);
  }
  if (config.value("use_ema", false) == true) {
    issues->Add("compile_config.optimizer: use_ema is true; distrain keeps no moving average of "
                "the weights");
  }
  for (const char* key : {"clipnorm", "global_clipnorm", "clipvalue",
                          "gradient_accumulation_steps", "loss_scale_factor"}) {
    auto v = config.find(key);
    if (v != config.end() && !v->is_null()) {
      issues->Add(absl::StrCat("compile_config.optimizer: ", key, " is set (", v->dump(),
                               "); distrain does not support it"));
    }
  }
  return o;
}

bool ReadLoss(const Json& compile, LossConfig* loss, ImportIssues* issues) {
  auto it = compile.find("loss");
  if (it == compile.end() || it->is_null()) return false;
  std::string class_name;
  bool from_logits = false;
  if (it->is_string()) {
    // A string loss ("sparse_categorical_crossentropy") has Keras' defaults.
    std::string snake = it->get<std::string>();
    for (LossKind kind : {LossKind::kSparseCategoricalCrossentropy,
                          LossKind::kCategoricalCrossentropy, LossKind::kBinaryCrossentropy,
                          LossKind::kMeanSquaredError}) {
      std::string name = LossKindName(kind);
      std::string s;
      for (size_t i = 0; i < name.size(); ++i) {
        if (i > 0 && absl::ascii_isupper(name[i])) s += '_';
        s += absl::ascii_tolower(name[i]);
      }
      if (s == snake) class_name = name;
    }
    if (class_name.empty()) class_name = snake;
  } else if (it->is_object()) {
    class_name = it->value("class_name", std::string());
    if (it->contains("config") && (*it)["config"].is_object()) {
      from_logits = (*it)["config"].value("from_logits", false);
    }
  }
  std::optional<LossKind> kind = ParseLossKindName(class_name);
  if (!kind) {
    issues->Add(absl::StrCat("compile_config.loss: ", class_name,
                             " is not supported; distrain has SparseCategoricalCrossentropy, "
                             "CategoricalCrossentropy, BinaryCrossentropy and MeanSquaredError"));
    return false;
  }
  loss->kind = *kind;
  if (*kind != LossKind::kMeanSquaredError) loss->from_logits = from_logits;
  return true;
}

// A Functional model distrain can import is a Sequential in all but name:
// one input, one output, and every layer after the InputLayer called once on
// the output of the layer listed before it, with no keyword arguments. Its
// config.layers list is then the Sequential's layer list (and the weights
// file addresses the layers as a Sequential's, by class name and count).
// Anything else (branches, merges, several inputs or outputs, shared
// layers) is refused naming the layer that breaks the chain.
absl::Status CheckFunctionalChain(const Json& config) {
  const std::string fix =
      "; distrain imports Functional models whose layers form one chain, input to output "
      "(a Sequential would do: keras.Sequential(model.layers))";
  const Json& layers = config["layers"];
  auto name_of = [&](size_t i) {
    const Json& entry = layers[i];
    return entry.is_object() ? entry.value("name", std::string()) : std::string();
  };
  // Keras writes one input or output as ["name", 0, 0], several as a list of those.
  auto single = [&](const char* key) -> std::optional<std::string> {
    if (!config.contains(key)) return std::nullopt;
    const Json& v = config[key];
    const Json& one = v.is_array() && v.size() == 1 && v[0].is_array() ? v[0] : v;
    if (one.is_array() && !one.empty() && one[0].is_string()) return one[0].get<std::string>();
    return std::nullopt;
  };
  if (layers.empty() || name_of(0).empty() ||
      !layers[0].is_object() || layers[0].value("class_name", "") != "InputLayer" ||
      single("input_layers") != name_of(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Functional model's first layer is not its one InputLayer", fix));
  }
  if (single("output_layers") != name_of(layers.size() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Functional model's one output is not its last layer '", name_of(layers.size() - 1),
        "'", fix));
  }
  for (size_t i = 1; i < layers.size(); ++i) {
    const Json& entry = layers[i];
    const std::string where =
        absl::StrCat("layers[", i, "] ", entry.is_object() ? entry.value("class_name", "") : "",
                     " '", name_of(i), "'");
    const Json* nodes = entry.is_object() && entry.contains("inbound_nodes")
                            ? &entry["inbound_nodes"] : nullptr;
    if (nodes == nullptr || !nodes->is_array() || nodes->size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is called ", nodes != nullptr && nodes->is_array() ? nodes->size() : 0,
          " times (a shared layer, or none)", fix));
    }
    const Json& node = (*nodes)[0];
    const Json* args = node.is_object() && node.contains("args") ? &node["args"] : nullptr;
    if (args == nullptr || !args->is_array() || args->size() != 1 || !(*args)[0].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " takes ", args != nullptr && args->is_array() ? args->size() : 0,
                       " inputs", fix));
    }
    const Json& tensor = (*args)[0];
    const Json* history = tensor.contains("config") && tensor["config"].is_object() &&
                                  tensor["config"].contains("keras_history")
                              ? &tensor["config"]["keras_history"] : nullptr;
    const std::string from = history != nullptr && history->is_array() && !history->empty() &&
                                     (*history)[0].is_string()
                                 ? (*history)[0].get<std::string>() : std::string();
    if (from != name_of(i - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " takes the output of '", from.empty() ? "(unknown)" : from,
          "', not of the layer listed before it, '", name_of(i - 1), "'", fix));
    }
    // Keras records unset call arguments too ({"mask": null} for
    // BatchNormalization); a set one (training=True, a mask) changes the call.
    if (node.contains("kwargs") && node["kwargs"].is_object()) {
      for (const auto& [key, value] : node["kwargs"].items()) {
        if (value.is_null()) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            where, " is called with the keyword argument ", key, "=", value.dump(), fix));
      }
    }
  }
  return absl::OkStatus();
}

// ImportKerasModelJson without the guard: a field read without a type check
// first throws nlohmann's type_error.
absl::StatusOr<KerasImport> ImportOrThrow(const std::string& json_text) {
  Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(
        "not a Keras model JSON: expected an object like model.to_json() writes "
        "({\"class_name\": \"Sequential\", \"config\": {\"layers\": [...]}})");
  }
  const std::string class_name = root.value("class_name", std::string());
  if (class_name != "Sequential" && class_name != "Functional") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model is a ", class_name.empty() ? std::string("(no class_name)") : class_name,
        "; distrain imports Sequential models, and Functional models whose layers form one "
        "chain (rebuild it with keras.Sequential)"));
  }
  const Json& config = root.contains("config") ? root["config"] : Json::object();
  if (!config.is_object() || !config.contains("layers") || !config["layers"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", class_name,
                                                   " has no config.layers list"));
  }
  if (class_name == "Functional") {
    if (absl::Status chain = CheckFunctionalChain(config); !chain.ok()) return chain;
  }
  KerasImport out;
  out.model.type = "sequential";
  ImportIssues issues;
  std::vector<LayerPolicy> policies;
  const Json& layers = config["layers"];
  for (size_t i = 0; i < layers.size(); ++i) {
    const Json& entry = layers[i];
    const std::string keras_class =
        entry.is_object() ? entry.value("class_name", std::string()) : std::string();
    const Json empty = Json::object();
    const Json& layer_config =
        entry.is_object() && entry.contains("config") && entry["config"].is_object()
            ? entry["config"]
            : empty;
    const std::string name = layer_config.value("name", std::string());
    const std::string where = absl::StrCat("layers[", i, "] ", keras_class,
                                           name.empty() ? "" : absl::StrCat(" '", name, "'"));
    std::optional<LayerKind> kind =
        keras_class == "InputLayer" ? std::optional<LayerKind>(LayerKind::kInput)
                                    : ParseLayerKind(keras_class);
    if (!kind || keras_class == "Input") {
      issues.Add(absl::StrCat(where, ": layer class ", keras_class.empty() ? "(none)" : keras_class,
                              " is not supported; distrain supports ", SupportedLayerList()));
      continue;
    }
    LayerConfig layer;
    layer.kind = *kind;
    layer.name = name;
    LayerReader reader(layer_config, where, &issues, &out.warnings);
    ReadLayer(*kind, reader, &layer);
    // An InputLayer's dtype is its tensor's type, not a policy.
    if (*kind != LayerKind::kInput) {
      const std::string field =
          absl::StrCat("layers[", i, "].dtype (", keras_class,
                       name.empty() ? "" : absl::StrCat(" '", name, "'"), ")");
      if (std::optional<Precision> p = ReadDTypePolicy(layer_config, field, &issues)) {
        const ActivationKind function = layer.Activation().kind;
        const bool output_activation =
            (*kind == LayerKind::kActivation || *kind == LayerKind::kSoftmax) &&
            (function == ActivationKind::kSoftmax || function == ActivationKind::kSigmoid ||
             function == ActivationKind::kLinear);
        policies.push_back({i, field, *p, output_activation});
      }
    }
    if (*kind == LayerKind::kInput) out.input_shape = layer.shape;
    out.model.layers.push_back(std::move(layer));
  }
  out.model.precision = ResolvePrecision(policies, &issues);
  if (out.input_shape.empty() && config.contains("build_input_shape")) {
    // A Sequential built without an Input still records the shape it was built for.
    LayerReader reader(config, "Sequential", &issues, &out.warnings);
    out.input_shape = reader.Shape("build_input_shape", true);
  }
  if (root.contains("compile_config") && root["compile_config"].is_object()) {
    const Json& compile = root["compile_config"];
    out.has_loss = ReadLoss(compile, &out.model.loss, &issues);
    out.optimizer = ReadOptimizer(compile, &issues, &out.warnings);
  }
  if (!issues.empty()) return issues.ToStatus();
  if (out.model.layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", class_name, " has no layers"));
  }
  AssignLayerNames(&out.model.layers);

  // The model must build as distrain builds it; then Keras' parameter count.
  if (!out.input_shape.empty()) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
        InferLayerShapes(out.model.layers, out.input_shape);
    if (!shapes.ok()) return shapes.status();
    const std::vector<int64_t>& output = shapes->back();
    ModelConfig probe = out.model;
    int classes = output.size() == 1 ? static_cast<int>(output[0]) : 0;
    if (classes == 1) {
      probe.loss.kind = LossKind::kBinaryCrossentropy;
      classes = 2;
    } else if (probe.loss.kind == LossKind::kBinaryCrossentropy) {
      probe.loss.kind = LossKind::kSparseCategoricalCrossentropy;
    }
    if (classes >= 2) {
      absl::StatusOr<std::unique_ptr<Model>> model =
          Model::Create(probe, out.input_shape, classes, /*seed=*/0);
      if (!model.ok()) return model.status();
      out.num_parameters = (*model)->num_parameters();
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<KerasImport> ImportKerasModelJson(const std::string& json_text) {
  // The JSON comes from a user's file: a field of an unexpected type (a null
  // "name", a string "nesterov") is an error about the file, never an abort.
  try {
    return ImportOrThrow(json_text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a Keras model JSON distrain can read: a field has an unexpected type (", e.what(),
        ")"));
  }
}

absl::StatusOr<KerasFileImport> ImportKerasFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  absl::StatusOr<std::map<std::string, std::string>> entries = ReadZip(bytes, path);
  if (!entries.ok()) return entries.status();
  for (const char* name : {"config.json", "model.weights.h5"}) {
    if (!entries->count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' has no ", name, "; it is not a Keras 3 .keras file"));
    }
  }
  KerasFileImport out;
  absl::StatusOr<KerasImport> imported = ImportKerasModelJson((*entries)["config.json"]);
  if (!imported.ok()) return imported.status();
  out.imported = *std::move(imported);
  const KerasImport& model = out.imported;
  if (model.input_shape.empty()) {
    return absl::InvalidArgumentError(
        "the model records no input shape; build it with keras.Input(shape=...) first");
  }
  // The model distrain builds from the import, for the variables' shapes.
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(model.model.layers, model.input_shape);
  if (!shapes.ok()) return shapes.status();
  const std::vector<int64_t>& output = shapes->back();
  const int num_classes = output.size() == 1 && output[0] >= 2 ? static_cast<int>(output[0]) : 2;
  ModelConfig probe = model.model;
  if (output.size() == 1 && output[0] == 1) probe.loss.kind = LossKind::kBinaryCrossentropy;
  absl::StatusOr<std::unique_ptr<Model>> built =
      Model::Create(probe, model.input_shape, num_classes, /*seed=*/0);
  if (!built.ok()) return built.status();
  std::map<std::string, const Parameter*> variables;
  for (Parameter* p : (*built)->parameters()) variables[p->name] = p;
  for (Parameter* p : (*built)->state_variables()) variables[p->name] = p;

  absl::StatusOr<Hdf5Image> h5 = Hdf5Image::OpenBytes((*entries)["model.weights.h5"]);
  if (!h5.ok()) return h5.status();
  CheckpointState& state = out.weights;
  state.step = 0;
  std::map<std::string, int> used_keys;  // Keras' addressing, as ExportKerasModel writes it
  for (const LayerConfig& layer : model.model.layers) {
    if (layer.kind == LayerKind::kInput) continue;
    std::string key = LayerKindSnakeName(layer.kind);
    if (auto [it, inserted] = used_keys.try_emplace(key, 0); !inserted) {
      key = absl::StrCat(key, "_", ++it->second);
    }
    const LayerVariables vars = VariablesOf(layer);
    for (size_t v = 0; v < vars.names.size(); ++v) {
      const std::string h5_path = absl::StrCat("/layers/", key, "/vars/", v);
      auto read = h5->ReadFloats(h5_path);
      if (!read.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer '", layer.name, "': ", read.status().message(),
            " (its variable ", vars.names[v], "); was the model saved before it was built?"));
      }
      const Parameter* ours = variables.at(vars.names[v]);
      if (read->first != ours->value.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer '", layer.name, "': ", h5_path, " has shape [", absl::StrJoin(read->first, ", "),
            "] but distrain builds ", vars.names[v], " as ", ours->value.ShapeString()));
      }
      state.tensors[CheckpointVariable(vars.names[v])] =
          Tensor(read->first, std::move(read->second));
    }
  }
  state.metadata[kIterationsKey] = "0";
  state.metadata[kCheckpointNumClassesKey] = absl::StrCat(num_classes);
  state.metadata[kCheckpointExampleShapeKey] = absl::StrJoin(model.input_shape, ",");
  state.metadata["model"] = (*built)->Summary();
  state.metadata["imported_from"] = path;
  return out;
}

namespace {

bool PlainYamlScalar(const std::string& s) {
  if (s.empty()) return false;
  static const std::set<std::string> kReserved = {"true", "false", "null", "yes", "no",
                                                  "on",   "off",   "y",    "n",   "~"};
  if (kReserved.count(absl::AsciiStrToLower(s))) return false;
  if (!absl::ascii_isalpha(s[0]) && s[0] != '_') return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

// JSON as YAML flow style with plain keys and strings where YAML allows;
// ordered_json keeps the job writer's argument order (Keras').
using OrderedJson = nlohmann::ordered_json;
std::string FlowYaml(const OrderedJson& v) {
  if (v.is_object()) {
    std::vector<std::string> parts;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string key = PlainYamlScalar(it.key()) ? it.key() : OrderedJson(it.key()).dump();
      parts.push_back(absl::StrCat(key, ": ", FlowYaml(it.value())));
    }
    return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
  }
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (const OrderedJson& item : v) parts.push_back(FlowYaml(item));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    return PlainYamlScalar(s) ? s : v.dump();
  }
  return v.dump();
}

}  // namespace

std::string KerasImportYaml(const KerasImport& imported, const std::string& source) {
  // The job's own JSON writer decides the spelling (camelCase, defaults left
  // out), so the block reads like a hand-written one and parses back equal.
  JobConfig job;
  job.training.model = imported.model;
  if (imported.optimizer) job.training.optimizer = *imported.optimizer;
  const OrderedJson training = OrderedJson::parse(JobConfigToJson(job))["training"];
  std::string out = absl::StrCat("# spec.training blocks imported by `distrain import-keras` from ",
                                 source, "\n");
  if (imported.num_parameters >= 0) {
    absl::StrAppend(&out, "# ", imported.model.layers.size(), " layers, ",
                    imported.num_parameters, " parameters (Keras' count_params)\n");
  }
  for (const std::string& w : imported.warnings) absl::StrAppend(&out, "# note: ", w, "\n");
  if (std::any_of(imported.model.layers.begin(), imported.model.layers.end(),
                  [](const LayerConfig& l) { return l.kind == LayerKind::kRescaling; })) {
    absl::StrAppend(&out,
                    "# note: the model rescales its input itself (Rescaling); IDX and TFRecord "
                    "pixels arrive\n#   multiplied by spec.training.dataset.scale, 1/255 unless "
                    "set: set dataset.scale: 1 to scale them once\n");
  }
  absl::StrAppend(&out, "model:\n  layers:\n");
  // Each layer as the examples write it: `- Conv2D: {filters: 32, ...}`.
  for (const OrderedJson& layer : training["model"]["layers"]) {
    for (auto it = layer.begin(); it != layer.end(); ++it) {
      absl::StrAppend(&out, "    - ", it.key(), ": ", FlowYaml(it.value()), "\n");
    }
  }
  if (imported.has_loss) {
    absl::StrAppend(&out, "  loss: ", FlowYaml(training["model"]["loss"]), "\n");
  } else {
    absl::StrAppend(&out,
                    "  # the JSON names no loss (model.to_json() leaves compile settings out);\n"
                    "  # distrain's default is SparseCategoricalCrossentropy, fromLogits: false\n");
  }
  if (imported.optimizer) {
    // Only the fields of the chosen rule; the others would be ignored.
    OrderedJson optimizer = training["optimizer"];
    std::vector<std::string> unused;
    switch (imported.optimizer->type) {
      case OptimizerType::kSgd:
        unused = {"momentum", "nesterov", "beta1", "beta2", "epsilon", "rho", "centered"};
        break;
      case OptimizerType::kMomentum:
        unused = {"beta1", "beta2", "epsilon", "rho", "centered"};
        break;
      case OptimizerType::kAdam:
      case OptimizerType::kAdamW:
        unused = {"momentum", "nesterov", "rho", "centered"};
        break;
      case OptimizerType::kRmsprop:
        unused = {"momentum", "nesterov", "beta1", "beta2"};
        break;
    }
    for (const std::string& key : unused) optimizer.erase(key);
    // The schedule with only the fields its type reads.
    using T = LearningRateScheduleType;
    std::vector<std::string> keep = {"type"};
    switch (imported.optimizer->schedule.type) {
      case T::kConstant:
        keep.clear();
        break;
      case T::kExponentialDecay:
      case T::kInverseTimeDecay:
        keep.insert(keep.end(), {"decaySteps", "decayRate", "staircase"});
        break;
      case T::kPolynomialDecay:
        keep.insert(keep.end(), {"decaySteps", "endLearningRate", "power", "cycle"});
        break;
      case T::kPiecewiseConstantDecay:
        keep.insert(keep.end(), {"boundaries", "values"});
        break;
      case T::kCosineDecay:
        keep.insert(keep.end(), {"decaySteps", "alpha", "warmupSteps", "warmupTarget"});
        break;
    }
    if (keep.empty()) {
      optimizer.erase("schedule");
    } else {
      OrderedJson schedule = OrderedJson::object();
      for (const std::string& key : keep) {
        if (optimizer["schedule"].contains(key)) schedule[key] = optimizer["schedule"][key];
      }
      optimizer["schedule"] = std::move(schedule);
    }
    absl::StrAppend(&out, "optimizer: ", FlowYaml(optimizer), "\n");
  }
  if (imported.model.precision != Precision::kFloat32) {
    absl::StrAppend(&out, "precision: ", PrecisionName(imported.model.precision),
                    "  # the layers' Keras dtype policy\n");
  }
  return out;
}

}  // namespace distrain

#ifndef DISTRAIN_COMMON_JOB_CONFIG_H_
#define DISTRAIN_COMMON_JOB_CONFIG_H_

// Typed view of a DistributedTrainingJob (distrain.io/v1alpha1), with the
// defaults of crds/ applied. One place for every knob the worker and
// `distrain run` read; the operator's API types (operator/api) build on it.
//
// Sources:
//   * a DistributedTrainingJob YAML file (distrain run, tests);
//   * DISTRAIN_JOB_CONFIG, the JSON the operator puts in every pod:
//     {"strategy": "...", "training": {...}, "replicas": {"Worker": 2, ...}}.
// Every error names the field path and the fix, e.g.
//   spec.training.globalBatchSize: must be a positive integer, got "abc"
// Unknown fields are errors (with a "did you mean" hint), never silently ignored.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "nlohmann/json.hpp"

namespace distrain {

enum class StrategyKind {
  kOneDevice,
  kMirrored,
  kMultiWorkerMirrored,
  kParameterServer,
  kCentralStorage,
  kTPU,
  kAuto,
};
const char* StrategyName(StrategyKind kind);  // "MultiWorkerMirrored"
std::optional<StrategyKind> ParseStrategyName(const std::string& name);

// Replica types as spelled in spec.replicaSpecs keys.
enum class ReplicaType { kChief, kWorker, kPS, kEvaluator };
const char* ReplicaTypeName(ReplicaType type);    // "Chief", "Worker", "PS", "Evaluator"
const char* ReplicaTaskType(ReplicaType type);    // TF_CONFIG task type: "chief", "worker", "ps", "evaluator"

enum class RestartPolicy { kNever, kOnFailure, kAlways, kExitCode };

struct ReplicaSpec {
  int replicas = 1;
  RestartPolicy restart_policy = RestartPolicy::kExitCode;  // default per crds/
  bool operator==(const ReplicaSpec&) const = default;
};

// spec.training.precision: Keras' dtype policy for every layer. float32:
// everything in FP32. mixed_bfloat16 / mixed_float16: variables and the
// optimizer stay FP32; layers compute in the 16-bit type (their inputs,
// kernels and outputs rounded to it, products accumulated in FP32), the
// loss is FP32; mixed_float16 adds Keras' dynamic loss scaling
// (worker/model/loss_scale.h). Lives with the model because a Keras file
// records it per layer.
enum class Precision { kFloat32, kMixedBfloat16, kMixedFloat16 };

const char* PrecisionName(Precision precision);  // "mixed_bfloat16"
std::optional<Precision> ParsePrecisionName(const std::string& name);

// spec.training.model (common/model_spec.h): a Keras layer stack, or the
// mlp shorthand.
struct ModelConfig {
  // "mlp": Dense(hidden_units[0]), ReLU, ..., Dense(classes) (logits);
  // "sequential": `layers`. Default: sequential when layers are given.
  std::string type = "mlp";
  std::vector<int> hidden_units = {128};  // mlp: sizes of the hidden Dense layers
  std::string activation = "relu";       // mlp: only "relu"
  std::vector<LayerConfig> layers;       // sequential; names assigned (AssignLayerNames)
  LossConfig loss;
  Precision precision = Precision::kFloat32;  // spec.training.precision
  bool operator==(const ModelConfig&) const = default;
};

enum class DatasetType { kSynthetic, kIdx, kCsv, kTfRecord };
enum class AutoShardPolicy { kAuto, kData, kFile, kOff };
// tfrecord: how each file is compressed as a whole (tf.io.TFRecordOptions).
enum class DataCompression { kNone, kGzip, kZlib };
// tfrecord: how the input feature of a tf.train.Example holds one example.
enum class FeatureEncoding {
  kUint8Bytes,  // bytes_list with one value of prod(featureShape) raw bytes, times `scale`
  kFloatList,   // float_list of prod(featureShape) values, used as written
  kInt64List,   // int64_list of prod(featureShape) values, times `scale`
};

// spec.training.dataset
struct DatasetConfig {
  DatasetType type = DatasetType::kSynthetic;
  // synthetic: Gaussian class clusters, deterministic in (seed, index).
  int64_t num_examples = 60000;
  int64_t num_eval_examples = 10000;
  int num_features = 784;
  int num_classes = 10;
  float noise = 1.0f;  // per-feature std-dev around the class centre
  // idx: MNIST-format image/label files; csv: files with the label column;
  // tfrecord: files of tf.train.Example records. Entries may be shell-style
  // patterns (`data/train-*.tfrecord.gz`), expanded in sorted order when the
  // data is opened (ExpandDatasetFiles).
  std::vector<std::string> train_files;  // idx: images files; csv: csv files
  std::vector<std::string> train_label_files;  // idx only, parallel to train_files
  std::vector<std::string> eval_files;
  std::vector<std::string> eval_label_files;
  int label_column = 0;       // csv
  bool csv_header = false;    // csv: skip the first line of each file
  float scale = 1.0f / 255;   // idx, tfrecord uint8Bytes/int64List: pixel multiplier
  // tfrecord: which features of each tf.train.Example are the input and the label.
  DataCompression compression = DataCompression::kNone;
  std::string feature_key = "image";
  std::vector<int> feature_shape;  // required for tfrecord: one example's shape, e.g. {28, 28, 1}
  FeatureEncoding feature_encoding = FeatureEncoding::kUint8Bytes;
  std::string label_key = "label";  // int64_list with one value in [0, numClasses)
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
  bool shuffle = true;
  int prefetch_batches = 2;
  bool operator==(const DatasetConfig&) const = default;
};

// spec.training.optimizer.schedule: Keras' learning-rate schedules
// (keras.optimizers.schedules), by class name, starting from the optimizer's
// learningRate (Keras' initial_learning_rate) — PiecewiseConstantDecay's
// `values` give every rate instead. The optimizer's step k (1-based) uses the
// rate at step k - 1, as Keras evaluates the schedule at `iterations` before
// incrementing it.
enum class LearningRateScheduleType {
  kConstant,                // learningRate throughout
  kExponentialDecay,        // lr * decayRate^(step / decaySteps)
  kInverseTimeDecay,        // lr / (1 + decayRate * step / decaySteps)
  kPolynomialDecay,         // (lr - end) * (1 - step / decaySteps)^power + end
  kPiecewiseConstantDecay,  // values[i] from boundaries[i - 1] (exclusive) to boundaries[i]
  kCosineDecay,             // optional linear warmup to warmupTarget, then cosine to alpha * peak
};
struct LearningRateScheduleConfig {
  LearningRateScheduleType type = LearningRateScheduleType::kConstant;
  int64_t decay_steps = 0;         // every type but Constant and PiecewiseConstantDecay
  float decay_rate = 0.0f;         // ExponentialDecay, InverseTimeDecay
  bool staircase = false;          // ExponentialDecay, InverseTimeDecay: whole periods only
  float end_learning_rate = 1e-4f;  // PolynomialDecay (Keras' defaults)
  float power = 1.0f;
  bool cycle = false;
  float alpha = 0.0f;              // CosineDecay: the final rate as a fraction of the peak
  int64_t warmup_steps = 0;        // CosineDecay
  std::optional<float> warmup_target;  // CosineDecay: the peak after warmup; unset: no warmup
  std::vector<int> boundaries;     // PiecewiseConstantDecay: increasing steps
  std::vector<float> values;       // PiecewiseConstantDecay: boundaries + 1 rates
  bool operator==(const LearningRateScheduleConfig&) const = default;
};
// The rate at optimizer step `step` (0-based: the number of updates already
// applied), in float32 as Keras computes it; `initial` is learningRate.
float LearningRateAt(const LearningRateScheduleConfig& schedule, float initial, int64_t step);

// sgd and momentum are Keras' SGD without and with momentum; adamw is Keras'
// AdamW (Adam with decoupled weight decay, 0.004 unless set).
enum class OptimizerType { kSgd, kMomentum, kAdam, kAdamW, kRmsprop };

// spec.training.optimizer — Keras semantics for every update rule.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdam;
  float learning_rate = 0.001f;
  float momentum = 0.9f;      // momentum
  bool nesterov = false;      // momentum
  float beta1 = 0.9f;         // adam, adamw
  float beta2 = 0.999f;       // adam, adamw
  float epsilon = 1e-7f;      // adam, adamw, rmsprop (Keras' default for each)
  float rho = 0.9f;           // rmsprop: decay of the squared-gradient average
  bool centered = false;      // rmsprop: divide by the gradient's variance estimate
  // Keras' weight_decay, any type: before each update w -= w * weightDecay *
  // learningRate. Unset: none, except adamw's 0.004.
  std::optional<float> weight_decay;
  LearningRateScheduleConfig schedule;
  bool operator==(const OptimizerConfig&) const = default;

  // The learning rate of optimizer step `step` (0-based), schedule applied.
  float LearningRate(int64_t step) const { return LearningRateAt(schedule, learning_rate, step); }

  float EffectiveWeightDecay() const {
    return weight_decay.value_or(type == OptimizerType::kAdamW ? 0.004f : 0.0f);
  }
};

// spec.training.export: the trained model as a Keras 3 .keras file, written
// by the chief after the last step (docs/keras.md).
struct ExportConfig {
  std::string path;  // empty: no export
  bool operator==(const ExportConfig&) const = default;
};

// spec.training.checkpoint.storage: the PersistentVolumeClaim the operator
// provisions for a job's checkpoints when `volume` names no storage of the
// job's own (operator/controller/checkpoint_volume.h). An empty field takes
// the operator's default (its --checkpoint-storage-* flags, the chart's
// checkpointStorage values). Read by the operator only.
struct CheckpointStorageConfig {
  std::string storage_class_name;  // empty: the operator's (empty there too: the cluster default)
  std::string size;                // a Kubernetes quantity, e.g. "10Gi"
  std::string access_mode;         // "ReadWriteOnce" | "ReadWriteMany"
  bool operator==(const CheckpointStorageConfig&) const = default;
};

// spec.training.checkpoint
struct CheckpointConfig {
  std::string dir;          // empty: DISTRAIN_CHECKPOINT_DIR, else no checkpoints
  int64_t every_steps = 0;  // 0: only the final (and SIGTERM) save
  int keep = 3;
  // The job's own storage for the checkpoints on Kubernetes: a core/v1
  // VolumeSource with exactly one source ({"persistentVolumeClaim":
  // {"claimName": "ckpt"}}, {"nfs": {...}}, {"emptyDir": {}} to opt out of
  // durable storage, ...), mounted at `dir` by the operator. Null: the
  // operator provisions a PersistentVolumeClaim (`storage`). Read by the
  // operator only; `distrain run` uses `dir` as a local directory.
  nlohmann::json volume;
  CheckpointStorageConfig storage;
  bool operator==(const CheckpointConfig&) const = default;
};

// The VolumeSource kinds spec.training.checkpoint.volume accepts: every
// core/v1 VolumeSource that can hold writable files (configMap, secret,
// downwardAPI, projected and image volumes are read-only).
const std::vector<std::string>& CheckpointVolumeSourceKinds();

// Whether `s` is a Kubernetes quantity as storage requests are written:
// digits, an optional fraction, an optional binary (Ki..Ei) or decimal (k..E)
// suffix ("10Gi", "500M"). The CRD's pattern for
// spec.training.checkpoint.storage.size is the same.
bool IsStorageQuantity(const std::string& s);

// spec.training.communication (TF's CommunicationOptions)
enum class CollectiveImplementation { kAuto, kRing, kNccl };
struct CommunicationConfig {
  CollectiveImplementation implementation = CollectiveImplementation::kAuto;
  double timeout_seconds = 60;
  int64_t bytes_per_pack = 4 << 20;
  bool operator==(const CommunicationConfig&) const = default;
};

// spec.training
struct TrainingConfig {
  ModelConfig model;
  DatasetConfig dataset;
  OptimizerConfig optimizer;
  CheckpointConfig checkpoint;
  ExportConfig export_model;  // spec.training.export ("export" is a C++ keyword)
  CommunicationConfig communication;
  int64_t global_batch_size = 256;
  int64_t steps = 1000;
  uint64_t seed = 42;
  int64_t log_every_steps = 50;
  int64_t eval_every_steps = 0;  // 0: evaluate once at the end
  int local_replicas = 0;        // Mirrored/CentralStorage: 0 = one per local device
  // ParameterServer: a push whose gradient was computed from parameters more
  // than this many updates old is rejected and redone on fresh parameters.
  // Unset: unbounded (TensorFlow's asynchronous default).
  std::optional<int64_t> max_staleness;
  bool operator==(const TrainingConfig&) const = default;
};

// spec.runPolicy: what the operator does around the job (Kubeflow's RunPolicy).
enum class CleanPodPolicy { kNone, kRunning, kAll };
// What a synchronous multi-process job (MultiWorkerMirrored) does when a
// worker dies. kInPlace: the survivors keep running and wait for its
// replacement, which rejoins the group; only the lost pod is recreated
// (losing the coordinator, the chief or worker 0, still restarts the group).
// kRestartGroup: every training process exits and all restart from the last
// checkpoint, as TensorFlow does.
enum class RecoveryPolicy { kInPlace, kRestartGroup };
struct SchedulingPolicy {
  bool gang = false;                  // create all pods as one gang (PodGroup)
  std::optional<int> min_available;   // gang size; unset: every replica
  std::string queue;
  std::string priority_class;
  std::string scheduler_name;         // empty: the cluster's default scheduler
  bool operator==(const SchedulingPolicy&) const = default;
};
struct RunPolicy {
  std::optional<int64_t> backoff_limit;             // unset: no limit on restarts
  std::optional<int64_t> active_deadline_seconds;   // unset: no deadline
  // How long a training process may go without completing a step before it
  // counts as stalled (/healthz fails, the operator sets Stalled and restarts
  // per restartPolicy); unset: derived from the step time
  // (common/progress_deadline.h).
  std::optional<int64_t> progress_deadline_seconds;
  std::optional<int64_t> ttl_seconds_after_finished;  // unset: keep the finished job
  RecoveryPolicy recovery_policy = RecoveryPolicy::kInPlace;
  // How long survivors wait for a lost worker's replacement before they give
  // up and exit (retryable: the group then restarts); unset: 300.
  std::optional<int64_t> recovery_timeout_seconds;
  // Running by default, as TFJob: a finished job holds no pod that still runs
  // (ps tasks, ours and TensorFlow's, never exit on their own).
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
  bool suspend = false;
  SchedulingPolicy scheduling;
  bool operator==(const RunPolicy&) const = default;
};

// spec.successPolicy. kDefault: the chief succeeds, or worker 0 when there is
// no chief; kAllWorkers: every worker succeeds.
enum class SuccessPolicy { kDefault, kAllWorkers };

// spec.security.transport: how the job's processes authenticate each other
// (docs/security.md). MutualTLS (the default): the operator (or `distrain
// run`) gives every task a certificate of a per-job CA and the job's ring
// key; gRPC is mutual TLS, the ring's handshake an HMAC challenge-response.
// Plaintext: the explicit opt-out, no credentials, anything that reaches a
// pod can join the job.
enum class TransportMode { kMutualTls, kPlaintext };

// spec.elasticPolicy: bounds on spec.replicaSpecs.Worker.replicas.
struct ElasticPolicy {
  int min_replicas = 1;
  int max_replicas = 1;
  bool operator==(const ElasticPolicy&) const = default;
};

struct JobConfig {
  std::string name = "job";  // metadata.name
  std::string namespace_ = "default";
  StrategyKind strategy = StrategyKind::kOneDevice;
  std::map<ReplicaType, ReplicaSpec> replicas;  // spec.replicaSpecs
  TrainingConfig training;
  RunPolicy run_policy;                         // spec.runPolicy
  SuccessPolicy success_policy = SuccessPolicy::kDefault;  // spec.successPolicy
  std::optional<ElasticPolicy> elastic_policy;  // spec.elasticPolicy
  TransportMode transport = TransportMode::kMutualTls;  // spec.security.transport
  bool operator==(const JobConfig&) const = default;

  int replicas_of(ReplicaType type) const {
    auto it = replicas.find(type);
    return it == replicas.end() ? 0 : it->second.replicas;
  }
};

// Parses a DistributedTrainingJob YAML document (apiVersion/kind/metadata/spec)
// and checks every field on its own (types, enums, bounds; all errors, one per
// line, each prefixed with the line of the YAML). Cross-field rules are
// ValidateJobConfig's job: call both.
absl::StatusOr<JobConfig> ParseJobYaml(const std::string& yaml_text);
absl::StatusOr<JobConfig> LoadJobYamlFile(const std::string& path);

// DISTRAIN_JOB_CONFIG round trip. Field paths in errors start at "spec." so a
// user sees the same path as in their YAML. The JSON carries every field:
//   {"name", "namespace", "strategy", "replicas": {"Worker": 2, ...},
//    "restartPolicies": {"Worker": "ExitCode", ...}, "successPolicy",
//    "runPolicy": {...}, "training": {...}, "elasticPolicy": {...} (when set)}
// with the camelCase names of the YAML. Parse(ToJson(c)) == c.
std::string JobConfigToJson(const JobConfig& config);
absl::StatusOr<JobConfig> ParseJobConfigJson(const std::string& json_text);

// Cross-field rules shared by every source (also enforced by the CRD's CEL
// rules): replica counts per strategy, batch divisibility, file lists, ...
absl::Status ValidateJobConfig(const JobConfig& config);

// The files a list of dataset.trainFiles-style entries names: an entry with a
// shell wildcard (* ? [) is expanded with glob(3) into its matches in sorted
// order, an error naming `field` and the pattern when it matches nothing;
// other entries are kept as written (a missing file is the loader's error,
// with its own message). `field` is the YAML path, e.g.
// "spec.training.dataset.trainFiles".
absl::StatusOr<std::vector<std::string>> ExpandDatasetFiles(
    const std::vector<std::string>& entries, const std::string& field);

// One example's shape as the worker will see it: synthetic -> {numFeatures};
// csv -> {columns - 1} from the first line of the first train file; idx ->
// {rows, cols, 1} from the first images file's header; tfrecord ->
// featureShape (declared in the YAML; the worker checks every record against
// it) once the first train file is found. Reads nothing else.
// An error when a file is missing or unreadable (the worker's data errors
// exit with code 4; callers treat this as "shape unknown").
absl::StatusOr<std::vector<int64_t>> ExampleShapeOf(const DatasetConfig& dataset);

// The model against its data, before any process starts (distrain run): the
// layers' shapes from ExampleShapeOf (every layer problem, one per line), the
// output against the loss and numClasses (synthetic). Call after
// ValidateJobConfig succeeded. `notes` (may be null) gets what is worth
// saying but not fatal: Keras' compile-time warnings (ModelWarnings) and shape
// checks skipped because the data could not be read.
absl::Status ValidateModelWithData(const JobConfig& config, std::vector<std::string>* notes);

// One field of spec that the parser accepts, so that other descriptions of
// the API (the CRD in crds/, docs) can be checked against this parser.
struct JobSpecField {
  std::string path;       // "spec.training.dataset.type"; "*" stands for each replica type
  std::string type;       // OpenAPI type: "integer", "number", "boolean", "string", "array"
  std::string item_type;  // arrays: the items' type
  std::vector<std::string> enum_values;  // allowed strings (case-sensitive); empty: any
  // Bounds; for arrays they apply to each item.
  std::optional<double> minimum;
  std::optional<double> maximum;
  bool exclusive_minimum = false;
  bool exclusive_maximum = false;
  // The default as compact JSON ("0.001", "\"adam\"", "[128]"); nullopt when an
  // absent field stays unset (std::optional) or the field is required.
  std::optional<std::string> default_json;
};
// Every leaf field of spec, in documentation order.
const std::vector<JobSpecField>& JobSpecFields();

}  // namespace distrain

#endif  // DISTRAIN_COMMON_JOB_CONFIG_H_

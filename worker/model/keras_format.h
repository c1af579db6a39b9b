#ifndef DISTRAIN_WORKER_MODEL_KERAS_FORMAT_H_
#define DISTRAIN_WORKER_MODEL_KERAS_FORMAT_H_

// Keras 3 interop both ways (docs/keras.md):
//   export: a checkpoint's variables and optimizer slots + the job's model
//           block -> a `.keras` file (a zip of config.json, metadata.json and
//           model.weights.h5) that keras.saving.load_model opens, compiled
//           with the job's loss and optimizer and carrying the optimizer's
//           state, so model.predict matches distrain and model.fit continues;
//   import: a Keras `model.to_json()` (or a .keras file's config.json) of a
//           Sequential, or of a Functional model whose layers form one chain
//           (the Sequential it equals) -> the model (and, when present, loss
//           and optimizer) blocks of a DistributedTrainingJob.
// Only the layers of common/model_spec.h exist on either side; anything else
// is an error naming the layer and listing the supported classes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "worker/checkpoint/checkpoint.h"

namespace distrain {

// The Keras release whose .keras layout (config keys, HDF5 groups, optimizer
// variable order) the writer follows and the interop tests load with.
inline constexpr char kKerasFormatVersion[] = "3.15.1";

// Checkpoint metadata keys that make a checkpoint directory exportable on its
// own: the job (JobConfigToJson) and the example shape ("28,28,1").
inline constexpr char kCheckpointJobConfigKey[] = "job_config";
inline constexpr char kCheckpointExampleShapeKey[] = "example_shape";

// What an export needs besides the variables.
struct KerasModelSpec {
  ModelConfig model;
  OptimizerConfig optimizer;
  std::vector<int64_t> example_shape;  // per example, as the dataset yields it
  int num_classes = 0;
};

// The model as Keras' config.json (a Sequential with its compile_config).
absl::StatusOr<std::string> KerasConfigJson(const KerasModelSpec& spec);

// Writes `path` (which must end in .keras) from a checkpoint's tensors
// ("variables/<name>", "optimizer/<name>/<slot>") and its
// "optimizer_iterations" metadata. Written to a temporary file and renamed,
// so a reader never sees half a model. Errors name the missing or mis-shaped
// variable (the checkpoint belongs to another model).
absl::Status ExportKerasModel(const KerasModelSpec& spec, const CheckpointState& state,
                              const std::string& path);

// The spec recorded in a checkpoint's metadata (kCheckpointJobConfigKey,
// kCheckpointExampleShapeKey, kCheckpointNumClassesKey); an error saying what
// is missing (checkpoints written before distrain recorded them: pass the
// job's YAML instead).
absl::StatusOr<KerasModelSpec> KerasModelSpecFromCheckpoint(const CheckpointState& state);

// A Keras Sequential's (or Functional chain's) JSON as spec.training blocks.
struct KerasImport {
  ModelConfig model;                         // type sequential, named layers; precision from
                                             // the layers' dtype policies (one for all)
  std::optional<OptimizerConfig> optimizer;  // from compile_config, when present
  bool has_loss = false;                     // compile_config named a loss
  std::vector<int64_t> input_shape;          // the InputLayer's, empty if none
  int64_t num_parameters = -1;               // Keras' count_params; -1 without an input shape
  std::vector<std::string> warnings;         // arguments distrain ignores
};
absl::StatusOr<KerasImport> ImportKerasModelJson(const std::string& json_text);

// A .keras file: its config.json imported as above, and its weights as a
// step-0 checkpoint of that model (variables only, optimizer iterations 0,
// so it restores into any spec.training.optimizer and training starts from
// Keras' weights: fine-tuning). The weights are matched by Keras' own
// addresses and checked against the shapes distrain builds.
struct KerasFileImport {
  KerasImport imported;
  CheckpointState weights;
};
absl::StatusOr<KerasFileImport> ImportKerasFile(const std::string& path);

// The imported blocks as YAML to paste under spec.training (model: and, when
// present, optimizer: and a mixed precision:), headed by a comment with the
// source and the parameter count.
std::string KerasImportYaml(const KerasImport& imported, const std::string& source);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_KERAS_FORMAT_H_

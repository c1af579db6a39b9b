#ifndef DISTRAIN_WORKER_DATA_DATASET_H_
#define DISTRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"

namespace distrain {

// A finite, random-access set of (features, label) examples held in memory.
// Immutable after construction, so Get() is safe from any thread.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int num_features() const = 0;
  virtual int num_classes() const = 0;
  // One example's shape; its product is num_features(). IDX images are
  // {rows, cols, 1} (NHWC without the batch, as Keras sees MNIST), rows of
  // CSV and synthetic data {num_features()}.
  virtual std::vector<int64_t> example_shape() const { return {num_features()}; }
  // Copies example `index` (0 <= index < size()) into features[num_features()].
  virtual void Get(int64_t index, float* features, int32_t* label) const = 0;
  // Where the examples came from ("train.csv", "synthetic"), for error messages.
  virtual std::string description() const { return "dataset"; }
};

// A dataset materialised as one contiguous float array (row-major
// [size, num_features]) plus int32 labels; what every loader produces, so
// Get() is a memcpy. Tests build it directly to get examples whose features
// encode their index.
class InMemoryDataset : public Dataset {
 public:
  // CHECKs features.size() == labels.size() * num_features. `example_shape`
  // (empty: {num_features}) must multiply out to num_features (CHECKed).
  InMemoryDataset(std::string description, int num_features, int num_classes,
                  std::vector<float> features, std::vector<int32_t> labels,
                  std::vector<int64_t> example_shape = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int num_features() const override { return num_features_; }
  int num_classes() const override { return num_classes_; }
  std::vector<int64_t> example_shape() const override { return example_shape_; }
  void Get(int64_t index, float* features, int32_t* label) const override;
  std::string description() const override { return description_; }

 private:
  std::string description_;
  int num_features_;
  int num_classes_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  std::vector<int64_t> example_shape_;
};

// Portable pseudo-random numbers: the same bits on every compiler, standard
// library and CPU (std::*_distribution are implementation-defined), so every
// process derives the same synthetic data and epoch permutations.
// SplitMix64 (Steele et al.): state advances by a Weyl constant and each
// output is a bijective mix of the state, so a stream is a pure function of
// its starting key. Not thread-safe; cheap to copy.
class PortableRng {
 public:
  explicit PortableRng(uint64_t key) : state_(key) {}
  // Key for an independent stream derived from (a, b); chain for more parts.
  static uint64_t MixKey(uint64_t a, uint64_t b);
  uint64_t NextU64();
  // Uniform in [0, 1) with 53 random bits.
  double NextDouble();
  // Uniform integer in [0, bound), bound > 0 (Lemire's multiply-shift).
  uint64_t NextBelow(uint64_t bound);
  // Two independent standard normals (Box-Muller, polar form).
  void NextNormalPair(double* z0, double* z1);

 private:
  uint64_t state_;
};

// Deterministic Gaussian-cluster classification: class centres and every
// example are pure functions of (seed, index), so all processes agree without
// communicating. `eval_split` draws a disjoint set from the same distribution.
absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticDataset(const DatasetConfig& config,
                                                              uint64_t seed, bool eval_split);

// MNIST-format IDX (magic 0x00000803 images uint8 [n, rows, cols], 0x00000801
// labels uint8 [n]); gzip is not supported (the error says to gunzip).
// example_shape() is {rows, cols, 1}. Errors name the file and the byte offset.
absl::StatusOr<std::unique_ptr<Dataset>> LoadIdxDataset(const std::string& images_path,
                                                         const std::string& labels_path, float scale);

// CSV: numeric columns, one of which (label_column) is the integer class.
// Errors name the file and the line. Number of classes = max label + 1 unless
// `num_classes` > 0 (then labels must be below it).
absl::StatusOr<std::unique_ptr<Dataset>> LoadCsvDataset(const std::string& path, int label_column,
                                                        bool header, int num_classes);

// TFRecord file of tf.train.Example records (worker/data/tfrecord_dataset.cc),
// read with config.compression. Each record's config.feature_key feature is
// decoded per config.feature_encoding into prod(config.feature_shape) floats
// (uint8Bytes and int64List times config.scale, floatList as written), its
// config.label_key feature (an int64_list with one value >= 0) is the label.
// example_shape() is feature_shape. Number of classes = max label + 1 (at
// least 2) unless `num_classes` > 0 (then labels must be below it). Errors
// name the record's index, the file and byte offset, the feature and the
// field to fix; an empty file is an error.
absl::StatusOr<std::unique_ptr<Dataset>> LoadTfRecordDataset(const std::string& path,
                                                             const DatasetConfig& config,
                                                             int num_classes);

// When the model's first layer (after Input) is an Embedding, checks that
// every feature of `data` is a token id it can look up: a whole number in
// [0, inputDim). The first bad one is named (its example, feature and value)
// with the fix; anything else is OK.
absl::Status CheckTokenIds(const Dataset& data, const ModelConfig& model);

// Concatenation of datasets with equal example_shape (num_classes = max); the
// result has that example_shape.
absl::StatusOr<std::unique_ptr<Dataset>> ConcatDatasets(std::vector<std::unique_ptr<Dataset>> parts);

// The training data one input pipeline reads, following the auto-shard policy
// (TensorFlow's AutoShardPolicy semantics). trainFiles entries that are
// patterns are expanded first (ExpandDatasetFiles, sorted), so "files" below
// are the expanded ones, as tf.data's list_files would give:
//   FILE: this pipeline reads files i with i % num_shards == shard_index (an
//         error when there are fewer files than shards);
//   DATA: all files; ShardedBatcher keeps every num_shards-th example;
//   AUTO: FILE when there are at least num_shards files, else DATA;
//   OFF:  all files, every pipeline sees every example.
// `effective_policy` reports the resolved policy (never kAuto).
struct TrainingInput {
  std::unique_ptr<Dataset> dataset;
  AutoShardPolicy effective_policy = AutoShardPolicy::kData;
};
absl::StatusOr<TrainingInput> OpenTrainingInput(const DatasetConfig& config, uint64_t seed,
                                                int shard_index, int num_shards);
// Held-out data for evaluation; nullptr (OK) when the config has none.
absl::StatusOr<std::unique_ptr<Dataset>> OpenEvalDataset(const DatasetConfig& config, uint64_t seed);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_DATA_DATASET_H_

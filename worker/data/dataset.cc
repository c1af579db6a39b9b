#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace distrain {

// ---------------------------------------------------------------------------
// InMemoryDataset

InMemoryDataset::InMemoryDataset(std::string description, int num_features, int num_classes,
                                 std::vector<float> features, std::vector<int32_t> labels,
                                 std::vector<int64_t> example_shape)
    : description_(std::move(description)),
      num_features_(num_features),
      num_classes_(num_classes),
      features_(std::move(features)),
      labels_(std::move(labels)),
      example_shape_(std::move(example_shape)) {
  DISTRAIN_CHECK_GT(num_features_, 0);
  DISTRAIN_CHECK_EQ(features_.size(), labels_.size() * static_cast<size_t>(num_features_));
  if (example_shape_.empty()) example_shape_ = {num_features_};
  int64_t product = 1;
  for (int64_t d : example_shape_) {
    DISTRAIN_CHECK_GT(d, 0);
    product *= d;
  }
  DISTRAIN_CHECK_EQ(product, static_cast<int64_t>(num_features_));
}

void InMemoryDataset::Get(int64_t index, float* features, int32_t* label) const {
  const size_t row = static_cast<size_t>(index) * num_features_;
  std::memcpy(features, features_.data() + row, num_features_ * sizeof(float));
  *label = labels_[index];
}

// ---------------------------------------------------------------------------
// PortableRng

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t PortableRng::MixKey(uint64_t a, uint64_t b) {
  // Mixing `a` before combining keeps (a, b) and (b, a) apart.
  return Mix64(Mix64(a + kGolden) ^ (b * 0xd1b54a32d192ed03ULL + 0x8cb92ba72f3d8dd7ULL));
}

uint64_t PortableRng::NextU64() {
  state_ += kGolden;
  return Mix64(state_);
}

double PortableRng::NextDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

uint64_t PortableRng::NextBelow(uint64_t bound) {
  DISTRAIN_CHECK_GT(bound, 0u);
  // The bias of plain multiply-shift is below bound / 2^64, far under
  // anything a dataset index could observe; no rejection loop keeps the
  // number of draws per call fixed (and the stream position predictable).
  return static_cast<uint64_t>((static_cast<unsigned __int128>(NextU64()) * bound) >> 64);
}

void PortableRng::NextNormalPair(double* z0, double* z1) {
  // Marsaglia's polar form of Box-Muller: no sin/cos, about twice as fast,
  // which matters when materialising tens of millions of features. Each draw
  // splits one 64-bit output into two 32-bit coordinates in [-1, 1); 32 bits
  // bound |z| below ~9, far beyond anything a Gaussian cluster needs.
  double x, y, s;
  do {
    const uint64_t bits = NextU64();
    x = static_cast<double>(bits >> 32) * 0x1.0p-31 - 1.0;
    y = static_cast<double>(bits & 0xffffffffULL) * 0x1.0p-31 - 1.0;
    s = x * x + y * y;
  } while (s >= 1.0 || s == 0.0);
  const double f = std::sqrt(-2.0 * std::log(s) / s);
  *z0 = x * f;
  *z1 = y * f;
}

// ---------------------------------------------------------------------------
// Concatenation

namespace {

// Parts laid end to end; Get() finds the part by binary search over the
// cumulative sizes (a handful of parts, so this is noise next to the copy).
class ConcatDataset : public Dataset {
 public:
  ConcatDataset(std::vector<std::unique_ptr<Dataset>> parts, int num_classes)
      : parts_(std::move(parts)), num_classes_(num_classes) {
    int64_t total = 0;
    for (const auto& part : parts_) {
      total += part->size();
      ends_.push_back(total);
    }
  }

  int64_t size() const override { return ends_.back(); }
  int num_features() const override { return parts_.front()->num_features(); }
  int num_classes() const override { return num_classes_; }
  std::vector<int64_t> example_shape() const override { return parts_.front()->example_shape(); }
  void Get(int64_t index, float* features, int32_t* label) const override {
    if (parts_.size() == 1) {
      parts_.front()->Get(index, features, label);
      return;
    }
    const size_t part = std::upper_bound(ends_.begin(), ends_.end(), index) - ends_.begin();
    const int64_t begin = part == 0 ? 0 : ends_[part - 1];
    parts_[part]->Get(index - begin, features, label);
  }
  std::string description() const override {
    std::string out;
    for (const auto& part : parts_) {
      absl::StrAppend(&out, out.empty() ? "" : "+", part->description());
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<Dataset>> parts_;
  std::vector<int64_t> ends_;
  int num_classes_;
};

// Concatenation whose num_classes is at least `min_num_classes`, so every
// shard and the eval set agree on the model's output width.
absl::StatusOr<std::unique_ptr<Dataset>> Concat(std::vector<std::unique_ptr<Dataset>> parts,
                                                int min_num_classes) {
  if (parts.empty()) return absl::InvalidArgumentError("no datasets to concatenate");
  int num_classes = min_num_classes;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("dataset part ", i, " is null"));
    if (parts[i]->num_features() != parts[0]->num_features()) {
      return absl::InvalidArgumentError(absl::StrCat(
          parts[i]->description(), " has ", parts[i]->num_features(), " features per example but ",
          parts[0]->description(), " has ", parts[0]->num_features(),
          "; every file of one dataset must have the same number of features"));
    }
    if (parts[i]->example_shape() != parts[0]->example_shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          parts[i]->description(), " has examples of shape [",
          absl::StrJoin(parts[i]->example_shape(), ", "), "] but ", parts[0]->description(),
          " has [", absl::StrJoin(parts[0]->example_shape(), ", "),
          "]; every file of one dataset must have the same example shape"));
    }
    num_classes = std::max(num_classes, parts[i]->num_classes());
  }
  return std::make_unique<ConcatDataset>(std::move(parts), num_classes);
}

}  // namespace

absl::Status CheckTokenIds(const Dataset& data, const ModelConfig& model) {
  const std::vector<LayerConfig>& layers = model.layers;
  size_t index = !layers.empty() && layers[0].kind == LayerKind::kInput ? 1 : 0;
  if (model.type != "sequential" || index >= layers.size() ||
      layers[index].kind != LayerKind::kEmbedding) {
    return absl::OkStatus();
  }
  const int64_t vocab = layers[index].input_dim;
  std::vector<float> features(static_cast<size_t>(data.num_features()));
  int32_t label = 0;
  for (int64_t e = 0; e < data.size(); ++e) {
    data.Get(e, features.data(), &label);
    for (size_t f = 0; f < features.size(); ++f) {
      const float id = features[f];
      if (id >= 0 && id < static_cast<float>(vocab) && std::floor(id) == id) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          data.description(), ": example ", e, ", feature ", f, " is ", id,
          ", but spec.training.model.layers[", index, "] (Embedding) looks up token ids, whole "
          "numbers in [0, ", vocab, ") (inputDim: ", vocab, "): fix the data, raise inputDim, "
          "or set spec.training.dataset.scale: 1 if the ids arrived scaled"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> ConcatDatasets(
    std::vector<std::unique_ptr<Dataset>> parts) {
  if (parts.size() == 1 && parts[0] != nullptr) return std::move(parts[0]);
  return Concat(std::move(parts), 0);
}

// ---------------------------------------------------------------------------
// Opening the configured data

namespace {

constexpr char kDatasetPath[] = "spec.training.dataset";

const char* TypeArticle(DatasetType type) {
  switch (type) {
    case DatasetType::kIdx:
      return "an IDX";
    case DatasetType::kCsv:
      return "a CSV";
    case DatasetType::kTfRecord:
      return "a TFRecord";
    case DatasetType::kSynthetic:
      break;
  }
  return "a synthetic";
}

// `entries` of config field `field` ("trainFiles") with patterns expanded.
absl::StatusOr<std::vector<std::string>> Expand(const std::vector<std::string>& entries,
                                                const std::string& field) {
  return ExpandDatasetFiles(entries, absl::StrCat(kDatasetPath, ".", field));
}

// Loads files[i] for every i in `indices` (plus label_files[i] for IDX) and
// concatenates them. `files_field` is the config path used in errors; the
// lists are already expanded (Expand), `from_patterns` when that changed them
// (then an index into the YAML's list would mislead, and errors say "file i").
absl::StatusOr<std::unique_ptr<Dataset>> LoadFiles(const DatasetConfig& config,
                                                   const std::vector<std::string>& files,
                                                   bool from_patterns,
                                                   const std::vector<std::string>& label_files,
                                                   const std::string& files_field,
                                                   const std::string& label_files_field,
                                                   const std::vector<size_t>& indices) {
  if (config.type == DatasetType::kIdx && label_files.size() != files.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kDatasetPath, ".", label_files_field,
        ": IDX datasets need one labels file per images file in ", kDatasetPath, ".", files_field,
        " (", files.size(), " images files, ", label_files.size(), " labels files)"));
  }
  if (config.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kDatasetPath, ".numClasses: must be at least 2, got ", config.num_classes));
  }
  std::vector<std::unique_ptr<Dataset>> parts;
  for (size_t i : indices) {
    absl::StatusOr<std::unique_ptr<Dataset>> part;
    if (config.type == DatasetType::kIdx) {
      part = LoadIdxDataset(files[i], label_files[i], config.scale);
    } else if (config.type == DatasetType::kTfRecord) {
      part = LoadTfRecordDataset(files[i], config, config.num_classes);
    } else {
      part = LoadCsvDataset(files[i], config.label_column, config.csv_header, config.num_classes);
    }
    if (!part.ok()) {
      const std::string which =
          from_patterns ? absl::StrCat(" (file ", i, " of ", files.size(), " the patterns match)")
                        : absl::StrCat("[", i, "]");
      return absl::Status(part.status().code(), absl::StrCat(kDatasetPath, ".", files_field, which,
                                                             ": ", part.status().message()));
    }
    if ((*part)->num_classes() > config.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(kDatasetPath, ".numClasses: ", files[i], " has labels up to ",
                       (*part)->num_classes() - 1, " but numClasses is ", config.num_classes,
                       "; set numClasses to at least ", (*part)->num_classes()));
    }
    parts.push_back(*std::move(part));
  }
  // Every shard (and the eval set) reports the configured class count, so
  // models built from different shards have the same output width.
  return Concat(std::move(parts), config.num_classes);
}

}  // namespace

absl::StatusOr<TrainingInput> OpenTrainingInput(const DatasetConfig& config, uint64_t seed,
                                                int shard_index, int num_shards) {
  if (num_shards < 1 || shard_index < 0 || shard_index >= num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("input shard ", shard_index, " of ", num_shards, " is out of range"));
  }
  TrainingInput input;
  if (config.type == DatasetType::kSynthetic) {
    switch (config.auto_shard_policy) {
      case AutoShardPolicy::kFile:
        return absl::InvalidArgumentError(
            absl::StrCat(kDatasetPath, ".autoShardPolicy: FILE sharding splits ", kDatasetPath,
                         ".trainFiles across workers, but a synthetic dataset has no files; use "
                         "DATA (or AUTO)"));
      case AutoShardPolicy::kAuto:
      case AutoShardPolicy::kData:
        input.effective_policy = AutoShardPolicy::kData;
        break;
      case AutoShardPolicy::kOff:
        input.effective_policy = AutoShardPolicy::kOff;
        break;
    }
    auto dataset = MakeSyntheticDataset(config, seed, /*eval_split=*/false);
    if (!dataset.ok()) return dataset.status();
    input.dataset = *std::move(dataset);
    return input;
  }

  absl::StatusOr<std::vector<std::string>> expanded = Expand(config.train_files, "trainFiles");
  if (!expanded.ok()) return expanded.status();
  absl::StatusOr<std::vector<std::string>> label_files =
      Expand(config.train_label_files, "trainLabelFiles");
  if (!label_files.ok()) return label_files.status();
  const std::vector<std::string>& files = *expanded;
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kDatasetPath, ".trainFiles: ",
                                                   TypeArticle(config.type),
                                                   " dataset needs at least one training file"));
  }
  AutoShardPolicy policy = config.auto_shard_policy;
  if (policy == AutoShardPolicy::kAuto) {
    policy = files.size() >= static_cast<size_t>(num_shards) ? AutoShardPolicy::kFile
                                                             : AutoShardPolicy::kData;
  }
  if (policy == AutoShardPolicy::kFile && files.size() < static_cast<size_t>(num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kDatasetPath,
        ".autoShardPolicy: FILE sharding needs at least one file per input pipeline, but ",
        kDatasetPath, ".trainFiles has ", files.size(), " for ", num_shards,
        " pipelines; add files, or use DATA (or AUTO)"));
  }
  std::vector<size_t> indices;
  for (size_t i = 0; i < files.size(); ++i) {
    if (policy != AutoShardPolicy::kFile || i % num_shards == static_cast<size_t>(shard_index)) {
      indices.push_back(i);
    }
  }
  auto dataset = LoadFiles(config, files, files != config.train_files, *label_files, "trainFiles",
                           "trainLabelFiles", indices);
  if (!dataset.ok()) return dataset.status();
  input.dataset = *std::move(dataset);
  input.effective_policy = policy;
  return input;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenEvalDataset(const DatasetConfig& config,
                                                         uint64_t seed) {
  if (config.type == DatasetType::kSynthetic) {
    if (config.num_eval_examples <= 0) return std::unique_ptr<Dataset>();
    return MakeSyntheticDataset(config, seed, /*eval_split=*/true);
  }
  if (config.eval_files.empty()) return std::unique_ptr<Dataset>();
  absl::StatusOr<std::vector<std::string>> files = Expand(config.eval_files, "evalFiles");
  if (!files.ok()) return files.status();
  absl::StatusOr<std::vector<std::string>> label_files =
      Expand(config.eval_label_files, "evalLabelFiles");
  if (!label_files.ok()) return label_files.status();
  std::vector<size_t> indices(files->size());
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = i;
  return LoadFiles(config, *files, *files != config.eval_files, *label_files, "evalFiles",
                   "evalLabelFiles", indices);
}

}  // namespace distrain

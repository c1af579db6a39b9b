// Synthetic Gaussian-cluster classification data.
//
// Class c has a centre mu_c whose coordinates are drawn N(0, s^2) with
// s = kCentreSpread / sqrt(num_features), so the expected distance between two
// centres (kCentreSpread * sqrt(2)) does not depend on the number of features
// and a 784-feature set is as hard as a 64-feature one. Example i of a split
// has label y_i uniform over the classes and features mu_{y_i} + noise * z,
// z ~ N(0, I). With noise 1 the Bayes classifier is right ~99% of the time,
// so a small MLP can reach 95%+ but the task is not solved at step 0.
//
// Everything is a pure function of (seed, split, index) through PortableRng,
// so every process derives identical data without communicating. A row is
// generated the first time it is read and kept (SyntheticDataset below), so a
// process pays only for the examples its shard reads, when it first reads
// them: starting one (a replacement rejoining a group in place, a restarted
// job) no longer generates the whole split first (60000 x 784 normals, most of
// a second, and 188 MB, of which a DATA-sharded process reads a quarter).

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

constexpr double kCentreSpread = 4.0;
// Stream tags: centres, train examples, eval examples.
constexpr uint64_t kCentreStream = 0x63656e7472657300ULL;
constexpr uint64_t kTrainStream = 1;
constexpr uint64_t kEvalStream = 2;
// 2^31 floats = 8 GiB; beyond that a typo in numExamples is likelier than intent.
constexpr int64_t kMaxFloats = int64_t{1} << 31;

// The examples of one split, each generated on its first Get() and kept.
// Owns the class centres and the row storage: one uninitialised allocation of
// size x num_features floats whose pages are touched only by the rows read.
// Thread-safe: Get() may run on any thread; a row's state goes 0 (absent) ->
// 1 (being written by the thread that claimed it) -> 2 (ready, published by a
// release store), and readers of a row in state 1 wait for it.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(std::string description, int64_t count, int num_features, int num_classes,
                   std::vector<float> centres, uint64_t split_key, double noise)
      : description_(std::move(description)),
        count_(count),
        num_features_(num_features),
        num_classes_(num_classes),
        centres_(std::move(centres)),
        split_key_(split_key),
        noise_(noise),
        features_(new float[static_cast<size_t>(count) * num_features]),
        labels_(new int32_t[count]),
        state_(new std::atomic<uint8_t>[count]()) {}

  int64_t size() const override { return count_; }
  int num_features() const override { return num_features_; }
  int num_classes() const override { return num_classes_; }
  std::string description() const override { return description_; }

  void Get(int64_t index, float* features, int32_t* label) const override {
    std::atomic<uint8_t>& state = state_[index];
    float* row = features_.get() + static_cast<size_t>(index) * num_features_;
    uint8_t seen = state.load(std::memory_order_acquire);
    if (seen != kReady) {
      uint8_t absent = kAbsent;
      if (state.compare_exchange_strong(absent, kWriting, std::memory_order_acquire)) {
        labels_[index] = Generate(index, row);
        state.store(kReady, std::memory_order_release);
      } else {
        while (state.load(std::memory_order_acquire) != kReady) std::this_thread::yield();
      }
    }
    std::memcpy(features, row, sizeof(float) * num_features_);
    *label = labels_[index];
  }

 private:
  static constexpr uint8_t kAbsent = 0;
  static constexpr uint8_t kWriting = 1;
  static constexpr uint8_t kReady = 2;

  // Example `index`: its label, and its features written to `row`.
  int32_t Generate(int64_t index, float* row) const {
    PortableRng rng(PortableRng::MixKey(split_key_, static_cast<uint64_t>(index)));
    const int32_t label = static_cast<int32_t>(rng.NextBelow(num_classes_));
    const float* centre = centres_.data() + static_cast<size_t>(label) * num_features_;
    int64_t j = 0;
    for (; j + 1 < num_features_; j += 2) {
      double z0, z1;
      rng.NextNormalPair(&z0, &z1);
      row[j] = centre[j] + static_cast<float>(noise_ * z0);
      row[j + 1] = centre[j + 1] + static_cast<float>(noise_ * z1);
    }
    if (j < num_features_) {
      double z0, z1;
      rng.NextNormalPair(&z0, &z1);
      row[j] = centre[j] + static_cast<float>(noise_ * z0);
    }
    return label;
  }

  const std::string description_;
  const int64_t count_;
  const int num_features_;
  const int num_classes_;
  const std::vector<float> centres_;
  const uint64_t split_key_;
  const double noise_;
  const std::unique_ptr<float[]> features_;  // rows in state kReady are valid
  const std::unique_ptr<int32_t[]> labels_;
  const std::unique_ptr<std::atomic<uint8_t>[]> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticDataset(const DatasetConfig& config,
                                                              uint64_t seed, bool eval_split) {
  const char* count_field = eval_split ? "numEvalExamples" : "numExamples";
  const int64_t count = eval_split ? config.num_eval_examples : config.num_examples;
  if (count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.training.dataset.", count_field, ": must be positive, got ", count));
  }
  if (config.num_features <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.numFeatures: must be positive, got ", config.num_features));
  }
  if (config.num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.numClasses: must be at least 2, got ", config.num_classes));
  }
  if (!(config.noise >= 0) || !std::isfinite(config.noise)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.training.dataset.noise: must be a finite number >= 0, got ", config.noise));
  }
  const int64_t nf = config.num_features;
  if (count > kMaxFloats / nf) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.training.dataset.", count_field, ": ", count, " examples of ", nf,
                     " features would need ", count * nf * 4 / (int64_t{1} << 30),
                     " GiB; use at most ", kMaxFloats / nf));
  }

  // Class centres: shared by both splits.
  std::vector<float> centres(static_cast<size_t>(config.num_classes) * nf);
  {
    PortableRng rng(PortableRng::MixKey(seed, kCentreStream));
    const double spread = kCentreSpread / std::sqrt(static_cast<double>(nf));
    for (size_t k = 0; k < centres.size(); k += 2) {
      double z0, z1;
      rng.NextNormalPair(&z0, &z1);
      centres[k] = static_cast<float>(spread * z0);
      if (k + 1 < centres.size()) centres[k + 1] = static_cast<float>(spread * z1);
    }
  }

  const uint64_t split_key = PortableRng::MixKey(seed, eval_split ? kEvalStream : kTrainStream);
  return std::make_unique<SyntheticDataset>(eval_split ? "synthetic (eval split)" : "synthetic",
                                            count, static_cast<int>(nf), config.num_classes,
                                            std::move(centres), split_key, config.noise);
}

}  // namespace distrain

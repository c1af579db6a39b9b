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
// so every process materialises identical data without communicating.

#include <cmath>
#include <cstdint>
#include <memory>
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

  std::vector<float> features(static_cast<size_t>(count * nf));
  std::vector<int32_t> labels(count);
  const uint64_t split_key = PortableRng::MixKey(seed, eval_split ? kEvalStream : kTrainStream);
  const double noise = config.noise;
  for (int64_t i = 0; i < count; ++i) {
    PortableRng rng(PortableRng::MixKey(split_key, static_cast<uint64_t>(i)));
    const int32_t label = static_cast<int32_t>(rng.NextBelow(config.num_classes));
    labels[i] = label;
    const float* centre = centres.data() + static_cast<size_t>(label) * nf;
    float* row = features.data() + static_cast<size_t>(i) * nf;
    int64_t j = 0;
    for (; j + 1 < nf; j += 2) {
      double z0, z1;
      rng.NextNormalPair(&z0, &z1);
      row[j] = centre[j] + static_cast<float>(noise * z0);
      row[j + 1] = centre[j + 1] + static_cast<float>(noise * z1);
    }
    if (j < nf) {
      double z0, z1;
      rng.NextNormalPair(&z0, &z1);
      row[j] = centre[j] + static_cast<float>(noise * z0);
    }
  }
  return std::make_unique<InMemoryDataset>(eval_split ? "synthetic (eval split)" : "synthetic",
                                           static_cast<int>(nf), config.num_classes,
                                           std::move(features), std::move(labels));
}

}  // namespace distrain

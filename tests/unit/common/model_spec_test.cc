// spec.training.model: Keras layer stacks (common/model_spec.h) and their
// parsing and validation (common/job_config.h).
#include "common/model_spec.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Shapes = std::vector<std::vector<int64_t>>;

// A whole job whose spec.training is `training` (YAML at column 0).
std::string JobWithTraining(const std::string& training) {
  std::string out =
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\nmetadata: {name: m}\n"
      "spec:\n  replicaSpecs: {Worker: {replicas: 1}}\n  training:\n";
  for (absl::string_view line : absl::StrSplit(training, '\n')) {
    if (!line.empty()) absl::StrAppend(&out, "    ", line, "\n");
  }
  return out;
}

// Parse + ValidateJobConfig + ValidateModelWithData, as `distrain run` does;
// the first error's message, or "<ok>".
std::string Problems(const std::string& training, std::vector<std::string>* notes = nullptr) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(JobWithTraining(training));
  if (!config.ok()) return std::string(config.status().message());
  if (absl::Status s = ValidateJobConfig(*config); !s.ok()) return std::string(s.message());
  if (absl::Status s = ValidateModelWithData(*config, notes); !s.ok()) {
    return std::string(s.message());
  }
  return "<ok>";
}

JobConfig MustParse(const std::string& training) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(JobWithTraining(training));
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return {};
  EXPECT_TRUE(ValidateJobConfig(*config).ok()) << ValidateJobConfig(*config);
  return *config;
}

LayerConfig Layer(LayerKind kind, const std::string& name) {
  LayerConfig l;
  l.kind = kind;
  l.name = name;
  return l;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "model-spec-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = (std::filesystem::path(path_) / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

 private:
  std::string path_;
};

// An IDX images header (magic 0x00000803, [n, rows, cols]) without pixels:
// shape checks read no further.
std::string IdxHeader(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = {0, 0, 8, 3};
  for (uint32_t v : {n, rows, cols}) {
    for (int shift : {24, 16, 8, 0}) s.push_back(static_cast<char>((v >> shift) & 0xff));
  }
  return s;
}

// TensorFlow's guide CNN (tensorflow.org/tutorials/images/cnn, MNIST-sized).
constexpr char kGuideCnn[] = R"(model:
  layers:
    - Conv2D: {filters: 32, kernelSize: [3, 3], activation: relu}
    - MaxPooling2D: {poolSize: [2, 2]}
    - Conv2D: {filters: 64, kernelSize: [3, 3], activation: relu}
    - Flatten: {}
    - Dense: {units: 64, activation: relu}
    - Dense: {units: 10}
  loss: {type: SparseCategoricalCrossentropy, fromLogits: true}
)";

// The guide CNN on MNIST-format files (not read: ValidateJobConfig checks
// the layers' arguments only; ValidateModelWithData reads the header).
const std::string kGuideCnnJob =
    std::string("dataset: {type: idx, trainFiles: [train.idx], trainLabelFiles: [labels.idx]}\n") +
    kGuideCnn;

// ---------------------------------------------------------------------------
// Names

TEST(ModelSpecNamesTest, LayerClassesRoundTrip) {
  const std::vector<std::string> names = LayerKindNames();
  EXPECT_EQ(names.size(), 25u);
  for (const std::string& name : names) {
    std::optional<LayerKind> kind = ParseLayerKind(name);
    ASSERT_TRUE(kind.has_value()) << name;
    EXPECT_EQ(LayerKindName(*kind), name);
  }
  EXPECT_FALSE(ParseLayerKind("conv2d").has_value()) << "class names are case-sensitive";
  EXPECT_FALSE(ParseLayerKind("LSTM").has_value());
}

TEST(ModelSpecNamesTest, ActivationsAndLossesRoundTrip) {
  const std::vector<std::string> names = ActivationNames();
  EXPECT_EQ(names.size(), 17u);
  for (const std::string& name : names) {
    ASSERT_TRUE(ParseActivationName(name).has_value()) << name;
    EXPECT_EQ(ActivationName(*ParseActivationName(name)), name);
  }
  // Keras' aliases parse, and print as the name Keras writes into files.
  EXPECT_EQ(ActivationNames(/*with_aliases=*/true).size(), 19u);
  EXPECT_STREQ(ActivationName(*ParseActivationName("swish")), "silu");
  EXPECT_STREQ(ActivationName(*ParseActivationName("hard_swish")), "hard_silu");
  EXPECT_FALSE(ParseActivationName("Relu").has_value());
  EXPECT_FALSE(ParseActivationName("log_softmax").has_value());
  for (const char* name : {"SparseCategoricalCrossentropy", "CategoricalCrossentropy",
                           "BinaryCrossentropy", "MeanSquaredError"}) {
    ASSERT_TRUE(ParseLossKindName(name).has_value()) << name;
    EXPECT_STREQ(LossKindName(*ParseLossKindName(name)), name);
  }
  EXPECT_FALSE(ParseLossKindName("mse").has_value());
}

TEST(ModelSpecNamesTest, KerasAutomaticNames) {
  std::vector<LayerConfig> layers = {
      Layer(LayerKind::kConv2D, ""),
      Layer(LayerKind::kMaxPooling2D, ""),
      Layer(LayerKind::kConv2D, ""),
      Layer(LayerKind::kAveragePooling2D, ""),
      Layer(LayerKind::kGlobalAveragePooling2D, ""),
      Layer(LayerKind::kBatchNormalization, ""),
      Layer(LayerKind::kFlatten, ""),
      Layer(LayerKind::kReshape, ""),
      Layer(LayerKind::kDense, ""),
      Layer(LayerKind::kDropout, ""),
      Layer(LayerKind::kActivation, ""),
      Layer(LayerKind::kDense, ""),
      Layer(LayerKind::kDense, "head"),
  };
  AssignLayerNames(&layers);
  std::vector<std::string> names;
  for (const LayerConfig& l : layers) names.push_back(l.name);
  EXPECT_THAT(names, ElementsAre("conv2d", "max_pooling2d", "conv2d_1", "average_pooling2d",
                                 "global_average_pooling2d", "batch_normalization", "flatten",
                                 "reshape", "dense", "dropout", "activation", "dense_1", "head"));
}

TEST(ModelSpecNamesTest, AutomaticNamesStepAroundUserNames) {
  std::vector<LayerConfig> layers = {Layer(LayerKind::kDense, ""),
                                     Layer(LayerKind::kDense, "dense_1"),
                                     Layer(LayerKind::kDense, "")};
  AssignLayerNames(&layers);
  EXPECT_EQ(layers[0].name, "dense");
  EXPECT_EQ(layers[1].name, "dense_1");
  EXPECT_EQ(layers[2].name, "dense_2");
}

TEST(ModelSpecNamesTest, EffectiveStridesFollowKeras) {
  LayerConfig conv = Layer(LayerKind::kConv2D, "");
  EXPECT_EQ(conv.EffectiveStrides(), (std::array<int64_t, 2>{1, 1}));
  LayerConfig pool = Layer(LayerKind::kMaxPooling2D, "");
  pool.pool_size = {3, 2};
  EXPECT_EQ(pool.EffectiveStrides(), (std::array<int64_t, 2>{3, 2}))
      << "strides default to poolSize";
  pool.strides = std::array<int64_t, 2>{1, 1};
  EXPECT_EQ(pool.EffectiveStrides(), (std::array<int64_t, 2>{1, 1}));
}

// ---------------------------------------------------------------------------
// Padding arithmetic

struct WindowCase {
  int64_t in;  // rows; cols are in + 1
  int64_t kernel;
  int64_t stride;
  PaddingKind padding;
  int64_t out_rows;
  int64_t out_cols;
};

// Conv2D(1, (k, k), strides=(s, s), padding=p).compute_output_shape(
// (None, n, n + 1, 1)), printed by Keras 3.15 (TensorFlow backend).
constexpr WindowCase kKerasWindows[] = {
    {5, 1, 1, PaddingKind::kValid, 5, 6}, {5, 1, 1, PaddingKind::kSame, 5, 6},
    {5, 1, 2, PaddingKind::kValid, 3, 3}, {5, 1, 2, PaddingKind::kSame, 3, 3},
    {5, 1, 3, PaddingKind::kValid, 2, 2}, {5, 1, 3, PaddingKind::kSame, 2, 2},
    {5, 2, 1, PaddingKind::kValid, 4, 5}, {5, 2, 1, PaddingKind::kSame, 5, 6},
    {5, 2, 2, PaddingKind::kValid, 2, 3}, {5, 2, 2, PaddingKind::kSame, 3, 3},
    {5, 2, 3, PaddingKind::kValid, 2, 2}, {5, 2, 3, PaddingKind::kSame, 2, 2},
    {5, 3, 1, PaddingKind::kValid, 3, 4}, {5, 3, 1, PaddingKind::kSame, 5, 6},
    {5, 3, 2, PaddingKind::kValid, 2, 2}, {5, 3, 2, PaddingKind::kSame, 3, 3},
    {5, 3, 3, PaddingKind::kValid, 1, 2}, {5, 3, 3, PaddingKind::kSame, 2, 2},
    {5, 4, 1, PaddingKind::kValid, 2, 3}, {5, 4, 1, PaddingKind::kSame, 5, 6},
    {5, 4, 2, PaddingKind::kValid, 1, 2}, {5, 4, 2, PaddingKind::kSame, 3, 3},
    {5, 4, 3, PaddingKind::kValid, 1, 1}, {5, 4, 3, PaddingKind::kSame, 2, 2},
    {5, 5, 1, PaddingKind::kValid, 1, 2}, {5, 5, 1, PaddingKind::kSame, 5, 6},
    {5, 5, 2, PaddingKind::kValid, 1, 1}, {5, 5, 2, PaddingKind::kSame, 3, 3},
    {5, 5, 3, PaddingKind::kValid, 1, 1}, {5, 5, 3, PaddingKind::kSame, 2, 2},
    {6, 1, 1, PaddingKind::kValid, 6, 7}, {6, 1, 1, PaddingKind::kSame, 6, 7},
    {6, 1, 2, PaddingKind::kValid, 3, 4}, {6, 1, 2, PaddingKind::kSame, 3, 4},
    {6, 1, 3, PaddingKind::kValid, 2, 3}, {6, 1, 3, PaddingKind::kSame, 2, 3},
    {6, 2, 1, PaddingKind::kValid, 5, 6}, {6, 2, 1, PaddingKind::kSame, 6, 7},
    {6, 2, 2, PaddingKind::kValid, 3, 3}, {6, 2, 2, PaddingKind::kSame, 3, 4},
    {6, 2, 3, PaddingKind::kValid, 2, 2}, {6, 2, 3, PaddingKind::kSame, 2, 3},
    {6, 3, 1, PaddingKind::kValid, 4, 5}, {6, 3, 1, PaddingKind::kSame, 6, 7},
    {6, 3, 2, PaddingKind::kValid, 2, 3}, {6, 3, 2, PaddingKind::kSame, 3, 4},
    {6, 3, 3, PaddingKind::kValid, 2, 2}, {6, 3, 3, PaddingKind::kSame, 2, 3},
    {6, 4, 1, PaddingKind::kValid, 3, 4}, {6, 4, 1, PaddingKind::kSame, 6, 7},
    {6, 4, 2, PaddingKind::kValid, 2, 2}, {6, 4, 2, PaddingKind::kSame, 3, 4},
    {6, 4, 3, PaddingKind::kValid, 1, 2}, {6, 4, 3, PaddingKind::kSame, 2, 3},
    {6, 5, 1, PaddingKind::kValid, 2, 3}, {6, 5, 1, PaddingKind::kSame, 6, 7},
    {6, 5, 2, PaddingKind::kValid, 1, 2}, {6, 5, 2, PaddingKind::kSame, 3, 4},
    {6, 5, 3, PaddingKind::kValid, 1, 1}, {6, 5, 3, PaddingKind::kSame, 2, 3},
    {7, 1, 1, PaddingKind::kValid, 7, 8}, {7, 1, 1, PaddingKind::kSame, 7, 8},
    {7, 1, 2, PaddingKind::kValid, 4, 4}, {7, 1, 2, PaddingKind::kSame, 4, 4},
    {7, 1, 3, PaddingKind::kValid, 3, 3}, {7, 1, 3, PaddingKind::kSame, 3, 3},
    {7, 2, 1, PaddingKind::kValid, 6, 7}, {7, 2, 1, PaddingKind::kSame, 7, 8},
    {7, 2, 2, PaddingKind::kValid, 3, 4}, {7, 2, 2, PaddingKind::kSame, 4, 4},
    {7, 2, 3, PaddingKind::kValid, 2, 3}, {7, 2, 3, PaddingKind::kSame, 3, 3},
    {7, 3, 1, PaddingKind::kValid, 5, 6}, {7, 3, 1, PaddingKind::kSame, 7, 8},
    {7, 3, 2, PaddingKind::kValid, 3, 3}, {7, 3, 2, PaddingKind::kSame, 4, 4},
    {7, 3, 3, PaddingKind::kValid, 2, 2}, {7, 3, 3, PaddingKind::kSame, 3, 3},
    {7, 4, 1, PaddingKind::kValid, 4, 5}, {7, 4, 1, PaddingKind::kSame, 7, 8},
    {7, 4, 2, PaddingKind::kValid, 2, 3}, {7, 4, 2, PaddingKind::kSame, 4, 4},
    {7, 4, 3, PaddingKind::kValid, 2, 2}, {7, 4, 3, PaddingKind::kSame, 3, 3},
    {7, 5, 1, PaddingKind::kValid, 3, 4}, {7, 5, 1, PaddingKind::kSame, 7, 8},
    {7, 5, 2, PaddingKind::kValid, 2, 2}, {7, 5, 2, PaddingKind::kSame, 4, 4},
    {7, 5, 3, PaddingKind::kValid, 1, 2}, {7, 5, 3, PaddingKind::kSame, 3, 3},
    {13, 1, 1, PaddingKind::kValid, 13, 14}, {13, 1, 1, PaddingKind::kSame, 13, 14},
    {13, 1, 2, PaddingKind::kValid, 7, 7}, {13, 1, 2, PaddingKind::kSame, 7, 7},
    {13, 1, 3, PaddingKind::kValid, 5, 5}, {13, 1, 3, PaddingKind::kSame, 5, 5},
    {13, 2, 1, PaddingKind::kValid, 12, 13}, {13, 2, 1, PaddingKind::kSame, 13, 14},
    {13, 2, 2, PaddingKind::kValid, 6, 7}, {13, 2, 2, PaddingKind::kSame, 7, 7},
    {13, 2, 3, PaddingKind::kValid, 4, 5}, {13, 2, 3, PaddingKind::kSame, 5, 5},
    {13, 3, 1, PaddingKind::kValid, 11, 12}, {13, 3, 1, PaddingKind::kSame, 13, 14},
    {13, 3, 2, PaddingKind::kValid, 6, 6}, {13, 3, 2, PaddingKind::kSame, 7, 7},
    {13, 3, 3, PaddingKind::kValid, 4, 4}, {13, 3, 3, PaddingKind::kSame, 5, 5},
    {13, 4, 1, PaddingKind::kValid, 10, 11}, {13, 4, 1, PaddingKind::kSame, 13, 14},
    {13, 4, 2, PaddingKind::kValid, 5, 6}, {13, 4, 2, PaddingKind::kSame, 7, 7},
    {13, 4, 3, PaddingKind::kValid, 4, 4}, {13, 4, 3, PaddingKind::kSame, 5, 5},
    {13, 5, 1, PaddingKind::kValid, 9, 10}, {13, 5, 1, PaddingKind::kSame, 13, 14},
    {13, 5, 2, PaddingKind::kValid, 5, 5}, {13, 5, 2, PaddingKind::kSame, 7, 7},
    {13, 5, 3, PaddingKind::kValid, 3, 4}, {13, 5, 3, PaddingKind::kSame, 5, 5},
    {28, 1, 1, PaddingKind::kValid, 28, 29}, {28, 1, 1, PaddingKind::kSame, 28, 29},
    {28, 1, 2, PaddingKind::kValid, 14, 15}, {28, 1, 2, PaddingKind::kSame, 14, 15},
    {28, 1, 3, PaddingKind::kValid, 10, 10}, {28, 1, 3, PaddingKind::kSame, 10, 10},
    {28, 2, 1, PaddingKind::kValid, 27, 28}, {28, 2, 1, PaddingKind::kSame, 28, 29},
    {28, 2, 2, PaddingKind::kValid, 14, 14}, {28, 2, 2, PaddingKind::kSame, 14, 15},
    {28, 2, 3, PaddingKind::kValid, 9, 10}, {28, 2, 3, PaddingKind::kSame, 10, 10},
    {28, 3, 1, PaddingKind::kValid, 26, 27}, {28, 3, 1, PaddingKind::kSame, 28, 29},
    {28, 3, 2, PaddingKind::kValid, 13, 14}, {28, 3, 2, PaddingKind::kSame, 14, 15},
    {28, 3, 3, PaddingKind::kValid, 9, 9}, {28, 3, 3, PaddingKind::kSame, 10, 10},
    {28, 4, 1, PaddingKind::kValid, 25, 26}, {28, 4, 1, PaddingKind::kSame, 28, 29},
    {28, 4, 2, PaddingKind::kValid, 13, 13}, {28, 4, 2, PaddingKind::kSame, 14, 15},
    {28, 4, 3, PaddingKind::kValid, 9, 9}, {28, 4, 3, PaddingKind::kSame, 10, 10},
    {28, 5, 1, PaddingKind::kValid, 24, 25}, {28, 5, 1, PaddingKind::kSame, 28, 29},
    {28, 5, 2, PaddingKind::kValid, 12, 13}, {28, 5, 2, PaddingKind::kSame, 14, 15},
    {28, 5, 3, PaddingKind::kValid, 8, 9}, {28, 5, 3, PaddingKind::kSame, 10, 10},
};

TEST(KerasAxisWindowTest, MatchesKerasOutputShapes) {
  for (const WindowCase& c : kKerasWindows) {
    SCOPED_TRACE(absl::StrCat("in ", c.in, " kernel ", c.kernel, " stride ", c.stride,
                              c.padding == PaddingKind::kSame ? " same" : " valid"));
    EXPECT_EQ(KerasAxisWindow(c.in, c.kernel, c.stride, c.padding).out, c.out_rows);
    EXPECT_EQ(KerasAxisWindow(c.in + 1, c.kernel, c.stride, c.padding).out, c.out_cols);
    // And through shape inference, both axes at once.
    LayerConfig conv = Layer(LayerKind::kConv2D, "c");
    conv.filters = 1;
    conv.kernel_size = {c.kernel, c.kernel};
    conv.strides = std::array<int64_t, 2>{c.stride, c.stride};
    conv.padding = c.padding;
    absl::StatusOr<Shapes> shapes = InferLayerShapes({conv}, {c.in, c.in + 1, 1});
    ASSERT_TRUE(shapes.ok()) << shapes.status();
    EXPECT_EQ((*shapes)[0], (std::vector<int64_t>{c.out_rows, c.out_cols, 1}));
  }
}

// Sizes no process can hold are refused by name before anything is
// allocated (the keras_json fuzzer found a 77-billion-float Conv2D kernel
// that reached the allocator).
TEST(InferLayerShapesTest, VariablesAndActivationsBeyondInt32ElementsAreRefusedByName) {
  LayerConfig conv = Layer(LayerKind::kConv2D, "c");
  conv.filters = 8;
  conv.kernel_size = {3, 3222222222};
  conv.padding = PaddingKind::kSame;
  absl::StatusOr<Shapes> huge_kernel = InferLayerShapes({conv}, {28, 28, 1});
  ASSERT_FALSE(huge_kernel.ok());
  EXPECT_THAT(std::string(huge_kernel.status().message()),
              ::testing::HasSubstr("layers[0] (Conv2D): its kernel would hold 77333333328 floats"));

  LayerConfig wide = Layer(LayerKind::kDense, "d");
  wide.units = int64_t{1} << 30;
  absl::StatusOr<Shapes> huge_dense = InferLayerShapes({wide}, {784});
  ASSERT_FALSE(huge_dense.ok());
  EXPECT_THAT(std::string(huge_dense.status().message()),
              ::testing::HasSubstr("(input features x units)"));

  LayerConfig many = Layer(LayerKind::kConv2D, "m");
  many.filters = int64_t{1} << 22;
  many.kernel_size = {1, 1};
  absl::StatusOr<Shapes> huge_output = InferLayerShapes({many}, {28, 28, 1});
  ASSERT_FALSE(huge_output.ok());
  EXPECT_THAT(std::string(huge_output.status().message()),
              ::testing::HasSubstr("floats per example"));

  // The guide's CNN is nowhere near.
  LayerConfig guide = Layer(LayerKind::kConv2D, "g");
  guide.filters = 32;
  guide.kernel_size = {3, 3};
  EXPECT_TRUE(InferLayerShapes({guide}, {28, 28, 1}).ok());
}

TEST(KerasAxisWindowTest, SamePaddingPutsTheOddElementAfter) {
  // TensorFlow: total = max((out - 1) * s + k - in, 0), before = total / 2.
  struct Case {
    int64_t in, k, s, out, before, after;
  };
  for (const Case& c : std::vector<Case>{{5, 3, 2, 3, 1, 1},
                                         {6, 3, 2, 3, 0, 1},
                                         {28, 3, 1, 28, 1, 1},
                                         {28, 4, 1, 28, 1, 2},
                                         {7, 2, 2, 4, 0, 1},
                                         {8, 2, 2, 4, 0, 0},
                                         {13, 5, 3, 5, 2, 2},
                                         {1, 5, 1, 1, 2, 2}}) {
    SCOPED_TRACE(absl::StrCat(c.in, " k", c.k, " s", c.s));
    AxisWindow w = KerasAxisWindow(c.in, c.k, c.s, PaddingKind::kSame);
    EXPECT_EQ(w.out, c.out);
    EXPECT_EQ(w.pad_before, c.before);
    EXPECT_EQ(w.pad_after, c.after);
  }
  AxisWindow valid = KerasAxisWindow(7, 3, 2, PaddingKind::kValid);
  EXPECT_EQ(valid.out, 3);
  EXPECT_EQ(valid.pad_before + valid.pad_after, 0);
}

TEST(KerasAxisWindowTest, WindowLargerThanInputDoesNotFit) {
  EXPECT_LE(KerasAxisWindow(2, 3, 1, PaddingKind::kValid).out, 0);
  EXPECT_LE(KerasAxisWindow(1, 5, 2, PaddingKind::kValid).out, 0);
  EXPECT_LE(KerasAxisWindow(3, 3, 0, PaddingKind::kValid).out, 0);
  EXPECT_EQ(KerasAxisWindow(3, 3, 5, PaddingKind::kValid).out, 1);
}

// ---------------------------------------------------------------------------
// Shape inference

TEST(InferLayerShapesTest, GuideCnnMatchesKeras) {
  JobConfig config = MustParse(kGuideCnnJob);
  absl::StatusOr<Shapes> shapes = InferLayerShapes(config.training.model.layers, {28, 28, 1});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  // keras.Sequential([...]).layers[i].output.shape, Keras 3.15.
  EXPECT_THAT(*shapes, ElementsAre(std::vector<int64_t>{26, 26, 32},
                                   std::vector<int64_t>{13, 13, 32},
                                   std::vector<int64_t>{11, 11, 64}, std::vector<int64_t>{7744},
                                   std::vector<int64_t>{64}, std::vector<int64_t>{10}));
}

TEST(InferLayerShapesTest, PoolingSameAndValidMatchKeras) {
  // keras.layers.MaxPooling2D(3, 2, padding=p).compute_output_shape((None, 7, 8, 4)).
  LayerConfig pool = Layer(LayerKind::kMaxPooling2D, "p");
  pool.pool_size = {3, 3};
  pool.strides = std::array<int64_t, 2>{2, 2};
  EXPECT_EQ(InferLayerShapes({pool}, {7, 8, 4})->at(0), (std::vector<int64_t>{3, 3, 4}));
  pool.padding = PaddingKind::kSame;
  EXPECT_EQ(InferLayerShapes({pool}, {7, 8, 4})->at(0), (std::vector<int64_t>{4, 4, 4}));
}

TEST(InferLayerShapesTest, ReshapeInfersTheMinusOne) {
  LayerConfig reshape = Layer(LayerKind::kReshape, "r");
  reshape.shape = {-1, 4, 1};
  LayerConfig gap = Layer(LayerKind::kGlobalAveragePooling2D, "g");
  absl::StatusOr<Shapes> shapes = InferLayerShapes({reshape, gap}, {16});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[0], (std::vector<int64_t>{4, 4, 1}));
  EXPECT_EQ((*shapes)[1], (std::vector<int64_t>{1}));
}

TEST(InferLayerShapesTest, ReportsEveryMistakeAtOnce) {
  LayerConfig conv = Layer(LayerKind::kConv2D, "conv2d");
  conv.filters = 8;
  conv.kernel_size = {3, 3};
  LayerConfig dense = Layer(LayerKind::kDense, "dense");
  dense.units = 0;
  LayerConfig dropout = Layer(LayerKind::kDropout, "dropout");
  dropout.rate = 1.5;
  LayerConfig dup = Layer(LayerKind::kDense, "dense");
  dup.units = 10;
  absl::StatusOr<Shapes> shapes = InferLayerShapes({conv, dense, dropout, dup}, {784});
  ASSERT_FALSE(shapes.ok());
  const std::string message(shapes.status().message());
  EXPECT_THAT(message, HasSubstr("spec.training.model.layers[0] (Conv2D): expects a 3-D input "
                                 "[rows, cols, channels] but gets [784]; add Reshape: "
                                 "{targetShape: [28, 28, 1]} before it"));
  EXPECT_THAT(message, HasSubstr("spec.training.model.layers[1] (Dense): units must be a "
                                 "positive integer, got 0"));
  EXPECT_THAT(message, HasSubstr("spec.training.model.layers[2] (Dropout): rate must be in "
                                 "[0, 1)"));
  EXPECT_THAT(message, HasSubstr("spec.training.model.layers[3] (Dense): name \"dense\" is "
                                 "already used by layers[1]"));
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 3) << message;
}

// Keras' Dense works on the last axis: on an image it maps each pixel's
// channels; the output check then names the Dense layer a Flatten was
// probably meant before.
TEST(InferLayerShapesTest, DenseMapsTheLastAxisAndAForgottenFlattenIsNamed) {
  LayerConfig conv = Layer(LayerKind::kConv2D, "conv2d");
  conv.filters = 32;
  conv.kernel_size = {3, 3};
  LayerConfig pool = Layer(LayerKind::kMaxPooling2D, "max_pooling2d");
  LayerConfig dense = Layer(LayerKind::kDense, "dense");
  dense.units = 10;
  const std::vector<LayerConfig> layers = {conv, pool, dense};
  absl::StatusOr<Shapes> shapes = InferLayerShapes(layers, {28, 28, 1});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(shapes->back(), (std::vector<int64_t>{13, 13, 10}));
  LossConfig loss;
  EXPECT_EQ(CheckModelOutput(layers, {28, 28, 1}, *shapes, 10, loss).message(),
            "spec.training.model.layers: the model's output is [13, 13, 10] but "
            "SparseCategoricalCrossentropy needs one value per class, [10]; layers[2] (Dense) "
            "gets [13, 13, 32] and, as in Keras, applies to its last axis only: add Flatten (or "
            "a global pooling) before it");
}

// ---------------------------------------------------------------------------
// Output against the loss; Keras' compile-time warnings

TEST(CheckModelOutputTest, OutputMustFitTheLoss) {
  LossConfig scce;
  EXPECT_TRUE(CheckModelOutput({10}, 10, scce).ok());
  EXPECT_TRUE(CheckModelOutput({7}, 0, scce).ok()) << "classes unknown: any [n]";
  EXPECT_THAT(std::string(CheckModelOutput({5}, 10, scce).message()),
              HasSubstr("the model's output is [5] but SparseCategoricalCrossentropy needs one "
                        "value per class, [10]; end the model with Dense: {units: 10}"));
  EXPECT_THAT(std::string(CheckModelOutput({5, 5, 10}, 10, scce).message()),
              HasSubstr("after a Flatten"));
  LossConfig bce;
  bce.kind = LossKind::kBinaryCrossentropy;
  EXPECT_TRUE(CheckModelOutput({1}, 2, bce).ok());
  EXPECT_THAT(std::string(CheckModelOutput({2}, 2, bce).message()), HasSubstr("needs [1]"));
  EXPECT_THAT(std::string(CheckModelOutput({1}, 10, bce).message()),
              HasSubstr("BinaryCrossentropy needs labels 0 and 1"));
  LossConfig mse;
  mse.kind = LossKind::kMeanSquaredError;
  EXPECT_TRUE(CheckModelOutput({1}, 10, mse).ok());
  EXPECT_TRUE(CheckModelOutput({10}, 10, mse).ok());
  EXPECT_FALSE(CheckModelOutput({3}, 10, mse).ok());
}

TEST(ModelWarningsTest, SoftmaxOutputWithFromLogitsGetsKerasWarning) {
  LayerConfig flatten = Layer(LayerKind::kFlatten, "flatten");
  LayerConfig head = Layer(LayerKind::kDense, "dense");
  head.units = 10;
  head.activation = ActivationKind::kSoftmax;
  LossConfig loss;
  loss.from_logits = true;
  std::vector<std::string> warnings = ModelWarnings({flatten, head}, loss);
  ASSERT_EQ(warnings.size(), 1u);
  // Keras' wording (keras/src/backend/tensorflow/nn.py), then where and the fix.
  EXPECT_THAT(warnings[0],
              HasSubstr("`sparse_categorical_crossentropy` received `from_logits=True`, but the "
                        "`output` argument was produced by a Softmax activation and thus does "
                        "not represent logits. Was this intended?"));
  EXPECT_THAT(warnings[0], HasSubstr("spec.training.model.layers[1] (Dense)"));
  loss.kind = LossKind::kCategoricalCrossentropy;
  EXPECT_THAT(ModelWarnings({flatten, head}, loss)[0],
              HasSubstr("`categorical_crossentropy` received `from_logits=True`"));

  loss.from_logits = false;
  EXPECT_THAT(ModelWarnings({flatten, head}, loss), IsEmpty());
  loss.from_logits = std::nullopt;
  EXPECT_THAT(ModelWarnings({flatten, head}, loss), IsEmpty()) << "unset: Keras' false";
  loss.from_logits = true;
  EXPECT_THAT(ModelWarnings({head, flatten}, loss), IsEmpty())
      << "Keras sees the last op only; a Flatten hides the Softmax";
}

TEST(ModelWarningsTest, SigmoidOrSoftmaxOutputWithAnyCrossentropyFromLogits) {
  LayerConfig head = Layer(LayerKind::kDense, "dense");
  head.units = 1;
  head.activation = ActivationKind::kSigmoid;
  LossConfig loss;
  loss.kind = LossKind::kBinaryCrossentropy;
  loss.from_logits = true;
  std::vector<std::string> warnings = ModelWarnings({head}, loss);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0],
              HasSubstr("`binary_crossentropy` received `from_logits=True`, but the `output` "
                        "argument was produced by a Sigmoid activation and thus does not "
                        "represent logits. Was this intended?"));
  LayerConfig act = Layer(LayerKind::kActivation, "activation");
  act.activation = ActivationKind::kSigmoid;
  head.activation = ActivationKind::kLinear;
  EXPECT_EQ(ModelWarnings({head, act}, loss).size(), 1u);
  // Keras 3 reads the logits behind a sigmoid for every cross-entropy, and
  // warns in the loss's own words (tests/golden: Keras warned for these).
  loss.kind = LossKind::kSparseCategoricalCrossentropy;
  warnings = ModelWarnings({head, act}, loss);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("produced by a Softmax activation"));
  EXPECT_THAT(warnings[0], HasSubstr("has activation: sigmoid"));
  act.activation = ActivationKind::kTanh;
  EXPECT_THAT(ModelWarnings({head, act}, loss), IsEmpty()) << "tanh keeps no logits";
}

TEST(ModelWarningsTest, ValidateModelWithDataPassesThemOn) {
  std::vector<std::string> notes;
  EXPECT_EQ(Problems(R"(dataset: {numFeatures: 8, numClasses: 3}
model:
  layers: [{Dense: {units: 3, activation: softmax}}]
  loss: {fromLogits: true}
)",
                     &notes),
            "<ok>");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("produced by a Softmax activation"));
}

// Keras' Rescaling(1/255) on pixels the dataset already scaled by 1/255 is
// legal but trains on values below 0.004: noted, with the fix.
TEST(ModelWarningsTest, PixelsScaledByTheDatasetAndByARescalingLayerAreNoted) {
  auto notes_for = [](const std::string& dataset_scale, const std::string& rescaling) {
    std::vector<std::string> notes;
    EXPECT_EQ(Problems(absl::StrCat("dataset: {type: idx, trainFiles: [no-such.idx], "
                                    "trainLabelFiles: [no-such-labels.idx]",
                                    dataset_scale, "}\nmodel:\n  layers:\n    - Rescaling: ",
                                    rescaling, "\n    - Dense: {units: 10}\n"),
                       &notes),
              "<ok>");
    std::vector<std::string> twice;
    for (const std::string& note : notes) {
      if (note.find("scaled twice") != std::string::npos) twice.push_back(note);
    }
    return twice;
  };
  std::vector<std::string> twice = notes_for("", "{scale: 0.00392156862745098}");
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_THAT(twice[0], AllOf(HasSubstr("spec.training.model.layers[0] (Rescaling): the pixels "
                                        "are scaled twice"),
                              HasSubstr("set spec.training.dataset.scale: 1")));
  EXPECT_THAT(notes_for(", scale: 1", "{scale: 0.00392156862745098}"), IsEmpty());
  EXPECT_THAT(notes_for("", "{scale: 2.0, offset: -1.0}"), IsEmpty()) << "[0, 1] to [-1, 1]";
}

// ---------------------------------------------------------------------------
// Parsing: good blocks

TEST(ModelParseTest, GuideCnnParsesToKerasLayers) {
  JobConfig config = MustParse(kGuideCnnJob);
  const ModelConfig& m = config.training.model;
  EXPECT_EQ(m.type, "sequential") << "layers without type mean sequential";
  ASSERT_EQ(m.layers.size(), 6u);
  LayerConfig conv = Layer(LayerKind::kConv2D, "conv2d");
  conv.filters = 32;
  conv.kernel_size = {3, 3};
  conv.activation = ActivationKind::kRelu;
  EXPECT_EQ(m.layers[0], conv);
  EXPECT_EQ(m.layers[1], Layer(LayerKind::kMaxPooling2D, "max_pooling2d"));
  conv.name = "conv2d_1";
  conv.filters = 64;
  EXPECT_EQ(m.layers[2], conv);
  EXPECT_EQ(m.layers[3], Layer(LayerKind::kFlatten, "flatten"));
  LayerConfig dense = Layer(LayerKind::kDense, "dense");
  dense.units = 64;
  dense.activation = ActivationKind::kRelu;
  EXPECT_EQ(m.layers[4], dense);
  LayerConfig logits = Layer(LayerKind::kDense, "dense_1");
  logits.units = 10;
  EXPECT_EQ(m.layers[5], logits);
  EXPECT_EQ(m.loss.kind, LossKind::kSparseCategoricalCrossentropy);
  EXPECT_EQ(m.loss.from_logits, true);
}

TEST(ModelParseTest, ScalarWindowsMeanBothAxes) {
  JobConfig config = MustParse(R"(model:
  layers:
    - Reshape: {targetShape: [28, 28, 1]}
    - Conv2D: {filters: 4, kernelSize: 5, strides: 2, padding: same}
    - AveragePooling2D: {poolSize: 3, strides: [1, 2]}
    - Flatten:
    - Dense: {units: 10}
)");
  const std::vector<LayerConfig>& layers = config.training.model.layers;
  ASSERT_EQ(layers.size(), 5u);
  EXPECT_EQ(layers[0].shape, (std::vector<int64_t>{28, 28, 1}));
  EXPECT_EQ(layers[1].kernel_size, (std::array<int64_t, 2>{5, 5}));
  EXPECT_EQ(layers[1].strides, (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(layers[1].padding, PaddingKind::kSame);
  EXPECT_EQ(layers[2].pool_size, (std::array<int64_t, 2>{3, 3}));
  EXPECT_EQ(layers[2].strides, (std::array<int64_t, 2>{1, 2}));
  EXPECT_EQ(layers[3], Layer(LayerKind::kFlatten, "flatten")) << "`- Flatten:` takes no arguments";
}

TEST(ModelParseTest, DropoutBatchNormGlobalPooling) {
  JobConfig config = MustParse(R"(model:
  layers:
    - Reshape: {targetShape: [28, 28, 1]}
    - Conv2D: {filters: 16, kernelSize: 3, padding: same, useBias: false}
    - BatchNormalization: {momentum: 0.9, epsilon: 0.00001}
    - Activation: {activation: relu}
    - GlobalAveragePooling2D: {}
    - Dropout: {rate: 0.25}
    - Dense: {units: 10, activation: softmax, name: head}
  loss: {type: SparseCategoricalCrossentropy}
)");
  const std::vector<LayerConfig>& layers = config.training.model.layers;
  ASSERT_EQ(layers.size(), 7u);
  LayerConfig conv = Layer(LayerKind::kConv2D, "conv2d");
  conv.filters = 16;
  conv.kernel_size = {3, 3};
  conv.padding = PaddingKind::kSame;
  conv.use_bias = false;
  EXPECT_EQ(layers[1], conv);
  LayerConfig bn = Layer(LayerKind::kBatchNormalization, "batch_normalization");
  bn.momentum = 0.9;
  bn.epsilon = 1e-5;
  EXPECT_EQ(layers[2], bn);
  LayerConfig act = Layer(LayerKind::kActivation, "activation");
  act.activation = ActivationKind::kRelu;
  EXPECT_EQ(layers[3], act);
  EXPECT_EQ(layers[4], Layer(LayerKind::kGlobalAveragePooling2D, "global_average_pooling2d"));
  LayerConfig dropout = Layer(LayerKind::kDropout, "dropout");
  dropout.rate = 0.25;
  EXPECT_EQ(layers[5], dropout);
  LayerConfig head = Layer(LayerKind::kDense, "head");
  head.units = 10;
  head.activation = ActivationKind::kSoftmax;
  EXPECT_EQ(layers[6], head);
  EXPECT_FALSE(config.training.model.loss.from_logits.has_value());
  absl::StatusOr<Shapes> shapes = InferLayerShapes(layers, {784});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[4], (std::vector<int64_t>{16}));
  EXPECT_EQ(shapes->back(), (std::vector<int64_t>{10}));
}

TEST(ModelParseTest, LayerAndRmsNormalizationTakeKerasArgumentsAndDefaults) {
  JobConfig config = MustParse(R"(model:
  layers:
    - Dense: {units: 16}
    - LayerNormalization: {}
    - LayerNormalization: {axis: 1, epsilon: 0.00001, center: false}
    - RMSNormalization: {}
    - RMSNormalization: {epsilon: 0.01, name: rms}
    - Dense: {units: 10}
  loss: {type: SparseCategoricalCrossentropy, fromLogits: true}
)");
  const std::vector<LayerConfig>& layers = config.training.model.layers;
  ASSERT_EQ(layers.size(), 6u);
  LayerConfig ln = Layer(LayerKind::kLayerNormalization, "layer_normalization");
  EXPECT_EQ(layers[1], ln) << "Keras' defaults: epsilon 1e-3, center and scale";
  EXPECT_EQ(layers[1].epsilon, 1e-3);
  ln.name = "layer_normalization_1";
  ln.axis = 1;
  ln.epsilon = 1e-5;
  ln.center = false;
  EXPECT_EQ(layers[2], ln);
  EXPECT_EQ(layers[3].kind, LayerKind::kRMSNormalization);
  EXPECT_EQ(layers[3].name, "rms_normalization");
  EXPECT_EQ(layers[3].epsilon, 1e-6) << "RMSNormalization's own default";
  EXPECT_EQ(layers[4].epsilon, 0.01);
  absl::StatusOr<Shapes> shapes = InferLayerShapes(layers, {784});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[3], (std::vector<int64_t>{16}));
}

TEST(ModelParseTest, EmbeddingTakesTokenIdsAndAddsAnAxis) {
  JobConfig config = MustParse(R"(dataset: {type: csv, trainFiles: [reviews.csv], numClasses: 2}
model:
  layers:
    - Input: {shape: [20]}
    - Embedding: {inputDim: 5000, outputDim: 16}
    - GlobalAveragePooling1D: {}
    - Dense: {units: 2}
  loss: {type: SparseCategoricalCrossentropy, fromLogits: true}
)");
  const std::vector<LayerConfig>& layers = config.training.model.layers;
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[1].kind, LayerKind::kEmbedding);
  EXPECT_EQ(layers[1].name, "embedding");
  EXPECT_EQ(layers[1].input_dim, 5000);
  EXPECT_EQ(layers[1].output_dim, 16);
  absl::StatusOr<Shapes> shapes = InferLayerShapes(layers, {20});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[1], (std::vector<int64_t>{20, 16}));
  EXPECT_EQ((*shapes)[2], (std::vector<int64_t>{16}));
  // A grid of ids keeps its shape and gains the vector axis.
  shapes = InferLayerShapes({layers[1]}, {4, 5});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[0], (std::vector<int64_t>{4, 5, 16}));
}

// Keras' causal padding: k - 1 steps before the sequence, none after, the
// length kept (divided by the stride, rounded up); Conv1D's only.
TEST(ModelParseTest, CausalConv1DKeepsTheLengthAndIsConv1DsOnly) {
  JobConfig config = MustParse(R"(model:
  layers:
    - Reshape: {targetShape: [784, 1]}
    - Conv1D: {filters: 4, kernelSize: 5, padding: causal}
    - Conv1D: {filters: 4, kernelSize: 3, strides: 2, padding: causal}
    - GlobalAveragePooling1D: {}
    - Dense: {units: 10}
)");
  const std::vector<LayerConfig>& layers = config.training.model.layers;
  EXPECT_EQ(layers[1].padding, PaddingKind::kCausal);
  absl::StatusOr<Shapes> shapes = InferLayerShapes(layers, {784});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[1], (std::vector<int64_t>{784, 4}));
  EXPECT_EQ((*shapes)[2], (std::vector<int64_t>{392, 4}));
  const AxisWindow w = KerasAxisWindow(10, 4, 3, PaddingKind::kCausal);
  EXPECT_EQ(w.out, 4);  // floor((10 - 1) / 3) + 1
  EXPECT_EQ(w.pad_before, 3);
  EXPECT_EQ(w.pad_after, 0);
  // A config built in code gets the same rule as the YAML.
  LayerConfig conv = Layer(LayerKind::kConv2D, "conv2d");
  conv.filters = 2;
  conv.kernel_size = {3, 3};
  conv.padding = PaddingKind::kCausal;
  absl::StatusOr<Shapes> refused = InferLayerShapes({conv}, {28, 28, 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("layers[0] (Conv2D): padding causal is Conv1D's only (as in Keras)"));
}

TEST(ModelParseTest, ReshapeCsvRowsIntoImages) {
  TempDir dir;
  // Label first, then 16 features: a 4x4 image per row.
  const std::string csv = dir.Write("rows.csv", "1,0,0,0,0,1,1,1,1,0,0,0,0,1,1,1,1\n"
                                                "0,1,1,1,1,0,0,0,0,1,1,1,1,0,0,0,0\n");
  const std::string training = absl::StrCat(R"(dataset: {type: csv, trainFiles: [")", csv, R"("]}
model:
  layers:
    - Reshape: {targetShape: [4, 4, 1]}
    - Conv2D: {filters: 4, kernelSize: 2, activation: relu}
    - Flatten: {}
    - Dense: {units: 2}
)");
  JobConfig config = MustParse(training);
  EXPECT_EQ(ExampleShapeOf(config.training.dataset).value(), (std::vector<int64_t>{16}));
  std::vector<std::string> notes;
  EXPECT_EQ(Problems(training, &notes), "<ok>");
  EXPECT_THAT(notes, IsEmpty());
  std::string wrong = training;
  wrong.replace(wrong.find("[4, 4, 1]"), 9, "[5, 5, 1]");
  EXPECT_THAT(Problems(wrong),
              HasSubstr("spec.training.model.layers[0] (Reshape): targetShape [5, 5, 1] has 25 "
                        "elements but its input [16] has 16"));
}

TEST(ModelParseTest, IdxHeaderGivesTheImageShape) {
  TempDir dir;
  const std::string images = dir.Write("images.idx", IdxHeader(3, 28, 28));
  const std::string labels = dir.Write("labels.idx", "");
  const std::string data = absl::StrCat("dataset: {type: idx, trainFiles: [\"", images,
                                        "\"], trainLabelFiles: [\"", labels, "\"]}\n");
  JobConfig config = MustParse(data + kGuideCnn);
  EXPECT_EQ(ExampleShapeOf(config.training.dataset).value(), (std::vector<int64_t>{28, 28, 1}));
  EXPECT_EQ(Problems(data + kGuideCnn), "<ok>");
  // The same model on 6x6 images: the second Conv2D no longer fits.
  const std::string small = dir.Write("small.idx", IdxHeader(3, 6, 6));
  std::string data8 = data;
  data8.replace(data8.find(images), images.size(), small);
  EXPECT_THAT(Problems(data8 + kGuideCnn),
              HasSubstr("spec.training.model.layers[2] (Conv2D): kernelSize [3, 3] is larger than "
                        "its input's spatial size [2, 2]"));
  // A dense model on images needs Flatten.
  EXPECT_THAT(Problems(data + "model: {layers: [{Dense: {units: 10}}]}\n"),
              HasSubstr("layers[0] (Dense) gets [28, 28, 1] and, as in Keras, applies to its last "
                        "axis only: add Flatten"));
}

TEST(ModelParseTest, UnreadableDataSkipsShapeChecksWithANote) {
  std::vector<std::string> notes;
  EXPECT_EQ(Problems(R"(dataset: {type: csv, trainFiles: ["/nonexistent/rows.csv"]}
model: {layers: [{Reshape: {targetShape: [28, 28, 1]}}, {Flatten: {}}, {Dense: {units: 10}}]}
)",
                     &notes),
            "<ok>");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("shape checks against the data skipped: /nonexistent/rows.csv"));
  EXPECT_THAT(notes[0], HasSubstr("exit code 4"));
  TempDir dir;
  EXPECT_THAT(ExampleShapeOf([&] {
                DatasetConfig d;
                d.type = DatasetType::kIdx;
                d.train_files = {dir.Write("g.idx", "\x1f\x8b\x08")};
                return d;
              }())
                  .status()
                  .message(),
              HasSubstr("gunzip it first"));
}

TEST(ModelParseTest, MlpShorthandStaysTheDefault) {
  JobConfig config = MustParse("model: {hiddenUnits: [64]}\n");
  EXPECT_EQ(config.training.model.type, "mlp");
  EXPECT_THAT(config.training.model.layers, IsEmpty());
  EXPECT_EQ(Problems("model: {}\n"), "<ok>");
  EXPECT_EQ(Problems("model: {type: mlp, loss: {fromLogits: true}}\n"), "<ok>");
}

TEST(ModelParseTest, JsonRoundTrip) {
  for (const std::string& training :
       {kGuideCnnJob, std::string(R"(model:
  layers:
    - Input: {shape: [784], name: pixels}
    - Reshape: {targetShape: [-1, 28, 1]}
    - Conv2D: {filters: 8, kernelSize: [5, 3], strides: [2, 1], padding: same,
               activation: gelu, useBias: false}
    - MaxPooling2D: {poolSize: 2, strides: 1, padding: same}
    - BatchNormalization: {momentum: 0.95, epsilon: 0.0001}
    - GlobalAveragePooling2D: {}
    - Dropout: {rate: 0.3}
    - Dense: {units: 1, activation: sigmoid}
  loss: {type: BinaryCrossentropy, fromLogits: false}
dataset: {numClasses: 2}
)"),
        std::string(R"(model:
  layers:
    - Rescaling: {scale: 0.00392156862745098, offset: -0.5}
    - Dense: {units: 32, activation: swish}
    - LeakyReLU: {}
    - Dense: {units: 16, activation: elu}
    - ReLU: {maxValue: 6}
    - ELU: {alpha: 0.5}
    - Dense: {units: 10, activation: mish}
    - LeakyReLU: {negativeSlope: 0.01}
    - ReLU: {negativeSlope: 0.1}
    - Softmax: {axis: 1}
dataset: {numFeatures: 8, numClasses: 10}
)"),
        std::string(R"(model:
  layers:
    - Reshape: {targetShape: [392, 2]}
    - Conv1D: {filters: 8, kernelSize: 5, strides: 2, padding: same, activation: relu}
    - MaxPooling1D: {}
    - AveragePooling1D: {poolSize: 3, strides: 1}
    - Conv1D: {filters: 4, kernelSize: [3], useBias: false}
    - GlobalAveragePooling1D: {}
    - Dense: {units: 10}
dataset: {numFeatures: 784, numClasses: 10}
)"),
        std::string(R"(model:
  layers:
    - Reshape: {targetShape: [49, 16]}
    - LayerNormalization: {}
    - LayerNormalization: {axis: 2, epsilon: 0.00001, center: false, scale: false}
    - RMSNormalization: {}
    - RMSNormalization: {epsilon: 0.001}
    - BatchNormalization: {axis: 2}
    - Flatten: {}
    - Dense: {units: 10}
    - LayerNormalization: {scale: false}
dataset: {numFeatures: 784, numClasses: 10}
)"),
        std::string(
            "model: {type: mlp, hiddenUnits: [32, 16], loss: {type: MeanSquaredError}}\n")}) {
    SCOPED_TRACE(training);
    JobConfig config = MustParse(training);
    const std::string json = JobConfigToJson(config);
    absl::StatusOr<JobConfig> back = ParseJobConfigJson(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(*back, config) << json;
    EXPECT_TRUE(ValidateJobConfig(*back).ok()) << ValidateJobConfig(*back);
    if (config.training.model.type == "sequential") {
      EXPECT_THAT(json, Not(HasSubstr("hiddenUnits"))) << "would conflict with the layers";
      EXPECT_THAT(json, HasSubstr("\"type\":\"sequential\""));
    } else {
      EXPECT_THAT(json, Not(HasSubstr("\"layers\"")));
    }
  }
}

TEST(ModelParseTest, JsonReadsLikeTheUsersYaml) {
  // Keras' defaults and automatic names are left out, so the spec the
  // operator writes back looks like what was applied.
  JobConfig config = MustParse(kGuideCnnJob);
  EXPECT_THAT(JobConfigToJson(config),
              HasSubstr("\"layers\":[{\"Conv2D\":{\"filters\":32,\"kernelSize\":[3,3],"
                        "\"activation\":\"relu\"}},{\"MaxPooling2D\":{\"poolSize\":[2,2]}},"
                        "{\"Conv2D\":{\"filters\":64,\"kernelSize\":[3,3],\"activation\":"
                        "\"relu\"}},{\"Flatten\":{}},{\"Dense\":{\"units\":64,\"activation\":"
                        "\"relu\"}},{\"Dense\":{\"units\":10}}],\"loss\":{\"type\":"
                        "\"SparseCategoricalCrossentropy\",\"fromLogits\":true}"));
  // Given names stay, also where they shift the automatic ones.
  JobConfig named = MustParse(R"(model:
  layers:
    - Dense: {units: 16, name: dense_1}
    - Dense: {units: 10}
)");
  EXPECT_EQ(named.training.model.layers[1].name, "dense");
  const std::string json = JobConfigToJson(named);
  EXPECT_THAT(json, HasSubstr("{\"Dense\":{\"units\":16,\"name\":\"dense_1\"}}"));
  absl::StatusOr<JobConfig> back = ParseJobConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, named);
}

TEST(ModelParseTest, CodeBuiltConfigsMeetTheYamlRules) {
  JobConfig config = MustParse(kGuideCnnJob);
  config.training.model.layers[0].filters = 0;
  config.training.model.layers[4].kernel_size = {0, 0};  // not a Conv2D argument: ignored
  config.training.model.loss.kind = LossKind::kMeanSquaredError;
  config.training.model.loss.from_logits = true;
  absl::Status s = ValidateJobConfig(config);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.training.model.layers[0].Conv2D.filters: must be a positive "
                        "integer, got 0"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.training.model.loss.fromLogits: MeanSquaredError takes no "
                        "fromLogits"));
  JobConfig mlp_with_layers = MustParse(kGuideCnnJob);
  mlp_with_layers.training.model.type = "mlp";
  EXPECT_THAT(std::string(ValidateJobConfig(mlp_with_layers).message()),
              HasSubstr("spec.training.model.layers: given with spec.training.model.type: mlp"));
}

// ---------------------------------------------------------------------------
// Parsing and validation: bad blocks. Each names the layer (or field) and
// the reason.

struct BadModel {
  const char* name;
  std::string training;  // spec.training, YAML
  std::vector<std::string> expected;  // substrings of the error
};

constexpr char kImage[] = "    - Reshape: {targetShape: [28, 28, 1]}\n";

std::string Layers(const std::string& body, const std::string& extra = "") {
  return absl::StrCat("dataset: {numFeatures: 784, numClasses: 10}\nmodel:\n  layers:\n", body,
                      extra);
}

class BadModelTest : public ::testing::TestWithParam<BadModel> {};

TEST_P(BadModelTest, ErrorNamesTheLayerAndTheReason) {
  const BadModel& bad = GetParam();
  const std::string problems = Problems(bad.training);
  EXPECT_NE(problems, "<ok>");
  for (const std::string& expected : bad.expected) {
    EXPECT_THAT(problems, HasSubstr(expected)) << bad.training;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, BadModelTest,
    ::testing::Values(
        BadModel{"ConvOnRows",
                 Layers("    - Conv2D: {filters: 8, kernelSize: 3}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0] (Conv2D): expects a 3-D input [rows, cols, "
                  "channels] but gets [784]; add Reshape: {targetShape: [28, 28, 1]} before it"}},
        BadModel{"DenseWithoutFlatten",
                 Layers(absl::StrCat(kImage, "    - Conv2D: {filters: 8, kernelSize: 3}\n"
                                             "    - Dense: {units: 10}\n")),
                 {"the model's output is [26, 26, 10] but SparseCategoricalCrossentropy needs "
                  "one value per class, [10]; layers[2] (Dense) gets [26, 26, 8] and, as in "
                  "Keras, applies to its last axis only: add Flatten"}},
        BadModel{"PoolLargerThanInput",
                 Layers(absl::StrCat(kImage, "    - MaxPooling2D: {poolSize: 32}\n"
                                             "    - Flatten: {}\n    - Dense: {units: 10}\n")),
                 {"spec.training.model.layers[1] (MaxPooling2D): poolSize [32, 32] is larger "
                  "than its input's spatial size [28, 28]",
                  "padding: same"}},
        BadModel{"KernelLargerThanPooledInput",
                 Layers(absl::StrCat(kImage, "    - MaxPooling2D: {poolSize: 14}\n"
                                             "    - Conv2D: {filters: 4, kernelSize: 3}\n"
                                             "    - Flatten: {}\n    - Dense: {units: 10}\n")),
                 {"spec.training.model.layers[2] (Conv2D): kernelSize [3, 3] is larger than its "
                  "input's spatial size [2, 2] (input [2, 2, 1], padding valid)"}},
        BadModel{"ReshapeElementCount",
                 Layers("    - Reshape: {targetShape: [27, 27, 1]}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0] (Reshape): targetShape [27, 27, 1] has 729 "
                  "elements but its input [784] has 784"}},
        BadModel{"ReshapeTwoUnknowns",
                 Layers("    - Reshape: {targetShape: [-1, -1, 1]}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0].Reshape.targetShape: has more than one -1"}},
        BadModel{"ReshapeUnknownNotDivisible",
                 Layers("    - Reshape: {targetShape: [-1, 5]}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0] (Reshape)", "not a multiple of 5"}},
        BadModel{"InputShapeDiffersFromData",
                 Layers("    - Input: {shape: [28, 28, 1]}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0] (Input): shape [28, 28, 1] differs from the "
                  "dataset's example shape [784]"}},
        BadModel{"InputNotFirst",
                 Layers("    - Flatten: {}\n    - Input: {shape: [784]}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[1] (Input): Input must be the first layer"}},
        BadModel{"ZeroFilters",
                 Layers(absl::StrCat(kImage, "    - Conv2D: {filters: 0, kernelSize: 3}\n")),
                 {"spec.training.model.layers[1].Conv2D.filters: must be a positive integer, "
                  "got 0"}},
        BadModel{"NegativeUnits", Layers("    - Dense: {units: -3}\n"),
                 {"spec.training.model.layers[0].Dense.units: must be a positive integer, got -3"}},
        BadModel{"KernelSizeOneEntry",
                 Layers(absl::StrCat(kImage, "    - Conv2D: {filters: 4, kernelSize: [3]}\n")),
                 {"spec.training.model.layers[1].Conv2D.kernelSize: must be an integer or a list "
                  "of 2 integers [rows, cols], got [3]"}},
        BadModel{"ZeroStrides",
                 Layers(absl::StrCat(kImage,
                                     "    - Conv2D: {filters: 4, kernelSize: 3, strides: 0}\n")),
                 {"spec.training.model.layers[1].Conv2D.strides: must be a positive integer"}},
        BadModel{"ZeroPoolSize",
                 Layers(absl::StrCat(kImage, "    - MaxPooling2D: {poolSize: [0, 2]}\n")),
                 {"spec.training.model.layers[1].MaxPooling2D.poolSize[0]: must be a positive "
                  "integer, got 0"}},
        BadModel{"DropoutRateOne",
                 Layers("    - Dropout: {rate: 1}\n    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0].Dropout.rate: must be a number in [0, 1), got 1"}},
        BadModel{"BatchNormMomentum",
                 Layers("    - BatchNormalization: {momentum: 1.5}\n    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0].BatchNormalization.momentum: must be a number "
                  "in [0, 1], got 1.5"}},
        BadModel{"BatchNormEpsilon",
                 Layers("    - BatchNormalization: {epsilon: 0}\n    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0].BatchNormalization.epsilon: must be a positive "
                  "number, got 0"}},
        BadModel{"UnknownClassCase", Layers("    - Conv2d: {filters: 4, kernelSize: 3}\n"),
                 {"spec.training.model.layers[0].Conv2d: unknown layer class \"Conv2d\"; did you "
                  "mean \"Conv2D\"? Supported layer classes: Input, Reshape, Conv2D, "
                  "MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, Flatten, Dense, "
                  "Dropout, BatchNormalization, Activation"}},
        BadModel{"KerasAliasClass", Layers("    - MaxPool2D: {poolSize: 2}\n"),
                 {"layers[0].MaxPool2D: unknown layer class \"MaxPool2D\"; did you mean "
                  "\"MaxPooling2D\"?"}},
        BadModel{"UnsupportedClass", Layers("    - LSTM: {units: 4}\n"),
                 {"layers[0].LSTM: unknown layer class \"LSTM\". Supported layer classes: "
                  "Input"}},
        BadModel{"SnakeCaseArgument",
                 Layers(absl::StrCat(kImage, "    - Conv2D: {filters: 4, kernel_size: 3}\n")),
                 {"spec.training.model.layers[1].Conv2D.kernel_size: unknown argument of Conv2D; "
                  "did you mean \"kernelSize\"?"}},
        BadModel{"ArgumentOfAnotherClass",
                 Layers(absl::StrCat(kImage,
                                     "    - Conv2D: {filters: 4, kernelSize: 3, units: 3}\n")),
                 {"spec.training.model.layers[1].Conv2D.units: Conv2D takes no argument "
                  "\"units\" in distrain; Conv2D's arguments: filters, kernelSize, strides, "
                  "padding, activation, useBias, name"}},
        BadModel{"TypoArgument", Layers("    - Dense: {unit: 10}\n"),
                 {"spec.training.model.layers[0].Dense.unit: unknown argument of Dense; did you "
                  "mean \"units\"?"}},
        BadModel{"MissingRequiredArgument", Layers("    - Dense: {}\n"),
                 {"spec.training.model.layers[0].Dense.units: required; Dense has no default for "
                  "it (e.g. units: 64)"}},
        BadModel{"TwoClassesInOneEntry",
                 Layers("    - {Flatten: {}, Dense: {units: 10}}\n"),
                 {"spec.training.model.layers[0]: has 2 keys (Flatten, Dense); each list entry is "
                  "one layer"}},
        BadModel{"ArgumentsNotIndented", Layers("    - Dense:\n      units: 10\n"),
                 {"spec.training.model.layers[0]: has keys Dense, units; the arguments units "
                  "belong under Dense"}},
        BadModel{"BareClassName", Layers("    - Flatten\n    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0]: must be a mapping with one key", "write "
                  "{Flatten: {}}"}},
        BadModel{"ActivationCase",
                 Layers("    - Dense: {units: 10, activation: Softmax}\n"),
                 {"spec.training.model.layers[0].Dense.activation: must be one of \"linear\", "
                  "\"relu\", \"sigmoid\", \"tanh\", \"softmax\", \"gelu\", \"elu\"",
                  "\"swish\"", "got \"Softmax\"; values are case-sensitive: write \"softmax\""}},
        BadModel{"PaddingUpperCase",
                 Layers(absl::StrCat(kImage,
                                     "    - Conv2D: {filters: 4, kernelSize: 3, padding: SAME}\n")),
                 {"spec.training.model.layers[1].Conv2D.padding: must be one of \"valid\", "
                  "\"same\", got \"SAME\"; values are case-sensitive: write \"same\""}},
        BadModel{"NameWithSlash", Layers("    - Dense: {units: 10, name: a/b}\n"),
                 {"spec.training.model.layers[0].Dense.name: must not contain '/'"}},
        BadModel{"DuplicateNames",
                 Layers("    - Dense: {units: 10, name: a}\n    - Dense: {units: 10, name: a}\n"),
                 {"spec.training.model.layers[1] (Dense): name \"a\" is already used by "
                  "layers[0]"}},
        BadModel{"GlobalPoolingOnRows",
                 Layers("    - GlobalAveragePooling2D: {}\n    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0] (GlobalAveragePooling2D): expects a 3-D input"}},
        BadModel{"OutputNotNumClasses", Layers("    - Dense: {units: 5}\n"),
                 {"spec.training.model.layers: the model's output is [5] but "
                  "SparseCategoricalCrossentropy needs one value per class, [10]"}},
        BadModel{"BinaryWithTenClasses",
                 Layers("    - Dense: {units: 1}\n", "  loss: {type: BinaryCrossentropy}\n"),
                 {"spec.training.model.loss.type: BinaryCrossentropy needs labels 0 and 1, but "
                  "the dataset has 10 classes"}},
        BadModel{"HiddenUnitsWithLayers",
                 "model:\n  hiddenUnits: [64]\n  layers: [{Dense: {units: 10}}]\n",
                 {"spec.training.model.hiddenUnits: given together with "
                  "spec.training.model.layers"}},
        BadModel{"MlpWithLayers", "model:\n  type: mlp\n  layers: [{Dense: {units: 10}}]\n",
                 {"spec.training.model.type: is mlp but spec.training.model.layers is given"}},
        BadModel{"SequentialWithoutLayers", "model: {type: sequential}\n",
                 {"spec.training.model.layers: required for spec.training.model.type: "
                  "sequential"}},
        BadModel{"UnknownLoss", "model: {loss: {type: CrossEntropy}}\n",
                 {"spec.training.model.loss.type: must be one of "
                  "\"SparseCategoricalCrossentropy\""}},
        BadModel{"LossSnakeCase", "model: {loss: {from_logits: true}}\n",
                 {"spec.training.model.loss.from_logits: unknown field; did you mean "
                  "\"fromLogits\"?"}},
        BadModel{"MlpFromLogitsFalse", "model: {loss: {fromLogits: false}}\n",
                 {"spec.training.model.loss.fromLogits: is false, but the mlp shorthand ends in "
                  "a Dense layer without activation"}},
        BadModel{"LayersNotAList", "model: {layers: {Dense: {units: 10}}}\n",
                 {"spec.training.model.layers: must be a list of layers"}},
        BadModel{"Conv1DOnAnImage",
                 Layers(absl::StrCat(kImage, "    - Conv1D: {filters: 4, kernelSize: 3}\n")),
                 {"spec.training.model.layers[1] (Conv1D): expects a 2-D input [steps, channels] "
                  "but gets [28, 28, 1]; add a Reshape to [steps, channels] before it"}},
        BadModel{"Conv1DOnRows", Layers("    - Conv1D: {filters: 4, kernelSize: 3}\n"),
                 {"(Conv1D): expects a 2-D input [steps, channels] but gets [784]; add Reshape: "
                  "{targetShape: [784, 1]} before it"}},
        BadModel{"Conv1DKernelLongerThanTheSequence",
                 Layers("    - Reshape: {targetShape: [4, 196]}\n"
                        "    - Conv1D: {filters: 4, kernelSize: 5}\n"),
                 {"spec.training.model.layers[1] (Conv1D): kernelSize 5 is larger than its "
                  "input's length 4 (input [4, 196], padding valid)"}},
        BadModel{"Conv1DKernelPair",
                 Layers("    - Reshape: {targetShape: [784, 1]}\n"
                        "    - Conv1D: {filters: 4, kernelSize: [3, 3]}\n"),
                 {"spec.training.model.layers[1].Conv1D.kernelSize: must be an integer or a list "
                  "of 1 integer [length] (a 1-D layer), got [3,3]"}},
        BadModel{"ReluThreshold", Layers("    - ReLU: {threshold: 0.5}\n"),
                 {"spec.training.model.layers[0] (ReLU): threshold 0.5 is not supported"}},
        BadModel{"ReluMaxValue", Layers("    - ReLU: {maxValue: 1}\n"),
                 {"spec.training.model.layers[0] (ReLU): maxValue 1 is not supported; use "
                  "maxValue: 6 (relu6)"}},
        BadModel{"ReluMaxValueAndSlope", Layers("    - ReLU: {maxValue: 6, negativeSlope: 0.1}\n"),
                 {"(ReLU): maxValue and negativeSlope together are not supported"}},
        BadModel{"LeakyReluNegativeSlope", Layers("    - LeakyReLU: {negativeSlope: -0.2}\n"),
                 {"spec.training.model.layers[0].LeakyReLU.negativeSlope: must be a non-negative "
                  "number, got -0.2"}},
        BadModel{"EluNegativeAlpha", Layers("    - ELU: {alpha: -1}\n"),
                 {"spec.training.model.layers[0].ELU.alpha: must be a non-negative number, got "
                  "-1"}},
        BadModel{"SoftmaxAxis", Layers("    - Softmax: {axis: 0}\n"),
                 {"spec.training.model.layers[0] (Softmax): axis 0 is not supported; "
                  "distrain's softmax is over the last axis: use axis: -1 (here also 1"}},
        BadModel{"SoftmaxAxisOfAnImage", Layers(absl::StrCat(kImage, "    - Softmax: {axis: 1}\n")),
                 {"spec.training.model.layers[1] (Softmax): axis 1 is not supported", "(here also 3"}},
        BadModel{"LayerNormalizationAxisOfAnImage",
                 Layers(absl::StrCat(kImage, "    - LayerNormalization: {axis: 1}\n")),
                 {"spec.training.model.layers[1] (LayerNormalization): axis 1 is not supported; "
                  "distrain normalises the last axis (features, or channels): use axis: -1 "
                  "(here also 3, for the input [28, 28, 1])"}},
        BadModel{"BatchNormalizationAxisOfAnImage",
                 Layers(absl::StrCat(kImage, "    - BatchNormalization: {axis: 2}\n")),
                 {"(BatchNormalization): axis 2 is not supported", "(here also 3"}},
        BadModel{"RmsNormalizationZeroEpsilon", Layers("    - RMSNormalization: {epsilon: 0}\n"),
                 {"spec.training.model.layers[0].RMSNormalization.epsilon: must be"}},
        BadModel{"LayerNormalizationScaleNotABoolean",
                 Layers("    - LayerNormalization: {scale: 2}\n"),
                 {"spec.training.model.layers[0].LayerNormalization.scale: must be true or false, got 2"}},
        BadModel{"RmsNormalizationCenter", Layers("    - RMSNormalization: {center: true}\n"),
                 {"spec.training.model.layers[0].RMSNormalization.center: RMSNormalization takes "
                  "no argument \"center\""}},
        BadModel{"CausalPaddingOnConv2D",
                 Layers(absl::StrCat(kImage, "    - Conv2D: {filters: 4, kernelSize: 3, "
                                             "padding: causal}\n")),
                 {"spec.training.model.layers[1].Conv2D.padding: must be one of \"valid\", "
                  "\"same\", got \"causal\""}},
        BadModel{"EmbeddingWithoutDims", Layers("    - Embedding: {}\n"),
                 {"spec.training.model.layers[0].Embedding.inputDim: required",
                  "spec.training.model.layers[0].Embedding.outputDim: required"}},
        BadModel{"EmbeddingAfterAnotherLayer",
                 Layers("    - Dense: {units: 8}\n    - Embedding: {inputDim: 10, outputDim: 4}\n"),
                 {"spec.training.model.layers[1] (Embedding): Embedding reads the integer token "
                  "ids the dataset holds, so it must be the first layer (after Input)"}},
        BadModel{"EmbeddingOnSyntheticData",
                 Layers("    - Embedding: {inputDim: 10, outputDim: 4}\n    - Flatten: {}\n"
                        "    - Dense: {units: 10}\n"),
                 {"spec.training.model.layers[0]: (Embedding) looks up integer token ids, but "
                  "synthetic data are real-valued features"}},
        BadModel{"EmbeddingOnScaledPixels",
                 "dataset: {type: idx, trainFiles: [x.idx], trainLabelFiles: [y.idx]}\n"
                 "model:\n  layers:\n    - Embedding: {inputDim: 256, outputDim: 4}\n",
                 {"spec.training.dataset.scale: is 0.00392157, so the values reach "
                  "spec.training.model.layers[0] (Embedding) as fractions, not token ids; set "
                  "scale: 1"}},
        BadModel{"EmbeddingTableTooLarge",
                 Layers("    - Embedding: {inputDim: 2000000000, outputDim: 64}\n"),
                 {"(Embedding): its kernel would hold 128000000000 floats (inputDim x "
                  "outputDim)"}},
        BadModel{"RescalingWithoutScale", Layers("    - Rescaling: {offset: 1}\n"),
                 {"spec.training.model.layers[0].Rescaling.scale: required", "scale: 0.0039"}},
        BadModel{"LeakyReluSnakeCase", Layers("    - LeakyReLU: {negative_slope: 0.1}\n"),
                 {"did you mean \"negativeSlope\"?"}},
        BadModel{"UnknownActivation", Layers("    - Dense: {units: 10, activation: log_softmax}\n"),
                 {"spec.training.model.layers[0].Dense.activation: must be one of", "\"mish\"",
                  "got \"log_softmax\""}}),
    [](const ::testing::TestParamInfo<BadModel>& info) { return std::string(info.param.name); });

// Every `model:` / `dataset:` / `optimizer:` YAML block of docs/models.md is a valid
// spec.training (files it names need not exist: shape checks are skipped).
TEST(ModelDocsTest, EveryTrainingBlockInTheDocsValidates) {
  std::ifstream in(absl::StrCat(DISTRAIN_SOURCE_DIR, "/docs/models.md"));
  ASSERT_TRUE(in) << "docs/models.md";
  std::string line;
  std::string block;
  bool in_yaml = false;
  int checked = 0;
  while (std::getline(in, line)) {
    if (!in_yaml && line == "```yaml") {
      in_yaml = true;
      block.clear();
    } else if (in_yaml && line == "```") {
      in_yaml = false;
      if (block.rfind("model:", 0) == 0 || block.rfind("dataset:", 0) == 0 ||
          block.rfind("optimizer:", 0) == 0) {
        SCOPED_TRACE(block);
        std::vector<std::string> notes;
        EXPECT_EQ(Problems(block, &notes), "<ok>");
        ++checked;
      }
    } else if (in_yaml) {
      absl::StrAppend(&block, line, "\n");
    }
  }
  EXPECT_GE(checked, 3);
}

// tests/kube/valid/every-layer-class.yaml, which the kube tier sends to the
// API server to prove the CRD's schema takes every class, must name every
// class and be a model distrain accepts (shapes included).
TEST(ModelDocsTest, TheKubeTiersEveryLayerManifestNamesEveryClassAndValidates) {
  const std::string path =
      absl::StrCat(DISTRAIN_SOURCE_DIR, "/tests/kube/valid/every-layer-class.yaml");
  absl::StatusOr<JobConfig> config = LoadJobYamlFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(ValidateJobConfig(*config).ok()) << ValidateJobConfig(*config);
  std::vector<std::string> notes;
  EXPECT_TRUE(ValidateModelWithData(*config, &notes).ok())
      << ValidateModelWithData(*config, &notes);
  std::set<std::string> named;
  for (const LayerConfig& layer : config->training.model.layers) {
    named.insert(LayerKindName(layer.kind));
  }
  for (const std::string& name : LayerKindNames()) {
    EXPECT_TRUE(named.count(name)) << path << " has no " << name << " layer";
  }
}

TEST(BadModelTest, YamlErrorsCarryTheLine) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(JobWithTraining(Layers(
      absl::StrCat(kImage, "    - Conv2D: {filters: 4, kernel_size: 3}\n"))));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("line 11: spec.training.model.layers[1].Conv2D.kernel_size"));
  EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr("required")))
      << "the misspelt argument is not also reported missing";
}

TEST(BadModelTest, EveryLayerProblemInOneError) {
  const std::string problems = Problems(Layers(
      "    - Conv2D: {filters: 8, kernelSize: 3}\n    - Dropout: {rate: 0.5}\n"
      "    - Dense: {units: 10, name: x}\n    - Input: {shape: [10]}\n"
      "    - Dense: {units: 10, name: x}\n"));
  EXPECT_THAT(problems, HasSubstr("layers[0] (Conv2D): expects a 3-D input"));
  EXPECT_THAT(problems, HasSubstr("layers[3] (Input): Input must be the first layer"));
  EXPECT_THAT(problems, HasSubstr("layers[4] (Dense): name \"x\" is already used by layers[2]"));
}

}  // namespace
}  // namespace distrain

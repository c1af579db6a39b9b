// Embedding: Keras' variable and initial range, the lookup, the table's
// gradient (repeated ids add up) against central differences, and a
// mixed-precision model passing ids that bfloat16 cannot hold unrounded.
// Values against Keras itself: tests/golden/layers.json.

#include "worker/model/embedding.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/model/gradient_check.h"
#include "worker/model/model.h"

namespace distrain {
namespace {

using ::distrain::testing::ExpectLayerGradients;
using ::distrain::testing::Training;

TEST(EmbeddingTest, KerasVariableAndUniformInitialValues) {
  Embedding embedding("embedding", 50, 8, /*seed=*/3);
  ASSERT_EQ(embedding.parameters().size(), 1u);
  const Parameter& table = *embedding.parameters()[0];
  EXPECT_EQ(table.name, "embedding/embeddings");
  EXPECT_EQ(table.value.shape(), (std::vector<int64_t>{50, 8}));
  float lo = 1, hi = -1;
  for (float v : table.value.span()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // Keras' "uniform": U(-0.05, 0.05), and the 400 draws spread over it.
  EXPECT_GE(lo, -0.05f);
  EXPECT_LT(hi, 0.05f);
  EXPECT_LT(lo, -0.04f);
  EXPECT_GT(hi, 0.04f);
  Embedding same("embedding", 50, 8, /*seed=*/3), other("other", 50, 8, /*seed=*/3);
  EXPECT_EQ(same.parameters()[0]->value.span()[7], table.value.span()[7]);
  EXPECT_NE(other.parameters()[0]->value.span()[7], table.value.span()[7]) << "seeded by name";
}

TEST(EmbeddingTest, LooksUpRowsAndAddsTheGradientsOfRepeatedIds) {
  Embedding embedding("e", 4, 2, 1);
  embedding.parameters()[0]->value = Tensor({4, 2}, std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31});
  const Tensor ids({2, 3}, std::vector<float>{3, 1, 3, 0, 3, 2});
  Tensor y;
  embedding.Forward(ids, &y, Training());
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(std::vector<float>(y.span().begin(), y.span().end()),
            (std::vector<float>{30, 31, 10, 11, 30, 31, 0, 1, 30, 31, 20, 21}));
  Tensor dy({2, 3, 2});
  for (int64_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i + 1);
  embedding.Backward(dy, nullptr);
  const Tensor& grad = embedding.parameters()[0]->grad;
  // Row 3 gets positions 0, 2 and 4: (1 + 5 + 9, 2 + 6 + 10).
  EXPECT_EQ(std::vector<float>(grad.span().begin(), grad.span().end()),
            (std::vector<float>{7, 8, 3, 4, 11, 12, 15, 18}));
}

TEST(EmbeddingTest, TableGradientMatchesFiniteDifferences) {
  Embedding embedding("e", 6, 3, 2);
  const Tensor ids({4, 5}, std::vector<float>{0, 1, 2, 3, 4, 5, 5, 5, 1, 0, 2, 2, 2, 2, 2, 3, 1,
                                              4, 0, 5});
  ExpectLayerGradients(embedding, ids, Training(), 9,
                       {.h = 1e-2f, .rtol = 1e-3, .atol = 1e-4, .check_input = false});
}

// Under mixed_bfloat16 a model rounds its input to bfloat16, which holds no
// odd integer above 256; ids must reach the Embedding exactly.
TEST(EmbeddingTest, MixedPrecisionModelsLookUpIdsBfloat16CannotHold) {
  ModelConfig config;
  config.type = "sequential";
  LayerConfig embedding;
  embedding.kind = LayerKind::kEmbedding;
  embedding.input_dim = 1000;
  embedding.output_dim = 4;
  LayerConfig flatten;
  flatten.kind = LayerKind::kFlatten;
  config.layers = {embedding, flatten};
  config.loss.kind = LossKind::kMeanSquaredError;
  config.precision = Precision::kMixedBfloat16;
  auto model = Model::Create(config, {2}, 8, /*seed=*/4);
  ASSERT_TRUE(model.ok()) << model.status();
  const Tensor ids({1, 2}, std::vector<float>{257, 999});
  const Tensor& out = (*model)->Predict(ids);
  const Tensor& table = (*model)->parameters()[0]->value;
  for (int k = 0; k < 4; ++k) {
    // The row of 257 (not of 256 or 258, where bfloat16 would round it),
    // rounded to bfloat16 like every layer's output.
    const float want = table[257 * 4 + k];
    EXPECT_NEAR(out[k], want, std::abs(want) * 0x1p-8f) << k;
    EXPECT_NE(out[k], table[256 * 4 + k]);
    EXPECT_NEAR(out[4 + k], table[999 * 4 + k], std::abs(table[999 * 4 + k]) * 0x1p-8f);
  }
}

}  // namespace
}  // namespace distrain

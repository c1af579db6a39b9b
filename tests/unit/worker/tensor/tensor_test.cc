// Tensor's value semantics and its one exception, the alias (Tensor::Alias):
// what Flatten and Reshape rely on to pass a tensor on without copying it,
// and what keeps an alias from writing into the tensor it aliases.

#include "worker/tensor/tensor.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;

Tensor Counting(std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
  return t;
}

TEST(TensorTest, CopiesAreDeepAndMovesKeepTheStorage) {
  Tensor a = Counting({2, 3});
  Tensor copy = a;
  copy[0] = 42.0f;
  EXPECT_EQ(a[0], 0.0f);
  const float* storage = a.data();
  Tensor moved = std::move(a);
  EXPECT_EQ(moved.data(), storage);
  EXPECT_THAT(moved.shape(), ElementsAre(2, 3));
}

TEST(TensorTest, AnAliasSharesTheElementsUnderItsOwnShape) {
  Tensor base = Counting({2, 3, 2});
  Tensor alias = Tensor::Alias(base, {2, 6});
  EXPECT_TRUE(alias.is_alias());
  EXPECT_EQ(alias.data(), base.data());
  EXPECT_THAT(alias.shape(), ElementsAre(2, 6));
  EXPECT_EQ(alias.size(), 12);
  EXPECT_EQ(alias.at(1, 5), 11.0f);
  EXPECT_EQ(alias.span().size(), 12u);
  base[7] = -1.0f;  // the aliased tensor's writes show through
  EXPECT_EQ(alias[7], -1.0f);
  // Moving an alias moves the alias, not the elements.
  Tensor moved = std::move(alias);
  EXPECT_TRUE(moved.is_alias());
  EXPECT_EQ(moved.data(), base.data());
}

TEST(TensorTest, CopyingAssigningOrResizingAnAliasNeverWritesTheAliasedTensor) {
  Tensor base = Counting({4, 3});
  const Tensor untouched = base;

  Tensor copy = Tensor::Alias(base, {12});
  Tensor deep = copy;  // a copy of an alias owns its elements
  EXPECT_FALSE(deep.is_alias());
  EXPECT_NE(deep.data(), base.data());
  EXPECT_EQ(deep[11], 11.0f);
  deep[0] = 99.0f;

  Tensor assigned = Tensor::Alias(base, {12});
  assigned = Counting({12});  // assignment gives the alias storage of its own
  EXPECT_FALSE(assigned.is_alias());
  assigned[0] = 99.0f;

  Tensor resized = Tensor::Alias(base, {12});
  resized.Resize({3, 4});  // the same element count: still its own storage
  EXPECT_FALSE(resized.is_alias());
  resized.Fill(99.0f);

  EXPECT_EQ(std::vector<float>(base.span().begin(), base.span().end()),
            std::vector<float>(untouched.span().begin(), untouched.span().end()));
}

TEST(TensorTest, AnAliasNeedsTheSameElementCount) {
  const Tensor base = Counting({2, 3});
  EXPECT_DEATH(Tensor::Alias(base, {7}), "alias of \\[2, 3\\] as \\[7\\]");
}

}  // namespace
}  // namespace distrain

#include "worker/strategy/param_checksum.h"

#include <gtest/gtest.h>

#include <cstring>

namespace distrain {
namespace {

std::unique_ptr<Model> MakeModel(uint64_t seed) {
  ModelConfig mc;
  mc.hidden_units = {8};
  auto model = Model::Create(mc, 5, 3, seed);
  EXPECT_TRUE(model.ok());
  return std::move(*model);
}

TEST(ParameterChecksumTest, EqualForIdenticalModelsAndChangesWithOneBit) {
  auto a = MakeModel(1);
  auto b = MakeModel(1);
  EXPECT_EQ(ParameterChecksum(*a), ParameterChecksum(*b));
  EXPECT_NE(ParameterChecksum(*a), ParameterChecksum(*MakeModel(2)));
  // Flip the lowest mantissa bit of the last bias element.
  Parameter* last = b->parameters().back();
  uint32_t bits;
  std::memcpy(&bits, &last->value[last->value.size() - 1], 4);
  bits ^= 1u;
  std::memcpy(&last->value[last->value.size() - 1], &bits, 4);
  EXPECT_NE(ParameterChecksum(*a), ParameterChecksum(*b));
}

TEST(ParameterChecksumTest, ReplicaChecksumNamesTheReplicaThatDiverged) {
  auto a = MakeModel(1), b = MakeModel(1), c = MakeModel(1);
  std::vector<Model*> models = {a.get(), b.get(), c.get()};
  auto same = ReplicaChecksum(models);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, ParameterChecksum(*a));
  c->parameters()[0]->value[0] += 1e-3f;
  auto diverged = ReplicaChecksum(models);
  ASSERT_FALSE(diverged.ok());
  EXPECT_NE(diverged.status().message().find("local replica 2 diverged"), std::string::npos)
      << diverged.status();
}

TEST(ParameterChecksumTest, HexIsSixteenDigits) {
  EXPECT_EQ(ChecksumHex(0x1f), "000000000000001f");
  EXPECT_EQ(ChecksumHex(0xcbf29ce484222325ULL), "cbf29ce484222325");
}

}  // namespace
}  // namespace distrain

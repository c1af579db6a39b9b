#include "worker/ps/partitioner.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST(SplitRowsTest, FirstShardsTakeTheRemainder) {
  struct Case {
    int64_t rows;
    int shards;
    std::vector<int64_t> want;
  };
  const Case cases[] = {
      {13, 5, {3, 3, 3, 2, 2}},  // TF's documented example
      {10, 5, {2, 2, 2, 2, 2}},
      {11, 5, {3, 2, 2, 2, 2}},
      {14, 5, {3, 3, 3, 3, 2}},
      {5, 5, {1, 1, 1, 1, 1}},
      {7, 1, {7}},
      {0, 1, {0}},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(SplitRows(c.rows, c.shards), ElementsAreArray(c.want))
        << c.rows << " rows / " << c.shards << " shards";
  }
}

TEST(PartitionerTest, NumShardsTable) {
  struct Case {
    const char* name;
    absl::StatusOr<Partitioner> partitioner;
    std::vector<int64_t> shape;
    int want;
  };
  // float32 rows of 256 elements are 1 KiB.
  const Case cases[] = {
      {"none", Partitioner::None(), {1000, 256}, 1},
      {"fixed 5 of 13 rows", Partitioner::FixedShards(5), {13, 4}, 5},
      {"fixed never exceeds rows", Partitioner::FixedShards(8), {3, 4}, 3},
      {"fixed on a scalar", Partitioner::FixedShards(4), {}, 1},
      {"fixed on zero rows", Partitioner::FixedShards(4), {0, 4}, 1},
      {"fixed on a vector", Partitioner::FixedShards(4), {10}, 4},
      // MinSize: ceil(total / min) capped by max_shards and rows.
      {"minsize exactly one shard", Partitioner::MinSize(4 << 10, 16), {4, 256}, 1},
      {"minsize one byte over", Partitioner::MinSize((4 << 10) - 1, 16), {4, 256}, 2},
      {"minsize two shards", Partitioner::MinSize(4 << 10, 16), {8, 256}, 2},
      {"minsize rounds up", Partitioner::MinSize(4 << 10, 16), {9, 256}, 3},
      {"minsize capped by max_shards", Partitioner::MinSize(1 << 10, 4), {100, 256}, 4},
      {"minsize capped by rows", Partitioner::MinSize(4, 64), {3, 256}, 3},
      {"minsize default keeps one shard", Partitioner::MinSize(), {100000, 256}, 1},
      {"minsize small variable", Partitioner::MinSize(256 << 10, 8), {10, 10}, 1},
      // MaxSize: rows per shard = floor(max / row bytes).
      {"maxsize fits", Partitioner::MaxSize(8 << 10), {8, 256}, 1},
      {"maxsize one row over", Partitioner::MaxSize(8 << 10), {9, 256}, 2},
      {"maxsize row bigger than max", Partitioner::MaxSize(100), {5, 256}, 5},
      {"maxsize capped", Partitioner::MaxSize(1 << 10, 3), {10, 256}, 3},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(c.partitioner.ok()) << c.name;
    EXPECT_EQ(c.partitioner->NumShards(c.shape), c.want)
        << c.name << " " << c.partitioner->DebugString();
  }
}

TEST(PartitionerTest, RejectsNonsenseArguments) {
  EXPECT_THAT(Partitioner::FixedShards(0).status().message(), HasSubstr("num_shards"));
  EXPECT_THAT(Partitioner::MinSize(0, 1).status().message(), HasSubstr("min_shard_bytes"));
  EXPECT_THAT(Partitioner::MinSize(1024, 0).status().message(), HasSubstr("max_shards"));
  EXPECT_THAT(Partitioner::MaxSize(-1).status().message(), HasSubstr("max_shard_bytes"));
  EXPECT_THAT(Partitioner::MaxSize(1024, -2).status().message(), HasSubstr("max_shards"));
}

std::vector<VariableSpec> Model() {
  return {
      {"dense_0/kernel", {13, 4}}, {"dense_0/bias", {4}}, {"dense_1/kernel", {4, 3}}, {"step", {}}};
}

TEST(ShardingPlanTest, SplitsAlongAxisZeroAndPlacesRoundRobin) {
  absl::StatusOr<ShardingPlan> plan =
      ShardingPlan::Create(Model(), *Partitioner::FixedShards(5), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // dense_0/kernel: 5 shards, dense_0/bias: 4, dense_1/kernel: 4, step: 1.
  std::vector<std::string> keys;
  std::vector<int> tasks;
  for (const ShardInfo& s : plan->shards()) {
    keys.push_back(s.key());
    tasks.push_back(s.ps_task);
  }
  EXPECT_THAT(keys,
              ElementsAre("dense_0/kernel/part_0", "dense_0/kernel/part_1", "dense_0/kernel/part_2",
                          "dense_0/kernel/part_3", "dense_0/kernel/part_4", "dense_0/bias/part_0",
                          "dense_0/bias/part_1", "dense_0/bias/part_2", "dense_0/bias/part_3",
                          "dense_1/kernel/part_0", "dense_1/kernel/part_1", "dense_1/kernel/part_2",
                          "dense_1/kernel/part_3", "step/part_0"));
  // Placement continues round-robin across variables, in creation order.
  EXPECT_THAT(tasks, ElementsAre(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1));

  const VariablePlan* kernel = plan->Find("dense_0/kernel");
  ASSERT_NE(kernel, nullptr);
  std::vector<int64_t> rows, offsets;
  for (int idx : kernel->shards) {
    const ShardInfo& s = plan->shards()[idx];
    rows.push_back(s.shape[0]);
    offsets.push_back(s.element_offset());
    EXPECT_EQ(s.full_shape, (std::vector<int64_t>{13, 4}));
    EXPECT_EQ(s.num_elements(), s.shape[0] * 4);
  }
  EXPECT_THAT(rows, ElementsAre(3, 3, 3, 2, 2));
  EXPECT_THAT(offsets, ElementsAre(0, 12, 24, 36, 44));

  const ShardInfo& scalar = plan->shards().back();
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.num_elements(), 1);
  EXPECT_EQ(plan->ShardsOnPs(0).size(), 7u);
  EXPECT_EQ(plan->ShardsOnPs(1).size(), 7u);
  EXPECT_EQ(plan->Find("nope"), nullptr);
}

TEST(ShardingPlanTest, SameInputsGiveTheSameFingerprint) {
  const Partitioner p = *Partitioner::MinSize(64, 3);
  absl::StatusOr<ShardingPlan> a = ShardingPlan::Create(Model(), p, 2);
  absl::StatusOr<ShardingPlan> b = ShardingPlan::Create(Model(), p, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  EXPECT_EQ(a->Fingerprint().size(), 16u);
  // Any change of order, ps count or partitioner changes the plan.
  std::vector<VariableSpec> reordered = Model();
  std::swap(reordered[0], reordered[1]);
  EXPECT_NE(ShardingPlan::Create(reordered, p, 2)->Fingerprint(), a->Fingerprint());
  EXPECT_NE(ShardingPlan::Create(Model(), p, 3)->Fingerprint(), a->Fingerprint());
  EXPECT_NE(ShardingPlan::Create(Model(), *Partitioner::MinSize(64, 2), 2)->Fingerprint(),
            a->Fingerprint());
}

// Non-trainable variables listed after the trainable ones are split and
// placed by the same rules, carry their flag into every shard, and change the
// fingerprint; a plan without them keeps its fingerprint.
TEST(ShardingPlanTest, NonTrainableVariablesFollowThePartitionerAndTheFingerprint) {
  const Partitioner p = *Partitioner::FixedShards(2);
  std::vector<VariableSpec> vars = Model();
  absl::StatusOr<ShardingPlan> trainable_only = ShardingPlan::Create(vars, p, 3);
  ASSERT_TRUE(trainable_only.ok());
  vars.push_back({"bn/moving_mean", {5}, /*trainable=*/false});
  vars.push_back({"bn/moving_variance", {1}, /*trainable=*/false});
  absl::StatusOr<ShardingPlan> plan = ShardingPlan::Create(vars, p, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The trainable shards keep their place.
  const size_t n = trainable_only->shards().size();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(plan->shards()[i].key(), trainable_only->shards()[i].key());
    EXPECT_EQ(plan->shards()[i].ps_task, trainable_only->shards()[i].ps_task);
    EXPECT_TRUE(plan->shards()[i].trainable);
  }
  const VariablePlan* mean = plan->Find("bn/moving_mean");
  ASSERT_NE(mean, nullptr);
  EXPECT_FALSE(mean->trainable);
  EXPECT_TRUE(plan->Find("dense_0/kernel")->trainable);
  ASSERT_EQ(mean->shards.size(), 2u);  // 5 rows: 3, 2
  EXPECT_EQ(plan->shards()[mean->shards[1]].row_begin, 3);
  ASSERT_EQ(plan->Find("bn/moving_variance")->shards.size(), 1u);  // min(2, rows)
  for (size_t i = n; i < plan->shards().size(); ++i) {
    EXPECT_FALSE(plan->shards()[i].trainable);
    EXPECT_EQ(plan->shards()[i].ps_task, static_cast<int>(i % 3));  // round-robin goes on
  }
  // Trainability is part of the plan.
  std::vector<VariableSpec> flipped = vars;
  flipped.back().trainable = true;
  EXPECT_NE(ShardingPlan::Create(flipped, p, 3)->Fingerprint(), plan->Fingerprint());
  // A plan of trainable variables only is fingerprinted as before the flag
  // existed (computed with the partitioner of that time), so workers and
  // chiefs of both builds still agree on such a plan.
  EXPECT_EQ(trainable_only->Fingerprint(), "fee004a610a88f40");
}

TEST(ShardingPlanTest, RejectsBadVariablesNamingThem) {
  const Partitioner p;
  EXPECT_THAT(ShardingPlan::Create(Model(), p, 0).status().message(), HasSubstr("ps task"));
  EXPECT_THAT(ShardingPlan::Create({{"a", {2}}, {"a", {3}}}, p, 1).status().message(),
              HasSubstr("\"a\" is declared twice"));
  EXPECT_THAT(ShardingPlan::Create({{"", {2}}}, p, 1).status().message(), HasSubstr("empty name"));
  absl::Status neg = ShardingPlan::Create({{"w", {4, -1}}}, p, 1).status();
  EXPECT_EQ(neg.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(neg.message(), HasSubstr("variable \"w\": dimension 1 is -1"));
  EXPECT_THAT(ShardingPlan::Create({{"huge", {int64_t{1} << 30, int64_t{1} << 30}}}, p, 1)
                  .status()
                  .message(),
              HasSubstr("more than 2^40 elements"));
}

}  // namespace
}  // namespace distrain

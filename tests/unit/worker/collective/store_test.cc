#include "worker/collective/store.h"

#include <gtest/gtest.h>

#include <thread>

namespace distrain {
namespace {

TEST(InMemoryStoreTest, GetBlocksUntilAnotherThreadSetsTheKey) {
  InMemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set("job/ring/1", "127.0.0.1:4000").ok());
  });
  absl::StatusOr<std::string> value = store.Get("job/ring/1", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "127.0.0.1:4000");
}

TEST(InMemoryStoreTest, SetOverwritesEarlierValue) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("k", "a").ok());
  ASSERT_TRUE(store.Set("k", "b").ok());
  EXPECT_EQ(*store.Get("k", absl::ZeroDuration()), "b");
}

TEST(InMemoryStoreTest, GetTimesOutNamingTheKey) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("other", "x").ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store.Get("gen7/ring/3", absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(value.status().message().find("gen7/ring/3"), std::string::npos)
      << value.status();
}

}  // namespace
}  // namespace distrain

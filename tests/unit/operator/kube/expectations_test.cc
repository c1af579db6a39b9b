#include "operator/kube/expectations.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "operator/kube/clock.h"

namespace distrain::kube {
namespace {

constexpr char kKey[] = "ns/job";

// A table of operation sequences on one job key and what they leave behind.
struct Case {
  std::string name;
  std::function<void(Expectations&, FakeClock&)> ops;
  bool satisfied;
  int creations;
  int deletions;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExpectationsTableTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExpectationsTableTest, SatisfiedAndPending) {
  FakeClock clock;
  Expectations e(&clock);
  GetParam().ops(e, clock);
  EXPECT_EQ(e.SatisfiedExpectations(kKey), GetParam().satisfied);
  EXPECT_EQ(e.Get(kKey).creations, GetParam().creations);
  EXPECT_EQ(e.Get(kKey).deletions, GetParam().deletions);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ExpectationsTableTest,
    ::testing::Values(
        Case{"NoRecordIsSatisfied", [](Expectations&, FakeClock&) {}, true, 0, 0},
        Case{"PendingCreationsAreNotSatisfied",
             [](Expectations& e, FakeClock&) { e.ExpectCreations(kKey, 3); }, false, 3, 0},
        Case{"SomeCreationsObserved",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 3);
               e.CreationObserved(kKey);
               e.CreationObserved(kKey);
             },
             false, 1, 0},
        Case{"AllCreationsObserved",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 2);
               e.CreationObserved(kKey);
               e.CreationObserved(kKey);
             },
             true, 0, 0},
        Case{"ExtraObservationsDoNotGoNegative",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 1);
               e.CreationObserved(kKey);
               e.CreationObserved(kKey);
               e.ExpectCreations(kKey, 1);
             },
             false, 1, 0},
        Case{"ZeroCreationsIsSatisfied",
             [](Expectations& e, FakeClock&) { e.ExpectCreations(kKey, 0); }, true, 0, 0},
        Case{"ExpectCreationsReplacesTheCount",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 5);
               e.ExpectCreations(kKey, 2);
             },
             false, 2, 0},
        Case{"ExpiresAfterTtl",
             [](Expectations& e, FakeClock& c) {
               e.ExpectCreations(kKey, 2);
               c.Advance(Expectations::kDefaultTtl + absl::Seconds(1));
             },
             true, 2, 0},
        Case{"NotExpiredJustBeforeTtl",
             [](Expectations& e, FakeClock& c) {
               e.ExpectCreations(kKey, 2);
               c.Advance(Expectations::kDefaultTtl - absl::Seconds(1));
             },
             false, 2, 0},
        Case{"NewExpectationRestartsTtl",
             [](Expectations& e, FakeClock& c) {
               e.ExpectCreations(kKey, 2);
               c.Advance(absl::Minutes(4));
               e.ExpectCreations(kKey, 1);
               c.Advance(absl::Minutes(4));
             },
             false, 1, 0},
        Case{"UidDeletionCountedOncePerUid",
             [](Expectations& e, FakeClock&) {
               e.ExpectDeletions(kKey, std::vector<std::string>{"u1", "u2"});
               e.DeletionObserved(kKey, "u1");  // deletionTimestamp set
               e.DeletionObserved(kKey, "u1");  // then DELETED
             },
             false, 0, 1},
        Case{"UnknownUidChangesNothing",
             [](Expectations& e, FakeClock&) {
               e.ExpectDeletions(kKey, std::vector<std::string>{"u1"});
               e.DeletionObserved(kKey, "other");
               e.DeletionObserved(kKey);
             },
             false, 0, 1},
        Case{"AllUidDeletionsObserved",
             [](Expectations& e, FakeClock&) {
               e.ExpectDeletions(kKey, std::vector<std::string>{"u1", "u2"});
               e.DeletionObserved(kKey, "u2");
               e.DeletionObserved(kKey, "u1");
             },
             true, 0, 0},
        Case{"CountDeletions",
             [](Expectations& e, FakeClock&) {
               e.ExpectDeletions(kKey, 2);
               e.DeletionObserved(kKey);
             },
             false, 0, 1},
        Case{"CreationsAndDeletionsBothMustBeObserved",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 1);
               e.ExpectDeletions(kKey, std::vector<std::string>{"u1"});
               e.CreationObserved(kKey);
             },
             false, 0, 1},
        Case{"ObservationWithoutRecordCreatesNone",
             [](Expectations& e, FakeClock&) {
               e.CreationObserved(kKey);
               e.DeletionObserved(kKey, "u1");
             },
             true, 0, 0},
        Case{"DeleteExpectationsForgetsTheJob",
             [](Expectations& e, FakeClock&) {
               e.ExpectCreations(kKey, 4);
               e.DeleteExpectations(kKey);
             },
             true, 0, 0}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ExpectationsTest, KeysAreIndependent) {
  FakeClock clock;
  Expectations e(&clock);
  e.ExpectCreations("ns/a", 1);
  EXPECT_FALSE(e.SatisfiedExpectations("ns/a"));
  EXPECT_TRUE(e.SatisfiedExpectations("ns/b"));
  e.CreationObserved("ns/b");
  EXPECT_FALSE(e.SatisfiedExpectations("ns/a"));
}

TEST(ExpectationsTest, ConcurrentObservationsLowerExactly) {
  Expectations e;
  e.ExpectCreations(kKey, 4000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 999; ++i) e.CreationObserved(kKey);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(e.Get(kKey).creations, 4);
  EXPECT_FALSE(e.SatisfiedExpectations(kKey));
}

}  // namespace
}  // namespace distrain::kube

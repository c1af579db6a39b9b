// Hostile clients against a real CoordinationService on loopback (issue 16
// item 2): floods of barrier names, keys, bytes and blocked calls stop at the
// CoordinationServiceOptions bounds with RESOURCE_EXHAUSTED naming the field,
// the value and the limit; nothing is stored beyond them, and the real job's
// tasks are still served (Join, Set/Get, Barrier) afterwards.
// coordination_test.cc covers malformed single requests (unknown tasks,
// negative timeouts, oversized keys and values).

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distrain/v1/coordination.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/coordination/coordination_client.h"
#include "worker/coordination/coordination_service.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// chief:0 and worker:0, joined, each with its own client; a raw stub for the
// hostile calls (which name one of the real tasks: nothing authenticates
// them yet, so the bounds are what protects the service).
class CoordinationFloodTest : public ::testing::Test {
 protected:
  void Start(CoordinationServiceOptions options) {
    members_ = {{"chief", 0}, {"worker", 0}};
    options.coordinator = members_[0];
    auto service = CoordinationService::Start("127.0.0.1:0", members_, options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    address_ = absl::StrCat("127.0.0.1:", service_->port());
    std::vector<absl::Status> joined(members_.size());
    std::vector<std::thread> threads;
    for (const TaskId& t : members_) {
      clients_.push_back(std::make_unique<CoordinationClient>(address_, members_[0], t));
    }
    for (size_t i = 0; i < clients_.size(); ++i) {
      threads.emplace_back([&, i] {
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        joined[i] = clients_[i]->Connect(deadline);
        if (joined[i].ok()) joined[i] = clients_[i]->Join(deadline).status();
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& s : joined) ASSERT_TRUE(s.ok()) << s;
    stub_ = v1::Coordination::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    clients_.clear();
    service_.reset();
  }

  grpc::Status Barrier(const std::string& name, int64_t timeout_ms) {
    v1::BarrierRequest r;
    r.set_name(name);
    r.mutable_task()->set_type("chief");
    r.mutable_task()->set_index(0);
    r.set_timeout_ms(timeout_ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::BarrierResponse response;
    return stub_->Barrier(&ctx, r, &response);
  }
  grpc::Status Set(const std::string& key, const std::string& value) {
    v1::KeyValueSetRequest r;
    r.set_key(key);
    r.set_value(value);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::KeyValueSetResponse response;
    return stub_->KeyValueSet(&ctx, r, &response);
  }
  grpc::Status Get(const std::string& key, int64_t timeout_ms) {
    v1::KeyValueGetRequest r;
    r.set_key(key);
    r.set_timeout_ms(timeout_ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::KeyValueGetResponse response;
    return stub_->KeyValueGet(&ctx, r, &response);
  }

  // Both real tasks pass a barrier together and exchange a key.
  void ExpectRealJobServed(const std::string& barrier) {
    absl::Status a, b;
    std::thread t([&] { a = clients_[0]->Barrier(barrier, absl::Seconds(10)); });
    b = clients_[1]->Barrier(barrier, absl::Seconds(10));
    t.join();
    EXPECT_TRUE(a.ok()) << a;
    EXPECT_TRUE(b.ok()) << b;
    ASSERT_TRUE(clients_[0]->Set("real/ring/0", "10.0.0.1:2222").ok());
    absl::StatusOr<std::string> got = clients_[1]->Get("real/ring/0", absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "10.0.0.1:2222");
  }

  std::vector<TaskId> members_;
  std::unique_ptr<CoordinationService> service_;
  std::string address_;
  std::vector<std::unique_ptr<CoordinationClient>> clients_;
  std::unique_ptr<v1::Coordination::Stub> stub_;
};

TEST_F(CoordinationFloodTest, FloodOfDistinctBarrierNamesStopsAtTheDefaultLimitAndNamesReuse) {
  Start(CoordinationServiceOptions());  // not {}: see CoordinationService::Start
  // The job's own barrier exists before the flood.
  ExpectRealJobServed("real/step");
  // Each flooding call times out at once (worker:0 never arrives) but leaves
  // its name behind: 1023 more fit under the default of 1024.
  for (int i = 0; i < 1023; ++i) {
    const grpc::Status s = Barrier(absl::StrCat("flood/", i), 0);
    ASSERT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED) << i << ": " << s.error_message();
  }
  const grpc::Status s = Barrier("flood/one-more", 0);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("BarrierRequest.name 'flood/one-more' would be distinct barrier "
                              "name number 1025"),
                    HasSubstr("the limit is 1024 (CoordinationServiceOptions::max_barriers)")));
  // Names are reusable: the job's barrier still completes.
  ExpectRealJobServed("real/step");
}

TEST_F(CoordinationFloodTest, FloodOfDistinctKeysStopsAtMaxKeysAndStoresNothingBeyond) {
  CoordinationServiceOptions options;
  options.max_keys = 32;
  Start(options);
  for (int i = 0; i < 32; ++i) ASSERT_TRUE(Set(absl::StrCat("flood/", i), "x").ok()) << i;
  grpc::Status s = Set("flood/32", "x");
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("KeyValueSetRequest.key 'flood/32' would be key number 33"),
                    HasSubstr("the limit is 32 keys (CoordinationServiceOptions::max_keys)")));
  EXPECT_EQ(Get("flood/32", 0).error_code(), grpc::DEADLINE_EXCEEDED) << "not stored";
  // An existing key can still be overwritten (a restarted rank republishes).
  EXPECT_TRUE(Set("flood/0", "y").ok());
}

TEST_F(CoordinationFloodTest, ValuesBeyondTheStoreBudgetAreResourceExhaustedAndNotStored) {
  CoordinationServiceOptions options;
  options.max_store_bytes = 64 << 10;
  Start(options);
  ASSERT_TRUE(Set("a", std::string(40 << 10, 'a')).ok());
  const grpc::Status s = Set("b", std::string(40 << 10, 'b'));
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("the key-value store holds 40961 bytes; setting 'b'"),
                    HasSubstr("limit of 65536 bytes "
                              "(CoordinationServiceOptions::max_store_bytes)")));
  EXPECT_EQ(Get("b", 0).error_code(), grpc::DEADLINE_EXCEEDED) << "not stored";
  ExpectRealJobServed("after a store flood");
}

TEST_F(CoordinationFloodTest, FloodOfBlockedCallsStopsAtMaxWaitersAndTheJobIsServedAfterwards) {
  Start(CoordinationServiceOptions());  // max_waiters 0: 4 per task + 16 = 24 for two tasks
  constexpr int kLimit = 24;
  std::vector<grpc::Status> blocked(kLimit);
  std::vector<std::thread> threads;
  for (int i = 0; i < kLimit; ++i) {
    // A call that arrives while a probe below holds the last slot for its
    // millisecond is refused as the 25th; it asks again, as a client would.
    threads.emplace_back([&, i] {
      do {
        blocked[i] = Get(absl::StrCat("never/", i), 20000);
      } while (blocked[i].error_code() == grpc::RESOURCE_EXHAUSTED);
    });
  }
  // Until all of them are blocked, a probe waits 1 ms and times out; then
  // it is refused.
  grpc::Status s;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    s = Get("never/extra", 1);
    if (s.error_code() == grpc::RESOURCE_EXHAUSTED) break;
  }
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("KeyValueGet: 24 calls are already blocked"),
                    HasSubstr("the limit is 24 (CoordinationServiceOptions::max_waiters)")));
  // A barrier that would have to wait is refused the same way, and changes
  // no barrier count (the real barrier below still needs both tasks).
  s = Barrier("real/after-flood", 20000);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  // A Get that need not wait is served at once.
  ASSERT_TRUE(Set("present", "v").ok());
  EXPECT_TRUE(Get("present", 20000).ok());
  // The flood ends (its keys appear); the job goes on.
  for (int i = 0; i < kLimit; ++i) ASSERT_TRUE(Set(absl::StrCat("never/", i), "v").ok());
  for (auto& t : threads) t.join();
  for (const grpc::Status& b : blocked) EXPECT_TRUE(b.ok()) << b.error_message();
  ExpectRealJobServed("real/after-flood");
}

}  // namespace
}  // namespace distrain

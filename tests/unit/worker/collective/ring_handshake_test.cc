// The ring's connection handshake (worker/collective/ring.h): what a ring
// port accepts from the network. Only a peer of this group that holds the
// job's key and answers this setup's nonce gets in; the fuzz target
// tests/fuzz/ring_handshake_fuzz.cc feeds the parsers anything.

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/collective/ring.h"

namespace distrain {
namespace {

constexpr uint64_t kGroup = 0x1234567890abcdefull;
const std::string kKey(32, 'k');

class RingHandshakeTest : public ::testing::Test {
 protected:
  const std::string acceptor_nonce_ = NewRingNonce();
  const std::string dialler_nonce_ = NewRingNonce();
  std::string Hello(int from, int to, int size, uint64_t group = kGroup) {
    return MakeRingHello(group, from, to, size, kKey, dialler_nonce_, acceptor_nonce_);
  }
  absl::StatusOr<int> Parse(const std::string& bytes, int to, int size) {
    return ParseRingHello(bytes, kGroup, to, size, kKey, acceptor_nonce_, nullptr);
  }
};

TEST_F(RingHandshakeTest, AcceptsTheHelloOfAPeerOfThisGroupAndReturnsItsNonce) {
  std::string nonce;
  absl::StatusOr<int> from =
      ParseRingHello(Hello(2, 0, 3), kGroup, 0, 3, kKey, acceptor_nonce_, &nonce);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 2);
  EXPECT_EQ(nonce, dialler_nonce_);
}

TEST_F(RingHandshakeTest, RefusesStrayStaleAndMalformedHellos) {
  EXPECT_FALSE(Parse(Hello(1, 0, 2, kGroup + 1), 0, 2).ok());  // another group
  EXPECT_FALSE(Parse(Hello(1, 1, 2), 0, 2).ok());              // for another rank
  EXPECT_FALSE(Parse(Hello(1, 0, 3), 0, 2).ok());              // another size
  EXPECT_FALSE(Parse(Hello(-1, 0, 2), 0, 2).ok());             // ranks outside the group
  EXPECT_FALSE(Parse(Hello(2, 0, 2), 0, 2).ok());
  EXPECT_FALSE(Parse(Hello(0, 0, 2), 0, 2).ok());  // the receiver itself
  const std::string hello = Hello(1, 0, 2);
  EXPECT_FALSE(Parse(hello.substr(0, kRingHelloBytes - 1), 0, 2).ok());
  EXPECT_FALSE(Parse(hello + "x", 0, 2).ok());
  std::string wrong_magic = hello;
  wrong_magic[0] ^= 1;
  EXPECT_FALSE(Parse(wrong_magic, 0, 2).ok());
}

TEST_F(RingHandshakeTest, RefusesAnotherJobsKeyATamperedFieldAndAReplay) {
  // Another job's key.
  const std::string foreign =
      MakeRingHello(kGroup, 1, 0, 2, std::string(32, 'x'), dialler_nonce_, acceptor_nonce_);
  EXPECT_EQ(Parse(foreign, 0, 2).status().code(), absl::StatusCode::kPermissionDenied);
  // A real hello with its sender changed: the MAC covers every field.
  std::string tampered = Hello(1, 0, 3);
  const int32_t two = 2;
  std::memcpy(tampered.data() + 16, &two, 4);
  EXPECT_EQ(Parse(tampered, 0, 3).status().code(), absl::StatusCode::kPermissionDenied);
  // A hello recorded in an earlier setup (the acceptor published another
  // nonce then) does not open this one.
  const std::string recorded =
      MakeRingHello(kGroup, 1, 0, 2, kKey, dialler_nonce_, NewRingNonce());
  absl::Status replay = Parse(recorded, 0, 2).status();
  EXPECT_EQ(replay.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(replay.message().find("replay"), std::string::npos) << replay;
}

TEST_F(RingHandshakeTest, AcceptsOnlyTheDialledPeersAnswerToThisHello) {
  const std::string ack = MakeRingAck(kGroup, 1, kKey, dialler_nonce_, acceptor_nonce_);
  EXPECT_TRUE(ParseRingAck(ack, kGroup, 1, kKey, dialler_nonce_, acceptor_nonce_).ok());
  EXPECT_FALSE(ParseRingAck(ack, kGroup, 2, kKey, dialler_nonce_, acceptor_nonce_).ok());
  EXPECT_FALSE(ParseRingAck(ack, kGroup + 1, 1, kKey, dialler_nonce_, acceptor_nonce_).ok());
  EXPECT_FALSE(ParseRingAck(ack.substr(0, kRingAckBytes - 1), kGroup, 1, kKey, dialler_nonce_,
                            acceptor_nonce_)
                   .ok());
  // An ack recorded for another hello, or made with another key.
  EXPECT_EQ(ParseRingAck(ack, kGroup, 1, kKey, NewRingNonce(), acceptor_nonce_).code(),
            absl::StatusCode::kPermissionDenied);
  const std::string foreign =
      MakeRingAck(kGroup, 1, std::string(32, 'x'), dialler_nonce_, acceptor_nonce_);
  EXPECT_EQ(ParseRingAck(foreign, kGroup, 1, kKey, dialler_nonce_, acceptor_nonce_).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(RingAddressTest, CarriesTheListenersNonce) {
  const std::string nonce = NewRingNonce();
  std::string hex;
  for (unsigned char c : nonce) hex += absl::StrCat(absl::Hex(c, absl::kZeroPad2));
  absl::StatusOr<RingAddress> a = ParseRingAddress("10.0.0.5:4000 " + hex);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->address.port, 4000);
  EXPECT_EQ(a->nonce, nonce);
  EXPECT_FALSE(ParseRingAddress("10.0.0.5:4000").ok());
  EXPECT_FALSE(ParseRingAddress("10.0.0.5:4000 " + hex.substr(1)).ok());
  EXPECT_FALSE(ParseRingAddress("10.0.0.5:4000 " + std::string(32, 'z')).ok());
}

}  // namespace
}  // namespace distrain

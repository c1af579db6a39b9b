// ParseRingHello / ParseRingAck (worker/collective/ring.h): the handshake
// bytes a ring port accepts from the network; the fuzz target
// tests/fuzz/ring_handshake_fuzz.cc feeds them anything, these pin the rules.

#include <cstdint>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "worker/collective/ring.h"

namespace distrain {
namespace {

constexpr uint64_t kGroup = 0x1234567890abcdefull;

std::string Hello(uint32_t magic, uint32_t version, uint64_t group, int32_t from, int32_t to,
                  int32_t size) {
  std::string out(32, '\0');
  const int32_t reserved = 0;
  char* p = out.data();
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &version, 4);
  std::memcpy(p + 8, &group, 8);
  std::memcpy(p + 16, &from, 4);
  std::memcpy(p + 20, &to, 4);
  std::memcpy(p + 24, &size, 4);
  std::memcpy(p + 28, &reserved, 4);
  return out;
}

std::string Ack(uint32_t magic, int32_t rank, uint64_t group) {
  std::string out(16, '\0');
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &rank, 4);
  std::memcpy(out.data() + 8, &group, 8);
  return out;
}

constexpr uint32_t kHello = 0x47525444, kAck = 0x41525444, kVersion = 2;

TEST(RingHandshakeTest, AcceptsTheHelloOfAPeerOfThisGroup) {
  absl::StatusOr<int> from = ParseRingHello(Hello(kHello, kVersion, kGroup, 2, 0, 3), kGroup, 0, 3);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 2);
}

TEST(RingHandshakeTest, RefusesStrayStaleAndMalformedHellos) {
  EXPECT_FALSE(ParseRingHello(Hello(kAck, kVersion, kGroup, 1, 0, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, 1, kGroup, 1, 0, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup + 1, 1, 0, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup, 1, 1, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup, 1, 0, 3), kGroup, 0, 2).ok());
  // Ranks outside the group, and the receiver itself.
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup, -1, 0, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup, 2, 0, 2), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(Hello(kHello, kVersion, kGroup, 0, 0, 2), kGroup, 0, 2).ok());
  // Short and long messages.
  const std::string hello = Hello(kHello, kVersion, kGroup, 1, 0, 2);
  EXPECT_FALSE(ParseRingHello(hello.substr(0, 31), kGroup, 0, 2).ok());
  EXPECT_FALSE(ParseRingHello(hello + "x", kGroup, 0, 2).ok());
}

TEST(RingHandshakeTest, AcceptsOnlyTheDialledPeersAck) {
  EXPECT_TRUE(ParseRingAck(Ack(kAck, 1, kGroup), kGroup, 1).ok());
  EXPECT_FALSE(ParseRingAck(Ack(kAck, 2, kGroup), kGroup, 1).ok());
  EXPECT_FALSE(ParseRingAck(Ack(kAck, 1, kGroup + 1), kGroup, 1).ok());
  EXPECT_FALSE(ParseRingAck(Ack(kHello, 1, kGroup), kGroup, 1).ok());
  EXPECT_FALSE(ParseRingAck(Ack(kAck, 1, kGroup).substr(0, 15), kGroup, 1).ok());
}

}  // namespace
}  // namespace distrain

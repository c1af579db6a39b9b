#include "common/net.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace distrain {
namespace {

TEST(ListenHostTest, PodIpWhenSetElseEveryInterface) {
  struct Case {
    std::optional<std::string> pod_ip;
    std::string want;
  };
  const Case cases[] = {
      {std::nullopt, "0.0.0.0"},
      {"", "0.0.0.0"},
      {"10.244.1.7", "10.244.1.7"},
      {"127.0.1.3", "127.0.1.3"},
      {"fd00::5", "fd00::5"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ListenHostFor(c.pod_ip), c.want) << c.pod_ip.value_or("<unset>");
  }
}

TEST(ListenHostTest, ReadsPodIpFromTheEnvironment) {
  setenv("POD_IP", "127.0.9.9", 1);
  EXPECT_EQ(ListenHost(), "127.0.9.9");
  unsetenv("POD_IP");
  EXPECT_EQ(ListenHost(), "0.0.0.0");
}

TEST(JoinHostPortTest, BracketsIpv6Only) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", 2222), "10.0.0.1:2222");
  EXPECT_EQ(JoinHostPort("0.0.0.0", 80), "0.0.0.0:80");
  EXPECT_EQ(JoinHostPort("fd00::5", 2222), "[fd00::5]:2222");
  EXPECT_EQ(JoinHostPort("[fd00::5]", 2222), "[fd00::5]:2222");
}

TEST(ConnectHostForTest, WildcardsBecomeLoopback) {
  EXPECT_EQ(ConnectHostFor("0.0.0.0"), "127.0.0.1");
  EXPECT_EQ(ConnectHostFor("::"), "127.0.0.1");
  EXPECT_EQ(ConnectHostFor("[::]"), "127.0.0.1");
  EXPECT_EQ(ConnectHostFor(""), "127.0.0.1");
  EXPECT_EQ(ConnectHostFor("127.0.1.4"), "127.0.1.4");
  EXPECT_EQ(ConnectHostFor("10.244.0.9"), "10.244.0.9");
}

TEST(IsWildcardHostTest, OnlyTheEveryInterfaceAddressesAreWildcards) {
  for (const char* host : {"", "0.0.0.0", "::", "[::]"}) EXPECT_TRUE(IsWildcardHost(host)) << host;
  for (const char* host : {"10.244.0.7", "127.0.0.1", "fd00::7", "w-0.ns.svc"}) {
    EXPECT_FALSE(IsWildcardHost(host)) << host;
  }
}

}  // namespace
}  // namespace distrain

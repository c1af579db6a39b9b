// RestClient behaviour that needs no API server: configuration errors and
// transport failures on loopback. Everything that talks to a server is in
// tests/kube/rest_client_test.cc, against the real one.

#include "operator/kube/rest_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace distrain::kube {
namespace {

using ::testing::HasSubstr;

// A loopback port that nothing listens on (bound, then released).
int ClosedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(RestClientTest, MalformedCaIsRejectedAtCreateNamingTheSource) {
  RestConfig config;
  config.server = "https://127.0.0.1:6443";
  config.ca_pem = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n";
  config.source = "kubeconfig /etc/k.yaml (context dev)";
  auto client = RestClient::Create(config);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("kubeconfig /etc/k.yaml"));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("certificate-authority"));
}

TEST(RestClientTest, ServerMustBeHttpOrHttps) {
  RestConfig config;
  config.server = "ftp://127.0.0.1:6443";
  auto client = RestClient::Create(config);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("must be https:// or http://"));
}

TEST(RestClientTest, ConnectionRefusedIsRetriedThenUnavailableWithTheUrl) {
  RestConfig config;
  config.server = "http://127.0.0.1:" + std::to_string(ClosedPort());
  RestClientOptions options;
  options.max_retries = 2;
  options.initial_backoff = std::chrono::milliseconds(1);
  options.registry = std::make_shared<prometheus::Registry>();
  auto client = RestClient::Create(config, options);
  ASSERT_TRUE(client.ok()) << client.status();
  // POST is not idempotent, but a refused connection never reached the server.
  nlohmann::json body = {{"a", 1}};
  auto r = (*client)->Request("POST", "/api/v1/namespaces", &body);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(config.server + "/api/v1/namespaces"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("after 3 attempts"));
  double errors = 0;
  for (const auto& family : options.registry->Collect()) {
    if (family.name != "rest_client_requests_total") continue;
    for (const auto& metric : family.metric) errors += metric.counter.value;
  }
  EXPECT_EQ(errors, 3);
}

TEST(RestClientTest, WatchThatCannotConnectIsUnavailable) {
  RestConfig config;
  config.server = "http://127.0.0.1:" + std::to_string(ClosedPort());
  auto client = RestClient::Create(config);
  ASSERT_TRUE(client.ok()) << client.status();
  int events = 0;
  absl::Status st = (*client)->Watch(
      "/api/v1/pods?watch=1", [&](const WatchEvent&) { return ++events, true; }, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(events, 0);
}

TEST(ApiResponseTest, MessageComesFromTheStatusBody) {
  ApiResponse r{404, {{"kind", "Status"}, {"message", "configmaps \"x\" not found"}}};
  EXPECT_EQ(r.message(), "configmaps \"x\" not found");
  EXPECT_TRUE(r.not_found());
  ApiResponse text{503, "service unavailable"};
  EXPECT_EQ(text.message(), "service unavailable");
  ApiResponse empty{500, nullptr};
  EXPECT_EQ(empty.message(), "HTTP 500");
}

}  // namespace
}  // namespace distrain::kube

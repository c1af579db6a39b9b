#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The whole HTTP/1.0 response to GET `path`.
std::string Get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

std::string Body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

TEST(MetricsServerTest, HealthzAnswers503WithTheCheckReasonOnOneLine) {
  std::atomic<bool> stalled{false};
  const int port = FreePort();
  auto server = MetricsServer::StartWithChecks(
      "127.0.0.1", port, std::make_shared<prometheus::Registry>(), [&stalled] {
        return stalled ? absl::UnavailableError("stalled: no step completed for 31 s\nsecond line")
                       : absl::OkStatus();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  std::string r = Get(port, "/healthz");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(Body(r), "ok\n");
  stalled = true;
  r = Get(port, "/healthz");
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  EXPECT_EQ(Body(r), "stalled: no step completed for 31 s\n");
  // Readiness follows health unless told otherwise.
  EXPECT_EQ(Body(Get(port, "/readyz")), "stalled: no step completed for 31 s\n");
}

TEST(MetricsServerTest, BoolChecksStillAnswerOkOrUnhealthy) {
  std::atomic<bool> healthy{true};
  const int port = FreePort();
  auto server = MetricsServer::Start("127.0.0.1", port, std::make_shared<prometheus::Registry>(),
                                     [&healthy] { return healthy.load(); });
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Body(Get(port, "/healthz")), "ok\n");
  healthy = false;
  const std::string r = Get(port, "/healthz");
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  EXPECT_EQ(Body(r), "unhealthy\n");
}

}  // namespace
}  // namespace distrain

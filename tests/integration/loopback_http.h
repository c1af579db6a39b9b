#ifndef DISTRAIN_TESTS_INTEGRATION_LOOPBACK_HTTP_H_
#define DISTRAIN_TESTS_INTEGRATION_LOOPBACK_HTTP_H_

// Test helpers for talking to processes on 127.0.0.1: a free port, and a
// minimal HTTP/1.0 GET (enough to scrape /metrics and /healthz).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace distrain::testing {

// Full response (status line, headers, body); "" when nothing answers.
inline std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) response.append(buf, n);
  ::close(fd);
  return response;
}

// `n` distinct ports that were free a moment ago: all are bound before any is
// released, so no two coincide (the kernel may still hand one out again later;
// good enough for tests on a quiet loopback).
inline std::vector<int> FreeLoopbackPorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

inline int FreeLoopbackPort() { return FreeLoopbackPorts(1)[0]; }

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_LOOPBACK_HTTP_H_

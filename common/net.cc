#include "common/net.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace distrain {

std::string ListenHostFor(const std::optional<std::string>& pod_ip) {
  if (pod_ip.has_value() && !pod_ip->empty()) return *pod_ip;
  return "0.0.0.0";
}

std::string ListenHost() {
  const char* pod_ip = std::getenv("POD_IP");
  return ListenHostFor(pod_ip == nullptr ? std::nullopt : std::optional<std::string>(pod_ip));
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string ConnectHostFor(const std::string& host) {
  return IsWildcardHost(host) ? "127.0.0.1" : host;
}

}  // namespace distrain

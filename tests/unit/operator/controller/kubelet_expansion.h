// The kubelet's environment building, copied as a pod can observe it, so the
// unit and kube tiers can read the environment of the pods the operator writes
// without a kubelet (kubelet_env.h); kubelet_expansion_test.cc holds it to
// Kubernetes' own expansion cases. Header-only test support. Stateless; every
// function is thread-safe.

#ifndef DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_EXPANSION_H_
#define DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_EXPANSION_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace distrain::kubelet {

// A name -> value lookup chain: the first map holding the name wins.
using EnvMaps = std::vector<const std::map<std::string, std::string>*>;

// Kubernetes' dependent variable expansion (the kubelet's
// third_party/forked/golang/expansion): `$(NAME)` becomes NAME's value from
// the first of `maps` that defines it, `$$` becomes `$`, and anything else,
// including an unknown `$(NAME)` or an unclosed `$(`, stays as written.
inline std::string ExpandKubeVars(const std::string& input, const EnvMaps& maps) {
  std::string out;
  out.reserve(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const char c = input[i];
    if (c != '$' || i + 1 == input.size()) {
      out += c;
      continue;
    }
    const char next = input[i + 1];
    if (next == '$') {  // escaped operator
      out += '$';
      ++i;
      continue;
    }
    if (next == '(') {
      const size_t close = input.find(')', i + 2);
      if (close == std::string::npos) {  // incomplete: literal "$(", scanning goes on after it
        out += "$(";
        ++i;
        continue;
      }
      const std::string name = input.substr(i + 2, close - i - 2);
      bool found = false;
      for (const auto* m : maps) {
        auto it = m->find(name);
        if (it != m->end()) {
          out += it->second;
          found = true;
          break;
        }
      }
      if (!found) out += "$(" + name + ")";
      i = close;
      continue;
    }
    // Not an expression: the operator and the next character, as written.
    out += '$';
    out += next;
    ++i;
  }
  return out;
}

// A container's env list as a kubelet builds it: entries in order; a literal
// `value` is expanded against the entries before it, then `service_env`; a
// resolved valueFrom is taken as is (kubelet does not expand those). Later
// entries of the same name replace earlier ones. `service_env` (e.g.
// KUBERNETES_SERVICE_HOST) fills in names the container does not set.
struct EnvEntry {
  std::string name;
  std::string value;
  bool expand = true;  // false for values that came from valueFrom
};

inline std::map<std::string, std::string> BuildContainerEnv(const std::vector<EnvEntry>& entries,
                                                            const std::map<std::string, std::string>& service_env) {
  std::map<std::string, std::string> env;
  for (const EnvEntry& e : entries) {
    std::string value = e.expand ? ExpandKubeVars(e.value, {&env, &service_env}) : e.value;
    env[e.name] = std::move(value);
  }
  for (const auto& [k, v] : service_env) env.emplace(k, v);
  return env;
}

// Host and port of an API server URL ("https://127.0.0.1:6443" -> {"127.0.0.1",
// "6443"}; no port: 443). Empty host when `server` is not an https?:// URL.
inline std::pair<std::string, std::string> ServerHostPort(const std::string& server) {
  size_t scheme = server.find("://");
  if (scheme == std::string::npos) return {};
  const bool https = server.compare(0, scheme, "https") == 0;
  std::string rest = server.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  std::string host = rest, port = https ? "443" : "80";
  if (!rest.empty() && rest.front() == '[') {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return {};
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  return {host, port};
}

}  // namespace distrain::kubelet

#endif  // DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_EXPANSION_H_

#ifndef DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_ENV_H_
#define DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_ENV_H_

// What a container's environment becomes in the kubelet, for tests that
// check the pods the operator writes (unit: from the pure plan; kube: from
// the real API server, which has no kubelet). Header-only test support.

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/operator/controller/kubelet_expansion.h"

namespace distrain::controller::testing {

// The environment the kubelet gives a pod's main container, built by
// BuildContainerEnv (kubelet_expansion.h: $(VAR) expansion from earlier
// entries): configMapKeyRef read from `config_maps`
// (name -> ConfigMap), fieldRef as "<fieldRef:path>". An unknown ConfigMap or
// key fails the test (the kubelet would not start the container).
inline std::map<std::string, std::string> KubeletEnv(
    const nlohmann::json& pod, const std::map<std::string, nlohmann::json>& config_maps) {
  const nlohmann::json& containers = pod["spec"]["containers"];
  const nlohmann::json* main = &containers[0];
  for (const nlohmann::json& c : containers) {
    if (c.value("name", "") == "distrain") main = &c;
  }
  std::vector<kubelet::EnvEntry> entries;
  for (const nlohmann::json& e : main->value("env", nlohmann::json::array())) {
    const std::string name = e["name"];
    if (e.contains("value")) {
      entries.push_back({name, e["value"].get<std::string>()});
    } else if (e.contains("valueFrom") && e["valueFrom"].contains("configMapKeyRef")) {
      const nlohmann::json& ref = e["valueFrom"]["configMapKeyRef"];
      auto cm = config_maps.find(ref["name"].get<std::string>());
      if (cm == config_maps.end() || !cm->second["data"].contains(ref["key"].get<std::string>())) {
        ADD_FAILURE() << "env " << name << ": no ConfigMap key " << ref.dump();
        continue;
      }
      entries.push_back({name, cm->second["data"][ref["key"].get<std::string>()], false});
    } else if (e.contains("valueFrom") && e["valueFrom"].contains("fieldRef")) {
      entries.push_back(
          {name, "<fieldRef:" + e["valueFrom"]["fieldRef"]["fieldPath"].get<std::string>() + ">",
           false});
    } else {
      entries.push_back({name, "", false});
    }
  }
  return kubelet::BuildContainerEnv(entries, {});
}

}  // namespace distrain::controller::testing

#endif  // DISTRAIN_TESTS_UNIT_OPERATOR_CONTROLLER_KUBELET_ENV_H_

#include "operator/controller/network_policy.h"

#include <cstdint>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

Json Ports(const std::map<ReplicaType, int>& by_type) {
  std::set<int> ports;  // sorted and unique, so the object is stable
  for (const auto& [type, port] : by_type) ports.insert(port);
  Json out = Json::array();
  for (int port : ports) out.push_back({{"protocol", "TCP"}, {"port", port}});
  return out;
}

// FNV-1a, 64 bit, of the spec's serialisation: stable across processes.
std::string SpecHash(const Json& spec) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : spec.dump()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace

std::string NetworkPolicyName(const std::string& job_name) {
  return absl::StrCat(job_name, kNetworkPolicySuffix);
}

nlohmann::json BuildNetworkPolicy(const api::DistributedTrainingJob& job, const Topology& topology,
                                  const ControllerOptions& options) {
  const Json job_pods = {{"matchLabels", {{api::kLabelJobName, job.metadata.name}}}};
  Json ingress = Json::array();
  ingress.push_back({{"from", Json::array({{{"podSelector", job_pods}}})},
                     {"ports", Ports(topology.ports)}});
  if (!options.network_policy.metrics_peers.empty()) {
    ingress.push_back({{"from", options.network_policy.metrics_peers},
                       {"ports", Ports(topology.metrics_ports)}});
  }
  Json spec = {{"podSelector", job_pods},
               {"policyTypes", Json::array({"Ingress"})},
               {"ingress", std::move(ingress)}};
  const std::string hash = SpecHash(spec);
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata",
           {{"name", NetworkPolicyName(job.metadata.name)},
            {"namespace", job.metadata.namespace_},
            {"labels",
             {{api::kLabelJobName, job.metadata.name}, {api::kLabelManagedBy, api::kManagedBy}}},
            {"annotations", {{kNetworkPolicyHashAnnotation, hash}}},
            {"ownerReferences", Json::array({ControllerReference(job)})}}},
          {"spec", std::move(spec)}};
}

}  // namespace distrain::controller

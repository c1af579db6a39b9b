#ifndef DISTRAIN_OPERATOR_KUBE_PATHS_H_
#define DISTRAIN_OPERATOR_KUBE_PATHS_H_

// REST paths and query strings of the Kubernetes API, and object keys.
//
//   Resource pods{"", "v1", "pods"};
//   ResourcePath(pods, "ns", "job-worker-0")          -> /api/v1/namespaces/ns/pods/job-worker-0
//   ResourcePath(kDtj, "ns", "j", "status")           -> /apis/distrain.io/v1alpha1/namespaces/ns/distributedtrainingjobs/j/status
//   WithQuery(ResourcePath(pods, "ns"), {.label_selector = "a=b", .limit = 500})
//                                                      -> /api/v1/namespaces/ns/pods?labelSelector=a%3Db&limit=500
//
// Pure functions; thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "nlohmann/json.hpp"

namespace distrain::kube {

// A resource type: group ("" for the core group), version and plural name.
struct Resource {
  std::string group;
  std::string version;
  std::string plural;
  bool namespaced = true;

  // "v1" or "apps/v1".
  std::string GroupVersion() const;
};

// Resources the operator uses.
Resource PodsResource();
Resource ServicesResource();
Resource ConfigMapsResource();
Resource PersistentVolumeClaimsResource();
Resource EventsResource();      // events.k8s.io/v1
Resource LeasesResource();      // coordination.k8s.io/v1
Resource NamespacesResource();  // cluster-scoped

// /api/v1[/namespaces/NS]/PLURAL[/NAME[/SUBRESOURCE]] (or /apis/GROUP/VERSION/...).
// An empty namespace_name means all namespaces (or a cluster-scoped resource).
// Name and namespace are path-escaped.
std::string ResourcePath(const Resource& resource, std::string_view namespace_name = "",
                         std::string_view name = "", std::string_view subresource = "");

// Query parameters of LIST and WATCH; unset fields are left out.
struct ListOptions {
  std::string label_selector{};
  std::string field_selector{};
  int64_t limit = 0;                  // 0: no pagination
  std::string continue_token{};
  std::optional<std::string> resource_version{};
  std::string resource_version_match{};  // "NotOlderThan" | "Exact"
  bool watch = false;
  bool allow_watch_bookmarks = false;
  int64_t timeout_seconds = 0;         // 0: the server's default
};

// path + "?" + the query of `options` ("" when nothing is set).
std::string WithQuery(std::string path, const ListOptions& options);

// Percent-encodes a query component (RFC 3986 unreserved characters stay).
std::string QueryEscape(std::string_view s);
// Percent-encodes one path segment.
std::string PathEscape(std::string_view s);

// "a=b,c=d" from a map (keys in order); equality selectors only.
std::string LabelSelector(const std::map<std::string, std::string>& labels);

// "namespace/name" for namespaced objects, "name" for cluster-scoped ones,
// from object.metadata; "" when the object has no name.
std::string ObjectKey(const nlohmann::json& object);
std::string ObjectKey(std::string_view namespace_name, std::string_view name);
// The inverse of ObjectKey: {namespace, name} ({"", key} when there is no '/').
std::pair<std::string, std::string> SplitObjectKey(std::string_view key);

// object.metadata.resourceVersion, or "".
std::string ResourceVersionOf(const nlohmann::json& object);

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_PATHS_H_

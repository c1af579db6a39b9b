#include "operator/kube/paths.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace distrain::kube {
namespace {

bool IsUnreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

std::string PercentEncode(std::string_view s, std::string_view also_allowed) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (IsUnreserved(c) || also_allowed.find(static_cast<char>(c)) != std::string_view::npos) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

void AddParam(std::string& query, std::string_view key, std::string_view value) {
  query.append(query.empty() ? "?" : "&");
  query.append(key);
  query.push_back('=');
  query.append(QueryEscape(value));
}

}  // namespace

std::string Resource::GroupVersion() const {
  return group.empty() ? version : group + "/" + version;
}

Resource PodsResource() { return {"", "v1", "pods", true}; }
Resource ServicesResource() { return {"", "v1", "services", true}; }
Resource ConfigMapsResource() { return {"", "v1", "configmaps", true}; }
Resource PersistentVolumeClaimsResource() { return {"", "v1", "persistentvolumeclaims", true}; }
Resource EventsResource() { return {"events.k8s.io", "v1", "events", true}; }
Resource LeasesResource() { return {"coordination.k8s.io", "v1", "leases", true}; }
Resource NamespacesResource() { return {"", "v1", "namespaces", false}; }

std::string ResourcePath(const Resource& resource, std::string_view namespace_name,
                         std::string_view name, std::string_view subresource) {
  // StrCat / StrAppend, not operator+: GCC 12 -Wrestrict misreads "literal" + std::string.
  std::string path = resource.group.empty()
                         ? absl::StrCat("/api/", resource.version)
                         : absl::StrCat("/apis/", resource.group, "/", resource.version);
  if (resource.namespaced && !namespace_name.empty()) {
    absl::StrAppend(&path, "/namespaces/", PathEscape(namespace_name));
  }
  absl::StrAppend(&path, "/", resource.plural);
  if (!name.empty()) {
    absl::StrAppend(&path, "/", PathEscape(name));
    if (!subresource.empty()) absl::StrAppend(&path, "/", std::string(subresource));
  }
  return path;
}

std::string QueryEscape(std::string_view s) { return PercentEncode(s, ""); }

std::string PathEscape(std::string_view s) { return PercentEncode(s, ":@!$&'()*+,;="); }

std::string WithQuery(std::string path, const ListOptions& options) {
  std::string query;
  if (!options.label_selector.empty()) AddParam(query, "labelSelector", options.label_selector);
  if (!options.field_selector.empty()) AddParam(query, "fieldSelector", options.field_selector);
  if (options.limit > 0) AddParam(query, "limit", std::to_string(options.limit));
  if (!options.continue_token.empty()) AddParam(query, "continue", options.continue_token);
  if (options.resource_version) AddParam(query, "resourceVersion", *options.resource_version);
  if (!options.resource_version_match.empty()) {
    AddParam(query, "resourceVersionMatch", options.resource_version_match);
  }
  if (options.watch) AddParam(query, "watch", "1");
  if (options.allow_watch_bookmarks) AddParam(query, "allowWatchBookmarks", "true");
  if (options.timeout_seconds > 0) {
    AddParam(query, "timeoutSeconds", std::to_string(options.timeout_seconds));
  }
  return path + query;
}

std::string LabelSelector(const std::map<std::string, std::string>& labels) {
  std::string out;
  for (const auto& [key, value] : labels) {
    if (!out.empty()) out.push_back(',');
    out += key + "=" + value;
  }
  return out;
}

std::string ObjectKey(std::string_view namespace_name, std::string_view name) {
  if (namespace_name.empty()) return std::string(name);
  return std::string(namespace_name) + "/" + std::string(name);
}

std::string ObjectKey(const nlohmann::json& object) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto name = metadata->find("name");
  if (name == metadata->end() || !name->is_string()) return "";
  auto ns = metadata->find("namespace");
  std::string namespace_name = (ns != metadata->end() && ns->is_string()) ? ns->get<std::string>() : "";
  return ObjectKey(namespace_name, name->get<std::string>());
}

std::pair<std::string, std::string> SplitObjectKey(std::string_view key) {
  auto slash = key.find('/');
  if (slash == std::string_view::npos) return {"", std::string(key)};
  return {std::string(key.substr(0, slash)), std::string(key.substr(slash + 1))};
}

std::string ResourceVersionOf(const nlohmann::json& object) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto rv = metadata->find("resourceVersion");
  if (rv == metadata->end() || !rv->is_string()) return "";
  return rv->get<std::string>();
}

}  // namespace distrain::kube

#include "operator/kube/kubeconfig.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/yaml_json.h"

namespace distrain::kube {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(what, ": ", path, " does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(err)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(what, ": error reading ", path));
  }
  return text.str();
}

std::string ResolvePath(const std::string& path, const std::string& relative_to_file) {
  fs::path p(path);
  if (p.is_absolute() || relative_to_file.empty()) return path;
  return (fs::path(relative_to_file).parent_path() / p).lexically_normal().string();
}

// A string field of `object`: "" when absent; an error when present with another type.
absl::StatusOr<std::string> StringField(const nlohmann::json& object, const std::string& key,
                                        const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, ": must be a string, got ", it->type_name()));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> DecodeData(const std::string& encoded, const std::string& where) {
  std::string compact;
  for (char c : encoded) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) compact.push_back(c);
  }
  std::string decoded;
  if (!absl::Base64Unescape(compact, &decoded)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": not valid base64 (the *-data fields hold the base64 of the PEM file)"));
  }
  return decoded;
}

// `data_key` (base64) wins over `file_key` (a path), as in kubectl.
absl::StatusOr<std::string> DataOrFile(const nlohmann::json& object, const std::string& data_key,
                                       const std::string& file_key, const std::string& where,
                                       const std::string& origin_file) {
  auto data = StringField(object, data_key, where);
  if (!data.ok()) return data.status();
  if (!data->empty()) return DecodeData(*data, absl::StrCat(where, ".", data_key));
  auto file = StringField(object, file_key, where);
  if (!file.ok()) return file.status();
  if (file->empty()) return std::string();
  return ReadWholeFile(ResolvePath(*file, origin_file), absl::StrCat(where, ".", file_key));
}

absl::Status CheckPem(const std::string& pem, const std::string& where) {
  if (!pem.empty() && pem.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not PEM (no \"-----BEGIN\" line); give a PEM certificate or key"));
  }
  return absl::OkStatus();
}

std::string TrimToken(std::string token) {
  return std::string(absl::StripAsciiWhitespace(token));
}

// Adds the named entries of list `key` of one file, first definition wins.
absl::Status MergeList(const YamlJson& doc, const std::string& file, const std::string& key,
                       const std::string& inner_key, std::map<std::string, Kubeconfig::Entry>& out) {
  auto it = doc.value.find(key);
  if (it == doc.value.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", key, ": must be a list of {name, ", inner_key, "}"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& item = (*it)[i];
    std::string path = JoinYamlPath(key, i);
    std::string line;
    if (auto loc = doc.locations.find(path); loc != doc.locations.end()) {
      line = absl::StrCat(", line ", loc->second.line);
    }
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string() ||
        item["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", path, line, ": each entry needs a non-empty string \"name\""));
    }
    std::string name = item["name"].get<std::string>();
    if (out.count(name)) continue;  // an earlier file (or entry) defined it: it wins
    nlohmann::json value = nlohmann::json::object();
    if (auto inner = item.find(inner_key); inner != item.end() && !inner->is_null()) {
      if (!inner->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": ", path, ".", inner_key, line, ": must be a mapping"));
      }
      value = nlohmann::json::parse(inner->dump());
    }
    out[name] = Kubeconfig::Entry{std::move(value), file,
                                  absl::StrCat(file, ": ", path, " (name ", name, line, ").",
                                               inner_key)};
  }
  return absl::OkStatus();
}

std::string Names(const std::map<std::string, Kubeconfig::Entry>& entries) {
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries) names.push_back(name);
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::vector<std::string> SplitKubeconfigList(std::string_view value) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(':', start);
    if (end == std::string_view::npos) end = value.size();
    std::string item(value.substr(start, end - start));
    if (!item.empty() && seen.insert(item).second) out.push_back(item);
    start = end + 1;
  }
  return out;
}

absl::StatusOr<Kubeconfig> MergeKubeconfigFiles(const std::vector<std::string>& paths,
                                                bool require_all) {
  Kubeconfig merged;
  for (const std::string& path : paths) {
    auto text = ReadWholeFile(path, "kubeconfig");
    if (!text.ok()) {
      if (absl::IsNotFound(text.status()) && !require_all) continue;
      return text.status();
    }
    merged.files.push_back(path);
    if (absl::StripAsciiWhitespace(*text).empty()) continue;  // an empty file is an empty config
    auto doc = YamlToJson(*text);
    if (!doc.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kubeconfig ", path, ": not valid YAML: ", doc.status().message()));
    }
    if (doc->value.is_null()) continue;
    if (!doc->value.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kubeconfig ", path, ": must be a mapping with clusters, users and contexts"));
    }
    if (auto st = MergeList(*doc, path, "clusters", "cluster", merged.clusters); !st.ok()) return st;
    if (auto st = MergeList(*doc, path, "users", "user", merged.users); !st.ok()) return st;
    if (auto st = MergeList(*doc, path, "contexts", "context", merged.contexts); !st.ok()) return st;
    if (merged.current_context.empty()) {
      auto current = doc->value.find("current-context");
      if (current != doc->value.end() && current->is_string() &&
          !current->get<std::string>().empty()) {
        merged.current_context = current->get<std::string>();
        merged.current_context_file = path;
      }
    }
  }
  return merged;
}

absl::StatusOr<RestConfig> ResolveContext(const Kubeconfig& config, const std::string& context) {
  std::string files = config.files.empty() ? "(no kubeconfig file)" : absl::StrJoin(config.files, ":");
  std::string context_name = context.empty() ? config.current_context : context;
  if (context_name.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kubeconfig ", files, ": no current-context is set; pass --context or run "
        "`kubectl config use-context NAME` (contexts: ", Names(config.contexts), ")"));
  }
  auto ctx_it = config.contexts.find(context_name);
  if (ctx_it == config.contexts.end()) {
    return absl::NotFoundError(absl::StrCat("kubeconfig ", files, ": context \"", context_name,
                                            "\" is not defined (contexts: ",
                                            Names(config.contexts), ")"));
  }
  const Kubeconfig::Entry& ctx = ctx_it->second;
  auto cluster_name = StringField(ctx.value, "cluster", ctx.where);
  if (!cluster_name.ok()) return cluster_name.status();
  auto user_name = StringField(ctx.value, "user", ctx.where);
  if (!user_name.ok()) return user_name.status();
  auto namespace_name = StringField(ctx.value, "namespace", ctx.where);
  if (!namespace_name.ok()) return namespace_name.status();

  RestConfig out;
  out.source = absl::StrCat("kubeconfig ", files, " (context ", context_name, ")");
  if (!namespace_name->empty()) out.namespace_name = *namespace_name;

  // Cluster.
  if (cluster_name->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx.where, ".cluster: missing; name one of: ", Names(config.clusters)));
  }
  auto cl_it = config.clusters.find(*cluster_name);
  if (cl_it == config.clusters.end()) {
    return absl::NotFoundError(absl::StrCat(ctx.where, ".cluster: cluster \"", *cluster_name,
                                            "\" is not defined (clusters: ",
                                            Names(config.clusters), ")"));
  }
  const Kubeconfig::Entry& cluster = cl_it->second;
  auto server = StringField(cluster.value, "server", cluster.where);
  if (!server.ok()) return server.status();
  if (server->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cluster.where, ".server: missing; set the API server URL (https://host:port)"));
  }
  while (!server->empty() && server->back() == '/') server->pop_back();
  if (server->rfind("https://", 0) != 0 && server->rfind("http://", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(cluster.where, ".server: \"", *server,
                                                   "\" must start with https:// or http://"));
  }
  out.server = *server;
  if (auto it = cluster.value.find("insecure-skip-tls-verify"); it != cluster.value.end()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(cluster.where, ".insecure-skip-tls-verify: must be true or false"));
    }
    out.insecure_skip_tls_verify = it->get<bool>();
  }
  auto tls_server_name = StringField(cluster.value, "tls-server-name", cluster.where);
  if (!tls_server_name.ok()) return tls_server_name.status();
  if (!tls_server_name->empty()) {
    return absl::UnimplementedError(absl::StrCat(
        cluster.where, ".tls-server-name: not supported by distrain; use a server URL whose host "
        "is in the API server certificate"));
  }
  auto ca = DataOrFile(cluster.value, "certificate-authority-data", "certificate-authority",
                       cluster.where, cluster.file);
  if (!ca.ok()) return ca.status();
  if (auto st = CheckPem(*ca, absl::StrCat(cluster.where, ".certificate-authority")); !st.ok()) {
    return st;
  }
  out.ca_pem = std::move(*ca);

  // User (optional: a context may name none, e.g. an insecure local server).
  if (user_name->empty()) return out;
  auto user_it = config.users.find(*user_name);
  if (user_it == config.users.end()) {
    return absl::NotFoundError(absl::StrCat(ctx.where, ".user: user \"", *user_name,
                                            "\" is not defined (users: ", Names(config.users),
                                            ")"));
  }
  const Kubeconfig::Entry& user = user_it->second;
  for (const char* unsupported : {"exec", "auth-provider"}) {
    if (user.value.contains(unsupported) && !user.value[unsupported].is_null()) {
      return absl::UnimplementedError(absl::StrCat(
          user.where, ".", unsupported,
          ": credential plugins are not supported by distrain; use a token, tokenFile or a "
          "client certificate (e.g. `kubectl create token SERVICEACCOUNT`)"));
    }
  }
  auto cert = DataOrFile(user.value, "client-certificate-data", "client-certificate", user.where,
                         user.file);
  if (!cert.ok()) return cert.status();
  auto key = DataOrFile(user.value, "client-key-data", "client-key", user.where, user.file);
  if (!key.ok()) return key.status();
  if (cert->empty() != key->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        user.where, ": has a client ", cert->empty() ? "key" : "certificate", " but no client ",
        cert->empty() ? "certificate" : "key", "; set both client-certificate(-data) and "
        "client-key(-data)"));
  }
  if (auto st = CheckPem(*cert, absl::StrCat(user.where, ".client-certificate")); !st.ok()) return st;
  if (auto st = CheckPem(*key, absl::StrCat(user.where, ".client-key")); !st.ok()) return st;
  out.client_cert_pem = std::move(*cert);
  out.client_key_pem = std::move(*key);

  auto token = StringField(user.value, "token", user.where);
  if (!token.ok()) return token.status();
  out.bearer_token = TrimToken(*token);
  auto token_file = StringField(user.value, "tokenFile", user.where);
  if (!token_file.ok()) return token_file.status();
  if (!token_file->empty()) {
    out.bearer_token_file = ResolvePath(*token_file, user.file);
    auto content = ReadWholeFile(out.bearer_token_file, absl::StrCat(user.where, ".tokenFile"));
    if (!content.ok()) return content.status();
    out.bearer_token = TrimToken(*content);
  }
  auto username = StringField(user.value, "username", user.where);
  if (!username.ok()) return username.status();
  auto password = StringField(user.value, "password", user.where);
  if (!password.ok()) return password.status();
  if (username->empty() != password->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(user.where, ": username and password must be set together"));
  }
  out.username = *username;
  out.password = *password;
  return out;
}

absl::StatusOr<RestConfig> LoadKubeconfig(const LoadOptions& options) {
  EnvLookup env = options.env ? options.env : ProcessEnv();
  std::vector<std::string> paths;
  bool require_all = false;
  std::string origin;
  if (!options.kubeconfig_path.empty()) {
    paths = {options.kubeconfig_path};
    require_all = true;
    origin = "--kubeconfig";
  } else if (auto list = env("KUBECONFIG"); list && !list->empty()) {
    paths = SplitKubeconfigList(*list);
    origin = absl::StrCat("KUBECONFIG=", *list);
  } else if (auto home = env("HOME"); home && !home->empty()) {
    paths = {(fs::path(*home) / ".kube" / "config").string()};
    origin = "the default ~/.kube/config";
  }
  if (paths.empty()) {
    return absl::NotFoundError(
        "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run inside a cluster");
  }
  auto merged = MergeKubeconfigFiles(paths, require_all);
  if (!merged.ok()) return merged.status();
  if (merged->files.empty()) {
    return absl::NotFoundError(absl::StrCat("no kubeconfig: none of the files named by ", origin,
                                            " exists (", absl::StrJoin(paths, ", "),
                                            "); pass --kubeconfig or set KUBECONFIG"));
  }
  return ResolveContext(*merged, options.context);
}

absl::StatusOr<RestConfig> LoadInClusterConfig(const LoadOptions& options) {
  EnvLookup env = options.env ? options.env : ProcessEnv();
  auto host = env("KUBERNETES_SERVICE_HOST");
  auto port = env("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty() || !port || port->empty()) {
    return absl::FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both "
        "be set (outside a cluster, pass --kubeconfig)");
  }
  const fs::path dir(options.service_account_dir);
  RestConfig out;
  std::string bracketed = host->find(':') != std::string::npos ? "[" + *host + "]" : *host;
  out.server = absl::StrCat("https://", bracketed, ":", *port);
  out.source = absl::StrCat("in-cluster ServiceAccount (", dir.string(), ")");
  out.bearer_token_file = (dir / "token").string();
  auto token = ReadWholeFile(out.bearer_token_file,
                             "in-cluster config: the ServiceAccount token (is automountServiceAccountToken off?)");
  if (!token.ok()) return token.status();
  out.bearer_token = TrimToken(*token);
  if (out.bearer_token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("in-cluster config: ", out.bearer_token_file, " is empty"));
  }
  auto ca = ReadWholeFile((dir / "ca.crt").string(), "in-cluster config: the cluster CA");
  if (!ca.ok()) return ca.status();
  if (auto st = CheckPem(*ca, (dir / "ca.crt").string()); !st.ok()) return st;
  out.ca_pem = std::move(*ca);
  auto ns = ReadWholeFile((dir / "namespace").string(), "in-cluster config: the pod's namespace");
  if (ns.ok()) {
    std::string trimmed = TrimToken(*ns);
    if (!trimmed.empty()) out.namespace_name = trimmed;
  } else if (!absl::IsNotFound(ns.status())) {
    return ns.status();
  }
  return out;
}

absl::StatusOr<RestConfig> LoadRestConfig(const LoadOptions& options) {
  EnvLookup env = options.env ? options.env : ProcessEnv();
  if (options.kubeconfig_path.empty()) {
    auto list = env("KUBECONFIG");
    auto host = env("KUBERNETES_SERVICE_HOST");
    if ((!list || list->empty()) && host && !host->empty()) {
      LoadOptions in_cluster = options;
      in_cluster.env = env;
      return LoadInClusterConfig(in_cluster);
    }
  }
  LoadOptions with_env = options;
  with_env.env = env;
  return LoadKubeconfig(with_env);
}

}  // namespace distrain::kube

#ifndef DISTRAIN_OPERATOR_KUBE_KUBECONFIG_H_
#define DISTRAIN_OPERATOR_KUBE_KUBECONFIG_H_

// Where the API server is and how to authenticate to it: kubeconfig files
// (kubectl's rules) and the in-cluster ServiceAccount.
//
// Loading order of LoadRestConfig (controller-runtime's, so `distrain-operator`
// behaves like other operators):
//   1. --kubeconfig (options.kubeconfig_path): exactly that file, which must exist;
//   2. $KUBECONFIG: a colon-separated list, merged;
//   3. in-cluster: $KUBERNETES_SERVICE_HOST/_PORT and the ServiceAccount files;
//   4. ~/.kube/config.
// Merge rules for a $KUBECONFIG list (kubectl's): files are read in order, empty
// entries, duplicates and files that do not exist are skipped; for clusters,
// users and contexts the first file to define a name wins; current-context comes
// from the first file that sets it. Relative paths (certificate-authority,
// client-certificate, client-key, tokenFile) are relative to the file that
// holds them.
//
// Errors name the file and the key ("/home/u/.kube/config: users[0] (name
// admin).user.client-key-data: not valid base64") and say what to do.
//
// Pure functions over the filesystem and the environment; thread-safe.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace distrain::kube {

// Everything RestClient needs to reach and authenticate to one API server.
struct RestConfig {
  std::string server;                 // "https://127.0.0.1:6443"
  std::string ca_pem;                 // PEM bundle to trust; empty: the system's trust store
  bool insecure_skip_tls_verify = false;
  std::string client_cert_pem;        // client certificate (chain), PEM
  std::string client_key_pem;         // its private key, PEM
  std::string bearer_token;           // a static token
  std::string bearer_token_file;      // re-read every minute; wins over bearer_token
  std::string username;               // basic auth (legacy; both set or neither)
  std::string password;
  std::string namespace_name = "default";  // the context's (or the pod's) namespace
  std::string source;                 // where this came from, for messages
};

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The process environment.
EnvLookup ProcessEnv();

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct LoadOptions {
  std::string kubeconfig_path;  // --kubeconfig: only this file; must exist
  std::string context;          // --context: overrides current-context
  std::string service_account_dir = kServiceAccountDir;  // in-cluster token, ca.crt, namespace
  EnvLookup env{};              // null: the process environment
};

// A kubeconfig after merging: named entries with the file each came from.
struct Kubeconfig {
  struct Entry {
    nlohmann::json value;  // the cluster / user / context object
    std::string file;      // the file that defined it (relative paths resolve against it)
    std::string where;     // "users[0] (name admin)", for messages
  };
  std::map<std::string, Entry> clusters;
  std::map<std::string, Entry> users;
  std::map<std::string, Entry> contexts;
  std::string current_context;
  std::string current_context_file;
  std::vector<std::string> files;  // the files read, in order
};

// Splits a $KUBECONFIG value on ':' and drops empty entries and duplicates.
std::vector<std::string> SplitKubeconfigList(std::string_view value);

// Reads and merges kubeconfig files with kubectl's rules. A missing file is an
// error when `require_all` (the --kubeconfig case), else skipped.
absl::StatusOr<Kubeconfig> MergeKubeconfigFiles(const std::vector<std::string>& paths,
                                                bool require_all);

// The RestConfig of `context` (empty: current-context): reads referenced files,
// decodes *-data fields.
absl::StatusOr<RestConfig> ResolveContext(const Kubeconfig& config, const std::string& context);

// Steps 1, 2 and 4 of the loading order (no in-cluster).
absl::StatusOr<RestConfig> LoadKubeconfig(const LoadOptions& options);

// Step 3 alone: fails when KUBERNETES_SERVICE_HOST/PORT are unset or the token
// is missing.
absl::StatusOr<RestConfig> LoadInClusterConfig(const LoadOptions& options);

// The whole loading order.
absl::StatusOr<RestConfig> LoadRestConfig(const LoadOptions& options);

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_KUBECONFIG_H_

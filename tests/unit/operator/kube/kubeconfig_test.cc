#include "operator/kube/kubeconfig.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain::kube {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kCaPem[] = "-----BEGIN CERTIFICATE-----\nY2E=\n-----END CERTIFICATE-----\n";
constexpr char kCertPem[] = "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n";
constexpr char kKeyPem[] = "-----BEGIN PRIVATE KEY-----\na2V5\n-----END PRIVATE KEY-----\n";

// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("distrain_kubeconfig_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) const {
    fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

LoadOptions FromFile(const std::string& path, const std::string& context = "") {
  LoadOptions options;
  options.kubeconfig_path = path;
  options.context = context;
  return options;
}

// Three files exercising the merge rules: "a" and "b" both define cluster c1,
// user u1 and context ctx-a; "c" sets no current-context.
constexpr char kFileA[] = R"(apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "https://a.example:1"}
users:
- name: u1
  user: {token: token-a}
contexts:
- name: ctx-a
  context: {cluster: c1, user: u1, namespace: ns-a}
current-context: ctx-a
)";
constexpr char kFileB[] = R"(clusters:
- name: c1
  cluster: {server: "https://b.example:1"}
- name: c2
  cluster: {server: "https://b.example:2/"}
users:
- name: u1
  user: {token: token-b}
- name: u2
  user: {token: token-b2}
contexts:
- name: ctx-a
  context: {cluster: c2, user: u2}
- name: ctx-b
  context: {cluster: c2, user: u2, namespace: ns-b}
current-context: ctx-b
)";
constexpr char kFileC[] = R"(contexts:
- name: ctx-c
  context: {cluster: c2, user: u1}
current-context: ""
)";

struct MergeCase {
  std::string name;
  std::string kubeconfig_env;   // file letters joined with ':' ("x" is a missing file)
  std::string kubeconfig_flag;  // a file letter or ""
  std::string context;
  bool home_config = false;     // ~/.kube/config holds file b
  // Expected on success:
  std::string server;
  std::string token;
  std::string namespace_name;
  // Expected on failure (non-empty: must fail with this in the message):
  std::string error;
};

void PrintTo(const MergeCase& c, std::ostream* os) { *os << c.name; }

class KubeconfigMergeTest : public ::testing::TestWithParam<MergeCase> {};

TEST_P(KubeconfigMergeTest, FollowsKubectlMergeRules) {
  const MergeCase& c = GetParam();
  TempDir dir;
  std::map<char, std::string> files = {{'a', dir.Write("a.yaml", kFileA)},
                                       {'b', dir.Write("b.yaml", kFileB)},
                                       {'c', dir.Write("c.yaml", kFileC)},
                                       {'x', dir.Path("missing.yaml")}};
  auto expand = [&](const std::string& letters) {
    std::string out;
    for (char ch : letters) out += (ch == ':') ? std::string(":") : files.at(ch);
    return out;
  };
  std::map<std::string, std::string> env;
  if (!c.kubeconfig_env.empty()) env["KUBECONFIG"] = expand(c.kubeconfig_env);
  if (c.home_config) {
    dir.Write("home/.kube/config", kFileB);
    env["HOME"] = dir.Path("home");
  }
  LoadOptions options;
  options.kubeconfig_path = c.kubeconfig_flag.empty() ? "" : expand(c.kubeconfig_flag);
  options.context = c.context;
  options.env = MapEnv(env);

  absl::StatusOr<RestConfig> config = LoadKubeconfig(options);
  if (!c.error.empty()) {
    ASSERT_FALSE(config.ok()) << "expected an error with \"" << c.error << "\", got server "
                              << config->server;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.error));
    return;
  }
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, c.server);
  EXPECT_EQ(config->bearer_token, c.token);
  EXPECT_EQ(config->namespace_name, c.namespace_name);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, KubeconfigMergeTest,
    ::testing::Values(
        // The first file to define a name wins; current-context from the first that sets it.
        MergeCase{"FirstFileWins", "a:b", "", "", false, "https://a.example:1", "token-a", "ns-a", ""},
        MergeCase{"OrderMatters", "b:a", "", "", false, "https://b.example:2", "token-b2", "ns-b", ""},
        // An empty current-context does not count as set.
        MergeCase{"EmptyCurrentContextSkipped", "c:b", "", "", false, "https://b.example:2",
                  "token-b2", "ns-b", ""},
        // Entries merge across files: ctx-c (from c) uses c2 and u1 from b.
        MergeCase{"EntriesMergeAcrossFiles", "c:b", "", "ctx-c", false, "https://b.example:2",
                  "token-b", "default", ""},
        MergeCase{"MissingFilesSkipped", "x:a", "", "", false, "https://a.example:1", "token-a",
                  "ns-a", ""},
        MergeCase{"EmptyEntriesSkipped", "::a::", "", "", false, "https://a.example:1", "token-a",
                  "ns-a", ""},
        MergeCase{"ContextOverride", "a:b", "", "ctx-b", false, "https://b.example:2", "token-b2",
                  "ns-b", ""},
        MergeCase{"FlagBeatsEnv", "b", "a", "", false, "https://a.example:1", "token-a", "ns-a", ""},
        MergeCase{"HomeConfigWithoutEnv", "", "", "", true, "https://b.example:2", "token-b2",
                  "ns-b", ""},
        MergeCase{"EnvBeatsHome", "a", "", "", true, "https://a.example:1", "token-a", "ns-a", ""},
        MergeCase{"MissingFlagFileIsAnError", "", "x", "", false, "", "", "", "does not exist"},
        MergeCase{"AllEnvFilesMissing", "x", "", "", false, "", "", "", "none of the files"},
        MergeCase{"UnknownContextListsContexts", "a:b", "", "nope", false, "", "", "",
                  "context \"nope\" is not defined (contexts: ctx-a, ctx-b)"},
        MergeCase{"ContextNamesUndefinedCluster", "c:a", "", "ctx-c", false, "", "", "",
                  "cluster \"c2\" is not defined"},
        MergeCase{"NoCurrentContext", "c", "", "", false, "", "", "",
                  "no current-context is set"}),
    [](const ::testing::TestParamInfo<MergeCase>& info) { return info.param.name; });

TEST(KubeconfigTest, SplitKubeconfigListDropsEmptyAndDuplicateEntries) {
  EXPECT_THAT(SplitKubeconfigList(":/a::/b:/a:"), ::testing::ElementsAre("/a", "/b"));
  EXPECT_TRUE(SplitKubeconfigList("").empty());
}

TEST(KubeconfigTest, RelativePathsResolveAgainstTheFileThatHoldsThem) {
  TempDir dir;
  dir.Write("conf/pki/ca.crt", kCaPem);
  dir.Write("conf/pki/admin.crt", kCertPem);
  dir.Write("conf/pki/admin.key", kKeyPem);
  dir.Write("conf/token", "  secret-token\n");
  std::string path = dir.Write("conf/kubeconfig", R"(clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: pki/ca.crt}
users:
- name: cert
  user: {client-certificate: pki/admin.crt, client-key: pki/admin.key}
- name: tok
  user: {tokenFile: token}
contexts:
- {name: cert, context: {cluster: c, user: cert}}
- {name: tok, context: {cluster: c, user: tok}}
current-context: cert
)");
  auto config = LoadKubeconfig(FromFile(path));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->client_cert_pem, kCertPem);
  EXPECT_EQ(config->client_key_pem, kKeyPem);
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");

  auto token = LoadKubeconfig(FromFile(path, "tok"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->bearer_token, "secret-token");
  EXPECT_EQ(token->bearer_token_file, dir.Path("conf/token"));
}

TEST(KubeconfigTest, DataFieldsAreDecodedAndWinOverFiles) {
  TempDir dir;
  std::string path = dir.Write("kubeconfig", absl::StrCat(R"(clusters:
- name: c
  cluster:
    server: https://10.0.0.1:443
    certificate-authority: /nonexistent/ca.crt
    certificate-authority-data: )", absl::Base64Escape(kCaPem), R"(
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    client-certificate-data: )", absl::Base64Escape(kCertPem), R"(
    client-key-data: )", absl::Base64Escape(kKeyPem), R"(
contexts:
- {name: x, context: {cluster: c, user: u}}
current-context: x
)"));
  auto config = LoadKubeconfig(FromFile(path));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->client_cert_pem, kCertPem);
  EXPECT_EQ(config->client_key_pem, kKeyPem);
  EXPECT_TRUE(config->insecure_skip_tls_verify);
}

struct BadCase {
  std::string name;
  std::string user_yaml;  // the body of users[0].user
  std::string error;      // expected in the message (besides the file path)
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class KubeconfigBadUserTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(KubeconfigBadUserTest, ErrorNamesFileAndKey) {
  TempDir dir;
  std::string path = dir.Write("kubeconfig", R"(clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: admin
  user: )" + GetParam().user_yaml + R"(
contexts:
- {name: x, context: {cluster: c, user: admin}}
current-context: x
)");
  auto config = LoadKubeconfig(FromFile(path));
  ASSERT_FALSE(config.ok());
  std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("users[0] (name admin"));
  EXPECT_THAT(message, HasSubstr(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, KubeconfigBadUserTest,
    ::testing::Values(
        BadCase{"BadBase64", "{client-certificate-data: \"!!!\", client-key-data: \"!!!\"}",
                "client-certificate-data: not valid base64"},
        BadCase{"CertWithoutKey", "{client-certificate-data: \"" + absl::Base64Escape(kCertPem) + "\"}",
                "has a client certificate but no client key"},
        BadCase{"NotPem", "{client-certificate-data: \"" + absl::Base64Escape("junk") +
                              "\", client-key-data: \"" + absl::Base64Escape(kKeyPem) + "\"}",
                "client-certificate: not PEM"},
        BadCase{"ExecPlugin", "{exec: {command: aws}}", "credential plugins are not supported"},
        BadCase{"MissingKeyFile", "{client-certificate-data: \"" + absl::Base64Escape(kCertPem) +
                                      "\", client-key: nothere.key}",
                "client-key"},
        BadCase{"TokenNotString", "{token: [1, 2]}", "token: must be a string"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(KubeconfigTest, EntryWithoutNameNamesItsLine) {
  TempDir dir;
  std::string path = dir.Write("kubeconfig", "clusters:\n- cluster: {server: https://x}\n");
  auto config = LoadKubeconfig(FromFile(path));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ": clusters[0], line 2"));
}

class InClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("sa/token", "sa-token-1\n");
    dir_.Write("sa/ca.crt", kCaPem);
    dir_.Write("sa/namespace", "team-a");
  }
  LoadOptions Options(std::map<std::string, std::string> env) {
    LoadOptions options;
    options.service_account_dir = dir_.Path("sa");
    options.env = MapEnv(std::move(env));
    return options;
  }
  TempDir dir_;
};

TEST_F(InClusterTest, ReadsServiceAccountFilesAndServiceEnv) {
  auto config = LoadInClusterConfig(
      Options({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->bearer_token, "sa-token-1");
  EXPECT_EQ(config->bearer_token_file, dir_.Path("sa/token"));
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->namespace_name, "team-a");
}

TEST_F(InClusterTest, BracketsIpv6Host) {
  auto config = LoadInClusterConfig(
      Options({{"KUBERNETES_SERVICE_HOST", "fd00::1"}, {"KUBERNETES_SERVICE_PORT", "6443"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:6443");
}

TEST_F(InClusterTest, MissingNamespaceFileMeansDefault) {
  std::filesystem::remove(dir_.Path("sa/namespace"));
  auto config = LoadInClusterConfig(
      Options({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->namespace_name, "default");
}

TEST_F(InClusterTest, MissingTokenNamesTheFile) {
  std::filesystem::remove(dir_.Path("sa/token"));
  auto config = LoadInClusterConfig(
      Options({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(dir_.Path("sa/token")));
}

TEST_F(InClusterTest, RequiresServiceEnv) {
  auto config = LoadInClusterConfig(Options({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("KUBERNETES_SERVICE_PORT"));
}

TEST_F(InClusterTest, LoadRestConfigOrder) {
  std::string kubeconfig = dir_.Write("kc", kFileA);
  std::map<std::string, std::string> in_cluster = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                                   {"KUBERNETES_SERVICE_PORT", "443"},
                                                   {"HOME", dir_.Path("home")}};
  dir_.Write("home/.kube/config", kFileB);
  // In a pod without KUBECONFIG: the ServiceAccount, not ~/.kube/config.
  auto config = LoadRestConfig(Options(in_cluster));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  // KUBECONFIG beats in-cluster.
  auto with_env = in_cluster;
  with_env["KUBECONFIG"] = kubeconfig;
  config = LoadRestConfig(Options(with_env));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://a.example:1");
  // --kubeconfig beats everything.
  LoadOptions flag = Options(in_cluster);
  flag.kubeconfig_path = dir_.Path("home/.kube/config");
  config = LoadRestConfig(flag);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://b.example:2");
}

}  // namespace
}  // namespace distrain::kube

#include "tests/unit/operator/controller/kubelet_expansion.h"

#include <gtest/gtest.h>

namespace distrain::kubelet {
namespace {

struct ExpandCase {
  const char* name;
  const char* input;
  const char* want;
};

// The cases of Kubernetes' expansion_test.go that a pod can observe.
TEST(ExpandKubeVarsTest, MatchesKubeletExpansion) {
  const std::map<std::string, std::string> vars = {
      {"VAR_A", "A"}, {"VAR_B", "B"}, {"VAR_EMPTY", ""}, {"VAR_REF", "$(VAR_A)"}, {"JSON", R"({"w":["h:1"]})"}};
  const ExpandCase cases[] = {
      {"whole string", "$(VAR_A)", "A"},
      {"start", "$(VAR_A)_post", "A_post"},
      {"end", "pre_$(VAR_B)", "pre_B"},
      {"two", "$(VAR_A)$(VAR_B)", "AB"},
      {"empty value", "x$(VAR_EMPTY)y", "xy"},
      {"value is not re-expanded", "$(VAR_REF)", "$(VAR_A)"},
      {"unknown stays", "$(UNKNOWN)", "$(UNKNOWN)"},
      {"escaped", "$$(VAR_A)", "$(VAR_A)"},
      {"double escape then var", "$$$(VAR_A)", "$A"},
      {"lone dollar at end", "cost $", "cost $"},
      {"dollar before other", "$VAR_A", "$VAR_A"},
      {"unclosed", "$(VAR_A", "$(VAR_A"},
      {"a name runs to the first closer", "$($(VAR_A)", "$($(VAR_A)"},
      {"empty name", "$()", "$()"},
      {"json inside", R"({"cluster":$(JSON),"task":{"index":0}})", R"({"cluster":{"w":["h:1"]},"task":{"index":0}})"},
      {"no operator", "plain", "plain"},
  };
  for (const ExpandCase& c : cases) {
    EXPECT_EQ(ExpandKubeVars(c.input, {&vars}), c.want) << c.name;
  }
}

TEST(ExpandKubeVarsTest, FirstMapThatDefinesTheNameWins) {
  const std::map<std::string, std::string> container = {{"X", "container"}};
  const std::map<std::string, std::string> service = {{"X", "service"}, {"Y", "service-y"}};
  EXPECT_EQ(ExpandKubeVars("$(X) $(Y)", {&container, &service}), "container service-y");
}

TEST(BuildContainerEnvTest, ValuesSeeOnlyEarlierEntriesAndServiceEnv) {
  const std::map<std::string, std::string> service = {{"KUBERNETES_SERVICE_HOST", "127.0.0.1"}};
  const auto env = BuildContainerEnv(
      {
          {"LATER_REF", "$(CLUSTER)", true},  // defined after: stays literal
          {"CLUSTER", R"({"worker":["w-0:2222"]})", false},
          {"TF_CONFIG", R"({"cluster":$(CLUSTER),"task":{"type":"worker","index":0}})", true},
          {"API", "https://$(KUBERNETES_SERVICE_HOST)", true},
          {"FROM_REF", "$(CLUSTER)", false},  // a valueFrom value is taken as is
      },
      service);
  EXPECT_EQ(env.at("LATER_REF"), "$(CLUSTER)");
  EXPECT_EQ(env.at("TF_CONFIG"), R"({"cluster":{"worker":["w-0:2222"]},"task":{"type":"worker","index":0}})");
  EXPECT_EQ(env.at("API"), "https://127.0.0.1");
  EXPECT_EQ(env.at("FROM_REF"), "$(CLUSTER)");
  EXPECT_EQ(env.at("KUBERNETES_SERVICE_HOST"), "127.0.0.1");
}

TEST(BuildContainerEnvTest, ContainerEntriesOverrideServiceEnvAndEachOther) {
  const auto env = BuildContainerEnv({{"A", "1", true}, {"A", "$(A)2", true}, {"HOST", "mine", true}},
                                     {{"HOST", "service"}});
  EXPECT_EQ(env.at("A"), "12");
  EXPECT_EQ(env.at("HOST"), "mine");
}

TEST(ServerHostPortTest, SplitsApiServerUrls) {
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(ServerHostPort("https://127.0.0.1:6443"), P("127.0.0.1", "6443"));
  EXPECT_EQ(ServerHostPort("https://127.0.0.1:6443/"), P("127.0.0.1", "6443"));
  EXPECT_EQ(ServerHostPort("https://kube.example"), P("kube.example", "443"));
  EXPECT_EQ(ServerHostPort("https://[::1]:8443"), P("::1", "8443"));
  EXPECT_EQ(ServerHostPort("not a url"), P());
}

}  // namespace
}  // namespace distrain::kubelet

#include "operator/kube/paths.h"

#include <string>

#include "gtest/gtest.h"

namespace distrain::kube {
namespace {

struct PathCase {
  Resource resource;
  std::string namespace_name, name, subresource;
  std::string expected;
};

class ResourcePathTest : public ::testing::TestWithParam<PathCase> {};

TEST_P(ResourcePathTest, BuildsTheRestPath) {
  const PathCase& c = GetParam();
  EXPECT_EQ(ResourcePath(c.resource, c.namespace_name, c.name, c.subresource), c.expected);
}

const Resource kDtj{"distrain.io", "v1alpha1", "distributedtrainingjobs", true};

INSTANTIATE_TEST_SUITE_P(
    Paths, ResourcePathTest,
    ::testing::Values(
        PathCase{PodsResource(), "", "", "", "/api/v1/pods"},
        PathCase{PodsResource(), "ns", "", "", "/api/v1/namespaces/ns/pods"},
        PathCase{PodsResource(), "ns", "p-0", "", "/api/v1/namespaces/ns/pods/p-0"},
        PathCase{kDtj, "ns", "j", "status",
                 "/apis/distrain.io/v1alpha1/namespaces/ns/distributedtrainingjobs/j/status"},
        PathCase{LeasesResource(), "kube-system", "l", "",
                 "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"},
        // Cluster-scoped resources ignore the namespace.
        PathCase{NamespacesResource(), "ignored", "team-a", "", "/api/v1/namespaces/team-a"},
        // Names are path-escaped.
        PathCase{ConfigMapsResource(), "ns", "a b/c", "", "/api/v1/namespaces/ns/configmaps/a%20b%2Fc"}));

TEST(WithQueryTest, EncodesEverySetOption) {
  ListOptions options;
  options.label_selector = "distrain.io/job-name=j,role in (worker)";
  options.limit = 500;
  options.continue_token = "abc+/=";
  options.resource_version = "123";
  options.watch = true;
  options.allow_watch_bookmarks = true;
  options.timeout_seconds = 300;
  EXPECT_EQ(WithQuery("/api/v1/pods", options),
            "/api/v1/pods?labelSelector=distrain.io%2Fjob-name%3Dj%2Crole%20in%20%28worker%29"
            "&limit=500&continue=abc%2B%2F%3D&resourceVersion=123&watch=1"
            "&allowWatchBookmarks=true&timeoutSeconds=300");
}

TEST(WithQueryTest, NothingSetMeansNoQuery) {
  EXPECT_EQ(WithQuery("/api/v1/pods", {}), "/api/v1/pods");
  ListOptions rv0;
  rv0.resource_version = "0";  // set-but-"0" is meaningful (serve from cache)
  EXPECT_EQ(WithQuery("/api/v1/pods", rv0), "/api/v1/pods?resourceVersion=0");
}

TEST(ObjectKeyTest, NamespacedAndClusterScoped) {
  EXPECT_EQ(ObjectKey(nlohmann::json{{"metadata", {{"name", "p"}, {"namespace", "ns"}}}}), "ns/p");
  EXPECT_EQ(ObjectKey(nlohmann::json{{"metadata", {{"name", "n"}}}}), "n");
  EXPECT_EQ(ObjectKey(nlohmann::json{{"kind", "Pod"}}), "");
  EXPECT_EQ(SplitObjectKey("ns/p"), (std::pair<std::string, std::string>{"ns", "p"}));
  EXPECT_EQ(SplitObjectKey("n"), (std::pair<std::string, std::string>{"", "n"}));
}

TEST(LabelSelectorTest, JoinsInKeyOrder) {
  EXPECT_EQ(LabelSelector({{"b", "2"}, {"a", "1"}}), "a=1,b=2");
  EXPECT_EQ(LabelSelector({}), "");
}

}  // namespace
}  // namespace distrain::kube

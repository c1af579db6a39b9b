#include "operator/self_check.h"

#include <gtest/gtest.h>

namespace distrain {
namespace {

struct MetricsCase {
  const char* name;
  const char* exposition;
  absl::StatusCode want;
};

TEST(CheckLeaderMetricsTest, PassesOnlyWhenALeaderSampleIsOne) {
  const MetricsCase cases[] = {
      {"leader with labels",
       "# HELP leader_election_master_status 1 if this replica leads\n"
       "# TYPE leader_election_master_status gauge\n"
       "leader_election_master_status{name=\"dt-distrain-operator\"} 1\n",
       absl::StatusCode::kOk},
      {"leader without labels", "leader_election_master_status 1\n", absl::StatusCode::kOk},
      {"with a timestamp", "leader_election_master_status{name=\"x\"} 1 1700000000000\n", absl::StatusCode::kOk},
      {"float form", "leader_election_master_status{name=\"x\"} 1.0\n", absl::StatusCode::kOk},
      {"standby", "leader_election_master_status{name=\"x\"} 0\n", absl::StatusCode::kFailedPrecondition},
      {"absent", "workqueue_depth{name=\"x\"} 0\n", absl::StatusCode::kNotFound},
      {"only in a comment", "# HELP leader_election_master_status 1\n", absl::StatusCode::kNotFound},
      {"a longer name is another metric", "leader_election_master_status_total 1\n", absl::StatusCode::kNotFound},
      {"empty", "", absl::StatusCode::kNotFound},
  };
  for (const MetricsCase& c : cases) {
    EXPECT_EQ(CheckLeaderMetrics(c.exposition).code(), c.want) << c.name;
  }
}

TEST(CheckCrdServedTest, FindsThePluralInTheResourceList) {
  const nlohmann::json list = {
      {"kind", "APIResourceList"},
      {"groupVersion", "distrain.io/v1alpha1"},
      {"resources",
       {{{"name", "distributedtrainingjobs"}, {"kind", "DistributedTrainingJob"}},
        {{"name", "distributedtrainingjobs/status"}, {"kind", "DistributedTrainingJob"}}}}};
  EXPECT_TRUE(CheckCrdServed(list, "distributedtrainingjobs").ok());
  const absl::Status missing = CheckCrdServed(list, "podgroups");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.message()).find("distrain.io/v1alpha1"), std::string::npos) << missing;
  EXPECT_EQ(CheckCrdServed(nlohmann::json::object(), "distributedtrainingjobs").code(), absl::StatusCode::kNotFound);
}

TEST(RunSelfCheckTest, FailsNamingTheUrlWhenNothingListens) {
  SelfCheckOptions options;
  options.readyz_url = "http://127.0.0.1:1/readyz";  // port 1: refused at once
  options.wait = absl::ZeroDuration();
  std::vector<std::string> said;
  const absl::Status s = RunSelfCheck(options, [&](const std::string& l) { said.push_back(l); });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("127.0.0.1:1/readyz"), std::string::npos) << s;
  EXPECT_TRUE(said.empty());
}

}  // namespace
}  // namespace distrain

#include "operator/api/distributed_training_job.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/yaml_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace distrain::api {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> YamlFilesIn(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Json YamlFileToJson(const std::string& path) {
  absl::StatusOr<YamlJson> yaml = YamlToJson(ReadFile(path));
  EXPECT_TRUE(yaml.ok()) << path << ": " << yaml.status();
  return yaml.ok() ? Json::parse(yaml->value.dump()) : Json();
}

// The CRD's openAPIV3Schema.
const Json& CrdSchema() {
  static const Json* const kSchema = new Json(YamlFileToJson(
      std::string(DISTRAIN_SOURCE_DIR) +
      "/crds/distrain.io_distributedtrainingjobs.yaml")["spec"]["versions"][0]["schema"]
                                                        ["openAPIV3Schema"]);
  return *kSchema;
}

// Structural defaulting as the API server does it: a missing property with a
// default gets it, then the defaulted value is defaulted in turn (so
// `training: {}` fills in its children); templates are left alone.
void ApplyCrdDefaults(const Json& schema, Json* value) {
  if (!value->is_object() || !schema.contains("properties")) return;
  for (const auto& [name, property] : schema["properties"].items()) {
    if (!value->contains(name)) {
      if (!property.contains("default")) continue;
      (*value)[name] = property["default"];
    }
    if (property.value("x-kubernetes-preserve-unknown-fields", false)) continue;
    ApplyCrdDefaults(property, &(*value)[name]);
  }
}

// Every leaf of `expected` has the same value at the same path of `actual`.
void ExpectLeavesEqual(const Json& expected, const Json& actual, const std::string& path,
                       const std::string& file) {
  if (expected.is_object()) {
    ASSERT_TRUE(actual.is_object()) << file << ": " << path << " is " << actual.dump();
    for (const auto& [k, v] : expected.items()) {
      if (k == "template") continue;  // kept verbatim; compared elsewhere
      ASSERT_TRUE(actual.contains(k)) << file << ": C++ has no " << path << "." << k;
      ExpectLeavesEqual(v, actual[k], absl::StrCat(path, ".", k), file);
    }
  } else if (expected.is_number() && actual.is_number()) {
    const double e = expected.get<double>(), a = actual.get<double>();
    EXPECT_LE(std::fabs(e - a), 1e-6 * std::max(1.0, std::fabs(e)))
        << file << ": " << path << ": CRD " << e << ", C++ " << a;
  } else {
    EXPECT_EQ(expected, actual) << file << ": " << path;
  }
}

TEST(ApiAgreementTest, EveryExampleParsesWithTheCrdDefaults) {
  const std::vector<std::string> files = YamlFilesIn(std::string(DISTRAIN_SOURCE_DIR) + "/examples");
  ASSERT_GE(files.size(), 7u);
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    Json raw = YamlFileToJson(file);
    absl::StatusOr<DistributedTrainingJob> job = ParseJob(raw);
    ASSERT_TRUE(job.ok()) << job.status();
    absl::StatusOr<DistributedTrainingJob> from_text = ParseJobYamlText(ReadFile(file));
    ASSERT_TRUE(from_text.ok()) << from_text.status();
    EXPECT_EQ(*from_text, *job);

    // What the API server stores after defaulting equals what C++ defaults to.
    Json server = raw;
    ApplyCrdDefaults(CrdSchema(), &server);
    ExpectLeavesEqual(server["spec"], SpecToJson(*job), "spec", file);
    // And the API server's defaulted object parses to the same job.
    absl::StatusOr<DistributedTrainingJob> defaulted = ParseJob(server);
    ASSERT_TRUE(defaulted.ok()) << defaulted.status();
    EXPECT_EQ(*defaulted, *job);
    // Templates are kept verbatim.
    for (const auto& [type, tmpl] : job->templates) {
      EXPECT_EQ(tmpl, raw["spec"]["replicaSpecs"][ReplicaTypeName(type)]["template"]);
    }
  }
}

TEST(ApiAgreementTest, AnEmptySpecGetsEveryCrdDefault) {
  Json raw = {{"apiVersion", kApiVersion},
              {"kind", kKind},
              {"metadata", {{"name", "j"}}},
              {"spec", {{"replicaSpecs", {{"Worker", Json::object()}}}}}};
  absl::StatusOr<DistributedTrainingJob> job = ParseJob(raw);
  ASSERT_TRUE(job.ok()) << job.status();
  Json server = raw;
  ApplyCrdDefaults(CrdSchema(), &server);
  // Sanity: the defaulting walked into nested objects.
  ASSERT_EQ(server["spec"]["training"]["optimizer"]["epsilon"].get<double>(), 1e-7);
  ASSERT_EQ(server["spec"]["replicaSpecs"]["Worker"]["restartPolicy"], "ExitCode");
  ExpectLeavesEqual(server["spec"], SpecToJson(*job), "spec", "empty spec");
}

// The field each rejected spec must name, for the files whose `# expect:`
// line quotes the API server's message without a field path.
const std::map<std::string, std::string>& FieldWithoutPathInExpect() {
  static const auto* const kFields = new std::map<std::string, std::string>{
      {"central-storage-with-chief.yaml", "spec.replicaSpecs.Chief"},
      {"mirrored-two-workers.yaml", "spec.replicaSpecs.Worker.replicas"},
      {"parameter-server-without-chief.yaml", "spec.replicaSpecs.Chief.replicas"},
      {"parameter-server-without-ps.yaml", "spec.replicaSpecs.PS.replicas"},
      {"ps-on-multi-worker-mirrored.yaml", "spec.replicaSpecs.PS"},
      {"unknown-strategy.yaml", "spec.strategy"},
  };
  return *kFields;
}

TEST(ApiAgreementTest, EveryInvalidSpecIsRejectedNamingTheSameField) {
  const std::vector<std::string> files =
      YamlFilesIn(std::string(DISTRAIN_SOURCE_DIR) + "/tests/kube/invalid");
  ASSERT_GE(files.size(), 10u);
  const std::regex field_path(R"(\b((spec|metadata)\.[A-Za-z.]*[A-Za-z]))");
  std::set<std::string> used;
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    const std::string text = ReadFile(file);
    std::smatch expect_line;
    ASSERT_TRUE(std::regex_search(text, expect_line, std::regex("# expect: ([^\n]*)")));
    const std::string expect = expect_line[1];
    const std::string base = std::filesystem::path(file).filename().string();
    std::string field;
    std::smatch m;
    if (std::regex_search(expect, m, field_path)) {
      field = m[1];
    } else {
      auto it = FieldWithoutPathInExpect().find(base);
      ASSERT_NE(it, FieldWithoutPathInExpect().end())
          << "the expect line names no field; add the field to FieldWithoutPathInExpect()";
      field = it->second;
      used.insert(base);
    }
    for (const absl::StatusOr<DistributedTrainingJob>& job :
         {ParseJob(YamlFileToJson(file)), ParseJobYamlText(text)}) {
      ASSERT_FALSE(job.ok()) << "accepted in C++, but the API server rejects it: " << expect;
      // The same field, or (for a CEL rule on an object) a field inside it.
      const std::string message(job.status().message());
      EXPECT_TRUE(message.find(field + ":") != std::string::npos ||
                  message.find(field + ".") != std::string::npos)
          << "C++ says: " << message << "\nthe API server says: " << expect;
    }
  }
  EXPECT_EQ(used.size(), FieldWithoutPathInExpect().size()) << "stale entries in the table";
}

TEST(ParseJobTest, ErrorsFromJsonCarryNoLineNumbers) {
  Json raw = {{"apiVersion", kApiVersion},
              {"kind", kKind},
              {"metadata", {{"name", "j"}}},
              {"spec", {{"replicaSpecs", {{"Worker", {{"replicas", 1}}}}},
                        {"training", {{"steps", 0}}}}}};
  absl::StatusOr<DistributedTrainingJob> job = ParseJob(raw);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.training.steps: must be"));
  EXPECT_THAT(std::string(job.status().message()), Not(HasSubstr("line ")));
}

Json ServerObject() {
  return Json::parse(R"({
    "apiVersion": "distrain.io/v1alpha1",
    "kind": "DistributedTrainingJob",
    "metadata": {
      "name": "mnist", "namespace": "team-a", "uid": "1234-abcd",
      "resourceVersion": "991", "generation": 3,
      "creationTimestamp": "2026-01-02T03:04:05Z",
      "labels": {"team": "a"}, "annotations": {"note": "x"},
      "managedFields": [{"manager": "kubectl", "operation": "Update"}]
    },
    "spec": {
      "strategy": "ParameterServer",
      "replicaSpecs": {
        "Chief": {"replicas": 1, "restartPolicy": "ExitCode"},
        "Worker": {"replicas": 2, "restartPolicy": "OnFailure",
                   "template": {"spec": {"containers": [{"name": "distrain", "image": "img:1"}]}}},
        "PS": {"replicas": 2}
      },
      "runPolicy": {"backoffLimit": 4, "cleanPodPolicy": "Running", "suspend": false},
      "training": {"steps": 10, "globalBatchSize": 64}
    },
    "status": {
      "state": "Running",
      "conditions": [
        {"type": "Created", "status": "True", "reason": "JobCreated", "message": "m",
         "observedGeneration": 3, "lastTransitionTime": "2026-01-02T03:04:06Z"},
        {"type": "Running", "status": "True", "reason": "JobRunning", "message": "r",
         "observedGeneration": 3, "lastTransitionTime": "2026-01-02T03:05:00Z"}
      ],
      "replicaStatuses": {"Worker": {"active": 2, "succeeded": 0, "failed": 0, "restarts": 1}},
      "startTime": "2026-01-02T03:04:06Z",
      "restartCount": 1,
      "observedGeneration": 3,
      "progress": {"step": 5, "totalSteps": 10, "loss": 0.5},
      "selector": "distrain.io/job-name=mnist,distrain.io/replica-type=worker"
    }
  })");
}

TEST(ParseJobTest, ReadsAnApiServerObject) {
  absl::StatusOr<DistributedTrainingJob> job = ParseJob(ServerObject());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->metadata.name, "mnist");
  EXPECT_EQ(job->metadata.namespace_, "team-a");
  EXPECT_EQ(job->spec.namespace_, "team-a");
  EXPECT_EQ(job->metadata.uid, "1234-abcd");
  EXPECT_EQ(job->metadata.generation, 3);
  EXPECT_EQ(job->metadata.labels.at("team"), "a");
  EXPECT_EQ(job->spec.strategy, StrategyKind::kParameterServer);
  EXPECT_EQ(job->spec.replicas_of(ReplicaType::kPS), 2);
  EXPECT_EQ(job->spec.replicas.at(ReplicaType::kWorker).restart_policy, RestartPolicy::kOnFailure);
  EXPECT_EQ(job->spec.run_policy.backoff_limit, 4);
  EXPECT_EQ(job->spec.run_policy.clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_EQ(job->Template(ReplicaType::kWorker)["spec"]["containers"][0]["image"], "img:1");
  EXPECT_TRUE(job->Template(ReplicaType::kPS).is_null());
  ASSERT_EQ(job->status.conditions.size(), 2u);
  EXPECT_TRUE(job->status.IsTrue(kConditionRunning));
  EXPECT_FALSE(job->status.IsTrue(kConditionSucceeded));
  EXPECT_EQ(job->status.conditions[1].last_transition_time,
            absl::FromUnixSeconds(1767323100));  // 2026-01-02T03:05:00Z
  EXPECT_EQ(job->status.replica_statuses.at(ReplicaType::kWorker).restarts, 1);
  EXPECT_EQ(job->status.restart_count, 1);
  EXPECT_EQ(job->status.progress["step"], 5);
  EXPECT_EQ(job->status.selector, WorkerSelector("mnist"));
}

TEST(ParseJobTest, ToJsonRoundTripsLosslessly) {
  absl::StatusOr<DistributedTrainingJob> job = ParseJob(ServerObject());
  ASSERT_TRUE(job.ok()) << job.status();
  const Json out = ToJson(*job);
  EXPECT_EQ(out["apiVersion"], kApiVersion);
  EXPECT_EQ(out["kind"], kKind);
  EXPECT_EQ(out["status"], ServerObject()["status"]);
  absl::StatusOr<DistributedTrainingJob> again = ParseJob(out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *job);
}

struct BadStatusCase {
  std::string name;
  std::string patch;  // merged into status
  std::string field;
};

class BadStatusTest : public ::testing::TestWithParam<BadStatusCase> {};

TEST_P(BadStatusTest, NamesTheStatusField) {
  Json object = ServerObject();
  object["status"].merge_patch(Json::parse(GetParam().patch));
  absl::StatusOr<DistributedTrainingJob> job = ParseJob(object);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(std::string(job.status().message()), HasSubstr(GetParam().field + ":"));
  absl::StatusOr<JobStatus> status = ParseStatus(object["status"]);
  EXPECT_FALSE(status.ok());
}

INSTANTIATE_TEST_SUITE_P(
    Status, BadStatusTest,
    ::testing::Values(
        BadStatusCase{"StartTime", R"({"startTime": "yesterday"})", "status.startTime"},
        BadStatusCase{"RestartCount", R"({"restartCount": "1"})", "status.restartCount"},
        BadStatusCase{"ReplicaType", R"({"replicaStatuses": {"Master": {}}})",
                      "status.replicaStatuses.Master"},
        BadStatusCase{"Conditions", R"({"conditions": {"type": "Running"}})", "status.conditions"}),
    [](const auto& info) { return info.param.name; });

TEST(TimeTest, FormatsSecondsInUtcAndParsesOffsets) {
  EXPECT_EQ(FormatKubeTime(absl::FromUnixSeconds(1767323100)), "2026-01-02T03:05:00Z");
  absl::StatusOr<absl::Time> t = ParseKubeTime("2026-01-02T04:05:00.5+01:00", "x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, absl::FromUnixMillis(1767323100500));
  EXPECT_THAT(std::string(ParseKubeTime("soon", "status.startTime").status().message()),
              HasSubstr("status.startTime: must be an RFC 3339 time"));
}

}  // namespace
}  // namespace distrain::api

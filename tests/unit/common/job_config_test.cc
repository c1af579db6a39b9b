#include "common/job_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/yaml_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace distrain {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using Json = nlohmann::ordered_json;

constexpr char kHeader[] =
    "apiVersion: distrain.io/v1alpha1\n"
    "kind: DistributedTrainingJob\n"
    "metadata:\n"
    "  name: test-job\n";

// A whole document whose spec is `spec_body` (YAML written at column 0; it is
// indented here). Without replicaSpecs, one Worker is added.
std::string JobYaml(const std::string& spec_body) {
  std::string out = absl::StrCat(kHeader, "spec:\n");
  if (spec_body.find("replicaSpecs:") == std::string::npos) {
    absl::StrAppend(&out, "  replicaSpecs:\n    Worker:\n      replicas: 1\n");
  }
  for (absl::string_view line : absl::StrSplit(spec_body, '\n')) {
    if (!line.empty()) absl::StrAppend(&out, "  ", line, "\n");
  }
  return out;
}

std::string ErrorOf(const absl::StatusOr<JobConfig>& config) {
  return config.ok() ? "<ok>" : std::string(config.status().message());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// ---------------------------------------------------------------------------
// Parsing

TEST(JobConfigTest, MinimalDocumentGetsEveryDefault) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(JobYaml(""));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "test-job");
  EXPECT_EQ(config->namespace_, "default");
  EXPECT_EQ(config->strategy, StrategyKind::kOneDevice);
  ASSERT_EQ(config->replicas.size(), 1u);
  EXPECT_EQ(config->replicas.at(ReplicaType::kWorker), (ReplicaSpec{1, RestartPolicy::kExitCode}));
  EXPECT_EQ(config->training, TrainingConfig{});
  EXPECT_EQ(config->run_policy, RunPolicy{});
  EXPECT_EQ(config->success_policy, SuccessPolicy::kDefault);
  EXPECT_FALSE(config->elastic_policy.has_value());
  // Spot-check the values behind TrainingConfig{} so a changed default is noticed.
  EXPECT_EQ(config->training.global_batch_size, 256);
  EXPECT_EQ(config->training.optimizer.type, OptimizerType::kAdam);
  EXPECT_FLOAT_EQ(config->training.optimizer.learning_rate, 0.001f);
  EXPECT_EQ(config->training.model.hidden_units, std::vector<int>{128});
  EXPECT_EQ(config->training.dataset.type, DatasetType::kSynthetic);
  EXPECT_EQ(config->run_policy.recovery_policy, RecoveryPolicy::kInPlace);
  EXPECT_TRUE(ValidateJobConfig(*config).ok());
}

TEST(JobConfigTest, ReplicaSpecDefaultsApplyPerType) {
  auto config =
      ParseJobYaml(JobYaml("strategy: MultiWorkerMirrored\nreplicaSpecs:\n  Chief: {}\n  Worker:\n "
                           "   restartPolicy: Never\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->replicas.at(ReplicaType::kChief), (ReplicaSpec{1, RestartPolicy::kExitCode}));
  EXPECT_EQ(config->replicas.at(ReplicaType::kWorker), (ReplicaSpec{1, RestartPolicy::kNever}));
  EXPECT_EQ(config->replicas_of(ReplicaType::kPS), 0);
}

constexpr char kFullJob[] = R"(apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata:
  name: full-job
  namespace: team-a
  labels: {app: full}
  uid: 1234
spec:
  strategy: MultiWorkerMirrored
  replicaSpecs:
    Chief: {replicas: 1, restartPolicy: Never}
    Worker:
      replicas: 3
      restartPolicy: OnFailure
      template:
        spec:
          containers: [{name: distrain, image: "example.com/distrain-worker:1"}]
    Evaluator: {replicas: 1, restartPolicy: Always}
  successPolicy: AllWorkers
  runPolicy:
    backoffLimit: 4
    activeDeadlineSeconds: 3600
    progressDeadlineSeconds: 300
    ttlSecondsAfterFinished: 600
    cleanPodPolicy: All
    recoveryPolicy: RestartGroup
    recoveryTimeoutSeconds: 120
    suspend: true
    scheduling: {gang: true, minAvailable: 4, queue: q1, priorityClass: high, schedulerName: volcano}
  elasticPolicy: {minReplicas: 2, maxReplicas: 5}
  training:
    model: {type: mlp, hiddenUnits: [256, 64], activation: relu}
    dataset:
      type: idx
      numExamples: 1000
      numEvalExamples: 100
      numFeatures: 700
      numClasses: 12
      noise: 0.5
      trainFiles: [a.idx, b.idx]
      trainLabelFiles: [a.lbl, b.lbl]
      evalFiles: [e.idx]
      evalLabelFiles: [e.lbl]
      labelColumn: 3
      csvHeader: true
      scale: 0.5
      autoShardPolicy: FILE
      shuffle: false
      prefetchBatches: 4
    optimizer: {type: momentum, learningRate: 0.05, momentum: 0.8, nesterov: true, beta1: 0.8, beta2: 0.99,
                epsilon: 1e-8}
    checkpoint: {dir: /ckpt, everySteps: 100, keep: 5}
    communication: {implementation: NCCL, timeoutSeconds: 30.5, bytesPerPack: 1048576}
    globalBatchSize: 128
    steps: 500
    seed: 7
    logEverySteps: 10
    evalEverySteps: 100
    localReplicas: 2
    precision: mixed_bfloat16
status:
  state: Running
  progress: {step: 3}
)";

TEST(JobConfigTest, ParsesEveryField) {
  absl::StatusOr<JobConfig> config = ParseJobYaml(kFullJob);
  ASSERT_TRUE(config.ok()) << config.status();
  const JobConfig& c = *config;
  EXPECT_EQ(c.name, "full-job");
  EXPECT_EQ(c.namespace_, "team-a");
  EXPECT_EQ(c.strategy, StrategyKind::kMultiWorkerMirrored);
  EXPECT_EQ(c.replicas.at(ReplicaType::kChief), (ReplicaSpec{1, RestartPolicy::kNever}));
  EXPECT_EQ(c.replicas.at(ReplicaType::kWorker), (ReplicaSpec{3, RestartPolicy::kOnFailure}));
  EXPECT_EQ(c.replicas.at(ReplicaType::kEvaluator), (ReplicaSpec{1, RestartPolicy::kAlways}));
  EXPECT_EQ(c.success_policy, SuccessPolicy::kAllWorkers);
  EXPECT_EQ(c.run_policy.backoff_limit, 4);
  EXPECT_EQ(c.run_policy.active_deadline_seconds, 3600);
  EXPECT_EQ(c.run_policy.progress_deadline_seconds, 300);
  EXPECT_EQ(c.run_policy.ttl_seconds_after_finished, 600);
  EXPECT_EQ(c.run_policy.clean_pod_policy, CleanPodPolicy::kAll);
  EXPECT_EQ(c.run_policy.recovery_policy, RecoveryPolicy::kRestartGroup);
  EXPECT_EQ(c.run_policy.recovery_timeout_seconds, 120);
  EXPECT_TRUE(c.run_policy.suspend);
  EXPECT_TRUE(c.run_policy.scheduling.gang);
  EXPECT_EQ(c.run_policy.scheduling.min_available, 4);
  EXPECT_EQ(c.run_policy.scheduling.queue, "q1");
  EXPECT_EQ(c.run_policy.scheduling.priority_class, "high");
  EXPECT_EQ(c.run_policy.scheduling.scheduler_name, "volcano");
  ASSERT_TRUE(c.elastic_policy.has_value());
  EXPECT_EQ(*c.elastic_policy, (ElasticPolicy{2, 5}));

  const TrainingConfig& t = c.training;
  EXPECT_EQ(t.model.type, "mlp");
  EXPECT_EQ(t.model.hidden_units, (std::vector<int>{256, 64}));
  EXPECT_EQ(t.model.activation, "relu");
  EXPECT_EQ(t.dataset.type, DatasetType::kIdx);
  EXPECT_EQ(t.dataset.num_examples, 1000);
  EXPECT_EQ(t.dataset.num_eval_examples, 100);
  EXPECT_EQ(t.dataset.num_features, 700);
  EXPECT_EQ(t.dataset.num_classes, 12);
  EXPECT_FLOAT_EQ(t.dataset.noise, 0.5f);
  EXPECT_EQ(t.dataset.train_files, (std::vector<std::string>{"a.idx", "b.idx"}));
  EXPECT_EQ(t.dataset.train_label_files, (std::vector<std::string>{"a.lbl", "b.lbl"}));
  EXPECT_EQ(t.dataset.eval_files, (std::vector<std::string>{"e.idx"}));
  EXPECT_EQ(t.dataset.eval_label_files, (std::vector<std::string>{"e.lbl"}));
  EXPECT_EQ(t.dataset.label_column, 3);
  EXPECT_TRUE(t.dataset.csv_header);
  EXPECT_FLOAT_EQ(t.dataset.scale, 0.5f);
  EXPECT_EQ(t.dataset.auto_shard_policy, AutoShardPolicy::kFile);
  EXPECT_FALSE(t.dataset.shuffle);
  EXPECT_EQ(t.dataset.prefetch_batches, 4);
  EXPECT_EQ(t.optimizer.type, OptimizerType::kMomentum);
  EXPECT_FLOAT_EQ(t.optimizer.learning_rate, 0.05f);
  EXPECT_FLOAT_EQ(t.optimizer.momentum, 0.8f);
  EXPECT_TRUE(t.optimizer.nesterov);
  EXPECT_FLOAT_EQ(t.optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(t.optimizer.beta2, 0.99f);
  EXPECT_FLOAT_EQ(t.optimizer.epsilon, 1e-8f);
  EXPECT_EQ(t.checkpoint.dir, "/ckpt");
  EXPECT_EQ(t.checkpoint.every_steps, 100);
  EXPECT_EQ(t.checkpoint.keep, 5);
  EXPECT_EQ(t.communication.implementation, CollectiveImplementation::kNccl);
  EXPECT_DOUBLE_EQ(t.communication.timeout_seconds, 30.5);
  EXPECT_EQ(t.communication.bytes_per_pack, 1048576);
  EXPECT_EQ(t.global_batch_size, 128);
  EXPECT_EQ(t.steps, 500);
  EXPECT_EQ(t.seed, 7u);
  EXPECT_EQ(t.log_every_steps, 10);
  EXPECT_EQ(t.eval_every_steps, 100);
  EXPECT_EQ(t.local_replicas, 2);
  EXPECT_EQ(t.model.precision, Precision::kMixedBfloat16);
  // Cross-field rules hold too (128 = (1 + 3) x 2 x 16; 2 <= 3 <= 5 workers).
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
}

TEST(JobConfigTest, NullValuesAreAbsentLikeTheApiServer) {
  auto config = ParseJobYaml(JobYaml("strategy:\ntraining:\n  model:\n  steps: ~\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->strategy, StrategyKind::kOneDevice);
  EXPECT_EQ(config->training, TrainingConfig{});
}

TEST(JobConfigTest, GlobalBatchSizeNotANumberHasTheExactMessage) {
  auto config = ParseJobYaml(JobYaml("training:\n  globalBatchSize: abc\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  // The YAML line, then the path, the problem and the value.
  EXPECT_EQ(ErrorOf(config),
            "line 10: spec.training.globalBatchSize: must be a positive integer, got \"abc\"");
}

TEST(JobConfigTest, QuotedNumberIsAStringAndRejected) {
  auto config = ParseJobYaml(JobYaml("training:\n  globalBatchSize: \"256\"\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("spec.training.globalBatchSize: must be a positive integer, got \"256\"; "
                        "remove the quotes so it is read as a number"));
  // The same number unquoted is fine.
  auto plain = ParseJobYaml(JobYaml("training:\n  globalBatchSize: 256\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->training.global_batch_size, 256);
}

TEST(JobConfigTest, UnknownFieldSuggestsTheNestedField) {
  auto config = ParseJobYaml(JobYaml("training:\n  learningrate: 0.1\n"));
  EXPECT_THAT(
      ErrorOf(config),
      HasSubstr(
          "spec.training.learningrate: unknown field; did you mean \"optimizer.learningRate\"?"));
}

TEST(JobConfigTest, UnknownFieldWithoutCloseNameListsTheKnownOnes) {
  auto config = ParseJobYaml(JobYaml("training:\n  optimizer:\n    zzzzzz: 1\n"));
  EXPECT_THAT(ErrorOf(config),
              HasSubstr("spec.training.optimizer.zzzzzz: unknown field; known fields here: type, "
                        "learningRate, momentum, nesterov, beta1, beta2, epsilon"));
}

TEST(JobConfigTest, YamlSyntaxErrorNamesTheLine) {
  auto config = ParseJobYaml(
      absl::StrCat(kHeader, "spec:\n  replicaSpecs: {Worker: {replicas: 1}\n  strategy: x\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(ErrorOf(config), MatchesRegex("YAML syntax error at line [0-9]+, column [0-9]+: .*"));
  auto indent = ParseJobYaml(absl::StrCat(kHeader, "spec:\n  strategy: Mirrored\n strategy: x\n"));
  EXPECT_THAT(ErrorOf(indent), HasSubstr("YAML syntax error at line 7, column"));
}

TEST(JobConfigTest, ReportsEveryErrorInDocumentOrderOnePerLine) {
  auto config = ParseJobYaml(
      JobYaml("strategy: Mirror\ntraining:\n  steps: 0\n  optimizer:\n    type: SGD\n"));
  ASSERT_FALSE(config.ok());
  std::vector<std::string> lines = absl::StrSplit(ErrorOf(config), '\n');
  ASSERT_EQ(lines.size(), 3u) << ErrorOf(config);
  EXPECT_THAT(lines[0], HasSubstr("line 9: spec.strategy: must be one of \"OneDevice\""));
  EXPECT_THAT(lines[1],
              HasSubstr("line 11: spec.training.steps: must be a positive integer, got 0"));
  EXPECT_THAT(
      lines[2],
      HasSubstr("line 13: spec.training.optimizer.type: must be one of \"sgd\", \"momentum\", "
                "\"adam\", \"adamw\", \"rmsprop\", got \"SGD\"; values are case-sensitive: write "
                "\"sgd\""));
}

struct BadDocCase {
  std::string name;
  std::string yaml;      // a whole document
  std::string expected;  // substring of the error
};
void PrintTo(const BadDocCase& c, std::ostream* os) { *os << c.name; }

class JobConfigBadDocTest : public ::testing::TestWithParam<BadDocCase> {};

TEST_P(JobConfigBadDocTest, ErrorNamesTheFieldPath) {
  const BadDocCase& c = GetParam();
  absl::StatusOr<JobConfig> config = ParseJobYaml(c.yaml);
  ASSERT_FALSE(config.ok()) << c.yaml;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ErrorOf(config), HasSubstr(c.expected)) << c.yaml;
}

std::vector<BadDocCase> BadDocs() {
  const std::string header_no_name =
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\n";
  const std::string body = "spec:\n  replicaSpecs:\n    Worker: {replicas: 1}\n";
  return {
      // Envelope.
      {"EmptyDocument", "", "the document is empty; expected a DistributedTrainingJob"},
      {"NotAMapping", "- a\n- b\n", "the document must be a mapping"},
      {"WrongApiVersion",
       absl::StrCat("apiVersion: distrain.io/v1\nkind: DistributedTrainingJob\n"
                    "metadata: {name: x}\n",
                    body),
       "apiVersion: must be \"distrain.io/v1alpha1\", got \"distrain.io/v1\"; set apiVersion: "
       "distrain.io/v1alpha1"},
      {"MissingApiVersion",
       absl::StrCat("kind: DistributedTrainingJob\nmetadata: {name: x}\n", body),
       "apiVersion: required; add \"apiVersion: distrain.io/v1alpha1\""},
      {"WrongKind",
       absl::StrCat("apiVersion: distrain.io/v1alpha1\nkind: TFJob\nmetadata: {name: x}\n", body),
       "kind: must be \"DistributedTrainingJob\", got \"TFJob\"; set kind: DistributedTrainingJob"},
      {"UnknownTopLevelField", absl::StrCat(kHeader, "specs:\n  strategy: OneDevice\n"),
       "specs: unknown field; did you mean \"spec\"?"},
      {"MissingMetadata", absl::StrCat(header_no_name, body), "metadata: required"},
      {"MissingName", absl::StrCat(header_no_name, "metadata: {namespace: a}\n", body),
       "metadata.name: required"},
      {"NameNotADnsLabel", absl::StrCat(header_no_name, "metadata: {name: My_Job}\n", body),
       "metadata.name: must be a DNS-1123 label (lowercase letters, digits and '-', starting and "
       "ending with a "
       "letter or digit, at most 63 characters), got \"My_Job\""},
      {"NameTooLong",
       absl::StrCat(header_no_name, "metadata: {name: ", std::string(64, 'a'), "}\n", body),
       "metadata.name: must be a DNS-1123 label"},
      {"BadNamespace", absl::StrCat(header_no_name, "metadata: {name: a, namespace: -x}\n", body),
       "metadata.namespace: must be a DNS-1123 label"},
      {"MissingSpec", kHeader, "spec: required"},
      {"SpecNotAMapping", absl::StrCat(kHeader, "spec: 5\n"), "spec: must be a mapping, got 5"},
      {"MissingReplicaSpecs", absl::StrCat(kHeader, "spec:\n  strategy: OneDevice\n"),
       "spec.replicaSpecs: required"},
      {"DuplicateKey", absl::StrCat(kHeader, "metadata: {name: b}\n", body),
       "duplicate key \"metadata\""},
      {"TwoDocuments", absl::StrCat(kHeader, body, "---\n", kHeader, body),
       "the file has 2 YAML documents"},

      // spec.
      {"BadStrategy", JobYaml("strategy: Mirror"),
       "spec.strategy: must be one of \"OneDevice\", \"Mirrored\", \"MultiWorkerMirrored\", "
       "\"ParameterServer\", "
       "\"CentralStorage\", \"TPU\", \"Auto\", got \"Mirror\""},
      {"StrategyWrongCase", JobYaml("strategy: mirrored"),
       "values are case-sensitive: write \"Mirrored\""},
      {"MisspelledTraining", JobYaml("trainig: {}"),
       "spec.trainig: unknown field; did you mean \"training\"?"},
      {"BadPrecision", JobYaml("training: {precision: bfloat16}"),
       "spec.training.precision: must be one of \"float32\", \"mixed_bfloat16\", "
       "\"mixed_float16\", got \"bfloat16\""},
      {"BadSuccessPolicy", JobYaml("successPolicy: AllWorker"),
       "spec.successPolicy: must be one of \"Default\", \"AllWorkers\", got \"AllWorker\""},

      // replicaSpecs.
      {"ReplicaSpecsNotAMapping", JobYaml("replicaSpecs: [Worker]"),
       "spec.replicaSpecs: must be a mapping"},
      {"LowercaseReplicaType", JobYaml("replicaSpecs:\n  worker: {replicas: 1}"),
       "spec.replicaSpecs.worker: unknown replica type; expected one of Chief, Worker, PS, "
       "Evaluator (did you mean "
       "\"Worker\"?)"},
      {"NegativeReplicas", JobYaml("replicaSpecs:\n  Worker: {replicas: -1}"),
       "spec.replicaSpecs.Worker.replicas: must be a non-negative integer, got -1"},
      {"QuotedReplicas", JobYaml("replicaSpecs:\n  Worker: {replicas: \"2\"}"),
       "spec.replicaSpecs.Worker.replicas: must be a non-negative integer, got \"2\"; remove the "
       "quotes"},
      {"BadRestartPolicy", JobYaml("replicaSpecs:\n  Worker: {restartPolicy: Sometimes}"),
       "spec.replicaSpecs.Worker.restartPolicy: must be one of \"Never\", \"OnFailure\", "
       "\"Always\", \"ExitCode\", "
       "got \"Sometimes\""},
      {"TemplateNotAMapping", JobYaml("replicaSpecs:\n  Worker: {template: 5}"),
       "spec.replicaSpecs.Worker.template: must be a pod template"},
      {"MisspelledReplicas", JobYaml("replicaSpecs:\n  Worker: {replica: 2}"),
       "spec.replicaSpecs.Worker.replica: unknown field; did you mean \"replicas\"?"},
      {"ReplicaSpecNotAMapping", JobYaml("replicaSpecs:\n  Worker: 2"),
       "spec.replicaSpecs.Worker: must be a mapping with replicas, restartPolicy and template, got "
       "2"},

      // runPolicy and elasticPolicy.
      {"NegativeBackoffLimit", JobYaml("runPolicy: {backoffLimit: -1}"),
       "spec.runPolicy.backoffLimit: must be a non-negative integer, got -1"},
      {"ZeroDeadline", JobYaml("runPolicy: {activeDeadlineSeconds: 0}"),
       "spec.runPolicy.activeDeadlineSeconds: must be a positive integer, got 0"},
      {"ZeroProgressDeadline", JobYaml("runPolicy: {progressDeadlineSeconds: 0}"),
       "spec.runPolicy.progressDeadlineSeconds: must be a positive integer, got 0"},
      {"ProgressDeadlineNotANumber", JobYaml("runPolicy: {progressDeadlineSeconds: 5m}"),
       "spec.runPolicy.progressDeadlineSeconds: must be"},
      {"BadCleanPodPolicy", JobYaml("runPolicy: {cleanPodPolicy: Some}"),
       "spec.runPolicy.cleanPodPolicy: must be one of \"None\", \"Running\", \"All\", got "
       "\"Some\""},
      {"BadRecoveryPolicy", JobYaml("runPolicy: {recoveryPolicy: Restart}"),
       "spec.runPolicy.recoveryPolicy: must be one of \"InPlace\", \"RestartGroup\", got "
       "\"Restart\""},
      {"ZeroRecoveryTimeout", JobYaml("runPolicy: {recoveryTimeoutSeconds: 0}"),
       "spec.runPolicy.recoveryTimeoutSeconds"},
      {"SuspendNotABool", JobYaml("runPolicy: {suspend: yes}"),
       "spec.runPolicy.suspend: must be true or false, got \"yes\"; write true or false"},
      {"ZeroMinAvailable", JobYaml("runPolicy: {scheduling: {minAvailable: 0}}"),
       "spec.runPolicy.scheduling.minAvailable: must be a positive integer, got 0"},
      {"QueueNotAString", JobYaml("runPolicy: {scheduling: {queue: 5}}"),
       "spec.runPolicy.scheduling.queue: must be a string, got 5; put it in quotes"},
      {"ElasticMissingMax", JobYaml("elasticPolicy: {minReplicas: 1}"),
       "spec.elasticPolicy.maxReplicas: required when elasticPolicy is set"},
      {"ElasticZeroMin", JobYaml("elasticPolicy: {minReplicas: 0, maxReplicas: 2}"),
       "spec.elasticPolicy.minReplicas: must be a positive integer, got 0"},
      {"ElasticUnknownField", JobYaml("elasticPolicy: {minReplica: 1, maxReplicas: 2}"),
       "spec.elasticPolicy.minReplica: unknown field; did you mean \"minReplicas\"?"},

      // training.
      {"BatchSizeZero", JobYaml("training: {globalBatchSize: 0}"),
       "spec.training.globalBatchSize: must be a positive integer, got 0"},
      {"BatchSizeFloat", JobYaml("training: {globalBatchSize: 2.5}"),
       "spec.training.globalBatchSize: must be a positive integer, got 2.5"},
      {"BatchSizeWithDecimalPoint", JobYaml("training: {globalBatchSize: 256.0}"),
       "got 256.0; write it without a decimal point"},
      {"BatchSizeAsList", JobYaml("training: {globalBatchSize: [256]}"),
       "got [256]; write a single value, not a list"},
      {"BatchSizeSuffix", JobYaml("training: {batchSize: 64}"),
       "spec.training.batchSize: unknown field; did you mean \"globalBatchSize\"?"},
      {"StepsNegative", JobYaml("training: {steps: -5}"),
       "spec.training.steps: must be a positive integer, got -5"},
      {"SeedNegative", JobYaml("training: {seed: -1}"),
       "spec.training.seed: must be a non-negative integer, got -1"},
      {"LocalReplicasNegative", JobYaml("training: {localReplicas: -1}"),
       "spec.training.localReplicas: must be a non-negative integer, got -1"},
      {"ModelNotAMapping", JobYaml("training: {model: 5}"),
       "spec.training.model: must be a mapping, got 5"},
      {"BadModelType", JobYaml("training: {model: {type: cnn}}"),
       "spec.training.model.type: must be one of \"mlp\", \"sequential\", got \"cnn\""},
      {"BadActivation", JobYaml("training: {model: {activation: tanh}}"),
       "spec.training.model.activation: must be one of \"relu\", got \"tanh\""},
      {"HiddenUnitZero", JobYaml("training: {model: {hiddenUnits: [128, 0]}}"),
       "spec.training.model.hiddenUnits[1]: must be a positive integer, got 0"},
      {"HiddenUnitsNotAList", JobYaml("training: {model: {hiddenUnits: 128}}"),
       "spec.training.model.hiddenUnits: must be a list of positive integers, got 128; write a "
       "list such as [128]"},
      {"HiddenUnitsSingular", JobYaml("training: {model: {hiddenUnit: [1]}}"),
       "spec.training.model.hiddenUnit: unknown field; did you mean \"hiddenUnits\"?"},
      {"BadDatasetType", JobYaml("training: {dataset: {type: mnist}}"),
       "spec.training.dataset.type: must be one of \"synthetic\", \"idx\", \"csv\", \"tfrecord\", "
       "got \"mnist\""},
      {"NumClassesOne", JobYaml("training: {dataset: {numClasses: 1}}"),
       "spec.training.dataset.numClasses: must be an integer >= 2, got 1"},
      {"NumFeaturesTooLarge", JobYaml("training: {dataset: {numFeatures: 3000000000}}"),
       "spec.training.dataset.numFeatures: must be a positive integer, got 3000000000; the largest "
       "allowed value is "
       "2147483647"},
      {"NumExamplesZero", JobYaml("training: {dataset: {numExamples: 0}}"),
       "spec.training.dataset.numExamples: must be a positive integer, got 0"},
      {"NegativeNoise", JobYaml("training: {dataset: {noise: -1}}"),
       "spec.training.dataset.noise: must be a non-negative number, got -1"},
      {"QuotedNoise", JobYaml("training: {dataset: {noise: \"0.5\"}}"),
       "spec.training.dataset.noise: must be a non-negative number, got \"0.5\"; remove the "
       "quotes"},
      {"ZeroScale", JobYaml("training: {dataset: {scale: 0}}"),
       "spec.training.dataset.scale: must be a positive number, got 0"},
      {"FileNotAString", JobYaml("training: {dataset: {type: csv, trainFiles: [a.csv, 1]}}"),
       "spec.training.dataset.trainFiles[1]: must be a string, got 1; put it in quotes"},
      {"FilesNotAList", JobYaml("training: {dataset: {type: csv, trainFiles: a.csv}}"),
       "spec.training.dataset.trainFiles: must be a list of strings, got \"a.csv\"; write a list "
       "such as [\"a.csv\"]"},
      {"CsvHeaderQuoted", JobYaml("training: {dataset: {csvHeader: \"true\"}}"),
       "spec.training.dataset.csvHeader: must be true or false, got \"true\"; remove the quotes"},
      {"AutoShardWrongCase", JobYaml("training: {dataset: {autoShardPolicy: auto}}"),
       "spec.training.dataset.autoShardPolicy: must be one of \"AUTO\", \"DATA\", \"FILE\", "
       "\"OFF\", got \"auto\"; "
       "values are case-sensitive: write \"AUTO\""},
      {"NegativePrefetch", JobYaml("training: {dataset: {prefetchBatches: -1}}"),
       "spec.training.dataset.prefetchBatches: must be a non-negative integer, got -1"},
      {"BadOptimizer", JobYaml("training: {optimizer: {type: adagrad}}"),
       "spec.training.optimizer.type: must be one of \"sgd\", \"momentum\", \"adam\", "
       "\"adamw\", \"rmsprop\", got \"adagrad\""},
      {"NegativeWeightDecay", JobYaml("training: {optimizer: {type: adamw, weightDecay: -0.1}}"),
       "spec.training.optimizer.weightDecay: must be a non-negative number, got -0.1"},
      {"RhoOfOne", JobYaml("training: {optimizer: {type: rmsprop, rho: 1}}"),
       "spec.training.optimizer.rho: must be"},
      {"ScheduleClassSpelling",
       JobYaml("training: {optimizer: {schedule: {type: CosineDecayRestarts}}}"),
       "spec.training.optimizer.schedule.type: must be one of \"Constant\""},
      {"ZeroLearningRate", JobYaml("training: {optimizer: {learningRate: 0}}"),
       "spec.training.optimizer.learningRate: must be a positive number, got 0"},
      {"MomentumOne", JobYaml("training: {optimizer: {momentum: 1.0}}"),
       "spec.training.optimizer.momentum: must be a number in [0, 1), got 1.0"},
      {"Beta2Negative", JobYaml("training: {optimizer: {beta2: -0.1}}"),
       "spec.training.optimizer.beta2: must be a number in [0, 1), got -0.1"},
      {"ZeroEpsilon", JobYaml("training: {optimizer: {epsilon: 0.0}}"),
       "spec.training.optimizer.epsilon: must be a positive number, got 0.0"},
      {"LearningRateTooLargeForFloat", JobYaml("training: {optimizer: {learningRate: 1e300}}"),
       "spec.training.optimizer.learningRate: must be a positive number, got 1e+300; the largest "
       "allowed magnitude"},
      {"NesterovNotABool", JobYaml("training: {optimizer: {nesterov: 1}}"),
       "spec.training.optimizer.nesterov: must be true or false, got 1"},
      {"KeepZero", JobYaml("training: {checkpoint: {keep: 0}}"),
       "spec.training.checkpoint.keep: must be a positive integer, got 0"},
      {"CheckpointDirNotAString", JobYaml("training: {checkpoint: {dir: 5}}"),
       "spec.training.checkpoint.dir: must be a string, got 5"},
      {"NegativeEverySteps", JobYaml("training: {checkpoint: {everySteps: -1}}"),
       "spec.training.checkpoint.everySteps: must be a non-negative integer, got -1"},
      {"BadImplementation", JobYaml("training: {communication: {implementation: nccl}}"),
       "spec.training.communication.implementation: must be one of \"Auto\", \"Ring\", \"NCCL\", "
       "got \"nccl\"; "
       "values are case-sensitive: write \"NCCL\""},
      {"ZeroTimeout", JobYaml("training: {communication: {timeoutSeconds: 0}}"),
       "spec.training.communication.timeoutSeconds: must be a positive number, got 0"},
      {"ZeroBytesPerPack", JobYaml("training: {communication: {bytesPerPack: 0}}"),
       "spec.training.communication.bytesPerPack: must be a positive integer, got 0"},
  };
}

INSTANTIATE_TEST_SUITE_P(Errors, JobConfigBadDocTest, ::testing::ValuesIn(BadDocs()),
                         [](const ::testing::TestParamInfo<BadDocCase>& info) {
                           return info.param.name;
                         });

TEST(JobConfigTest, StatusAndExtraMetadataAreIgnored) {
  auto config = ParseJobYaml(absl::StrCat(
      "apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\n"
      "metadata:\n  name: x\n  uid: abc\n  resourceVersion: \"5\"\n  labels: {a: b}\n"
      "spec:\n  replicaSpecs: {Worker: {replicas: 1}}\n"
      "status:\n  conditions: [{type: Running, status: \"True\"}]\n  anything: [1, 2]\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "x");
}

TEST(JobConfigTest, TemplateContentIsNotInterpreted) {
  auto config = ParseJobYaml(JobYaml(
      "replicaSpecs:\n  Worker:\n    template:\n      metadata: {labels: {a: b}}\n      spec:\n"
      "        containers: [{name: main, image: img, resources: {limits: {google.com/tpu: "
      "4}}}]\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->replicas_of(ReplicaType::kWorker), 1);
}

TEST(JobConfigTest, LoadJobYamlFilePrefixesErrorsWithThePath) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/bad_job.yaml");
  {
    std::ofstream out(path);
    out << JobYaml("training: {steps: 0, seed: -1}");
  }
  auto config = LoadJobYamlFile(path);
  ASSERT_FALSE(config.ok());
  std::vector<std::string> lines = absl::StrSplit(ErrorOf(config), '\n');
  ASSERT_EQ(lines.size(), 2u) << ErrorOf(config);
  EXPECT_EQ(lines[0],
            absl::StrCat(path, ": line 9: spec.training.steps: must be a positive integer, got 0"));
  EXPECT_EQ(
      lines[1],
      absl::StrCat(path, ": line 9: spec.training.seed: must be a non-negative integer, got -1"));
  std::filesystem::remove(path);

  auto missing = LoadJobYamlFile("/nonexistent/job.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ErrorOf(missing), HasSubstr("/nonexistent/job.yaml: cannot read the job file"));

  auto directory = LoadJobYamlFile(::testing::TempDir());
  EXPECT_THAT(ErrorOf(directory), HasSubstr(": is a directory; give a job YAML file"));
}

TEST(JobConfigTest, NamesRoundTrip) {
  for (StrategyKind kind :
       {StrategyKind::kOneDevice, StrategyKind::kMirrored, StrategyKind::kMultiWorkerMirrored,
        StrategyKind::kParameterServer, StrategyKind::kCentralStorage, StrategyKind::kTPU,
        StrategyKind::kAuto}) {
    EXPECT_EQ(ParseStrategyName(StrategyName(kind)), kind);
  }
  EXPECT_EQ(ParseStrategyName("mirrored"), std::nullopt);
  EXPECT_STREQ(StrategyName(StrategyKind::kMultiWorkerMirrored), "MultiWorkerMirrored");
  EXPECT_STREQ(ReplicaTypeName(ReplicaType::kPS), "PS");
  EXPECT_STREQ(ReplicaTaskType(ReplicaType::kChief), "chief");
  EXPECT_STREQ(ReplicaTaskType(ReplicaType::kWorker), "worker");
  EXPECT_STREQ(ReplicaTaskType(ReplicaType::kPS), "ps");
  EXPECT_STREQ(ReplicaTaskType(ReplicaType::kEvaluator), "evaluator");
}

// ---------------------------------------------------------------------------
// DISTRAIN_JOB_CONFIG

TEST(JobConfigJsonTest, RoundTripIsLossless) {
  absl::StatusOr<JobConfig> full = ParseJobYaml(kFullJob);
  ASSERT_TRUE(full.ok()) << full.status();
  for (const JobConfig& original : {*full, JobConfig{}}) {
    const std::string json = JobConfigToJson(original);
    absl::StatusOr<JobConfig> again = ParseJobConfigJson(json);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
    EXPECT_EQ(*again, original) << json;
    EXPECT_EQ(JobConfigToJson(*again), json);
  }
}

TEST(JobConfigJsonTest, RoundTripKeepsOddFloatsAndBigSeeds) {
  JobConfig config;
  config.replicas[ReplicaType::kWorker] = {1, RestartPolicy::kAlways};
  config.training.optimizer.learning_rate = 0.1f + 0.2f;
  config.training.dataset.scale = 1.0f / 3;
  config.training.optimizer.epsilon = 1.17549435e-38f;
  config.training.communication.timeout_seconds = 1.0 / 3;
  config.training.seed = 9007199254740993ull;  // not representable as a double
  config.run_policy.scheduling.min_available = 3;
  auto again = ParseJobConfigJson(JobConfigToJson(config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, config);
}

TEST(JobConfigJsonTest, HasTheContractShape) {
  auto config = ParseJobYaml(JobYaml(
      "strategy: ParameterServer\nreplicaSpecs:\n  Chief: {replicas: 1}\n  Worker: {replicas: 2}\n"
      "  PS: {replicas: 2, restartPolicy: Always}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  Json j = Json::parse(JobConfigToJson(*config));
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"name", "namespace", "strategy", "replicas",
                                            "restartPolicies", "successPolicy", "security",
                                            "runPolicy", "training"}));
  EXPECT_EQ(j["security"]["transport"], "MutualTLS");  // secure unless the job opts out
  EXPECT_EQ(j["name"], "test-job");
  EXPECT_EQ(j["strategy"], "ParameterServer");
  EXPECT_EQ(j["replicas"].dump(), R"({"Chief":1,"Worker":2,"PS":2})");
  EXPECT_EQ(j["restartPolicies"]["PS"], "Always");
  EXPECT_EQ(j["training"]["globalBatchSize"], 256);
  EXPECT_EQ(j["training"]["dataset"]["type"], "synthetic");
  // Floats are written as their shortest decimal, as a user would.
  EXPECT_EQ(j["training"]["optimizer"]["learningRate"].dump(), "0.001");
  EXPECT_EQ(j["training"]["optimizer"]["epsilon"].dump(), "1e-07");
  EXPECT_FALSE(j["runPolicy"].contains("backoffLimit"));  // unset stays unset
}

TEST(JobConfigJsonTest, ErrorsUseTheYamlPaths) {
  auto bad =
      ParseJobConfigJson(R"({"replicas": {"Worker": 1}, "training": {"globalBatchSize": "abc"}})");
  EXPECT_EQ(ErrorOf(bad), "spec.training.globalBatchSize: must be a positive integer, got \"abc\"");
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(
                  R"({"replicas": {"Worker": 1}, "training": {"optimizer": {"lr": 1}}})")),
              HasSubstr("spec.training.optimizer.lr: unknown field"));
  EXPECT_THAT(
      ErrorOf(ParseJobConfigJson(R"({"replicas": {"Worker": -2}})")),
      HasSubstr("spec.replicaSpecs.Worker.replicas: must be a non-negative integer, got -2"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(R"({"replicas": {"Workers": 2}})")),
              HasSubstr("spec.replicaSpecs.Workers: unknown replica type"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(
                  R"({"replicas": {"Worker": 1}, "restartPolicies": {"PS": "Never"}})")),
              HasSubstr("spec.replicaSpecs.PS.restartPolicy: has a policy but no replica count"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(R"({"replicas": {"Worker": 1}, "name": "A"})")),
              HasSubstr("metadata.name: must be a DNS-1123 label"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(R"({"strategy": "OneDevice"})")),
              HasSubstr("spec.replicaSpecs: required"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson(R"({"replicas": )")),
              HasSubstr("DISTRAIN_JOB_CONFIG: invalid JSON at byte"));
  EXPECT_THAT(ErrorOf(ParseJobConfigJson("[1]")),
              HasSubstr("DISTRAIN_JOB_CONFIG: must be a JSON object"));
}

// ---------------------------------------------------------------------------
// Cross-field rules

struct RuleCase {
  std::string name;
  std::string spec;      // spec body (see JobYaml)
  std::string expected;  // "" when valid, else a substring of the error
};
void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.name; }

class ValidateJobConfigTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(ValidateJobConfigTest, AppliesTheCrdRules) {
  const RuleCase& c = GetParam();
  absl::StatusOr<JobConfig> config = ParseJobYaml(JobYaml(c.spec));
  ASSERT_TRUE(config.ok()) << config.status();
  absl::Status status = ValidateJobConfig(*config);
  if (c.expected.empty()) {
    EXPECT_TRUE(status.ok()) << status;
  } else {
    ASSERT_FALSE(status.ok()) << c.spec;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, ValidateJobConfigTest,
    ::testing::Values(
        RuleCase{"OneDeviceOneWorker", "strategy: OneDevice", ""},
        RuleCase{"CosineScheduleWithWarmup",
                 "training: {optimizer: {schedule: {type: CosineDecay, decaySteps: 1000, "
                 "warmupSteps: 100, warmupTarget: 0.01}}}",
                 ""},
        RuleCase{"ScheduleWithoutDecaySteps",
                 "training: {optimizer: {schedule: {type: CosineDecay}}}",
                 "spec.training.optimizer.schedule.decaySteps: required for CosineDecay"},
        RuleCase{"ScheduleWithoutDecayRate",
                 "training: {optimizer: {schedule: {type: ExponentialDecay, decaySteps: 100}}}",
                 "spec.training.optimizer.schedule.decayRate: required for ExponentialDecay"},
        RuleCase{"WarmupWithoutTarget",
                 "training: {optimizer: {schedule: {type: CosineDecay, decaySteps: 100, "
                 "warmupSteps: 10}}}",
                 "spec.training.optimizer.schedule.warmupTarget: required with warmupSteps"},
        RuleCase{"PiecewiseValuesCount",
                 "training: {optimizer: {schedule: {type: PiecewiseConstantDecay, "
                 "boundaries: [100, 200], values: [0.1, 0.01]}}}",
                 "spec.training.optimizer.schedule.values: needs one more entry than "
                 "boundaries"},
        RuleCase{"PiecewiseBoundariesOrder",
                 "training: {optimizer: {schedule: {type: PiecewiseConstantDecay, "
                 "boundaries: [200, 100], values: [0.1, 0.01, 0.001]}}}",
                 "spec.training.optimizer.schedule.boundaries[1]: must be greater than the "
                 "boundary before it (200), got 100"},
        RuleCase{
            "MirroredWithEvaluator",
            "strategy: Mirrored\nreplicaSpecs: {Worker: {replicas: 1}, Evaluator: {replicas: 1}}\n"
            "training: {localReplicas: 4, globalBatchSize: 64}",
            ""},
        RuleCase{"MultiWorkerMirroredChiefAndWorkers",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 3}}\n"
                 "training: {globalBatchSize: 64}",
                 ""},
        RuleCase{"ParameterServerFull",
                 "strategy: ParameterServer\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 2}, "
                 "PS: {replicas: 2}, Evaluator: {replicas: 1}}\ntraining: {globalBatchSize: 63}",
                 ""},
        RuleCase{"TpuManyWorkers", "strategy: TPU\nreplicaSpecs: {Worker: {replicas: 4}}", ""},
        RuleCase{"AutoWithPs",
                 "strategy: Auto\nreplicaSpecs: {Worker: {replicas: 2}, PS: {replicas: 1}}", ""},
        RuleCase{"ElasticWithinBounds",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}}\n"
                 "elasticPolicy: {minReplicas: 1, maxReplicas: 4}\ntraining: {globalBatchSize: 64}",
                 ""},
        RuleCase{"IdxWithFiles",
                 "training: {dataset: {type: idx, trainFiles: [a, b], trainLabelFiles: [c, d], "
                 "evalFiles: [e], "
                 "evalLabelFiles: [f]}}",
                 ""},
        RuleCase{"CsvWithFiles",
                 "training: {dataset: {type: csv, trainFiles: [a.csv], evalFiles: [b.csv]}}", ""},
        RuleCase{"NcclIsAccepted", "training: {communication: {implementation: NCCL}}", ""},
        RuleCase{"MixedFloat16Synchronous",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}}\n"
                 "training: {precision: mixed_float16, globalBatchSize: 64}",
                 ""},
        RuleCase{"MixedBfloat16ParameterServer",
                 "strategy: ParameterServer\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 2}, PS: {replicas: 1}}\ntraining: {precision: mixed_bfloat16}",
                 ""},
        RuleCase{"MixedFloat16ParameterServerIsRefused",
                 "strategy: ParameterServer\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 2}, PS: {replicas: 1}}\ntraining: {precision: mixed_float16}",
                 "spec.training.precision: mixed_float16 needs dynamic loss scaling, which "
                 "distrain runs only in the synchronous strategies; use mixed_bfloat16"},
        RuleCase{"OneDeviceTwoWorkers",
                 "strategy: OneDevice\nreplicaSpecs: {Worker: {replicas: 2}}",
                 "spec.replicaSpecs.Worker.replicas: OneDevice runs in one pod and needs exactly 1 "
                 "Worker, got 2"},
        RuleCase{"MirroredWithChief",
                 "strategy: Mirrored\nreplicaSpecs: {Chief: {replicas: 1}, Worker: {replicas: 1}}",
                 "spec.replicaSpecs.Chief: Mirrored takes no Chief, got 1"},
        RuleCase{
            "CentralStorageWithPs",
            "strategy: CentralStorage\nreplicaSpecs: {Worker: {replicas: 1}, PS: {replicas: 1}}",
            "spec.replicaSpecs.PS: CentralStorage takes no PS, got 1"},
        RuleCase{"MultiWorkerMirroredWithPs",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}, PS: "
                 "{replicas: 1}}",
                 "spec.replicaSpecs.PS: MultiWorkerMirrored takes no PS, got 1"},
        RuleCase{"TwoChiefs",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Chief: {replicas: 2}, Worker: "
                 "{replicas: 2}}",
                 "spec.replicaSpecs.Chief.replicas: must be 0 or 1, got 2"},
        RuleCase{"TwoEvaluators",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}, Evaluator: "
                 "{replicas: 2}}",
                 "spec.replicaSpecs.Evaluator.replicas: must be 0 or 1, got 2"},
        RuleCase{"ParameterServerWithoutPs",
                 "strategy: ParameterServer\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 2}}",
                 "spec.replicaSpecs.PS.replicas: ParameterServer needs at least 1 PS"},
        RuleCase{
            "ParameterServerWithoutChief",
            "strategy: ParameterServer\nreplicaSpecs: {Worker: {replicas: 2}, PS: {replicas: 1}}",
            "spec.replicaSpecs.Chief.replicas: ParameterServer needs exactly 1 Chief (the "
            "coordinator)"},
        RuleCase{"TpuWithPs",
                 "strategy: TPU\nreplicaSpecs: {Worker: {replicas: 1}, PS: {replicas: 1}}",
                 "spec.replicaSpecs.PS: TPU takes no PS"},
        RuleCase{"NoWorker", "strategy: Auto\nreplicaSpecs: {Chief: {replicas: 1}}",
                 "spec.replicaSpecs.Worker: required"},
        RuleCase{
            "ZeroWorkers", "replicaSpecs: {Worker: {replicas: 0}}",
            "spec.replicaSpecs.Worker.replicas: every strategy needs at least 1 Worker, got 0"},
        RuleCase{"ElasticWorkersAboveMax",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 5}}\n"
                 "elasticPolicy: {minReplicas: 1, maxReplicas: 4}\ntraining: {globalBatchSize: 60}",
                 "spec.replicaSpecs.Worker.replicas: must be within spec.elasticPolicy "
                 "[minReplicas, maxReplicas] = "
                 "[1, 4], got 5"},
        RuleCase{"ElasticMinAboveMax",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}}\n"
                 "elasticPolicy: {minReplicas: 3, maxReplicas: 2}\ntraining: {globalBatchSize: 64}",
                 "spec.elasticPolicy.minReplicas: must be <= maxReplicas, got minReplicas 3 > "
                 "maxReplicas 2"},
        RuleCase{
            "ElasticMirrored",
            "strategy: Mirrored\nelasticPolicy: {minReplicas: 1, maxReplicas: 2}",
            "spec.elasticPolicy: only MultiWorkerMirrored and ParameterServer jobs can be elastic"},
        RuleCase{"MultiWorkerBatchNotDivisible",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Chief: {replicas: 1}, Worker: "
                 "{replicas: 2}}\n"
                 "training: {globalBatchSize: 100}",
                 "spec.training.globalBatchSize: 100 is not divisible by the 3 replicas in sync "
                 "((1 Chief + 2 Workers) "
                 "x 1 local replica); use a multiple of 3 such as 99 or 102"},
        RuleCase{"MultiWorkerBatchWithLocalReplicas",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 2}}\n"
                 "training: {globalBatchSize: 6, localReplicas: 2}",
                 "spec.training.globalBatchSize: 6 is not divisible by the 4 replicas in sync ((0 "
                 "Chiefs + 2 Workers) "
                 "x 2 local replicas); use a multiple of 4 such as 4 or 8"},
        RuleCase{"MultiWorkerBatchSmallerThanReplicas",
                 "strategy: MultiWorkerMirrored\nreplicaSpecs: {Worker: {replicas: 4}}\ntraining: "
                 "{globalBatchSize: 2}",
                 "2 is not divisible by the 4 replicas in sync ((0 Chiefs + 4 Workers) x 1 local "
                 "replica); use a "
                 "multiple of 4 such as 4"},
        RuleCase{"MirroredBatchNotDivisible",
                 "strategy: Mirrored\ntraining: {localReplicas: 3, globalBatchSize: 64}",
                 "spec.training.globalBatchSize: 64 is not divisible by the 3 replicas in sync "
                 "(spec.training.localReplicas)"},
        RuleCase{"CentralStorageBatchNotDivisible",
                 "strategy: CentralStorage\ntraining: {localReplicas: 5, globalBatchSize: 64}",
                 "spec.training.globalBatchSize: 64 is not divisible by the 5 replicas in sync"},
        RuleCase{"IdxWithoutFiles", "training: {dataset: {type: idx}}",
                 "spec.training.dataset.trainFiles: required for dataset type idx"},
        RuleCase{"IdxWithoutLabels", "training: {dataset: {type: idx, trainFiles: [a]}}",
                 "spec.training.dataset.trainLabelFiles: required for dataset type idx"},
        RuleCase{"IdxLabelCountMismatch",
                 "training: {dataset: {type: idx, trainFiles: [a, b], trainLabelFiles: [c]}}",
                 "spec.training.dataset.trainLabelFiles: has 1 files but trainFiles has 2"},
        RuleCase{"IdxEvalLabelMismatch",
                 "training: {dataset: {type: idx, trainFiles: [a], trainLabelFiles: [b], "
                 "evalFiles: [c]}}",
                 "spec.training.dataset.evalLabelFiles: has 0 files but evalFiles has 1"},
        RuleCase{"CsvWithoutFiles", "training: {dataset: {type: csv}}",
                 "spec.training.dataset.trainFiles: required for dataset type csv"},
        RuleCase{
            "CsvWithLabelFiles",
            "training: {dataset: {type: csv, trainFiles: [a], trainLabelFiles: [b]}}",
            "spec.training.dataset.trainLabelFiles: csv files carry their labels in labelColumn"},
        RuleCase{"SyntheticWithFiles", "training: {dataset: {trainFiles: [a]}}",
                 "spec.training.dataset.type: synthetic reads no files"}),
    [](const ::testing::TestParamInfo<RuleCase>& info) { return info.param.name; });

TEST(ValidateJobConfigTest, ChecksSingleFieldRulesOfConfigsBuiltInCode) {
  JobConfig config;
  config.replicas[ReplicaType::kWorker] = {};
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  struct Case {
    void (*mutate)(JobConfig*);
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](JobConfig* c) { c->training.steps = 0; },
       "spec.training.steps: must be a positive integer, got 0"},
      {[](JobConfig* c) { c->training.optimizer.learning_rate = 0; },
       "spec.training.optimizer.learningRate: must be a positive number, got 0.0"},
      {[](JobConfig* c) { c->training.model.hidden_units = {64, 0}; },
       "spec.training.model.hiddenUnits[1]: must be a positive integer, got 0"},
      {[](JobConfig* c) { c->training.checkpoint.keep = 0; },
       "spec.training.checkpoint.keep: must be a positive integer, got 0"},
      {[](JobConfig* c) { c->training.dataset.num_classes = 1; },
       "spec.training.dataset.numClasses: must be an integer >= 2, got 1"},
      {[](JobConfig* c) { c->training.dataset.num_features = 0; },
       "spec.training.dataset.numFeatures: must be a positive integer, got 0"},
      {[](JobConfig* c) { c->training.model.type = "cnn"; },
       "spec.training.model.type: must be one of \"mlp\""},
      {[](JobConfig* c) { c->replicas[ReplicaType::kPS] = {-1, RestartPolicy::kNever}; },
       "spec.replicaSpecs.PS.replicas: must be a non-negative integer, got -1"},
      {[](JobConfig* c) { c->name = "Bad Name"; }, "metadata.name: must be a DNS-1123 label"},
      {[](JobConfig* c) { c->training.seed = UINT64_MAX; },
       "spec.training.seed: must be a non-negative integer, got 18446744073709551615"},
  };
  for (const Case& c : cases) {
    JobConfig broken = config;
    c.mutate(&broken);
    absl::Status status = ValidateJobConfig(broken);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected));
  }
}

TEST(ValidateJobConfigTest, ReportsAllProblems) {
  JobConfig config;
  config.strategy = StrategyKind::kParameterServer;
  config.replicas[ReplicaType::kWorker] = {};
  config.training.steps = 0;
  absl::Status status = ValidateJobConfig(config);
  std::vector<std::string> lines = absl::StrSplit(status.message(), '\n');
  EXPECT_EQ(lines.size(), 3u) << status;  // steps, PS, Chief
}

// ---------------------------------------------------------------------------
// The CRD and the examples

// Like const operator[], but a missing key gives null instead of undefined behaviour.
const Json& Get(const Json& j, const std::string& key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(DISTRAIN_SOURCE_DIR, "/", relative);
}

const Json& Crd() {
  static const Json* const kCrd = [] {
    const std::string text = ReadFile(SourcePath("crds/distrain.io_distributedtrainingjobs.yaml"));
    absl::StatusOr<YamlJson> yaml = YamlToJson(text);
    if (!yaml.ok()) {
      ADD_FAILURE() << "CRD: " << yaml.status();
      return new Json();
    }
    return new Json(std::move(yaml->value));
  }();
  return *kCrd;
}

const Json& CrdSchema() {
  static const Json kEmpty = Json::object();
  const Json& crd = Crd();
  const Json& versions = Get(Get(crd, "spec"), "versions");
  if (!versions.is_array() || versions.empty()) return kEmpty;
  return Get(Get(versions[0], "schema"), "openAPIV3Schema");
}

// The schema nodes at `path` ("spec.training.steps"); "*" matches every property.
std::vector<const Json*> SchemaNodes(const std::string& path) {
  std::vector<const Json*> nodes = {&CrdSchema()};
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    std::vector<const Json*> next;
    for (const Json* node : nodes) {
      if (!node->contains("properties")) continue;
      const Json& properties = Get(*node, "properties");
      if (part == "*") {
        for (const auto& [name, child] : properties.items()) next.push_back(&child);
      } else if (properties.contains(std::string(part))) {
        next.push_back(&Get(properties, std::string(part)));
      }
    }
    nodes = std::move(next);
  }
  return nodes;
}

void CollectMissingDescriptions(const Json& node, const std::string& path,
                                std::vector<std::string>* missing) {
  // The API server allows nothing but "type: object" on the root metadata.
  if (path == "openAPIV3Schema.metadata") return;
  if (!Get(node, "description").is_string() ||
      Get(node, "description").get<std::string>().empty()) {
    missing->push_back(path);
  }
  if (node.contains("properties")) {
    for (const auto& [name, child] : Get(node, "properties").items()) {
      CollectMissingDescriptions(child, path + "." + name, missing);
    }
  }
  if (node.contains("items")) CollectMissingDescriptions(Get(node, "items"), path + "[]", missing);
  if (Get(node, "additionalProperties").is_object()) {
    CollectMissingDescriptions(Get(node, "additionalProperties"), path + "{}", missing);
  }
}

TEST(CrdTest, IsTheDistributedTrainingJobDefinition) {
  Json crd = Crd();  // a copy: operator[] below may add nulls
  ASSERT_TRUE(crd.is_object());
  EXPECT_EQ(crd["apiVersion"], "apiextensions.k8s.io/v1");
  EXPECT_EQ(crd["kind"], "CustomResourceDefinition");
  EXPECT_EQ(crd["metadata"]["name"], "distributedtrainingjobs.distrain.io");
  Json& spec = crd["spec"];
  EXPECT_EQ(spec["group"], "distrain.io");
  EXPECT_EQ(spec["scope"], "Namespaced");
  EXPECT_EQ(spec["names"]["kind"], "DistributedTrainingJob");
  EXPECT_EQ(spec["names"]["plural"], "distributedtrainingjobs");
  EXPECT_EQ(spec["names"]["singular"], "distributedtrainingjob");
  EXPECT_EQ(spec["names"]["shortNames"], Json::array({"dtj"}));
  EXPECT_EQ(spec["names"]["categories"], Json::array({"distrain"}));
  ASSERT_EQ(spec["versions"].size(), 1u);
  Json& version = spec["versions"][0];
  EXPECT_EQ(version["name"], "v1alpha1");
  EXPECT_EQ(version["served"], true);
  EXPECT_EQ(version["storage"], true);
  EXPECT_TRUE(version["subresources"].contains("status"));
  EXPECT_EQ(version["subresources"]["scale"]["specReplicasPath"],
            ".spec.replicaSpecs.Worker.replicas");
  EXPECT_EQ(version["subresources"]["scale"]["statusReplicasPath"],
            ".status.replicaStatuses.Worker.active");
  EXPECT_EQ(version["subresources"]["scale"]["labelSelectorPath"], ".status.selector");
  std::vector<std::string> columns;
  for (const Json& column : version["additionalPrinterColumns"])
    columns.push_back(Get(column, "name").dump());
  // Queue is a wide column (`-o wide`): why a Kueue-queued job waits.
  EXPECT_EQ(columns, (std::vector<std::string>{"\"Strategy\"", "\"State\"", "\"Workers\"",
                                               "\"Step\"", "\"Age\"", "\"Queue\""}));
  // The paths the subresources and columns read exist in the schema.
  EXPECT_EQ(SchemaNodes("spec.replicaSpecs.Worker.replicas").size(), 1u);
  EXPECT_EQ(SchemaNodes("status.replicaStatuses.Worker.active").size(), 1u);
  EXPECT_EQ(SchemaNodes("status.selector").size(), 1u);
  EXPECT_EQ(SchemaNodes("status.state").size(), 1u);
  EXPECT_EQ(SchemaNodes("status.progress.step").size(), 1u);
  // Cross-field rules are enforced at admission too.
  EXPECT_GE(Get(Get(Get(CrdSchema(), "properties"), "spec"), "x-kubernetes-validations").size(),
            10u);
}

TEST(CrdTest, EveryPropertyHasADescription) {
  std::vector<std::string> missing;
  CollectMissingDescriptions(CrdSchema(), "openAPIV3Schema", &missing);
  EXPECT_TRUE(missing.empty()) << "no description: " << absl::StrJoin(missing, ", ");
}

TEST(CrdTest, TemplatesAcceptAnyPodTemplate) {
  for (const Json* node : SchemaNodes("spec.replicaSpecs.*.template")) {
    EXPECT_EQ(Get(*node, "type"), "object");
    EXPECT_EQ(Get(*node, "x-kubernetes-preserve-unknown-fields"), true);
  }
  EXPECT_EQ(SchemaNodes("spec.replicaSpecs.*.template").size(), 4u);
}

// Every field the parser accepts is in the CRD with the same type, enum,
// bounds and default.
TEST(CrdTest, MatchesTheParserFieldByField) {
  ASSERT_FALSE(JobSpecFields().empty());
  for (const JobSpecField& field : JobSpecFields()) {
    SCOPED_TRACE(field.path);
    std::vector<const Json*> nodes = SchemaNodes(field.path);
    ASSERT_FALSE(nodes.empty()) << "not in the CRD";
    if (field.path.find('*') != std::string::npos) {
      EXPECT_EQ(nodes.size(), 4u);  // each replica type
    }
    for (const Json* node_ptr : nodes) {
      const Json& node = *node_ptr;
      EXPECT_EQ(Get(node, "type"), field.type);
      const Json& bounded = field.type == "array" ? Get(node, "items") : node;
      if (field.type == "array") {
        EXPECT_EQ(Get(bounded, "type"), field.item_type);
      }
      std::vector<std::string> crd_enum;
      if (bounded.contains("enum")) crd_enum = Get(bounded, "enum").get<std::vector<std::string>>();
      EXPECT_EQ(crd_enum, field.enum_values);
      if (field.minimum) {
        EXPECT_EQ(bounded.value("minimum", Json()), Json(*field.minimum));
      } else {
        EXPECT_FALSE(bounded.contains("minimum"));
      }
      if (field.maximum) {
        EXPECT_EQ(bounded.value("maximum", Json()), Json(*field.maximum));
      } else {
        EXPECT_FALSE(bounded.contains("maximum"));
      }
      EXPECT_EQ(bounded.value("exclusiveMinimum", false), field.exclusive_minimum);
      EXPECT_EQ(bounded.value("exclusiveMaximum", false), field.exclusive_maximum);
      if (node.contains("default")) {
        ASSERT_TRUE(field.default_json.has_value()) << "the CRD has a default the parser does not";
        EXPECT_EQ(Get(node, "default"), Json::parse(*field.default_json));
      } else {
        // Without a CRD default the parser's default must be "nothing".
        EXPECT_TRUE(!field.default_json || *field.default_json == "\"\"" ||
                    *field.default_json == "[]")
            << "the parser defaults to " << *field.default_json << " but the CRD has no default";
      }
    }
  }
}

void CollectLeaves(const Json& node, const std::string& path, std::vector<std::string>* leaves) {
  if (node.value("x-kubernetes-preserve-unknown-fields", false)) return;  // pod templates
  if (node.value("type", "") == "object" && node.contains("properties")) {
    const bool replica_map = path == "spec.replicaSpecs";
    for (const auto& [name, child] : Get(node, "properties").items()) {
      CollectLeaves(child, path + "." + (replica_map ? "*" : name), leaves);
    }
    return;
  }
  leaves->push_back(path);
}

TEST(CrdTest, HasNoFieldTheParserRejects) {
  std::set<std::string> parser;
  for (const JobSpecField& field : JobSpecFields()) parser.insert(field.path);
  std::vector<std::string> leaves;
  CollectLeaves(Get(Get(CrdSchema(), "properties"), "spec"), "spec", &leaves);
  ASSERT_GT(leaves.size(), 40u);
  for (const std::string& leaf : leaves)
    EXPECT_TRUE(parser.count(leaf)) << leaf << " is in the CRD only";
}

TEST(CrdTest, EnumsEqualWhatTheParserAccepts) {
  const std::vector<std::pair<std::string, std::string>> enums = {
      {"spec.strategy", "strategy: %s"},
      {"spec.replicaSpecs.*.restartPolicy", "replicaSpecs:\n  Worker: {restartPolicy: %s}"},
      {"spec.training.optimizer.type", "training: {optimizer: {type: %s}}"},
      {"spec.training.dataset.type", "training: {dataset: {type: %s}}"},
      {"spec.training.dataset.autoShardPolicy", "training: {dataset: {autoShardPolicy: %s}}"},
  };
  for (const auto& [path, snippet] : enums) {
    SCOPED_TRACE(path);
    std::vector<const Json*> nodes = SchemaNodes(path);
    ASSERT_FALSE(nodes.empty());
    for (const Json* node : nodes) {
      ASSERT_TRUE(node->contains("enum"));
      std::vector<std::string> crd_values = Get(*node, "enum").get<std::vector<std::string>>();
      ASSERT_FALSE(crd_values.empty());
      crd_values.push_back("NotAValue");
      for (const std::string& value : crd_values) {
        std::string spec = snippet;
        spec.replace(spec.find("%s"), 2, "\"" + value + "\"");
        absl::StatusOr<JobConfig> config = ParseJobYaml(JobYaml(spec));
        if (value == "NotAValue") {
          EXPECT_FALSE(config.ok()) << value;
        } else {
          EXPECT_TRUE(config.ok()) << value << ": " << config.status();
        }
      }
      // And the parser accepts nothing the CRD does not list.
      crd_values.pop_back();
      auto field = std::find_if(JobSpecFields().begin(), JobSpecFields().end(),
                                [&](const JobSpecField& f) { return f.path == path; });
      ASSERT_NE(field, JobSpecFields().end());
      EXPECT_EQ(field->enum_values, crd_values);
    }
  }
}

TEST(CrdTest, ChartCopyIsByteIdentical) {
  const std::string crd = ReadFile(SourcePath("crds/distrain.io_distributedtrainingjobs.yaml"));
  const std::string chart =
      ReadFile(SourcePath("charts/distrain/crds/distrain.io_distributedtrainingjobs.yaml"));
  ASSERT_FALSE(crd.empty());
  EXPECT_TRUE(crd == chart) << "charts/distrain/crds/ differs from crds/; copy crds/ over it";
}

TEST(ExamplesTest, EveryExampleParsesAndValidates) {
  const std::map<std::string, StrategyKind> expected = {
      {"onedevice", StrategyKind::kOneDevice},
      {"mirrored", StrategyKind::kMirrored},
      {"multi-worker-mirrored", StrategyKind::kMultiWorkerMirrored},
      {"parameter-server", StrategyKind::kParameterServer},
      {"central-storage", StrategyKind::kCentralStorage},
      {"tpu", StrategyKind::kTPU},
      {"auto", StrategyKind::kAuto},
  };
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(SourcePath("examples"))) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string stem = entry.path().stem().string();
    SCOPED_TRACE(entry.path().string());
    seen.insert(stem);
    absl::StatusOr<JobConfig> config = LoadJobYamlFile(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(ValidateJobConfig(*config).ok()) << ValidateJobConfig(*config);
    EXPECT_EQ(config->name, stem) << "metadata.name should match the file name";
    if (auto it = expected.find(stem); it != expected.end()) {
      EXPECT_EQ(config->strategy, it->second);
    }
    // Every example says how to run it, locally and on a cluster.
    const std::string text = ReadFile(entry.path().string());
    EXPECT_THAT(text, HasSubstr("distrain run examples/" + stem + ".yaml"));
    EXPECT_THAT(text, HasSubstr("kubectl apply -f examples/" + stem + ".yaml"));
  }
  for (const auto& [stem, strategy] : expected)
    EXPECT_TRUE(seen.count(stem)) << "missing examples/" << stem << ".yaml";
}

// The job's name prefixes <job>-<type>-<index>, a Service name (DNS-1035,
// at most 63 characters): how long a name may be depends on the replica
// counts, the elastic maximum included.
TEST(ValidateJobConfigNameTest, LongestReplicaNameMustFitADnsLabel) {
  const std::string name54 = "mnist-" + std::string(48, 'x');
  auto doc = [&](const std::string& name, const std::string& spec) {
    return absl::StrCat("apiVersion: distrain.io/v1alpha1\nkind: DistributedTrainingJob\n",
                        "metadata: {name: ", name, "}\nspec:\n", spec);
  };
  auto validate = [](const std::string& yaml) {
    absl::StatusOr<JobConfig> config = ParseJobYaml(yaml);
    if (!config.ok()) return config.status();
    return ValidateJobConfig(*config);
  };
  const std::string mwm10 =
      "  strategy: MultiWorkerMirrored\n  replicaSpecs: {Worker: {replicas: 10}}\n"
      "  training: {globalBatchSize: 100}\n";
  EXPECT_TRUE(validate(doc(name54, mwm10)).ok())
      << "the longest name has exactly 63 characters: " << validate(doc(name54, mwm10));
  absl::Status too_many = validate(doc(
      name54, "  strategy: MultiWorkerMirrored\n  replicaSpecs: {Worker: {replicas: 100}}\n"
               "  training: {globalBatchSize: 100}\n"));
  EXPECT_THAT(std::string(too_many.message()),
              HasSubstr(absl::StrCat("metadata.name: too long for its replicas' pod and Service "
                                     "names: \"",
                                     name54, "-worker-99\" has 64 characters (at most 63); "
                                     "shorten the name to at most 53 characters")));
  absl::Status elastic = validate(doc(
      name54, mwm10 + "  elasticPolicy: {minReplicas: 1, maxReplicas: 100}\n"));
  EXPECT_THAT(std::string(elastic.message()), HasSubstr("-worker-99\" has 64 characters"))
      << "scaling up to maxReplicas would create that name";
  absl::Status evaluator = validate(doc(
      name54, "  strategy: OneDevice\n  replicaSpecs: {Worker: {replicas: 1}, Evaluator: {}}\n"));
  EXPECT_THAT(std::string(evaluator.message()), HasSubstr("-evaluator-0\" has 66 characters"));
  EXPECT_THAT(std::string(validate(doc("3d-unet", "  strategy: OneDevice\n  replicaSpecs: {Worker: {replicas: 1}}\n")).message()),
              HasSubstr("metadata.name: must start with a letter"));
}

TEST(JobConfigTest, TransportIsMutualTlsUnlessTheJobOptsOutAndOtherValuesAreRefused) {
  auto secure = ParseJobYaml(JobYaml("strategy: OneDevice\nreplicaSpecs:\n  Worker: {replicas: 1}\n"));
  ASSERT_TRUE(secure.ok()) << secure.status();
  EXPECT_EQ(secure->transport, TransportMode::kMutualTls);
  auto plain = ParseJobYaml(JobYaml(
      "strategy: OneDevice\nsecurity: {transport: Plaintext}\nreplicaSpecs:\n  Worker: {replicas: 1}\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->transport, TransportMode::kPlaintext);
  auto bad = ParseJobYaml(JobYaml(
      "strategy: OneDevice\nsecurity: {transport: TLS}\nreplicaSpecs:\n  Worker: {replicas: 1}\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("spec.security.transport"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace distrain

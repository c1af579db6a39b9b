// TensorBoard event files as TensorBoard itself reads them: real jobs through
// `distrain run` (OneDevice with a restart, MultiWorkerMirrored with an
// Evaluator, ParameterServer's coordinator) write their runs next to the
// checkpoints, and the `tensorboard` package's own loading path (the
// multiplexer and data provider behind `tensorboard --logdir`'s scalar
// dashboard, with its default settings) must show every scalar at exactly
// the steps the chief logged, with exactly the values it logged.
//
// The processes run with DISTRAIN_LOG_LEVEL=debug, so each event is also in
// the log in full precision ("tensorboard: <dir> step S: tag=value ...",
// SummaryRun); those values are cross-checked against the chief's ordinary
// info lines (4 decimals), so the curves are what the job reports.
#include <gtest/gtest.h>

#include <algorithm>
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
#include "nlohmann/json.hpp"
#include "tests/integration/subprocess.h"
#include "tests/integration/sync_reference.h"
#include "tests/integration/tensorflow_peer.h"
#include "worker/checkpoint/checkpoint.h"

namespace distrain {
namespace {

using testing::DistrainBinary;
using testing::FreshTempDir;
using testing::Subprocess;
using testing::SyncJobYaml;
using testing::WriteTextFile;
namespace fs = std::filesystem;

// tag -> step -> value
using Curves = std::map<std::string, std::map<int64_t, double>>;
// run ("train", "validation") -> curves
using Runs = std::map<std::string, Curves>;

// What `tensorboard --logdir` serves its scalar dashboard: its own flag
// parser and data ingester (every default: orphan purging on restarts, one
// file followed per run, 1,000 points per scalar), loaded once.
constexpr char kReaderScript[] = R"(
import json, sys
from tensorboard import context, program
from tensorboard.backend.event_processing import data_ingester

logdir, out = sys.argv[1], sys.argv[2]
tb = program.TensorBoard()
tb.configure(argv=[None, "--logdir", logdir, "--reload_task", "blocking", "--reload_interval", "0"])
ingester = data_ingester.LocalDataIngester(tb.flags)
ingester.start()
data = ingester.data_provider.read_scalars(
    context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=1000)
with open(out, "w") as f:
    json.dump({run: {tag: [[p.step, p.value] for p in points] for tag, points in tags.items()}
               for run, tags in data.items()}, f)
)";

// What TensorBoard shows for `logdir`; a failure when a step appears twice
// in a curve (a restart's orphans not dropped, or two writers in one run).
Runs ReadWithTensorBoard(const std::string& python, const std::string& logdir) {
  const std::string script = WriteTextFile(logdir + "/../read_scalars.py", kReaderScript);
  const std::string json_path = logdir + "/../scalars.json";
  Subprocess reader({python, script, logdir, json_path}, {{"TF_CPP_MIN_LOG_LEVEL", "3"}});
  auto rc = reader.Wait(180);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << reader.output();
  Runs runs;
  std::ifstream in(json_path);
  if (!in) {
    ADD_FAILURE() << "the reader wrote no " << json_path << ":\n" << reader.output();
    return runs;
  }
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const auto& [run, tags] : j.items()) {
    for (const auto& [tag, points] : tags.items()) {
      for (const auto& point : points) {
        const int64_t step = point[0].get<int64_t>();
        auto [it, inserted] = runs[run][tag].emplace(step, point[1].get<double>());
        EXPECT_TRUE(inserted) << "TensorBoard shows " << run << "/" << tag << " twice at step "
                              << step;
      }
    }
  }
  return runs;
}

// The events a process of `distrain run` says it wrote ("[task] ... tensorboard:
// <dir>/<run> step S: tag=value ..."), run -> tag -> step -> value.
Runs WrittenBy(const std::string& out, const std::string& task) {
  Runs runs;
  const std::regex line("\\[" + task +
                        R"(\] [^\n]*tensorboard: \S+/(train|validation) step (\d+):([^\n]*))");
  const std::regex pair(R"( ([a-z_]+)=(\S+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    const std::string values = (*it)[3].str();
    for (auto p = std::sregex_iterator(values.begin(), values.end(), pair);
         p != std::sregex_iterator(); ++p) {
      runs[(*it)[1].str()][(*p)[1].str()][std::stoll((*it)[2].str())] = std::stod((*p)[2].str());
    }
  }
  return runs;
}

std::set<int64_t> StepsOf(const std::map<int64_t, double>& curve) {
  std::set<int64_t> steps;
  for (const auto& [step, value] : curve) steps.insert(step);
  return steps;
}

// TensorBoard shows exactly `want`: the same runs, tags and steps, and each
// value is the logged double rounded to float32 (what the event holds).
void ExpectTensorBoardShows(const Runs& shown, const Runs& want) {
  ASSERT_EQ(shown.size(), want.size());
  for (const auto& [run, curves] : want) {
    ASSERT_EQ(shown.count(run), 1u) << run;
    const Curves& got = shown.at(run);
    ASSERT_EQ(got.size(), curves.size()) << run;
    for (const auto& [tag, points] : curves) {
      ASSERT_EQ(got.count(tag), 1u) << run << "/" << tag;
      EXPECT_EQ(StepsOf(got.at(tag)), StepsOf(points)) << run << "/" << tag;
      for (const auto& [step, value] : points) {
        auto it = got.at(tag).find(step);
        if (it == got.at(tag).end()) continue;
        EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(value)))
            << run << "/" << tag << " at step " << step;
      }
    }
  }
}

// The chief's info line of each logged step: step -> (loss, accuracy, examples/s).
struct StepLine {
  double loss, accuracy, examples_per_second;
};
std::map<int64_t, StepLine> StepLines(const std::string& out, const std::string& task) {
  std::map<int64_t, StepLine> lines;
  const std::regex re(
      "\\[" + task +
      R"(\] [^\n]*step (\d+)/\d+ loss ([0-9.]+) accuracy ([0-9.]+) examples/s ([0-9]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    lines[std::stoll((*it)[1].str())] = {std::stod((*it)[2].str()), std::stod((*it)[3].str()),
                                         std::stod((*it)[4].str())};
  }
  return lines;
}

// Eval results in a process's info lines: step -> (loss, accuracy). The
// chief's periodic ("eval at step S: loss L accuracy A") and final ("training
// complete: steps S ... eval_loss L eval_accuracy A") ones, or the
// Evaluator's ("evaluator: checkpoint step S/T eval_loss L eval_accuracy A").
std::map<int64_t, std::pair<double, double>> EvalLines(const std::string& out,
                                                       const std::string& task) {
  std::map<int64_t, std::pair<double, double>> evals;
  const std::string p = "\\[" + task + "\\] [^\\n]*";
  for (const std::string& pattern :
       {p + R"(eval at step (\d+): loss ([0-9.]+) accuracy ([0-9.]+))",
        p + R"(training complete: steps (\d+) loss [0-9.]+ )"
            R"(eval_loss ([0-9.]+) eval_accuracy ([0-9.]+))",
        p + R"(evaluator: checkpoint step (\d+)/\d+ )"
            R"(eval_loss ([0-9.]+) eval_accuracy ([0-9.]+))"}) {
    const std::regex re(pattern);
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      evals[std::stoll((*it)[1].str())] = {std::stod((*it)[2].str()), std::stod((*it)[3].str())};
    }
  }
  return evals;
}

// The info lines print 4 decimals (examples/s: none).
constexpr double kFourDecimals = 0.5e-4 + 1e-9;

// The written train curves are the chief's info lines: loss and accuracy to
// their 4 printed decimals, examples/s job-wide (the line's per-process rate
// times the input shards), learning rate the configured one. `steps`: the
// logged steps; every tag is at each of them, except that with
// `loss_may_be_missing` (the ParameterServer coordinator) loss and accuracy
// may lack some, together.
void ExpectTrainMatchesTheChiefsLines(const Curves& train, const std::string& out,
                                      const std::string& task, const std::set<int64_t>& steps,
                                      int input_shards, float learning_rate,
                                      bool loss_may_be_missing = false) {
  const std::map<int64_t, StepLine> lines = StepLines(out, task);
  std::set<int64_t> line_steps;
  for (const auto& [step, line] : lines) line_steps.insert(step);
  EXPECT_EQ(line_steps, steps) << out;
  for (const char* tag :
       {"loss", "accuracy", "examples_per_second", "step_time_seconds", "learning_rate"}) {
    ASSERT_EQ(train.count(tag), 1u) << tag << "\n" << out;
    const bool may_miss = loss_may_be_missing && std::string(tag) != "examples_per_second" &&
                          std::string(tag) != "step_time_seconds" &&
                          std::string(tag) != "learning_rate";
    if (!may_miss) {
      EXPECT_EQ(StepsOf(train.at(tag)), steps) << tag;
    } else {
      const std::set<int64_t> got = StepsOf(train.at(tag));
      EXPECT_TRUE(std::includes(steps.begin(), steps.end(), got.begin(), got.end())) << tag;
    }
  }
  EXPECT_EQ(StepsOf(train.at("loss")), StepsOf(train.at("accuracy")));
  for (const auto& [step, line] : lines) {
    if (!train.at("loss").count(step)) continue;
    EXPECT_NEAR(train.at("loss").at(step), line.loss, kFourDecimals) << "step " << step;
    EXPECT_NEAR(train.at("accuracy").at(step), line.accuracy, kFourDecimals) << "step " << step;
    EXPECT_NEAR(train.at("examples_per_second").at(step), line.examples_per_second * input_shards,
                0.5 * input_shards + 1e-9)
        << "step " << step;
    EXPECT_GT(train.at("step_time_seconds").at(step), 0) << "step " << step;
    EXPECT_EQ(train.at("learning_rate").at(step), static_cast<double>(learning_rate));
  }
}

void ExpectValidationMatchesTheEvalLines(const Curves& validation, const std::string& out,
                                         const std::string& task) {
  const auto evals = EvalLines(out, task);
  ASSERT_EQ(validation.size(), 2u) << out;
  std::set<int64_t> steps;
  for (const auto& [step, eval] : evals) steps.insert(step);
  EXPECT_EQ(StepsOf(validation.at("loss")), steps) << out;
  EXPECT_EQ(StepsOf(validation.at("accuracy")), steps) << out;
  for (const auto& [step, eval] : evals) {
    if (!validation.at("loss").count(step) || !validation.at("accuracy").count(step)) continue;
    EXPECT_NEAR(validation.at("loss").at(step), eval.first, kFourDecimals) << "step " << step;
    EXPECT_NEAR(validation.at("accuracy").at(step), eval.second, kFourDecimals) << "step " << step;
  }
}

// `distrain run` of `job` with its checkpoints (and so its event files) in
// <dir>/ckpt; its output once it succeeded.
std::string RunJob(const std::string& job, const std::string& dir, const std::string& work) {
  Subprocess run({DistrainBinary(), "run", job, "--no-progress", "--checkpoint-dir", dir + "/ckpt",
                  "--work-dir", dir + "/" + work},
                 {{"DISTRAIN_LOG_LEVEL", "debug"}, {"DISTRAIN_EVAL_POLL_SECONDS", "0.1"}});
  auto rc = run.Wait(300);
  EXPECT_TRUE(rc.has_value()) << "distrain run did not finish in 300 s:\n" << run.output();
  EXPECT_EQ(rc.value_or(-1), 0) << run.output();
  return run.output();
}

// The chief's curves, then a restart from an earlier checkpoint: TensorBoard
// drops the points the first process logged after that checkpoint (the
// restarted chief's SessionLog START) and shows the second one's instead.
TEST(TensorBoardTest, OneDeviceRunShowsEveryScalarAndARestartReplacesThePointsAfterItsCheckpoint) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("tensorboard_onedevice");
  const std::string training =
      "    evalEverySteps: 20\n    checkpoint: {everySteps: 20, keep: 5}\n";
  const std::string out1 = RunJob(
      WriteTextFile(dir + "/job60.yaml",
                    SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n", 60, training)),
      dir, "work1");
  // As if the first chief died after logging step 60 but before its
  // checkpoint: the job goes on from step 40, to step 80.
  ASSERT_TRUE(fs::remove(CheckpointManager(dir + "/ckpt", 5).PathForStep(60)));
  const std::string out2 = RunJob(
      WriteTextFile(dir + "/job80.yaml",
                    SyncJobYaml("OneDevice", "    Worker: {replicas: 1}\n", 80, training)),
      dir, "work2");
  ASSERT_NE(out2.find("resumed from checkpoint step 40"), std::string::npos) << out2;

  const Runs first = WrittenBy(out1, "worker-0");
  const Runs second = WrittenBy(out2, "worker-0");
  ExpectTrainMatchesTheChiefsLines(first.at("train"), out1, "worker-0", {20, 40, 60}, 1, 0.002f);
  ExpectTrainMatchesTheChiefsLines(second.at("train"), out2, "worker-0", {60, 80}, 1, 0.002f);
  ExpectValidationMatchesTheEvalLines(first.at("validation"), out1, "worker-0");
  ExpectValidationMatchesTheEvalLines(second.at("validation"), out2, "worker-0");

  // What TensorBoard must show: the first chief's points up to its
  // checkpoint (step 40), then the second chief's.
  Runs want = first;
  for (auto& [run, curves] : want) {
    for (auto& [tag, points] : curves) {
      points.erase(points.upper_bound(40), points.end());
      for (const auto& [step, value] : second.at(run).at(tag)) points[step] = value;
    }
  }
  // The restarted run's examples/s (timing) tells the two processes apart.
  ASSERT_NE(first.at("train").at("examples_per_second").at(60),
            second.at("train").at("examples_per_second").at(60));
  ExpectTensorBoardShows(ReadWithTensorBoard(python, dir + "/ckpt"), want);
  fs::remove_all(dir);
}

// MultiWorkerMirrored: worker 0 is the chief and the only writer of train/;
// the job's Evaluator writes validation/ at the steps of the checkpoints it
// evaluated.
TEST(TensorBoardTest, MultiWorkerMirroredChiefWritesTrainAndTheEvaluatorWritesValidation) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("tensorboard_mwms");
  const std::string out = RunJob(
      WriteTextFile(dir + "/job.yaml",
                    SyncJobYaml("MultiWorkerMirrored",
                                "    Worker: {replicas: 2}\n    Evaluator: {replicas: 1}\n", 60,
                                "    checkpoint: {everySteps: 20, keep: 5}\n"
                                "    communication: {implementation: Ring, timeoutSeconds: 10}\n")),
      dir, "work");
  const Runs chief = WrittenBy(out, "worker-0");
  const Runs evaluator = WrittenBy(out, "evaluator-0");
  EXPECT_TRUE(WrittenBy(out, "worker-1").empty()) << "only the chief writes events:\n" << out;
  ASSERT_EQ(chief.size(), 1u) << "the chief leaves validation/ to the Evaluator:\n" << out;
  ASSERT_EQ(evaluator.size(), 1u) << out;
  ExpectTrainMatchesTheChiefsLines(chief.at("train"), out, "worker-0", {20, 40, 60}, 2, 0.002f);
  ExpectValidationMatchesTheEvalLines(evaluator.at("validation"), out, "evaluator-0");
  // It may skip a checkpoint when it falls behind, never the final one.
  EXPECT_EQ(evaluator.at("validation").at("loss").count(60), 1u) << out;

  ExpectTensorBoardShows(
      ReadWithTensorBoard(python, dir + "/ckpt"),
      {{"train", chief.at("train")}, {"validation", evaluator.at("validation")}});
  fs::remove_all(dir);
}

// ParameterServer: the chief is the coordinator, with no replica of its own;
// its loss and accuracy are those of the closures the workers finished.
TEST(TensorBoardTest, ParameterServerCoordinatorWritesTheClosuresResultsAtItsLoggedSteps) {
  DISTRAIN_REQUIRE_TENSORFLOW(python);
  const std::string dir = FreshTempDir("tensorboard_ps");
  const std::string job = WriteTextFile(
      dir + "/job.yaml",
      absl::StrCat("apiVersion: distrain.io/v1alpha1\n",                                         //
                   "kind: DistributedTrainingJob\n",                                             //
                   "metadata: {name: ps}\n",                                                     //
                   "spec:\n",                                                                    //
                   "  strategy: ParameterServer\n",                                              //
                   "  replicaSpecs:\n",                                                          //
                   "    Chief: {replicas: 1}\n",                                                 //
                   "    Worker: {replicas: 2}\n",                                                //
                   "    PS: {replicas: 1}\n",                                                    //
                   "  training:\n",                                                              //
                   "    model: {hiddenUnits: [32]}\n",                                           //
                   "    dataset: {type: synthetic, numExamples: 4096, numEvalExamples: 512,",    //
                   " numFeatures: 32, numClasses: 10, noise: 1.0}\n",                            //
                   "    optimizer: {type: adam, learningRate: 0.003}\n",                         //
                   "    globalBatchSize: 64\n",                                                  //
                   "    steps: 60\n",                                                            //
                   "    logEverySteps: 20\n",                                                    //
                   "    evalEverySteps: 30\n",                                                   //
                   "    communication: {timeoutSeconds: 10}\n"));
  const std::string out = RunJob(job, dir, "work");
  const Runs chief = WrittenBy(out, "chief-0");
  for (const char* task : {"worker-0", "worker-1", "ps-0"}) {
    EXPECT_TRUE(WrittenBy(out, task).empty()) << task << " writes no events:\n" << out;
  }
  ASSERT_EQ(chief.count("train"), 1u) << out;
  ASSERT_EQ(chief.count("validation"), 1u) << out;
  const Curves& train = chief.at("train");
  // A logged step at which no closure had finished has no loss point (see
  // docs/tensorboard.md); the last step waits for every closure, so it has one.
  ASSERT_EQ(train.count("loss"), 1u) << out;
  EXPECT_EQ(train.at("loss").count(60), 1u) << out;
  ExpectTrainMatchesTheChiefsLines(train, out, "chief-0", {20, 40, 60}, 1, 0.003f,
                                   /*loss_may_be_missing=*/true);
  ExpectValidationMatchesTheEvalLines(chief.at("validation"), out, "chief-0");
  EXPECT_EQ(StepsOf(chief.at("validation").at("loss")), (std::set<int64_t>{30, 60}));

  ExpectTensorBoardShows(ReadWithTensorBoard(python, dir + "/ckpt"), chief);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distrain

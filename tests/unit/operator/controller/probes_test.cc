#include "operator/controller/probes.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/operator/controller/world.h"

namespace distrain::controller {
namespace {

using testing::Json;
using testing::MakeJob;
using testing::World;

const Json* Main(const Json& pod) {
  for (const Json& c : pod["spec"]["containers"]) {
    if (c.value("name", "") == "distrain") return &c;
  }
  return &pod["spec"]["containers"][0];
}

Json FirstPod(const std::string& spec) {
  World w{MakeJob(spec)};
  Plan plan = w.Step();
  EXPECT_FALSE(plan.pods_to_create.empty());
  return plan.pods_to_create.empty() ? Json() : plan.pods_to_create[0];
}

const char kOneDevice[] =
    "  strategy: OneDevice\n  replicaSpecs:\n    Worker: {replicas: 1}\n";

TEST(ProbesTest, TheWorkerGetsStartupLivenessAndReadinessOnHealthzAtTheMetricsPort) {
  const Json pod = FirstPod(kOneDevice);
  const Json& main = *Main(pod);
  for (const char* kind : {"startupProbe", "livenessProbe", "readinessProbe"}) {
    ASSERT_TRUE(main.contains(kind)) << kind;
    const Json& p = main[kind];
    EXPECT_EQ(p["httpGet"]["path"], "/healthz") << kind;
    EXPECT_EQ(p["httpGet"]["port"], 9090) << kind;
    EXPECT_EQ(p["periodSeconds"], 10) << kind;
    EXPECT_EQ(p["timeoutSeconds"], 5) << kind;
  }
  // Start-up: 5 min for the port to open before liveness runs at all;
  // then the worker's own /healthz allows start-up its 10 minutes.
  EXPECT_EQ(main["startupProbe"]["failureThreshold"], 30);
  EXPECT_EQ(main["livenessProbe"]["failureThreshold"], 3);
}

TEST(ProbesTest, ATemplatesOwnProbesWinKindByKind) {
  const Json pod = FirstPod(R"(  strategy: OneDevice
  replicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: distrain
            ports: [{name: metrics, containerPort: 9400}]
            livenessProbe: {tcpSocket: {port: 9400}, periodSeconds: 60}
)");
  const Json& main = *Main(pod);
  EXPECT_EQ(main["livenessProbe"], Json({{"tcpSocket", {{"port", 9400}}}, {"periodSeconds", 60}}));
  EXPECT_EQ(main["readinessProbe"]["httpGet"]["port"], 9400);
  EXPECT_EQ(main["startupProbe"]["httpGet"]["port"], 9400);
}

TEST(ProbesTest, ImagesThatDoNotRunDistrainWorkerGetNone) {
  const Json tf = FirstPod(R"(  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - {name: tensorflow, image: "tensorflow/tensorflow:2.21.0", command: [python, train.py]}
  training: {globalBatchSize: 64}
)");
  for (const char* kind : {"startupProbe", "livenessProbe", "readinessProbe"}) {
    EXPECT_FALSE(Main(tf)->contains(kind)) << kind;
  }
}

TEST(ProbesTest, WhichContainersRunDistrainWorker) {
  ControllerOptions options;
  options.default_image = "ghcr.io/acme/distrain-worker:1.2";
  EXPECT_TRUE(RunsDistrainWorker({{"image", "ghcr.io/acme/distrain-worker:1.3"}}, options));
  EXPECT_TRUE(RunsDistrainWorker({{"image", "ghcr.io/acme/distrain-worker@sha256:abc"}}, options));
  EXPECT_TRUE(RunsDistrainWorker(
      {{"image", "my/own:1"}, {"command", {"/usr/local/bin/distrain-worker", "--log-level=debug"}}},
      options));
  EXPECT_FALSE(RunsDistrainWorker({{"image", "my/own:1"}}, options));
  EXPECT_FALSE(RunsDistrainWorker(
      {{"image", "ghcr.io/acme/distrain-worker:1.2"}, {"command", {"python", "train.py"}}},
      options));
  // A registry port is not a tag.
  options.default_image = "localhost:5000/distrain/worker";
  EXPECT_TRUE(RunsDistrainWorker({{"image", "localhost:5000/distrain/worker:dev"}}, options));
  EXPECT_FALSE(RunsDistrainWorker({{"image", "localhost:5000/other"}}, options));
}

}  // namespace
}  // namespace distrain::controller

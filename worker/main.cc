// distrain-worker: one replica of a distributed training job.
//
// Reads the pod contract (docs/architecture.md §5) from the environment:
//   TF_CONFIG               cluster spec + this task (absent: a lone worker)
//   DISTRAIN_JOB_CONFIG     spec.training + strategy as JSON (or --config job.yaml)
//   DISTRAIN_METRICS_PORT   Prometheus /metrics and /healthz (absent: no server);
//                           /healthz fails once training stalls (progress_watchdog.h)
//   DISTRAIN_CHECKPOINT_DIR where checkpoints go (spec.training.checkpoint.dir wins)
//   DISTRAIN_STATUS_FILE    progress JSON for `distrain run` (optional)
//   DISTRAIN_CREDENTIALS_DIR this task's job credentials (default
//                           /var/run/distrain/identity; docs/security.md)
//   DISTRAIN_TERMINATION_MESSAGE_PATH  the chief's final figures for the pod status
//   POD_NAME, POD_NAMESPACE for log lines
// Exit codes: common/exit_codes.h (0 done, 1-127 permanent, 128+ retryable).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auto_strategy.h"
#include "common/cluster_spec.h"
#include "common/device_use.h"
#include "common/exit_codes.h"
#include "common/job_identity.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "common/net.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/evaluator.h"
#include "worker/progress_watchdog.h"
#include "worker/security/transport_security.h"
#include "worker/strategy/ps_worker.h"
#include "worker/strategy/strategy.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"
#include "worker/trainer.h"
#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/cuda_libraries.h"
#include "worker/tensor/cuda/device_probe.h"
#include "worker/tensor/cuda/topology.h"
#endif

namespace {

// Whether this task talks to other processes of the job: any task but the
// evaluator (which only reads checkpoints) in a cluster of more than one.
bool NeedsJobTraffic(const distrain::ClusterSpec& cluster) {
  if (cluster.task().type == "evaluator") return false;
  int tasks = 0;
  for (const auto& [type, addresses] : cluster.jobs()) {
    if (type != "evaluator") tasks += static_cast<int>(addresses.size());
  }
  return tasks > 1;
}

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
    // Second signal: the user means it. Skip the final checkpoint.
    std::_Exit(128 + sig);
  }
  g_signal.store(sig);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Logs why the process gives up and leaves the reason where the kubelet
// copies it into the pod's status (DISTRAIN_TERMINATION_MESSAGE_PATH, as
// {"error": ..., "exitCode": ...}), so the operator can name it in the job's
// Failed condition and event (operator/controller/observed.h) instead of a
// bare exit code. Returns exit_code.
int Fail(int exit_code, const std::string& message) {
  spdlog::error("{}", message);
  const std::string path = Env("DISTRAIN_TERMINATION_MESSAGE_PATH");
  if (!path.empty()) {
    // The kubelet keeps at most 4096 bytes of the message.
    const nlohmann::json record = {{"error", message.substr(0, 3500)}, {"exitCode", exit_code}};
    std::ofstream out(path, std::ios::trunc);
    out << record.dump() << "\n";
  }
  return exit_code;
}

// Fail for a run that ended in error, saying whether a restart may help.
int FailOutcome(int exit_code, const absl::Status& status) {
  return Fail(exit_code, absl::StrCat(status.message(), " (exit code ", exit_code,
                                      distrain::IsRetryableExitCode(exit_code) ? ", retryable)"
                                                                               : ", permanent)"));
}

// What the process has of GPUs, for common/device_use.h: the build's and the
// driver's view, plus what the pod holds (DISTRAIN_POD_GPUS).
absl::StatusOr<distrain::DeviceUseFacts> DeviceUseFactsOfThisPod() {
  distrain::DeviceUseFacts facts = distrain::ThisProcessDeviceFacts();
  const std::string held = Env(distrain::kPodGpusEnv);
  if (!held.empty() && (!absl::SimpleAtoi(held, &facts.held_gpus) || facts.held_gpus < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        distrain::kPodGpusEnv, ": must be a GPU count >= 0 (the operator sets it from the pod's "
        "nvidia.com/gpu), got \"", held, "\""));
  }
  return facts;
}


// oneDNN's OpenMP threads and OpenBLAS's threads take turns on the same
// cores, layer by layer, and each pool's threads spin after their work
// before they sleep — libgomp for ~300,000 iterations, OpenBLAS for 2^28
// cycles (~0.1 s) — starving the other pool. Shorter spins, measured on the
// guide's CNN, OneDevice on 2 cores (Zen 4, quiet machine; bench/README.md):
// batch 64 2,750-2,940 -> 5,970 examples/s, batch 256 5,300 -> 6,700;
// the MLP paths did not change beyond run-to-run noise. Both libraries read
// these settings when they are loaded, before main, so the only way to
// change them is to run again with them set: once, and never over a value
// the user chose.
void ShortenThreadSpinsOrReexec(char** argv) {
  bool changed = false;
  if (std::getenv("GOMP_SPINCOUNT") == nullptr && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("GOMP_SPINCOUNT", "1000", 1);
    changed = true;
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    ::setenv("OPENBLAS_THREAD_TIMEOUT", "10", 1);  // 2^10 cycles
    changed = true;
  }
  if (changed) ::execv("/proc/self/exe", argv);
  // Reached when nothing changed, or exec failed (no /proc): run on as is.
}

}  // namespace

int main(int argc, char** argv) {
  using namespace distrain;
  ShortenThreadSpinsOrReexec(argv);
  CLI::App app{"distrain-worker: runs one replica (chief, worker, ps or evaluator) of a "
               "DistributedTrainingJob. Configured by TF_CONFIG and DISTRAIN_JOB_CONFIG "
               "(see README.md, 'Operator -> worker contract')."};
  std::string config_file, tf_config_flag, checkpoint_dir_flag, log_level = "info";
  int metrics_port_flag = -1;
  bool version = false;
  bool devices = false;
  app.add_option("--config", config_file,
                 "DistributedTrainingJob YAML to read instead of DISTRAIN_JOB_CONFIG");
  app.add_option("--tf-config", tf_config_flag, "TF_CONFIG JSON (overrides the environment)");
  app.add_option("--metrics-port", metrics_port_flag,
                 "port for /metrics and /healthz (overrides DISTRAIN_METRICS_PORT; 0 = off)");
  app.add_option("--checkpoint-dir", checkpoint_dir_flag,
                 "checkpoint directory (overrides DISTRAIN_CHECKPOINT_DIR)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_flag("--version", version, "print the version and exit");
  app.add_flag("--devices", devices,
               "measure the GPUs' copy bandwidths (host<->GPU, GPU<->GPU: what Auto decides "
               "on) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  // This thread's ops use the cores OpenBLAS was given (OPENBLAS_NUM_THREADS:
  // distrain run sets each process's share; default one per core), so
  // oneDNN's OpenMP team and OpenBLAS agree. Replica threads set their own.
  ops::SetCpuThreadsForThisThread(cpu::BlasThreads());
  if (devices) {
#ifdef DISTRAIN_HAVE_CUDA
    std::cout << cuda::MeasureTopology().ToString() << "\n";
#else
    std::cout << "no GPUs: this is a CPU-only build of distrain\n";
#endif
    return kExitOk;
  }
  if (version) {
    std::cout << "distrain-worker " << DISTRAIN_VERSION << "\n";
#ifdef DISTRAIN_HAVE_CUDA
    cuda::DeviceInfo cuda_info = cuda::Probe();
    std::cout << "cuda runtime " << cuda_info.runtime_version << ", " << cuda_info.device_count
              << " GPU(s)" << (cuda_info.error.empty() ? "" : " (" + cuda_info.error + ")") << "\n"
              << "cuda libraries: " << cuda::CudaLibrariesSummary() << "\n";
#else
    std::cout << "cuda: not built (CPU only)\n";
#endif
    return kExitOk;
  }
  InitLogging(log_level);
  // Debian's abseil is built without NDEBUG, so every Mutex lock also runs
  // the deadlock detector's graph bookkeeping (0.6% of a ps task's CPU). The
  // tests keep it; the shipped binary does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // 1. Job config.
  absl::StatusOr<JobConfig> config = absl::InvalidArgumentError(
      "no job configuration: set DISTRAIN_JOB_CONFIG (the operator does) or pass --config job.yaml");
  if (!config_file.empty()) {
    config = LoadJobYamlFile(config_file);
  } else if (std::string json = Env("DISTRAIN_JOB_CONFIG"); !json.empty()) {
    config = ParseJobConfigJson(json);
  }
  if (config.ok()) {
    if (absl::Status s = ValidateJobConfig(*config); !s.ok()) config = s;
  }
  if (!config.ok()) {
    return Fail(kExitInvalidConfig,
                absl::StrCat("invalid job configuration: ", config.status().message()));
  }
  // 1b. spec.strategy: Auto, on what this process finds (common/auto_strategy.h):
  // the visible GPUs and, with more than one, the copy bandwidths between
  // the host and them and between them, measured now.
  DeviceFacts auto_facts;
  std::string auto_reason;
  if (config->strategy == StrategyKind::kAuto) {
#ifdef DISTRAIN_HAVE_CUDA
    auto_facts.gpus = ThisProcessDeviceFacts().visible_gpus;
    if (auto_facts.gpus > 1) {
      const cuda::MeasuredTopology topology = cuda::MeasureTopology();
      spdlog::info("Auto: measured {}", topology.ToString());
      auto_facts.host_device_gbps = topology.host_device_gbps;
      auto_facts.device_device_gbps = topology.device_device_gbps;
    }
#endif
    auto_reason = ChooseAutoStrategy(*config, auto_facts).reason;
    auto resolved = ResolveAutoStrategy(*config, auto_facts);
    if (!resolved.ok()) {
      return Fail(kExitInvalidConfig,
                  absl::StrCat("invalid job configuration: ", resolved.status().message()));
    }
    config = std::move(resolved->first);
    spdlog::info("{}", resolved->second);
  }
  // 1c. Devices: never train on CPU while holding GPUs, never NCCL without
  // them (common/device_use.h).
  {
    absl::StatusOr<DeviceUseFacts> facts = DeviceUseFactsOfThisPod();
    if (!facts.ok()) return Fail(kExitInvalidConfig, std::string(facts.status().message()));
    if (absl::Status use = CheckDeviceUse(*config, *facts); !use.ok()) {
      return Fail(kExitUnsupported, std::string(use.message()));
    }
#ifdef DISTRAIN_HAVE_CUDA
    // A process that sees GPUs trains on them, so cuBLAS, cuDNN and NCCL must
    // load now, not at the first op (cuda_libraries.h): the CPU image has
    // none of them.
    if (facts->visible_gpus > 0) {
      if (absl::Status libs = cuda::LoadCudaLibraries(); !libs.ok()) {
        return Fail(kExitUnsupported, std::string(libs.message()));
      }
      spdlog::info("{} GPU(s); {}", facts->visible_gpus, cuda::CudaLibrariesSummary());
    }
#endif
  }

  // 2. Cluster spec.
  std::string tf_config = tf_config_flag.empty() ? Env("TF_CONFIG") : tf_config_flag;
  absl::StatusOr<ClusterSpec> cluster =
      tf_config.empty() ? ClusterSpec::Create({{"worker", {"localhost:2222"}}}, TaskId{"worker", 0})
                        : ClusterSpec::Parse(tf_config);
  if (!cluster.ok()) {
    return Fail(kExitInvalidConfig, absl::StrCat("invalid TF_CONFIG: ", cluster.status().message()));
  }
  spdlog::info("distrain-worker {} job {}/{} task {} strategy {}", DISTRAIN_VERSION,
               config->namespace_, config->name, cluster->task().ToString(),
               StrategyName(config->strategy));

  // 2b. Job credentials: every server and client of the strategies picks
  // them up (worker/security/transport_security.h). A lone process opens no
  // job ports and needs none; the evaluator only reads checkpoints.
  if (config->transport == distrain::TransportMode::kMutualTls &&
      NeedsJobTraffic(*cluster)) {
    std::string dir = Env("DISTRAIN_CREDENTIALS_DIR");
    if (dir.empty()) dir = distrain::kDefaultCredentialsDir;
    absl::StatusOr<distrain::LoadedCredentials> credentials = distrain::LoadCredentialsDir(dir);
    if (!credentials.ok()) {
      return Fail(kExitInvalidConfig,
                  absl::StrCat(
                      credentials.status().message(),
                      ". Job traffic is mutual TLS by default (spec.security.transport: "
                      "MutualTLS): the operator mounts each pod's credentials and `distrain run` "
                      "writes them; set DISTRAIN_CREDENTIALS_DIR to where they are, or opt out "
                      "with spec.security.transport: Plaintext"));
    }
    if (!(credentials->task == cluster->task())) {
      return Fail(kExitInvalidConfig,
                  absl::StrCat("the credentials in ", dir, " are ", credentials->task.ToString(),
                               "'s, but TF_CONFIG says this is ", cluster->task().ToString(),
                               "; every pod must get its own task's certificate"));
    }
    distrain::SetProcessTransportSecurity(
        std::make_shared<const distrain::TransportSecurity>(*std::move(credentials)));
    spdlog::info("job traffic: mutual TLS as {} (credentials from {})", cluster->task().ToString(),
                 dir);
  } else if (config->transport == distrain::TransportMode::kPlaintext &&
             NeedsJobTraffic(*cluster)) {
    spdlog::warn("job traffic is PLAINTEXT (spec.security.transport: Plaintext): anything that "
                 "reaches this pod's ports can join, push to or stop the job");
  }

  // 3. Strategy (refuses TPU and strategies this build lacks).
  auto strategy = CreateStrategy(*config);
  if (!strategy.ok()) {
    return Fail(strategy.status().code() == absl::StatusCode::kInvalidArgument
                    ? kExitInvalidConfig
                    : kExitUnsupported,
                std::string(strategy.status().message()));
  }

  // 4. Metrics + health.
  auto registry = std::make_shared<prometheus::Registry>();
  if (!auto_reason.empty()) {
    ExportAutoStrategy(*registry, StrategyName(config->strategy), auto_reason, auto_facts);
  }
  std::unique_ptr<MetricsServer> metrics_server;
  int metrics_port = metrics_port_flag;
  if (metrics_port < 0) {
    std::string env_port = Env("DISTRAIN_METRICS_PORT");
    if (env_port.empty()) {
      metrics_port = 0;
    } else if (!absl::SimpleAtoi(env_port, &metrics_port) || metrics_port < 0 || metrics_port > 65535) {
      return Fail(kExitInvalidConfig,
                  absl::StrCat("DISTRAIN_METRICS_PORT: must be a port number 0..65535, got \"",
                               env_port, "\""));
    }
  }
  // /healthz: whether training makes progress (worker/progress_watchdog.h).
  // Only the processes that run the Trainer take steps; the evaluator and
  // ParameterServer's ps and worker tasks answer OK while they serve.
  const bool trains = cluster->task().type != "evaluator" &&
                      !(config->strategy == StrategyKind::kParameterServer &&
                        (cluster->task().type == "ps" || cluster->task().type == "worker"));
  auto watchdog = std::make_shared<ProgressWatchdog>(config->run_policy.progress_deadline_seconds);
  if (metrics_port > 0) {
    MetricsServer::Check healthy = [watchdog, trains] {
      return trains ? watchdog->Check() : absl::OkStatus();
    };
    auto server = MetricsServer::StartWithChecks(ListenHost(), metrics_port, registry, healthy);
    if (!server.ok()) {
      return Fail(kExitInvalidConfig, std::string(server.status().message()));
    }
    metrics_server = std::move(*server);
    spdlog::info("metrics on :{}/metrics, health on :{}/healthz", metrics_port, metrics_port);
  }

  // 5. Train.
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  const std::string checkpoint_dir = !config->training.checkpoint.dir.empty()
                                         ? config->training.checkpoint.dir
                                     : !checkpoint_dir_flag.empty() ? checkpoint_dir_flag
                                                                    : Env("DISTRAIN_CHECKPOINT_DIR");
  if (cluster->task().type == "evaluator") {
    // Never part of the training cluster: evaluates the chief's checkpoints
    // from the shared directory (worker/evaluator.h).
    EvaluatorMetrics eval_metrics(*registry);
    auto options = EvaluatorOptionsFromEnv(checkpoint_dir);
    if (!options.ok()) {
      return Fail(kExitInvalidConfig, std::string(options.status().message()));
    }
    auto evaluator = Evaluator::Create(*config, *options, &eval_metrics);
    if (!evaluator.ok()) {
      return Fail(evaluator.status().code() == absl::StatusCode::kFailedPrecondition
                      ? kExitInvalidConfig
                      : kExitInvalidData,
                  std::string(evaluator.status().message()));
    }
    EvaluatorOutcome outcome = (*evaluator)->Run(g_stop);
    if (!outcome.status.ok()) return FailOutcome(outcome.exit_code, outcome.status);
    return outcome.exit_code;
  }

  // Strategies that checkpoint beside the chief read the resolved directory
  // from the config: ParameterServer's chief, and its ps tasks, which save
  // and restore only under their own directory (PsServiceOptions).
  config->training.checkpoint.dir = checkpoint_dir;

  // ParameterServer: ps and worker tasks run their own roles; the chief (the
  // coordinator) runs the Trainer below (worker/strategy/parameter_server.h).
  if (config->strategy == StrategyKind::kParameterServer &&
      (cluster->task().type == "ps" || cluster->task().type == "worker")) {
    const int code = cluster->task().type == "ps"
                         ? RunParameterServerTask(*config, *cluster, registry.get(), g_stop)
                         : RunPsWorkerTask(*config, *cluster, registry.get(), g_stop);
    return code == kExitTerminated && g_signal.load() == SIGINT ? kExitInterrupted : code;
  }

  TrainingMetrics metrics(*registry);
  TrainerEnv env;
  env.checkpoint_dir = checkpoint_dir;
  env.status_file = Env("DISTRAIN_STATUS_FILE");
  env.termination_message_file = Env("DISTRAIN_TERMINATION_MESSAGE_PATH");
  env.metrics = &metrics;
  env.watchdog = watchdog.get();
  watchdog->AttachGauge(&metrics.progress_deadline);
  Trainer trainer(*config, *cluster, env, std::move(*strategy));
  TrainOutcome outcome = trainer.Run(g_stop);
  if (outcome.exit_code == kExitTerminated && g_signal.load() == SIGINT) {
    outcome.exit_code = kExitInterrupted;
  }
  if (!outcome.status.ok() && outcome.exit_code != kExitTerminated &&
      outcome.exit_code != kExitInterrupted) {
    return FailOutcome(outcome.exit_code, outcome.status);
  }
  return outcome.exit_code;
}

// distrain-operator: reconciles DistributedTrainingJobs into pods, services
// and a truthful status (docs/architecture.md §7). Flags follow controller-runtime's
// names so manifests written for other operators read the same.
//
// Exit codes: 0 after SIGTERM/SIGINT (lease released); 1 when leadership was
// lost or the API server could not be reached at start; 2 bad flags;
// 3 bad kubeconfig.
#include <malloc.h>

#include <csignal>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "pplx/threadpool.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "operator/manager.h"
#include "operator/self_check.h"
#include "spdlog/spdlog.h"

namespace {

std::stop_source g_stop;

void OnSignal(int) { g_stop.request_stop(); }

// "host:port" or ":port" -> port; for the bind-address flags.
bool ParseBindAddress(const std::string& value, std::string* host, int* port) {
  size_t colon = value.rfind(':');
  if (colon == std::string::npos) return false;
  *host = value.substr(0, colon);
  if (host->empty()) *host = "0.0.0.0";
  try {
    size_t used = 0;
    *port = std::stoi(value.substr(colon + 1), &used);
    return used == value.size() - colon - 1 && *port >= 0 && *port <= 65535;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace distrain;
  CLI::App app{
      "distrain-operator: reconciles DistributedTrainingJob (distrain.io/v1alpha1) resources into "
      "chief / worker / ps / evaluator pods with a generated TF_CONFIG, one headless Service per "
      "replica, restarts, cleanup and status. Probes /healthz and /readyz on the health address, "
      "Prometheus metrics on the metrics address."};
  ManagerOptions options;
  std::string namespaces, metrics_address = ":8080", health_address = ":8081", log_level = "info";
  std::string lease_duration = "15s", renew_deadline = "10s", retry_period = "2s";
  bool version = false;
  app.add_option("--kubeconfig", options.kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG with its merge rules, else ~/.kube/config, "
                 "else the in-cluster ServiceAccount)");
  app.add_option("--context", options.context, "kubeconfig context (default: current-context)");
  app.add_option("--namespaces", namespaces,
                 "comma-separated namespaces whose jobs are reconciled (default: all)");
  app.add_option("--concurrent-reconciles", options.concurrent_reconciles,
                 "jobs reconciled in parallel")
      ->check(CLI::Range(1, 256));
  app.add_option("--kube-api-qps", options.qps, "client-side request rate limit (requests/s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kube-api-burst", options.burst, "client-side request burst")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--leader-elect", options.leader_elect,
               "elect a leader through a coordination.k8s.io Lease; only the leader reconciles");
  app.add_option("--leader-election-namespace", options.leader_election_namespace,
                 "namespace of the Lease (default: $POD_NAMESPACE, else the kubeconfig's)");
  app.add_option("--leader-election-id", options.leader_election_id, "name of the Lease");
  app.add_option("--leader-election-lease-duration", lease_duration,
                 "how long a lease is valid without renewal");
  app.add_option("--leader-election-renew-deadline", renew_deadline,
                 "how long the leader keeps trying to renew before it gives up (and exits)");
  app.add_option("--leader-election-retry-period", retry_period,
                 "interval between attempts to acquire or renew");
  app.add_option("--metrics-bind-address", metrics_address,
                 "address of the Prometheus endpoint (/metrics); \"0\" disables it");
  app.add_option("--health-probe-bind-address", health_address,
                 "address of /healthz and /readyz; \"0\" disables it");
  std::string progress_timeout = "2s";
  app.add_option("--progress-scrape-timeout", progress_timeout,
                 "deadline of each scrape of a chief's /metrics for status.progress (each job's own)");
  app.add_option("--progress-scrape-max-bytes", options.progress_scrape_max_bytes,
                 "the most bytes read from one chief's /metrics; a larger answer is skipped")
      ->check(CLI::Range(size_t{1024}, size_t{64} << 20));
  app.add_option("--progress-scrape-concurrency", options.progress_scrape_concurrency,
                 "chiefs' /metrics scraped at once (memory: this times --progress-scrape-max-bytes)")
      ->check(CLI::Range(1, 1024));
  options.default_worker_image = std::string("localhost/distrain/worker:") + DISTRAIN_VERSION;
  app.add_option("--worker-image", options.default_worker_image,
                 "image of a replica whose template names none: the worker image of this "
                 "operator's version (a versioned tag, so the kubelet pulls it only when the node "
                 "lacks it; the chart passes its workerImage)")
      ->capture_default_str();
  options.default_worker_cuda_image =
      std::string("localhost/distrain/worker-cuda:") + DISTRAIN_VERSION;
  app.add_option("--worker-cuda-image", options.default_worker_cuda_image,
                 "image of a replica whose template names none and requests nvidia.com/gpu: "
                 "the worker's CUDA variant (the CPU image has no cuBLAS, cuDNN or NCCL; the "
                 "chart passes its workerCudaImage)")
      ->capture_default_str();
  app.add_option("--cluster-domain", options.cluster_domain,
                 "appended to the replicas' host names in TF_CONFIG (\"cluster.local\" gives "
                 "<job>-worker-0.<ns>.svc.cluster.local), for images whose resolver ignores the DNS "
                 "search path (default \"\": <job>-worker-0.<ns>.svc)");
  app.add_option("--network-policy", options.network_policy,
                 "create a NetworkPolicy per job admitting only its own pods (and the metrics peers "
                 "on the metrics port); false: none (default: true)");
  app.add_option("--network-policy-metrics-peer", options.network_policy_metrics_peers,
                 "a NetworkPolicyPeer as JSON admitted to the jobs' metrics port (repeatable; "
                 "default: the operator's namespace, $POD_NAMESPACE)");
  app.add_option("--checkpoint-volumes", options.checkpoint_volumes,
                 "provision a PersistentVolumeClaim <job>-checkpoints for every job that names no "
                 "checkpoint storage of its own (spec.training.checkpoint.volume); false: none, "
                 "and no RBAC on persistentvolumeclaims is needed (default: true)");
  app.add_option("--checkpoint-storage-class", options.checkpoint_storage_class,
                 "StorageClass of the provisioned checkpoint claims (default \"\": the cluster's "
                 "default class); spec.training.checkpoint.storage.storageClassName overrides");
  app.add_option("--checkpoint-storage-size", options.checkpoint_storage_size,
                 "size of the provisioned checkpoint claims (default 1Gi); "
                 "spec.training.checkpoint.storage.size overrides")
      ->check([](const std::string& v) {
        return IsStorageQuantity(v) ? std::string()
                                    : "must be a Kubernetes storage quantity such as 10Gi or 500Mi";
      });
  app.add_option("--checkpoint-access-mode", options.checkpoint_access_mode,
                 "access mode of the provisioned checkpoint claims: ReadWriteOnce (the chief, PS and "
                 "Evaluator kept on one node) or ReadWriteMany (every pod mounts it) (default "
                 "ReadWriteOnce)")
      ->check(CLI::IsMember({"ReadWriteOnce", "ReadWriteMany"}));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_flag("--version", version, "print the version and exit");
  // `check`: the Helm test hook's probe of an installed operator (self_check.h).
  SelfCheckOptions check_options;
  std::string check_wait = "30s";
  bool check_standby_ok = false;
  CLI::App* check = app.add_subcommand(
      "check", "check a running operator from outside: /readyz answers 200, /metrics reports "
               "leader_election_master_status 1, the API server serves the CRD; exit 0 when all pass, 1 otherwise");
  check->add_option("--readyz-url", check_options.readyz_url, "URL of the operator's /readyz (\"\": skip)");
  check->add_option("--metrics-url", check_options.metrics_url, "URL of the operator's /metrics (\"\": skip)");
  check->add_flag("--no-leader-election", check_standby_ok,
                  "the operator runs without --leader-elect: do not require leader_election_master_status");
  check->add_option("--crd", check_options.crd,
                    "plural.group/version whose serving to check through the API server, e.g. "
                    "distributedtrainingjobs.distrain.io/v1alpha1 (\"\": skip)");
  check->add_option("--wait", check_wait, "retry each check this long before failing");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (version) {
    std::cout << "distrain-operator " << DISTRAIN_VERSION << "\n";
    return kExitOk;
  }
  if (*check) {
    InitLogging("warn");
    if (!absl::ParseDuration(check_wait, &check_options.wait) || check_options.wait < absl::ZeroDuration()) {
      std::cerr << "check --wait: must be a duration such as 30s, got \"" << check_wait << "\"\n";
      return kExitUsage;
    }
    check_options.require_leader = !check_standby_ok;
    check_options.kubeconfig = options.kubeconfig;
    absl::Status s = RunSelfCheck(check_options, [](const std::string& line) { std::cout << line << std::endl; });
    if (!s.ok()) {
      std::cout << "FAIL: " << s.message() << std::endl;
      return 1;
    }
    std::cout << "the operator works" << std::endl;
    return kExitOk;
  }
  InitLogging(log_level);
  // Debian's abseil is built without NDEBUG, so every Mutex lock also runs
  // the deadlock detector's graph bookkeeping (0.6% of a ps task's CPU). The
  // tests keep it; the shipped binary does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Footprint (target: <= 40 MB RSS while watching 200 jobs). glibc gives
  // every thread that allocates an arena of its own; the parallel creates of
  // a large job touch dozens, and that memory is never returned. Two arenas
  // are plenty for a process whose work is I/O. cpprestsdk's default pool of
  // 40 threads is sized for servers; the operator's requests are short (the
  // blocking watch streams run on the informers' own threads). Every request
  // hops between a caller thread and this pool, and a larger pool mostly adds
  // futex handoffs: on the 500-worker burst (bench/operator_scale.py) 8
  // threads cost 1.0 s of operator CPU and 2 threads 0.6 s, at 225 against
  // 270-310 pods/s; 1 thread was no cheaper and slower (TLS for 64
  // connections on one thread).
  mallopt(M_ARENA_MAX, 2);
  crossplat::threadpool::initialize_with_threads(2);

  for (absl::string_view ns : absl::StrSplit(namespaces, ',', absl::SkipWhitespace())) {
    options.namespaces.emplace_back(ns);
  }
  struct DurationFlag {
    const char* flag;
    const std::string& value;
    absl::Duration* out;
  };
  for (const DurationFlag& d :
       {DurationFlag{"--leader-election-lease-duration", lease_duration, &options.lease_duration},
        DurationFlag{"--leader-election-renew-deadline", renew_deadline, &options.renew_deadline},
        DurationFlag{"--leader-election-retry-period", retry_period, &options.retry_period},
        DurationFlag{"--progress-scrape-timeout", progress_timeout, &options.progress_scrape_timeout}}) {
    if (!absl::ParseDuration(d.value, d.out) || *d.out <= absl::ZeroDuration()) {
      std::cerr << d.flag << ": must be a positive duration such as 15s or 500ms, got \"" << d.value
                << "\"\n";
      return kExitUsage;
    }
  }
  if (options.renew_deadline >= options.lease_duration ||
      options.retry_period >= options.renew_deadline) {
    std::cerr << "--leader-election-*: need retry-period < renew-deadline < lease-duration (got "
              << retry_period << " / " << renew_deadline << " / " << lease_duration << ")\n";
    return kExitUsage;
  }
  struct AddressFlag {
    const char* flag;
    const std::string& value;
    std::string* host;
    int* port;
  };
  for (const AddressFlag& a :
       {AddressFlag{"--metrics-bind-address", metrics_address, &options.metrics_host,
                    &options.metrics_port},
        AddressFlag{"--health-probe-bind-address", health_address, &options.health_host,
                    &options.health_port}}) {
    if (a.value == "0") {
      *a.port = 0;
    } else if (!ParseBindAddress(a.value, a.host, a.port) || *a.port == 0) {
      std::cerr << a.flag << ": must be host:port or :port (or 0 to disable), got \"" << a.value
                << "\"\n";
      return kExitUsage;
    }
  }

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  auto manager = Manager::Create(options);
  if (!manager.ok()) {
    spdlog::error("{}", manager.status().message());
    return manager.status().code() == absl::StatusCode::kInvalidArgument ? kExitInvalidConfig
                                                                         : kExitInternal;
  }
  absl::Status result = (*manager)->Run(g_stop.get_token());
  if (!result.ok()) {
    spdlog::error("{}", result.message());
    return kExitInternal;
  }
  spdlog::info("stopped");
  return kExitOk;
}

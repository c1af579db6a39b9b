#include "cli/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_identity.h"
#include "common/cluster_spec.h"
#include "common/exit_codes.h"

namespace distrain {

absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status error;
  for (int i = 0; i < count && error.ok(); ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      error = absl::InternalError(absl::StrCat("socket(): ", std::strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      error = absl::UnavailableError(absl::StrCat("cannot find a free port on 127.0.0.1: ",
                                                  std::strerror(errno)));
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  if (!error.ok()) return error;
  return ports;
}

bool IsCoordinator(const JobConfig& config, const LocalReplica& replica) {
  if (config.replicas_of(ReplicaType::kChief) > 0) return replica.type == ReplicaType::kChief;
  return replica.type == ReplicaType::kWorker && replica.index == 0;
}

bool ShouldRestartLocally(const JobConfig& config, const LocalReplica& replica, int exit_code,
                          int restarts) {
  if (replica.type != ReplicaType::kWorker || exit_code == 0) return false;
  const bool rejoins_in_place = config.strategy == StrategyKind::kMultiWorkerMirrored &&
                                config.run_policy.recovery_policy == RecoveryPolicy::kInPlace &&
                                !IsCoordinator(config, replica) &&
                                exit_code != kExitTerminated;  // a stop the others share
  if (config.strategy != StrategyKind::kParameterServer && !rejoins_in_place) return false;
  const int64_t limit = config.run_policy.backoff_limit.value_or(kDefaultLocalRestarts);
  if (restarts >= limit) return false;
  auto spec = config.replicas.find(ReplicaType::kWorker);
  const RestartPolicy policy =
      spec == config.replicas.end() ? RestartPolicy::kExitCode : spec->second.restart_policy;
  return ShouldRestart(policy, exit_code);
}

absl::StatusOr<std::vector<LocalReplica>> PlanLocalCluster(const JobConfig& config,
                                                           const LocalClusterOptions& options) {
  const ReplicaType kOrder[] = {ReplicaType::kChief, ReplicaType::kWorker, ReplicaType::kPS,
                                ReplicaType::kEvaluator};
  int total = 0;
  for (ReplicaType t : kOrder) total += config.replicas_of(t);
  auto ports = FreeLoopbackPorts(2 * total);
  if (!ports.ok()) return ports.status();

  std::map<std::string, std::vector<std::string>> jobs;
  std::vector<LocalReplica> replicas;
  int next_port = 0;
  for (ReplicaType t : kOrder) {
    for (int i = 0; i < config.replicas_of(t); ++i) {
      LocalReplica r;
      r.type = t;
      r.index = i;
      r.label = absl::StrCat(ReplicaTaskType(t), "-", i);
      r.name = absl::StrCat(config.name, "-", r.label);
      jobs[ReplicaTaskType(t)].push_back(absl::StrCat("127.0.0.1:", (*ports)[next_port++]));
      r.env["DISTRAIN_METRICS_PORT"] = absl::StrCat((*ports)[next_port++]);
      replicas.push_back(std::move(r));
    }
  }

  // Processes share the machine's cores; without this each BLAS pool would
  // start one thread per core in every process and thrash.
  int cores = options.cpu_cores > 0 ? options.cpu_cores
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int blas_threads = std::max(1, cores / std::max(1, total));
  // NCCL across workers: training process t gets GPUs [t * per, (t + 1) * per).
  std::vector<std::vector<std::string>> gpu_slices;
  if (config.strategy == StrategyKind::kMultiWorkerMirrored &&
      config.training.communication.implementation == CollectiveImplementation::kNccl) {
    const int processes =
        config.replicas_of(ReplicaType::kChief) + config.replicas_of(ReplicaType::kWorker);
    const int gpus = static_cast<int>(options.gpu_ids.size());
    const int per = config.training.local_replicas > 0 ? config.training.local_replicas
                                                       : std::max(1, gpus / std::max(1, processes));
    if (processes * per > gpus) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec.training.communication.implementation: NCCL puts one rank on each GPU, and ",
          processes, " MultiWorkerMirrored process(es) x ", per, " local replica(s) need ",
          processes * per, " GPUs, but this machine shows distrain run ", gpus,
          "; use implementation: Ring (or Auto) to share the GPUs through host memory, or fewer "
          "replicas"));
    }
    for (int t = 0; t < processes; ++t) {
      gpu_slices.emplace_back(options.gpu_ids.begin() + t * per,
                              options.gpu_ids.begin() + (t + 1) * per);
    }
  }
  const std::string job_json = JobConfigToJson(config);
  int training_process = 0;
  for (LocalReplica& r : replicas) {
    if (!gpu_slices.empty() &&
        (r.type == ReplicaType::kChief || r.type == ReplicaType::kWorker)) {
      r.env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(gpu_slices[training_process++], ",");
    }
    auto spec = ClusterSpec::Create(jobs, TaskId{ReplicaTaskType(r.type), r.index});
    if (!spec.ok()) return spec.status();
    r.env["TF_CONFIG"] = spec->ToJson();
    r.env["DISTRAIN_JOB_CONFIG"] = job_json;
    r.env["DISTRAIN_CHECKPOINT_DIR"] = options.checkpoint_dir;
    r.env["DISTRAIN_STATUS_FILE"] = absl::StrCat(options.work_dir, "/", r.label, ".status.json");
    r.env["POD_NAME"] = r.name;
    r.env["POD_NAMESPACE"] = config.namespace_;
    r.env["OPENBLAS_NUM_THREADS"] = absl::StrCat(blas_threads);
  }
  return replicas;
}

absl::Status WriteLocalCredentials(const JobConfig& config, const std::string& work_dir,
                                   std::vector<LocalReplica>* replicas) {
  if (config.transport == TransportMode::kPlaintext || replicas->size() < 2) {
    return absl::OkStatus();
  }
  absl::StatusOr<JobAuthority> authority =
      NewJobAuthority(absl::StrCat(config.namespace_, "/", config.name));
  if (!authority.ok()) return authority.status();
  const std::string root = absl::StrCat(work_dir, "/identity");
  if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", root, ": ", std::strerror(errno)));
  }
  for (LocalReplica& r : *replicas) {
    absl::StatusOr<TaskCredentials> creds =
        IssueTaskCredentials(*authority, TaskId{ReplicaTaskType(r.type), r.index});
    if (!creds.ok()) return creds.status();
    const std::string dir = absl::StrCat(root, "/", r.label);
    if (absl::Status s = WriteCredentialsDir(dir, *authority, *creds); !s.ok()) return s;
    r.env["DISTRAIN_CREDENTIALS_DIR"] = dir;
  }
  return absl::OkStatus();
}

}  // namespace distrain

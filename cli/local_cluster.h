#ifndef DISTRAIN_CLI_LOCAL_CLUSTER_H_
#define DISTRAIN_CLI_LOCAL_CLUSTER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"

namespace distrain {

// One replica process of a local run, with exactly the environment the
// operator gives the corresponding pod (docs/architecture.md §5), addresses on 127.0.0.1.
struct LocalReplica {
  std::string name;  // "<job>-worker-0": the pod name the operator would use
  std::string label; // "worker-0": the prefix of its output lines
  ReplicaType type = ReplicaType::kWorker;
  int index = 0;
  std::map<std::string, std::string> env;
};

struct LocalClusterOptions {
  std::string work_dir;        // status files live here
  std::string checkpoint_dir;  // DISTRAIN_CHECKPOINT_DIR for every replica
  int cpu_cores = 0;           // 0: detect; spreads BLAS threads over the replicas
  // The GPUs `distrain run` sees, as CUDA_VISIBLE_DEVICES names them to a
  // child (its own list when set, else "0".."n-1"). MultiWorkerMirrored with
  // implementation: NCCL gives each training process its own slice of them,
  // as the device plugin gives each pod its own GPUs (NCCL puts one rank on
  // a GPU); every other job leaves CUDA_VISIBLE_DEVICES as it is.
  std::vector<std::string> gpu_ids;
};

// Lays out the job on this machine: one free loopback port per task for
// TF_CONFIG, one for metrics, replicas in TF_CONFIG order (chief, worker, ps,
// evaluator). Ports are reserved by binding them all before releasing any, so
// no two tasks share one. FAILED_PRECONDITION (naming the field) when
// MultiWorkerMirrored's NCCL needs more GPUs than options.gpu_ids holds.
absl::StatusOr<std::vector<LocalReplica>> PlanLocalCluster(const JobConfig& config,
                                                           const LocalClusterOptions& options);

// Gives every replica what the operator's "<job>-identity" Secret gives its
// pod (docs/security.md): a fresh CA for this run, a certificate per task and
// the ring key, written to <work_dir>/identity/<label>/ (0700 directory, 0600
// files), and DISTRAIN_CREDENTIALS_DIR pointing there. Nothing for
// spec.security.transport: Plaintext, or a job of one process.
absl::Status WriteLocalCredentials(const JobConfig& config, const std::string& work_dir,
                                   std::vector<LocalReplica>* replicas);

// The replica whose success means the job's success under the Default policy:
// the chief, or worker 0 when there is no chief.
bool IsCoordinator(const JobConfig& config, const LocalReplica& replica);

// Whether `distrain run` restarts a replica that exited with `exit_code`
// (non-zero, after `restarts` earlier restarts of it) instead of failing the
// job, as the operator's restart policy would on a cluster. Only replicas
// whose peers go on without them: ParameterServer workers (the chief
// re-queues a lost worker's closure and re-admits the worker when it is
// back) and, under runPolicy.recoveryPolicy InPlace, MultiWorkerMirrored
// workers other than the coordinator (the survivors wait for the restarted
// process and take it back into their group). The replica's
// restartPolicy decides (Never: no; OnFailure, Always: yes; ExitCode:
// retryable codes 128-255 only), at most runPolicy.backoffLimit times
// (unset: kDefaultLocalRestarts).
inline constexpr int kDefaultLocalRestarts = 3;
bool ShouldRestartLocally(const JobConfig& config, const LocalReplica& replica, int exit_code,
                          int restarts);

// Allocates `count` distinct free TCP ports on 127.0.0.1.
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count);

}  // namespace distrain

#endif  // DISTRAIN_CLI_LOCAL_CLUSTER_H_

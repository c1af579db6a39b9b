#ifndef DISTRAIN_CLI_KUBECTL_DTJ_KUBECTL_DTJ_H_
#define DISTRAIN_CLI_KUBECTL_DTJ_KUBECTL_DTJ_H_

// kubectl-dtj: the kubectl plugin for DistributedTrainingJobs
// (`kubectl dtj status|wait|logs <job>`). main.cc parses the flags; the
// commands here talk to the API server through operator/kube's RestClient and
// write to the given streams, so they are what the kube-tier test
// (tests/kube/kubectl_dtj_test.cc) exercises through the binary.
//
// Exit codes (also in --help):
//   status, logs: 0 done; 1 the job, its pods or the API server could not be read.
//   wait:         0 Succeeded; 1 Failed; 3 timed out; 4 the job could not be
//                 read (not found, deleted while waiting, API unreachable).
//   all:          2 bad usage.
//
// Free functions; each command uses its own client and streams. The pure
// helpers are thread-safe.

#include <chrono>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "operator/kube/client.h"
#include "operator/kube/rest_client.h"

namespace distrain::kubectl_dtj {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;   // wait: the job Failed; status/logs: an error
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 3;  // wait
inline constexpr int kExitError = 4;    // wait: the job could not be read

// Where the commands look: the namespace and the job's name.
struct Target {
  std::string namespace_name;
  std::string job;
};

// Connection flags, as kubectl has them.
struct ConnectionFlags {
  std::string kubeconfig;      // --kubeconfig
  std::string context;         // --context
  std::string namespace_name;  // -n/--namespace; empty: the context's namespace
};

// A client for the flags; `namespace_name` receives the namespace to use.
absl::StatusOr<std::unique_ptr<kube::RestClient>> Connect(const ConnectionFlags& flags,
                                                          std::string* namespace_name);

// GET the job. kNotFound says "no DistributedTrainingJob X in namespace Y;
// kubectl get dtj -n Y"; other failures name the server and the answer.
absl::StatusOr<nlohmann::json> GetJob(kube::Client& client, const Target& target);

// What a job's status says, from status.conditions (docs/architecture.md §3).
struct JobState {
  std::string state;    // status.state, or the most decisive True condition; "" when none
  std::string reason;   // of that condition
  std::string message;
  bool succeeded = false;
  bool failed = false;
  bool terminal() const { return succeeded || failed; }
  // "Running", "Failed (BackoffLimitExceeded: job has failed 4 times)", "Pending" when empty.
  std::string ToString() const;
};
JobState StateOf(const nlohmann::json& job);

// `kubectl dtj status`: the job's strategy, state, replicas, progress, times,
// pods and last events, as text on `out`. Errors go to `err`. Returns the exit code.
int RunStatus(kube::Client& client, const Target& target, std::ostream& out, std::ostream& err);

// The text of RunStatus from what it read (pure; `now` for ages).
std::string RenderStatus(const nlohmann::json& job, const nlohmann::json& pods,
                         const nlohmann::json& events, std::chrono::system_clock::time_point now);

struct WaitOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // <= 0: forever
  // Pause before re-opening a watch that failed or ended.
  std::chrono::milliseconds reconnect_backoff{1000};
};

// `kubectl dtj wait`: LIST the job (fieldSelector metadata.name=<job>), then
// WATCH it from that resourceVersion, re-listing after a 410 and reconnecting
// after any error, until it is Succeeded or Failed or the timeout passes.
// Prints each state change on `out` as it happens. Returns the exit code.
int RunWait(kube::Client& client, const Target& target, const WaitOptions& options,
            std::ostream& out, std::ostream& err);

struct LogsOptions {
  bool follow = false;
  std::optional<int64_t> tail_lines;  // --tail; unset: everything
  std::string replica_type;           // --replica-type (chief, worker, ps, evaluator); empty: all
  std::string container;              // --container; empty: "distrain", else the first one
};

// `kubectl dtj logs`: the logs of every replica pod of the job (label
// distrain.io/job-name), each line prefixed "[worker-0] " like `distrain run`.
// Without follow, pod after pod (chief, workers, ps, evaluators by index);
// with follow, one stream per pod at once, lines interleaved whole. A pod that
// is not on a node yet gets a message on `err` instead. Returns the exit code
// (1 when any pod's log could not be read).
int RunLogs(kube::RestClient& client, const Target& target, const LogsOptions& options,
            std::ostream& out, std::ostream& err);

// "[worker-0] " from the pod's replica-type/replica-index labels, or
// "[<pod name>] " without them.
std::string LogPrefix(const nlohmann::json& pod);

}  // namespace distrain::kubectl_dtj

#endif  // DISTRAIN_CLI_KUBECTL_DTJ_KUBECTL_DTJ_H_

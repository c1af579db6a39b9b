// kubectl-dtj: `kubectl dtj status|wait|logs <job>` (kubectl runs any
// kubectl-<name> on $PATH as `kubectl <name>`). See kubectl_dtj.h and the
// README's "kubectl plugin" section.

#include <charconv>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "cli/kubectl_dtj/kubectl_dtj.h"

namespace {

namespace dtj = distrain::kubectl_dtj;

constexpr char kExitCodes[] =
    "Exit codes: 0 done; 1 error (status, logs); 2 bad usage.\n"
    "wait: 0 the job Succeeded, 1 it Failed, 3 timed out, 4 the job could not be read.";

void AddConnectionFlags(CLI::App* cmd, dtj::ConnectionFlags* flags) {
  cmd->add_option("-n,--namespace", flags->namespace_name,
                  "namespace of the job (default: the kubeconfig context's namespace)");
  cmd->add_option("--kubeconfig", flags->kubeconfig,
                  "kubeconfig file (default: $KUBECONFIG, merged like kubectl, else ~/.kube/config)");
  cmd->add_option("--context", flags->context, "kubeconfig context (default: current-context)");
}

// Go-style durations as kubectl takes them ("90s", "10m", "1h30m"); a bare
// number is seconds; 0 waits forever.
bool ParseTimeout(std::string text, std::chrono::milliseconds* out) {
  absl::StripAsciiWhitespace(&text);
  int64_t seconds = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec == std::errc() && ptr == text.data() + text.size() && seconds >= 0) {
    *out = std::chrono::seconds(seconds);
    return true;
  }
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return false;
  }
  *out = absl::ToChronoMilliseconds(d);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kubectl dtj: status, wait and logs of distrain DistributedTrainingJobs."};
  app.name("kubectl dtj");
  app.require_subcommand(1);
  app.footer(kExitCodes);
  app.set_version_flag("--version", std::string("kubectl-dtj ") + DISTRAIN_VERSION);

  dtj::ConnectionFlags connection;
  dtj::Target target;

  CLI::App* status_cmd = app.add_subcommand(
      "status", "Strategy, state, replicas, progress (step, loss, examples/s), times, pods and the "
                "last events of a job");
  status_cmd->add_option("job", target.job, "the DistributedTrainingJob's name")->required();
  AddConnectionFlags(status_cmd, &connection);

  std::string timeout_text = "10m";
  CLI::App* wait_cmd = app.add_subcommand(
      "wait", "Wait until a job Succeeded (exit 0) or Failed (exit 1, with reason and message), "
              "printing its state changes; exit 3 on timeout");
  wait_cmd->add_option("job", target.job, "the DistributedTrainingJob's name")->required();
  wait_cmd->add_option("--timeout", timeout_text,
                       "how long to wait: 90s, 10m, 2h (0: forever)")
      ->capture_default_str();
  AddConnectionFlags(wait_cmd, &connection);

  dtj::LogsOptions logs;
  int64_t tail = -1;
  CLI::App* logs_cmd = app.add_subcommand(
      "logs", "Logs of every replica pod of a job, each line prefixed [worker-0]; -f follows all "
              "pods at once (pods created later are not picked up: run it again)");
  logs_cmd->add_option("job", target.job, "the DistributedTrainingJob's name")->required();
  logs_cmd->add_flag("-f,--follow", logs.follow, "stream the logs as they grow");
  logs_cmd->add_option("--tail", tail, "only the last N lines of each pod (-1: all)")
      ->capture_default_str();
  logs_cmd->add_option("--replica-type", logs.replica_type, "only this replica type")
      ->check(CLI::IsMember({"chief", "worker", "ps", "evaluator"}, CLI::ignore_case));
  logs_cmd->add_option("-c,--container", logs.container,
                       "container (default: distrain, else the pod's first)");
  AddConnectionFlags(logs_cmd, &connection);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? dtj::kExitOk : dtj::kExitUsage;
  }

  dtj::WaitOptions wait;
  if (*wait_cmd && !ParseTimeout(timeout_text, &wait.timeout)) {
    std::cerr << "error: --timeout " << timeout_text
              << " is not a duration; use e.g. 90s, 10m or 1h30m (0 waits forever)\n";
    return dtj::kExitUsage;
  }
  if (tail >= 0) logs.tail_lines = tail;
  logs.replica_type = absl::AsciiStrToLower(logs.replica_type);

  auto client = dtj::Connect(connection, &target.namespace_name);
  if (!client.ok()) {
    std::cerr << "error: " << client.status().message() << "\n";
    return *wait_cmd ? dtj::kExitError : dtj::kExitFailed;
  }
  if (*status_cmd) return dtj::RunStatus(**client, target, std::cout, std::cerr);
  if (*wait_cmd) return dtj::RunWait(**client, target, wait, std::cout, std::cerr);
  if (*logs_cmd) return dtj::RunLogs(**client, target, logs, std::cout, std::cerr);
  return dtj::kExitUsage;
}

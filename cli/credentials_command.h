#ifndef DISTRAIN_CLI_CREDENTIALS_COMMAND_H_
#define DISTRAIN_CLI_CREDENTIALS_COMMAND_H_

// `distrain credentials`: the job credentials the operator's "<job>-identity"
// Secret holds, as files, for processes started by hand (VMs, Slurm, the
// benchmarks): a fresh CA, a certificate per task and the ring key, one
// directory per task (<output>/<type>-<index>/) to pass to that task's
// worker as DISTRAIN_CREDENTIALS_DIR (docs/security.md).

#include <string>
#include <vector>

namespace distrain {

struct CredentialsOptions {
  std::string job = "job";          // for the CA's subject
  std::string output;               // parent directory
  std::vector<std::string> tasks;   // "chief:0", "worker:1", ...
};

// Exit codes: common/exit_codes.h (usage errors name the bad task).
int CredentialsCommand(const CredentialsOptions& options);

}  // namespace distrain

#endif  // DISTRAIN_CLI_CREDENTIALS_COMMAND_H_

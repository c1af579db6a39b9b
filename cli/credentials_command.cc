#include "cli/credentials_command.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/job_identity.h"

namespace distrain {

int CredentialsCommand(const CredentialsOptions& options) {
  std::vector<TaskId> tasks;
  for (const std::string& text : options.tasks) {
    absl::StatusOr<TaskId> task = ParseTaskCommonName(text);
    if (!task.ok()) {
      std::cerr << "distrain credentials: task \"" << text
                << "\": want chief:0, worker:N, ps:N or evaluator:0\n";
      return kExitUsage;
    }
    tasks.push_back(*task);
  }
  if (tasks.empty()) {
    std::cerr << "distrain credentials: name at least one task (e.g. chief:0 worker:0)\n";
    return kExitUsage;
  }
  if (::mkdir(options.output.c_str(), 0700) != 0 && errno != EEXIST) {
    std::cerr << "distrain credentials: cannot create " << options.output << ": "
              << std::strerror(errno) << "\n";
    return kExitUsage;
  }
  absl::StatusOr<JobAuthority> authority = NewJobAuthority(options.job);
  if (!authority.ok()) {
    std::cerr << "distrain credentials: " << authority.status().message() << "\n";
    return kExitInternal;
  }
  for (const TaskId& task : tasks) {
    absl::StatusOr<TaskCredentials> creds = IssueTaskCredentials(*authority, task);
    const std::string dir = absl::StrCat(options.output, "/", task.type, "-", task.index);
    absl::Status s = creds.ok() ? WriteCredentialsDir(dir, *authority, *creds) : creds.status();
    if (!s.ok()) {
      std::cerr << "distrain credentials: " << task.ToString() << ": " << s.message() << "\n";
      return kExitInternal;
    }
    std::cout << task.ToString() << "\t" << dir << "\n";
  }
  return kExitOk;
}

}  // namespace distrain

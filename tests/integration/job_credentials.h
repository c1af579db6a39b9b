#ifndef DISTRAIN_TESTS_INTEGRATION_JOB_CREDENTIALS_H_
#define DISTRAIN_TESTS_INTEGRATION_JOB_CREDENTIALS_H_

// The credentials of one test job, per task, as the operator's
// "<job>-identity" Secret gives each pod its own (docs/security.md): tests
// that start worker processes themselves pass DirFor(task) as
// DISTRAIN_CREDENTIALS_DIR. Not thread-safe (tests start processes from one
// thread).

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_identity.h"
#include "gtest/gtest.h"

namespace distrain::testing {

class TestJobCredentials {
 public:
  explicit TestJobCredentials(std::string dir) : dir_(std::move(dir)) {
    absl::StatusOr<JobAuthority> authority = NewJobAuthority("test/" + dir_);
    EXPECT_TRUE(authority.ok()) << authority.status();
    if (authority.ok()) authority_ = *std::move(authority);
  }

  // The credentials directory of `type`:`index`, written on first use.
  std::string DirFor(const std::string& type, int index) {
    const std::string dir = absl::StrCat(dir_, "/identity-", type, "-", index);
    if (written_[dir]) return dir;
    absl::StatusOr<TaskCredentials> creds = IssueTaskCredentials(authority_, TaskId{type, index});
    EXPECT_TRUE(creds.ok()) << creds.status();
    if (creds.ok()) {
      absl::Status s = WriteCredentialsDir(dir, authority_, *creds);
      EXPECT_TRUE(s.ok()) << s;
    }
    written_[dir] = true;
    return dir;
  }

 private:
  std::string dir_;
  JobAuthority authority_;
  std::map<std::string, bool> written_;
};

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_JOB_CREDENTIALS_H_

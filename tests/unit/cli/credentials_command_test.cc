// `distrain credentials`: one directory per task that a hand-started worker
// loads as its job identity; all of one job (the same CA and ring key).
#include "cli/credentials_command.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/exit_codes.h"
#include "common/job_identity.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

TEST(CredentialsCommandTest, WritesOneLoadableDirectoryPerTaskOfOneJob) {
  const std::string dir = ::testing::TempDir() + "/credentials_command_test";
  std::filesystem::remove_all(dir);
  CredentialsOptions options;
  options.output = dir;
  options.tasks = {"chief:0", "worker:1", "ps:0"};
  ASSERT_EQ(CredentialsCommand(options), kExitOk);
  auto chief = LoadCredentialsDir(dir + "/chief-0");
  auto worker = LoadCredentialsDir(dir + "/worker-1");
  auto ps = LoadCredentialsDir(dir + "/ps-0");
  ASSERT_TRUE(chief.ok() && worker.ok() && ps.ok()) << chief.status() << worker.status();
  EXPECT_EQ(worker->task, (TaskId{"worker", 1}));
  EXPECT_EQ(chief->ca_cert_pem, ps->ca_cert_pem);  // one job
  EXPECT_EQ(chief->ring_key, worker->ring_key);
  EXPECT_EQ(std::filesystem::status(dir + "/ps-0/tls.key").permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  std::filesystem::remove_all(dir);
}

TEST(CredentialsCommandTest, ATaskThatIsNotOneIsAUsageError) {
  CredentialsOptions options;
  options.output = ::testing::TempDir() + "/credentials_command_bad";
  options.tasks = {"chief:0", "master:0"};
  EXPECT_EQ(CredentialsCommand(options), kExitUsage);
  EXPECT_FALSE(std::filesystem::exists(options.output + "/chief-0"));
}

}  // namespace
}  // namespace distrain

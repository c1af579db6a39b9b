// A job's credentials: a task's certificate is accepted only under its own
// job's CA, names its task, and the directory the worker loads round-trips.
#include "common/job_identity.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace distrain {
namespace {

TEST(JobIdentityTest, IssuedCertificateNamesItsTaskAndChainsToItsJobOnly) {
  auto job = NewJobAuthority("team-a/mnist");
  auto other_job = NewJobAuthority("team-b/mnist");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(other_job.ok()) << other_job.status();
  EXPECT_NE(job->ring_key_hex, other_job->ring_key_hex);
  EXPECT_EQ(job->ring_key_hex.size(), 64u);

  auto creds = IssueTaskCredentials(*job, TaskId{"worker", 2});
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto loaded = CheckCredentials(job->ca_cert_pem, *creds, job->ring_key_hex);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->task, (TaskId{"worker", 2}));
  EXPECT_EQ(loaded->ring_key.size(), 32u);

  // Another job's CA does not vouch for this job's certificate.
  auto foreign = CheckCredentials(other_job->ca_cert_pem, *creds, job->ring_key_hex);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("not valid under ca.crt"), std::string::npos)
      << foreign.status();
}

TEST(JobIdentityTest, KeyOfAnotherTaskAndBadRingKeyAreRefusedNamingTheFile) {
  auto job = NewJobAuthority("ns/job");
  ASSERT_TRUE(job.ok());
  auto a = IssueTaskCredentials(*job, TaskId{"chief", 0});
  auto b = IssueTaskCredentials(*job, TaskId{"ps", 1});
  ASSERT_TRUE(a.ok() && b.ok());
  auto swapped = CheckCredentials(job->ca_cert_pem, TaskCredentials{a->cert_pem, b->key_pem},
                                  job->ring_key_hex);
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("tls.key is not the key of tls.crt"),
            std::string::npos);
  auto short_key = CheckCredentials(job->ca_cert_pem, *a, "abcd");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("ring.key"), std::string::npos);
  auto garbage = CheckCredentials("not a pem", *a, job->ring_key_hex);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("ca.crt"), std::string::npos);
}

TEST(JobIdentityTest, CommonNamesOtherThanTasksAreRefused) {
  EXPECT_TRUE(ParseTaskCommonName("evaluator:0").ok());
  for (const char* bad : {"worker", "worker:-1", "worker:01", "admin:0", "worker:1:2", ""}) {
    EXPECT_FALSE(ParseTaskCommonName(bad).ok()) << bad;
  }
  EXPECT_EQ(TaskServerName(TaskId{"ps", 3}), "ps-3.task.distrain");
}

TEST(JobIdentityTest, CredentialsDirectoryRoundTripsWithPrivateFiles) {
  char tmpl[] = "/tmp/job_identity_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/worker-0";
  auto job = NewJobAuthority("ns/job");
  ASSERT_TRUE(job.ok());
  auto creds = IssueTaskCredentials(*job, TaskId{"worker", 0});
  ASSERT_TRUE(creds.ok());
  ASSERT_TRUE(WriteCredentialsDir(dir, *job, *creds).ok());
  struct stat st {};
  ASSERT_EQ(stat((dir + "/tls.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto loaded = LoadCredentialsDir(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->task, (TaskId{"worker", 0}));
  // The CA key never lands in a task's directory.
  std::ifstream ca(dir + "/ca.crt");
  std::string text((std::istreambuf_iterator<char>(ca)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("PRIVATE KEY"), std::string::npos);
  auto missing = LoadCredentialsDir(std::string(tmpl) + "/nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nowhere/ca.crt"), std::string::npos);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

}  // namespace
}  // namespace distrain

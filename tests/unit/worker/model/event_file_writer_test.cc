#include "worker/model/event_file_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/unit/worker/model/event_files.h"

namespace distrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::EventFiles;
using testing::ReadEventFile;
using testing::ReadScalars;

// Records TensorFlow 2.21 wrote (tf.summary.create_file_writer, then
// tf.summary.scalar("loss", 0.5, step=3); and a SessionLog START at step 7
// built with tensorboard's event_pb2), with the wall times they carried: our
// records must be these bytes once the wall time is the same.
const std::string kTfScalarEvent(
    "\x09\x26\xaa\xd5\x01\xc1\xc1\xda\x41\x10\x03\x2a\x21\x0a\x1f\x0a\x04\x6c\x6f\x73\x73\x42\x0a"
    "\x08\x01\x12\x00\x22\x04\x00\x00\x00\x3f\x4a\x0b\x0a\x09\x0a\x07\x73\x63\x61\x6c\x61\x72\x73",
    46);
constexpr double kTfScalarWallTime = 1795621895.33851;
const std::string kTfSessionStartEvent(
    "\x09\x00\x00\x00\x00\x00\x00\x00\x40\x10\x07\x3a\x02\x08\x01", 15);

class EventFileWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("distrain_event_file_writer_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(EventFileWriterTest, FirstRecordIsTheFileVersionAndScalarsAreTheBytesTensorFlowWrites) {
  const double before = absl::ToUnixSeconds(absl::Now());
  auto writer = EventFileWriter::Create(dir_ + "/train");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteScalars(3, {{Scalar{"loss", 0.5}}}).ok());
  const double after = absl::ToUnixSeconds(absl::Now()) + 1;

  // Read back through the TFRecord reader: both CRCs of every record checked.
  const std::vector<v1::TfEvent> events = ReadEventFile((*writer)->path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[0].step(), 0);
  EXPECT_EQ(events[0].source_metadata().writer(), "distrain");
  // Whole seconds, the same as in the file's name (TensorFlow does this).
  EXPECT_EQ(events[0].wall_time(), std::floor(events[0].wall_time()));
  EXPECT_THAT((*writer)->path(),
              HasSubstr(".tfevents." + std::to_string(static_cast<int64_t>(events[0].wall_time())) +
                        "."));
  EXPECT_GE(events[1].wall_time(), before);
  EXPECT_LE(events[1].wall_time(), after);

  v1::TfEvent scalar = events[1];
  scalar.set_wall_time(kTfScalarWallTime);
  EXPECT_EQ(scalar.SerializeAsString(), kTfScalarEvent);
}

TEST_F(EventFileWriterTest, SessionStartIsTheRecordTensorBoardTreatsAsARestart) {
  auto writer = EventFileWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteSessionStart(7).ok());
  std::vector<v1::TfEvent> events = ReadEventFile((*writer)->path());
  ASSERT_EQ(events.size(), 2u);
  events[1].set_wall_time(2.0);
  EXPECT_EQ(events[1].SerializeAsString(), kTfSessionStartEvent);
}

TEST_F(EventFileWriterTest, FileIsNamedAsTensorFlow2NamesItAndSortsAfterTheRunsOtherFiles) {
  auto first = EventFileWriter::Create(dir_);
  auto second = EventFileWriter::Create(dir_);
  ASSERT_TRUE(first.ok() && second.ok());
  char host[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::regex name(std::string(R"(events\.out\.tfevents\.\d{10}\.)") + host + "\\." +
                        std::to_string(::getpid()) + R"(\.(\d+)\.v2)");
  std::smatch a, b;
  const std::string first_name = fs::path((*first)->path()).filename().string();
  const std::string second_name = fs::path((*second)->path()).filename().string();
  ASSERT_TRUE(std::regex_match(first_name, a, name)) << first_name;
  ASSERT_TRUE(std::regex_match(second_name, b, name)) << second_name;
  EXPECT_NE(a[1], b[1]);
  // TensorBoard's order is the names' order: the newer file comes last, even
  // within the same second, and after a file from a clock that runs ahead.
  EXPECT_LT(first_name, second_name);
  std::ofstream(dir_ + "/events.out.tfevents.4102444800.other.1.0.v2");  // year 2100
  auto third = EventFileWriter::Create(dir_);
  ASSERT_TRUE(third.ok());
  EXPECT_THAT((*third)->path(), HasSubstr("/events.out.tfevents.4102444801."));
  EXPECT_EQ(EventFiles(dir_).size(), 4u);
}

TEST_F(EventFileWriterTest, SeveralTagsShareOneEventAndValuesAreFloat32) {
  auto writer = EventFileWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(
      (*writer)->WriteScalars(10, {{Scalar{"loss", 0.1}, Scalar{"accuracy", 1.0 / 3}}}).ok());
  ASSERT_TRUE((*writer)->WriteScalars(20, {{Scalar{"loss", 0.05}}}).ok());
  const std::vector<v1::TfEvent> events = ReadEventFile((*writer)->path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].summary().value_size(), 2);
  const testing::ScalarCurves curves = ReadScalars(dir_);
  EXPECT_EQ(curves.at("loss"), (std::map<int64_t, float>{{10, 0.1f}, {20, 0.05f}}));
  EXPECT_EQ(curves.at("accuracy"), (std::map<int64_t, float>{{10, 1.0f / 3}}));
}

// Every record is flushed: a reader (TensorBoard polling the file) sees it
// while the writer is still open.
TEST_F(EventFileWriterTest, EachWriteIsVisibleToAReaderAtOnce) {
  auto writer = EventFileWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ(ReadEventFile((*writer)->path()).size(), 1u);
  ASSERT_TRUE((*writer)->WriteScalars(1, {{Scalar{"loss", 2}}}).ok());
  EXPECT_EQ(ReadEventFile((*writer)->path()).size(), 2u);
  ASSERT_TRUE((*writer)->WriteSessionStart(2).ok());
  EXPECT_EQ(ReadEventFile((*writer)->path()).size(), 3u);
}

TEST_F(EventFileWriterTest, IoErrorsAreReturnedNamingTheFile) {
  // A directory that cannot be created: its parent is a regular file.
  std::ofstream(dir_ + "/file") << "x";
  auto no_dir = EventFileWriter::Create(dir_ + "/file/train");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_THAT(std::string(no_dir.status().message()), HasSubstr(dir_ + "/file/train"));
  // A device that is always full: the first flush fails.
  auto full = EventFileWriter::CreateAt("/dev/full");
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("/dev/full"));
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("No space left"));
}

// Captures what the default logger prints while alive.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(log_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() { spdlog::default_logger()->sinks().pop_back(); }
  std::string str() const { return log_.str(); }
  int Count(const std::string& needle) const {
    const std::string s = log_.str();
    int n = 0;
    for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST_F(EventFileWriterTest, SummaryRunThatCannotCreateItsFileWarnsOnceAndCarriesOn) {
  std::ofstream(dir_ + "/file") << "x";
  SummaryRun run(dir_ + "/file/train");
  LogCapture log;
  run.WriteSessionStart(1);
  run.WriteScalars(10, {{"loss", 1}});
  run.WriteScalars(20, {{"loss", 1}});
  EXPECT_FALSE(run.enabled());
  EXPECT_EQ(log.Count("TensorBoard events"), 1) << log.str();
  EXPECT_THAT(log.str(), HasSubstr(dir_ + "/file/train"));
}

// A write that fails after the file was created (here: the file-size limit,
// which fails write(2) with EFBIG the way a full disk fails it with ENOSPC).
TEST_F(EventFileWriterTest, SummaryRunThatFailsMidRunWarnsOnceAndStopsWriting) {
  SummaryRun run(dir_);
  run.WriteScalars(1, {{"loss", 1}});
  ASSERT_TRUE(run.enabled());
  const std::vector<std::string> files = EventFiles(dir_);
  ASSERT_EQ(files.size(), 1u);

  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = fs::file_size(files[0]) + 100;  // room for one or two more events
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  LogCapture log;
  for (int step = 2; step <= 20; ++step) run.WriteScalars(step, {{"loss", 1}, {"accuracy", 0.5}});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_FALSE(run.enabled());
  EXPECT_EQ(log.Count("TensorBoard events"), 1) << log.str();
  EXPECT_THAT(log.str(), HasSubstr(files[0]));
  // What was written before the failure is intact and nothing came after it.
  const uintmax_t size = fs::file_size(files[0]);
  run.WriteScalars(21, {{"loss", 1}});
  EXPECT_EQ(fs::file_size(files[0]), size);
  EXPECT_EQ(EventFiles(dir_).size(), 1u);
}

TEST_F(EventFileWriterTest, SummaryRunLogsEachEventInFullPrecisionAtDebugLevel) {
  SummaryRun run(dir_ + "/train");
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::debug);
  LogCapture log;
  run.WriteScalars(40, {{"loss", 0.123456789012}, {"learning_rate", 0.001f}});
  spdlog::set_level(level);
  EXPECT_THAT(log.str(), HasSubstr("tensorboard: " + dir_ + "/train step 40: loss=0.123456789012 "
                                   "learning_rate=0.0010000000474974513"));
}

}  // namespace
}  // namespace distrain

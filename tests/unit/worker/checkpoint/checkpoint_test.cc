#include "worker/checkpoint/checkpoint.h"

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "distrain/v1/tensor.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ckpt_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/nested/ckpts";
  }
  void TearDown() override { fs::remove_all(root_); }

  static CheckpointState StateForStep(int64_t step) {
    CheckpointState state;
    state.step = step;
    state.tensors["w"] = Tensor({2, 3}, {1, 2, 3, 4, 5, static_cast<float>(step)});
    state.tensors["b"] = Tensor({3}, 0.25f);
    state.metadata["strategy"] = "OneDevice";
    return state;
  }

  static std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string root_;
  std::string dir_;
};

void ExpectBitIdentical(const CheckpointState& got, const CheckpointState& want) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.metadata, want.metadata);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [name, tensor] : want.tensors) {
    auto it = got.tensors.find(name);
    ASSERT_NE(it, got.tensors.end()) << name;
    EXPECT_EQ(it->second.shape(), tensor.shape()) << name;
    ASSERT_EQ(it->second.size(), tensor.size()) << name;
    EXPECT_EQ(0, std::memcmp(it->second.data(), tensor.data(), tensor.bytes())) << name;
  }
}

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  CheckpointState state;
  state.step = 123456789012LL;
  state.tensors["empty_default"] = Tensor();
  state.tensors["empty_rows"] = Tensor({0, 5});
  state.tensors["scalar"] = Tensor(std::vector<int64_t>{}, std::vector<float>{3.5f});
  state.tensors["specials"] = Tensor(
      {6}, {-0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(), -1e-30f});
  Tensor large({512, 1031});  // ~2 MB, odd width
  for (int64_t i = 0; i < large.size(); ++i) large[i] = std::sin(static_cast<float>(i)) * 1e3f;
  state.tensors["dense/kernel"] = large;
  state.metadata["model"] = "mlp 784-128-10";
  state.metadata["empty"] = "";
  state.metadata["text"] = std::string("a\0b \xc3\xa9 \xf0\x9f\x99\x82", 11);  // NUL, é, emoji

  const std::string path = root_ + "/one.dtc";
  ASSERT_TRUE(CheckpointManager::WriteFile(path, state).ok());
  auto read = CheckpointManager::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectBitIdentical(*read, state);
  EXPECT_EQ(read->tensors.at("empty_default").rank(), 0);
  EXPECT_EQ(read->tensors.at("scalar").size(), 1);
}

TEST_F(CheckpointTest, NonUtf8MetadataOrNamesAreRejectedNotCorrupted) {
  // The index is protobuf, whose string fields must be UTF-8: writing
  // anything else would produce a file that can never be read back.
  const std::string path = root_ + "/bad.dtc";
  const std::string not_utf8[] = {"\xff", "a\xc3", "\xc0\x80", "\xed\xa0\x80",
                                  std::string("\xe2\x82", 2)};
  for (const std::string& bad : not_utf8) {
    CheckpointState state;
    state.metadata["key"] = bad;
    auto status = CheckpointManager::WriteFile(path, state);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
    EXPECT_THAT(std::string(status.message()), HasSubstr("key")) << absl::CEscape(bad);
    CheckpointState named;
    named.tensors[bad] = Tensor({1});
    EXPECT_FALSE(CheckpointManager::WriteFile(path, named).ok()) << absl::CEscape(bad);
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(CheckpointTest, FileLayoutMatchesTheDocumentedFormat) {
  const std::string path = root_ + "/layout.dtc";
  ASSERT_TRUE(CheckpointManager::WriteFile(path, StateForStep(5)).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GT(bytes.size(), 32u);
  EXPECT_EQ(bytes.substr(0, 8), "DTRNCKPT");
  EXPECT_EQ(bytes.substr(bytes.size() - 8), "DTRNEND1");
  uint32_t version;
  uint64_t index_len;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&index_len, bytes.data() + 12, 8);
  EXPECT_EQ(version, 1u);
  distrain::v1::CheckpointIndex index;
  ASSERT_TRUE(index.ParseFromString(bytes.substr(20, index_len)));
  uint32_t index_crc;
  std::memcpy(&index_crc, bytes.data() + 20 + index_len, 4);
  EXPECT_EQ(index_crc, crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + 20), index_len));
  EXPECT_EQ(index.step(), 5);
  ASSERT_EQ(index.entries_size(), 2);
  const uint64_t data_start = 24 + index_len;
  uint64_t data_bytes = 0;
  for (const auto& entry : index.entries()) {
    data_bytes += entry.byte_size();
    EXPECT_EQ(entry.crc32(),
              crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + data_start + entry.offset()),
                    entry.byte_size()));
    if (entry.name() == "w") {
      float last;
      std::memcpy(&last, bytes.data() + data_start + entry.offset() + 20, 4);
      EXPECT_EQ(last, 5.0f);
      EXPECT_THAT(entry.shape(), ElementsAre(2, 3));
    }
  }
  EXPECT_EQ(bytes.size(), data_start + data_bytes + 8);
}

TEST_F(CheckpointTest, SaveCreatesTheDirectoryAndRestoreReturnsNewest) {
  CheckpointManager manager(dir_, 5);
  for (int64_t step : {10, 30, 20}) ASSERT_TRUE(manager.Save(StateForStep(step)).ok());
  EXPECT_TRUE(fs::is_directory(dir_));
  EXPECT_THAT(manager.ListSteps(), ElementsAre(10, 20, 30));
  EXPECT_EQ(manager.PathForStep(30), dir_ + "/ckpt-000000000030.dtc");
  EXPECT_TRUE(fs::exists(manager.PathForStep(30)));
  auto restored = manager.RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  ExpectBitIdentical(**restored, StateForStep(30));
}

TEST_F(CheckpointTest, RetentionKeepsTheLastK) {
  CheckpointManager manager(dir_, 3);
  for (int64_t step = 1; step <= 6; ++step)
    ASSERT_TRUE(manager.Save(StateForStep(step * 100)).ok());
  EXPECT_THAT(manager.ListSteps(), ElementsAre(400, 500, 600));
  // Only checkpoint files remain (no temporaries).
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".dtc") << entry.path();
  }
  EXPECT_EQ(files, 3);
}

TEST_F(CheckpointTest, RetentionNeverDeletesTheCheckpointJustWritten) {
  // A resumed run saving step 250 next to a leftover step 300 from an older run.
  CheckpointManager manager(dir_, 1);
  ASSERT_TRUE(manager.Save(StateForStep(300)).ok());
  ASSERT_TRUE(manager.Save(StateForStep(250)).ok());
  EXPECT_THAT(manager.ListSteps(), ElementsAre(250));
}

TEST_F(CheckpointTest, EmptyOrMissingDirectoryRestoresNothing) {
  CheckpointManager missing(root_ + "/does/not/exist", 3);
  auto none = missing.RestoreLatest();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  fs::create_directories(dir_);
  CheckpointManager empty(dir_, 3);
  none = empty.RestoreLatest();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  EXPECT_TRUE(empty.ListSteps().empty());
}

TEST_F(CheckpointTest, TruncatedNewestFallsBackToThePreviousCheckpoint) {
  CheckpointManager manager(dir_, 5);
  ASSERT_TRUE(manager.Save(StateForStep(1)).ok());
  ASSERT_TRUE(manager.Save(StateForStep(2)).ok());
  const std::string newest = manager.PathForStep(2);
  const std::string good = ReadBytes(newest);
  uint64_t index_len;
  std::memcpy(&index_len, good.data() + 12, 8);
  const size_t data_start = 24 + index_len;
  struct Cut {
    const char* where;
    size_t size;
  };
  const Cut cuts[] = {
      {"empty", 0},
      {"inside magic", 5},
      {"inside header", 15},
      {"inside index", 20 + index_len / 2},
      {"inside index crc", 22 + index_len},
      {"inside data", data_start + 7},
      {"before trailer", good.size() - 8},
      {"inside trailer", good.size() - 3},
  };
  for (const Cut& cut : cuts) {
    WriteBytes(newest, good.substr(0, cut.size));
    auto direct = CheckpointManager::ReadFile(newest);
    ASSERT_FALSE(direct.ok()) << cut.where;
    EXPECT_THAT(std::string(direct.status().message()), HasSubstr(newest)) << cut.where;
    auto restored = manager.RestoreLatest();
    ASSERT_TRUE(restored.ok()) << cut.where << ": " << restored.status();
    ASSERT_TRUE(restored->has_value()) << cut.where;
    EXPECT_EQ((*restored)->step, 1) << cut.where;
  }
}

TEST_F(CheckpointTest, FlippedBytesAreDetected) {
  const std::string path = root_ + "/flip.dtc";
  ASSERT_TRUE(CheckpointManager::WriteFile(path, StateForStep(7)).ok());
  const std::string good = ReadBytes(path);
  uint64_t index_len;
  std::memcpy(&index_len, good.data() + 12, 8);
  struct Flip {
    const char* where;
    size_t offset;
    const char* expected;
  };
  const Flip flips[] = {
      {"magic", 2, "bad magic at byte 0"},
      {"version", 8, "unsupported format version"},
      {"index", 21, "index checksum mismatch"},
      {"index crc", 20 + index_len, "index checksum mismatch"},
      {"first tensor data", 24 + index_len + 1, "checksum mismatch"},
      {"last tensor data", good.size() - 9, "checksum mismatch"},
      {"trailer", good.size() - 1, "missing end marker"},
  };
  for (const Flip& flip : flips) {
    std::string bad = good;
    bad[flip.offset] ^= 0x10;
    WriteBytes(path, bad);
    auto read = CheckpointManager::ReadFile(path);
    ASSERT_FALSE(read.ok()) << flip.where;
    EXPECT_THAT(std::string(read.status().message()),
                AllOf(HasSubstr(path), HasSubstr(flip.expected)))
        << flip.where;
  }
  // A data flip names the tensor.
  std::string bad = good;
  bad[good.size() - 9] ^= 0x01;
  WriteBytes(path, bad);
  EXPECT_THAT(std::string(CheckpointManager::ReadFile(path).status().message()),
              HasSubstr("tensor \"w\""));
}

// Files whose index is well-formed protobuf with a valid CRC but describes
// impossible tensors.
std::string AssembleFile(const distrain::v1::CheckpointIndex& index, const std::string& data) {
  std::string index_bytes = index.SerializeAsString();
  std::string out = "DTRNCKPT";
  uint32_t version = 1;
  uint64_t len = index_bytes.size();
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += index_bytes;
  uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(index_bytes.data()), index_bytes.size());
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out += data;
  out += "DTRNEND1";
  return out;
}

TEST_F(CheckpointTest, InconsistentIndexIsRejected) {
  const std::string data(16, '\0');  // room for 4 floats
  const uint32_t zero_crc = crc32(0, reinterpret_cast<const Bytef*>(data.data()), 8);
  auto entry = [&](distrain::v1::CheckpointIndex* index, const char* name,
                   std::vector<int64_t> shape, uint64_t offset, uint64_t size) {
    auto* e = index->add_entries();
    e->set_name(name);
    for (int64_t d : shape) e->add_shape(d);
    e->set_offset(offset);
    e->set_byte_size(size);
    e->set_crc32(zero_crc);
  };
  struct Case {
    const char* name;
    std::function<void(distrain::v1::CheckpointIndex*)> build;
    const char* expected;
  };
  const Case cases[] = {
      {"shape_vs_size",
       [&](auto* i) {
         entry(i, "a", {3}, 0, 8);
         entry(i, "b", {2}, 8, 8);
       },
       "has 8 bytes but its shape holds 3 floats"},
      {"out_of_range",
       [&](auto* i) {
         entry(i, "a", {2}, 0, 8);
         entry(i, "b", {2}, 12, 8);
       },
       "runs past the 16-byte data section"},
      {"overlap",
       [&](auto* i) {
         entry(i, "a", {2}, 0, 8);
         entry(i, "b", {2}, 4, 8);
       },
       "overlap at data offset 4"},
      {"uncovered", [&](auto* i) { entry(i, "a", {2}, 0, 8); },
       "data section has 16 bytes but the index describes 8"},
      {"negative_dim",
       [&](auto* i) {
         entry(i, "a", {-2}, 0, 8);
         entry(i, "b", {2}, 8, 8);
       },
       "negative dimension"},
      {"duplicate",
       [&](auto* i) {
         entry(i, "a", {2}, 0, 8);
         entry(i, "a", {2}, 8, 8);
       },
       "appears twice"},
  };
  for (const Case& c : cases) {
    distrain::v1::CheckpointIndex index;
    c.build(&index);
    const std::string path = absl::StrCat(root_, "/", c.name, ".dtc");
    WriteBytes(path, AssembleFile(index, data));
    auto read = CheckpointManager::ReadFile(path);
    ASSERT_FALSE(read.ok()) << c.name;
    EXPECT_THAT(std::string(read.status().message()), AllOf(HasSubstr(path), HasSubstr(c.expected)))
        << c.name;
  }
}

TEST_F(CheckpointTest, LeftoverTmpFileIsIgnoredAndCleaned) {
  CheckpointManager manager(dir_, 3);
  ASSERT_TRUE(manager.Save(StateForStep(4)).ok());
  const std::string leftover = manager.PathForStep(9) + ".tmp-4242";
  WriteBytes(leftover, "DTRNCKPT half written");
  EXPECT_THAT(manager.ListSteps(), ElementsAre(4));
  auto restored = manager.RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->step, 4);
  EXPECT_FALSE(fs::exists(leftover));
}

TEST_F(CheckpointTest, SkippedCorruptFileIsLoggedWithItsNameAndReason) {
  CheckpointManager manager(dir_, 3);
  ASSERT_TRUE(manager.Save(StateForStep(1)).ok());
  ASSERT_TRUE(manager.Save(StateForStep(2)).ok());
  const std::string newest = manager.PathForStep(2);
  std::string bytes = ReadBytes(newest);
  WriteBytes(newest, bytes.substr(0, bytes.size() - 1));

  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(sink);
  auto restored = manager.RestoreLatest();
  logger->sinks().pop_back();

  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->step, 1);
  EXPECT_THAT(log.str(),
              AllOf(HasSubstr("warn"), HasSubstr(newest), HasSubstr("missing end marker")));
}

TEST_F(CheckpointTest, AllCorruptMeansNothingToRestore) {
  CheckpointManager manager(dir_, 3);
  ASSERT_TRUE(manager.Save(StateForStep(1)).ok());
  WriteBytes(manager.PathForStep(1), "garbage");
  auto restored = manager.RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(restored->has_value());
}

TEST_F(CheckpointTest, NegativeStepIsRejected) {
  CheckpointManager manager(dir_, 3);
  EXPECT_FALSE(manager.Save(StateForStep(-1)).ok());
}

}  // namespace
}  // namespace distrain

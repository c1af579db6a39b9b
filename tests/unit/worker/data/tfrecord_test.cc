#include "worker/data/tfrecord.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Published CRC-32C check values (RFC 3720 appendix B.4 and the common "123456789").
TEST(Crc32cTest, MatchesPublishedCheckValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  const std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  // Chaining equals one pass, across the 8-byte stride of the SSE4.2 path.
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32c(text.data() + 13, text.size() - 13, Crc32c(text.data(), 13)),
            Crc32c(text.data(), text.size()));
}

// A record TensorFlow wrote: tf.io.TFRecordWriter with the payload b"hello"
// (bytes from a TF 2.21 run, kept here so the framing is checked against TF
// itself, not only against our own writer).
TEST(TfRecordTest, ReadsTheBytesTensorFlowWrites) {
  const std::string tf_bytes("\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04\x3e"
                             "hello"
                             "\xbb\x1f\x1c\x19",
                             21);
  EXPECT_EQ(TfRecordWriter::Frame("hello"), tf_bytes);
  TfRecordReader reader("tf.tfrecord", tf_bytes, false);
  std::string_view record;
  ASSERT_TRUE(*reader.Next(&record));
  EXPECT_EQ(record, "hello");
  EXPECT_FALSE(*reader.Next(&record));
}

class TfRecordFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/tfrecord_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void Put(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  std::string dir_;
};

TEST_F(TfRecordFileTest, WriterAndReaderRoundTripEveryRecord) {
  const std::vector<std::string> records = {"", "a", std::string(100000, 'x'), "last"};
  {
    auto writer = TfRecordWriter::Create(Path("r.tfrecord"));
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const auto& r : records) ASSERT_TRUE(writer->Write(r).ok());
    ASSERT_TRUE(writer->Flush().ok());
  }
  auto reader = TfRecordReader::Open(Path("r.tfrecord"), TfRecordCompression::kNone);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> read;
  std::string_view record;
  while (true) {
    auto more = reader->Next(&record);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    read.emplace_back(record);
  }
  EXPECT_EQ(read, records);
}

TEST_F(TfRecordFileTest, TruncatedFileIsReportedWithFileAndOffset) {
  std::string bytes = TfRecordWriter::Frame("first") + TfRecordWriter::Frame("second record");
  Put(Path("cut.tfrecord"), bytes.substr(0, bytes.size() - 3));
  auto reader = TfRecordReader::Open(Path("cut.tfrecord"), TfRecordCompression::kNone);
  ASSERT_TRUE(reader.ok());
  std::string_view record;
  ASSERT_TRUE(*reader->Next(&record));
  auto second = reader->Next(&record);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("cut.tfrecord"), HasSubstr("byte offset 21"), HasSubstr("truncated")));
}

TEST_F(TfRecordFileTest, FlippedDataBitIsACrcErrorNotGarbage) {
  std::string bytes = TfRecordWriter::Frame("payload");
  bytes[14] ^= 0x01;
  Put(Path("bad.tfrecord"), bytes);
  auto reader = TfRecordReader::Open(Path("bad.tfrecord"), TfRecordCompression::kNone);
  ASSERT_TRUE(reader.ok());
  std::string_view record;
  auto next = reader->Next(&record);
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(),
              AllOf(HasSubstr("bad.tfrecord"), HasSubstr("byte offset 0"), HasSubstr("data CRC")));
}

TEST_F(TfRecordFileTest, GarbageLengthNeverReadsOutOfBounds) {
  std::string bytes = TfRecordWriter::Frame("payload");
  bytes[7] = '\x7f';  // a huge length; its CRC no longer matches
  Put(Path("len.tfrecord"), bytes);
  auto reader = TfRecordReader::Open(Path("len.tfrecord"), TfRecordCompression::kNone);
  std::string_view record;
  auto next = reader->Next(&record);
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(), HasSubstr("length CRC"));
}

std::string Gzip(const std::string& plain) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, plain.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  zs.avail_in = plain.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST_F(TfRecordFileTest, GzipFilesDecompressAndTruncationIsNamed) {
  const std::string plain = TfRecordWriter::Frame("one") + TfRecordWriter::Frame("two");
  const std::string gz = Gzip(plain);
  Put(Path("r.tfrecord.gz"), gz);
  auto reader = TfRecordReader::Open(Path("r.tfrecord.gz"), TfRecordCompression::kGzip);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string_view record;
  ASSERT_TRUE(*reader->Next(&record));
  EXPECT_EQ(record, "one");
  ASSERT_TRUE(*reader->Next(&record));
  EXPECT_EQ(record, "two");

  Put(Path("cut.tfrecord.gz"), gz.substr(0, gz.size() / 2));
  auto cut = TfRecordReader::Open(Path("cut.tfrecord.gz"), TfRecordCompression::kGzip);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), AllOf(HasSubstr("cut.tfrecord.gz"), HasSubstr("GZIP")));

  // A plain file read as GZIP says to check the compression setting.
  Put(Path("plain.tfrecord"), plain);
  auto wrong = TfRecordReader::Open(Path("plain.tfrecord"), TfRecordCompression::kGzip);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("compression"));
}

TEST(TfRecordCompressionTest, ParsesTfDataNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseTfRecordCompression("gzip"), TfRecordCompression::kGzip);
  EXPECT_EQ(*ParseTfRecordCompression(""), TfRecordCompression::kNone);
  EXPECT_EQ(*ParseTfRecordCompression("ZLIB"), TfRecordCompression::kZlib);
  auto bad = ParseTfRecordCompression("bzip2");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("bzip2"), HasSubstr("GZIP")));
}

}  // namespace
}  // namespace distrain

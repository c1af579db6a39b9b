#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/idx_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void PutBigEndian(std::string* out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out->push_back(static_cast<char>((v >> shift) & 0xff));
  }
  static std::string Images(uint32_t n, uint32_t rows, uint32_t cols) {
    std::string bytes;
    PutBigEndian(&bytes, 0x00000803);
    PutBigEndian(&bytes, n);
    PutBigEndian(&bytes, rows);
    PutBigEndian(&bytes, cols);
    for (uint32_t i = 0; i < n * rows * cols; ++i)
      bytes.push_back(static_cast<char>((i * 7) % 256));
    return bytes;
  }
  static std::string Labels(const std::vector<uint8_t>& labels) {
    std::string bytes;
    PutBigEndian(&bytes, 0x00000801);
    PutBigEndian(&bytes, static_cast<uint32_t>(labels.size()));
    for (uint8_t l : labels) bytes.push_back(static_cast<char>(l));
    return bytes;
  }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(Path(name), std::ios::binary);
    out << bytes;
    return Path(name);
  }

  std::string dir_;
};

TEST_F(IdxReaderTest, RoundTripScalesPixelsAndKeepsLabels) {
  const std::string images = Write("img.idx", Images(4, 2, 3));
  const std::string labels = Write("lbl.idx", Labels({3, 0, 7, 1}));
  auto dataset = LoadIdxDataset(images, labels, 0.5f);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 4);
  EXPECT_EQ((*dataset)->num_features(), 6);
  EXPECT_EQ((*dataset)->num_classes(), 8);  // max label + 1
  const int32_t expected_labels[] = {3, 0, 7, 1};
  for (int i = 0; i < 4; ++i) {
    std::vector<float> features(6);
    int32_t label = -1;
    (*dataset)->Get(i, features.data(), &label);
    EXPECT_EQ(label, expected_labels[i]);
    for (int j = 0; j < 6; ++j) {
      EXPECT_EQ(features[j], static_cast<float>(((i * 6 + j) * 7) % 256) * 0.5f) << i << "," << j;
    }
  }
}

TEST_F(IdxReaderTest, ExampleShapeIsRowsColsOneChannel) {
  // NHWC without the batch, as Keras sees MNIST: what a Conv2D input needs.
  const std::string images = Write("img.idx", Images(4, 2, 3));
  const std::string labels = Write("lbl.idx", Labels({3, 0, 7, 1}));
  auto dataset = LoadIdxDataset(images, labels, 1.0f);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->example_shape(), (std::vector<int64_t>{2, 3, 1}));
}

TEST_F(IdxReaderTest, SingleLabelValueStillHasTwoClasses) {
  auto dataset =
      LoadIdxDataset(Write("img.idx", Images(2, 1, 1)), Write("lbl.idx", Labels({0, 0})), 1.0f);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->num_classes(), 2);
}

TEST_F(IdxReaderTest, TruncatedImageDataNamesFileAndOffset) {
  // 100 MNIST-sized images: 16 + 78400 bytes; cut at byte 8016.
  std::string bytes = Images(100, 28, 28);
  bytes.resize(8016);
  const std::string images = Write("mnist.idx", bytes);
  auto dataset = LoadIdxDataset(images, Write("lbl.idx", Labels(std::vector<uint8_t>(100))), 1.0f);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(std::string(dataset.status().message()),
              AllOf(HasSubstr(images), HasSubstr("truncated at byte 8016"),
                    HasSubstr("expected 78416 bytes"), HasSubstr("image data")));
}

TEST_F(IdxReaderTest, TruncatedLabelFileNamesFileAndOffset) {
  std::string labels = Labels(std::vector<uint8_t>(10, 1));
  labels.resize(13);
  const std::string path = Write("lbl.idx", labels);
  auto dataset = LoadIdxDataset(Write("img.idx", Images(10, 2, 2)), path, 1.0f);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(
      std::string(dataset.status().message()),
      AllOf(HasSubstr(path), HasSubstr("truncated at byte 13"), HasSubstr("expected 18 bytes")));
}

TEST_F(IdxReaderTest, MalformedImageFilesNameFileAndOffset) {
  struct Case {
    const char* name;
    std::string bytes;
    std::vector<const char*> expected;
  };
  std::string bad_magic = Images(2, 2, 2);
  bad_magic[3] = 0x02;
  std::string short_header = Images(2, 2, 2).substr(0, 10);
  std::string trailing = Images(2, 2, 2) + "xx";
  std::string zero_dim = Images(2, 2, 2);
  zero_dim[11] = 0;  // rows = 0
  const Case cases[] = {
      {"bad_magic", bad_magic, {"bad IDX magic 0x00000802 at byte 0", "expected 0x00000803"}},
      {"gzip", std::string("\x1f\x8b\x08\x00", 4) + std::string(20, 'z'), {"gzip", "gunzip"}},
      {"labels_as_images", Labels({1, 2}), {"at byte 0", "looks like a labels file"}},
      {"short_magic", std::string("\x00\x00", 2), {"truncated at byte 2", "magic"}},
      {"short_header", short_header, {"truncated at byte 10", "16-byte IDX header"}},
      {"trailing", trailing, {"2 unexpected bytes", "at byte 24"}},
      {"zero_dim", zero_dim, {"dimension 1 (at byte 8) is 0"}},
  };
  const std::string labels = Write("lbl.idx", Labels({1, 2}));
  for (const Case& c : cases) {
    const std::string path = Write(std::string(c.name) + ".idx", c.bytes);
    auto dataset = LoadIdxDataset(path, labels, 1.0f);
    ASSERT_FALSE(dataset.ok()) << c.name;
    const std::string message(dataset.status().message());
    EXPECT_THAT(message, HasSubstr(path)) << c.name;
    for (const char* part : c.expected) EXPECT_THAT(message, HasSubstr(part)) << c.name;
  }
}

TEST_F(IdxReaderTest, CountMismatchNamesBothFiles) {
  const std::string images = Write("img.idx", Images(3, 2, 2));
  const std::string labels = Write("lbl.idx", Labels({1, 2}));
  auto dataset = LoadIdxDataset(images, labels, 1.0f);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(std::string(dataset.status().message()),
              AllOf(HasSubstr(images + " has 3 images"), HasSubstr(labels + " has 2 labels")));
}

TEST_F(IdxReaderTest, MissingFileIsNotFoundAndNamed) {
  auto dataset = LoadIdxDataset(Path("nope.idx"), Write("lbl.idx", Labels({1})), 1.0f);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(dataset.status().message()), HasSubstr(Path("nope.idx")));
}

}  // namespace
}  // namespace distrain

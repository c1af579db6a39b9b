// dataset type tfrecord: tf.train.Example records built with the
// wire-compatible proto, framed with TfRecordWriter, read back through
// LoadTfRecordDataset and OpenTrainingInput. The records TensorFlow itself
// writes are covered by tests/integration/tfrecord_training_test.cc.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distrain/v1/tf_example.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/data/tfrecord.h"

namespace distrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

// An Example with a 2x3x1 image whose pixels are 10 * k + i and label k % 4,
// in the requested encoding (the key of each feature as given).
v1::TfExample ImageExample(int k, FeatureEncoding encoding, const std::string& image_key = "image",
                           const std::string& label_key = "label") {
  v1::TfExample example;
  auto& features = *example.mutable_features()->mutable_feature();
  v1::TfFeature& image = features[image_key];
  std::string raw;
  for (int i = 0; i < 6; ++i) {
    const int value = 10 * k + i;
    switch (encoding) {
      case FeatureEncoding::kUint8Bytes:
        raw.push_back(static_cast<char>(value));
        break;
      case FeatureEncoding::kFloatList:
        image.mutable_float_list()->add_value(static_cast<float>(value) + 0.5f);
        break;
      case FeatureEncoding::kInt64List:
        image.mutable_int64_list()->add_value(value);
        break;
    }
  }
  if (encoding == FeatureEncoding::kUint8Bytes) image.mutable_bytes_list()->add_value(raw);
  features[label_key].mutable_int64_list()->add_value(k % 4);
  return example;
}

std::string Framed(const std::vector<v1::TfExample>& examples) {
  std::string out;
  for (const auto& e : examples) out += TfRecordWriter::Frame(e.SerializeAsString());
  return out;
}

std::string Gzip(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                         Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

class TfRecordDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/tfrecord_dataset_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    config_.type = DatasetType::kTfRecord;
    config_.feature_shape = {2, 3, 1};
    config_.num_classes = 4;
    config_.scale = 0.5f;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // Records k = first .. first + n - 1.
  std::string WriteExamples(const std::string& name, int first, int n,
                            FeatureEncoding encoding = FeatureEncoding::kUint8Bytes) const {
    std::vector<v1::TfExample> examples;
    for (int k = first; k < first + n; ++k) examples.push_back(ImageExample(k, encoding));
    return Write(name, Framed(examples));
  }
  std::string ErrorOf(const std::string& path) const {
    auto dataset = LoadTfRecordDataset(path, config_, 0);
    return dataset.ok() ? "<ok>" : std::string(dataset.status().message());
  }

  std::string dir_;
  DatasetConfig config_;
};

std::vector<float> Example(const Dataset& d, int64_t index, int32_t* label) {
  std::vector<float> row(d.num_features());
  d.Get(index, row.data(), label);
  return row;
}

// First pixel / (10 * scale) of each example: which record it came from.
std::vector<int> RecordIds(const Dataset& d, float scale) {
  std::vector<int> ids;
  for (int64_t i = 0; i < d.size(); ++i) {
    int32_t label;
    ids.push_back(static_cast<int>(Example(d, i, &label)[0] / (10 * scale) + 0.5f));
  }
  return ids;
}

TEST_F(TfRecordDatasetTest, Uint8BytesAreScaledLikeIdxPixels) {
  const std::string path = WriteExamples("u8.tfrecord", 0, 3);
  auto dataset = LoadTfRecordDataset(path, config_, 0);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 3);
  EXPECT_EQ((*dataset)->num_features(), 6);
  EXPECT_THAT((*dataset)->example_shape(), ElementsAre(2, 3, 1));
  EXPECT_EQ((*dataset)->num_classes(), 3);  // labels 0..2: max + 1
  int32_t label;
  EXPECT_THAT(Example(**dataset, 2, &label), ElementsAre(10, 10.5, 11, 11.5, 12, 12.5));
  EXPECT_EQ(label, 2);
  EXPECT_EQ((*dataset)->description(), path);
}

TEST_F(TfRecordDatasetTest, FloatListIsUsedAsWrittenAndInt64ListIsScaled) {
  config_.feature_encoding = FeatureEncoding::kFloatList;
  auto floats =
      LoadTfRecordDataset(WriteExamples("f.tfrecord", 1, 2, FeatureEncoding::kFloatList), config_,
                          0);
  ASSERT_TRUE(floats.ok()) << floats.status();
  int32_t label;
  EXPECT_THAT(Example(**floats, 1, &label),
              ElementsAre(20.5, 21.5, 22.5, 23.5, 24.5, 25.5));  // no scale
  EXPECT_EQ(label, 2);

  config_.feature_encoding = FeatureEncoding::kInt64List;
  auto ints = LoadTfRecordDataset(
      WriteExamples("i.tfrecord", 1, 2, FeatureEncoding::kInt64List), config_, 0);
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_THAT(Example(**ints, 0, &label), ElementsAre(5, 5.5, 6, 6.5, 7, 7.5));
  EXPECT_EQ(label, 1);
}

TEST_F(TfRecordDatasetTest, GzipAndZlibFilesReadTheSameExamples) {
  const std::string plain = Framed({ImageExample(0, FeatureEncoding::kUint8Bytes),
                                    ImageExample(1, FeatureEncoding::kUint8Bytes)});
  config_.compression = DataCompression::kGzip;
  auto gz = LoadTfRecordDataset(Write("a.tfrecord.gz", Gzip(plain)), config_, 0);
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_THAT(RecordIds(**gz, config_.scale), ElementsAre(0, 1));

  config_.compression = DataCompression::kZlib;
  std::string zlib(compressBound(plain.size()), '\0');
  uLongf zlib_size = zlib.size();
  ASSERT_EQ(compress(reinterpret_cast<Bytef*>(zlib.data()), &zlib_size,
                     reinterpret_cast<const Bytef*>(plain.data()), plain.size()),
            Z_OK);
  zlib.resize(zlib_size);
  auto z = LoadTfRecordDataset(Write("a.tfrecord.z", zlib), config_, 0);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_THAT(RecordIds(**z, config_.scale), ElementsAre(0, 1));

  // A GZIP file read as plain says which setting fixes it.
  config_.compression = DataCompression::kNone;
  EXPECT_THAT(ErrorOf(dir_ + "/a.tfrecord.gz"),
              AllOf(HasSubstr("is GZIP-compressed"), HasSubstr("set compression: GZIP")));
}

TEST_F(TfRecordDatasetTest, WrongSizeNamesRecordOffsetFeatureAndShape) {
  std::vector<v1::TfExample> examples = {ImageExample(0, FeatureEncoding::kUint8Bytes),
                                         ImageExample(1, FeatureEncoding::kUint8Bytes)};
  std::string* raw = (*examples[1].mutable_features()->mutable_feature())["image"]
                         .mutable_bytes_list()
                         ->mutable_value(0);
  raw->pop_back();
  const std::string path = Write("short.tfrecord", Framed(examples));
  const size_t offset = TfRecordWriter::Frame(examples[0].SerializeAsString()).size();
  EXPECT_EQ(ErrorOf(path),
            absl::StrCat("record 1 (file '", path, "' at byte offset ", offset,
                         "): feature 'image' has 5 bytes, spec.training.dataset.featureShape "
                         "[2, 3, 1] needs 6"));

  config_.feature_encoding = FeatureEncoding::kFloatList;
  v1::TfExample floats = ImageExample(0, FeatureEncoding::kFloatList);
  (*floats.mutable_features()->mutable_feature())["image"].mutable_float_list()->add_value(1);
  EXPECT_THAT(ErrorOf(Write("long.tfrecord", Framed({floats}))),
              AllOf(HasSubstr("record 0 ("), HasSubstr("at byte offset 0"),
                    HasSubstr("feature 'image' has 7 floats"), HasSubstr("needs 6")));
}

TEST_F(TfRecordDatasetTest, EncodedImagesGetAHintToWriteRawPixels) {
  v1::TfExample png = ImageExample(0, FeatureEncoding::kUint8Bytes);
  *(*png.mutable_features()->mutable_feature())["image"].mutable_bytes_list()->mutable_value(0) =
      std::string("\x89PNG\r\n\x1a\n....", 12);
  EXPECT_THAT(ErrorOf(Write("png.tfrecord", Framed({png}))),
              AllOf(HasSubstr("has 12 bytes"), HasSubstr("PNG-encoded image"),
                    HasSubstr("tobytes()")));
}

TEST_F(TfRecordDatasetTest, MissingKeyListsTheKeysTheRecordHas) {
  std::vector<v1::TfExample> examples = {
      ImageExample(0, FeatureEncoding::kUint8Bytes),
      ImageExample(1, FeatureEncoding::kUint8Bytes, "image_raw", "digit")};
  const std::string path = Write("keys.tfrecord", Framed(examples));
  EXPECT_THAT(ErrorOf(path),
              AllOf(HasSubstr("record 1 (file '" + path + "' at byte offset "),
                    HasSubstr("has no feature 'image' (spec.training.dataset.featureKey"),
                    HasSubstr("its features are 'digit', 'image_raw'"),
                    HasSubstr("set spec.training.dataset.featureKey")));
  config_.feature_key = "image_raw";
  EXPECT_THAT(ErrorOf(Write("keys2.tfrecord", Framed({examples[1]}))),
              AllOf(HasSubstr("has no feature 'label' (spec.training.dataset.labelKey"),
                    HasSubstr("'digit', 'image_raw'")));
}

TEST_F(TfRecordDatasetTest, WrongFeatureKindSaysWhichEncodingReadsIt) {
  const std::string path =
      WriteExamples("floats.tfrecord", 0, 1, FeatureEncoding::kFloatList);
  EXPECT_THAT(ErrorOf(path),
              AllOf(HasSubstr("record 0 (file '" + path + "' at byte offset 0)"),
                    HasSubstr("feature 'image' is a float_list, but "
                              "spec.training.dataset.featureEncoding uint8Bytes reads a "
                              "bytes_list; set featureEncoding: floatList")));
  v1::TfExample float_label = ImageExample(0, FeatureEncoding::kUint8Bytes);
  (*float_label.mutable_features()->mutable_feature())["label"].mutable_float_list()->add_value(3);
  EXPECT_THAT(ErrorOf(Write("float_label.tfrecord", Framed({float_label}))),
              HasSubstr("label feature 'label' is a float_list, but labels are class indices in "
                        "an int64_list"));
}

TEST_F(TfRecordDatasetTest, NegativeOrTooLargeLabelsAreRejectedWithTheirRecord) {
  std::vector<v1::TfExample> examples = {ImageExample(0, FeatureEncoding::kUint8Bytes),
                                         ImageExample(1, FeatureEncoding::kUint8Bytes)};
  (*examples[1].mutable_features()->mutable_feature())["label"].mutable_int64_list()->set_value(
      0, -1);
  EXPECT_THAT(ErrorOf(Write("neg.tfrecord", Framed(examples))),
              AllOf(HasSubstr("record 1 ("), HasSubstr("label feature 'label' is -1"),
                    HasSubstr("class indices 0..numClasses-1")));

  (*examples[1].mutable_features()->mutable_feature())["label"].mutable_int64_list()->set_value(
      0, 9);
  auto limited = LoadTfRecordDataset(Write("big.tfrecord", Framed(examples)), config_, 4);
  ASSERT_FALSE(limited.ok());
  EXPECT_THAT(std::string(limited.status().message()),
              AllOf(HasSubstr("record 1 ("), HasSubstr("is 9, not below "
                                                       "spec.training.dataset.numClasses 4"),
                    HasSubstr("set numClasses to at least 10")));
  auto unlimited = LoadTfRecordDataset(dir_ + "/big.tfrecord", config_, 0);
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_EQ((*unlimited)->num_classes(), 10);
}

TEST_F(TfRecordDatasetTest, TruncatedFileNamesRecordAndOffset) {
  const std::string whole = Framed({ImageExample(0, FeatureEncoding::kUint8Bytes),
                                    ImageExample(1, FeatureEncoding::kUint8Bytes),
                                    ImageExample(2, FeatureEncoding::kUint8Bytes)});
  const size_t record = whole.size() / 3;
  for (size_t cut : {whole.size() - 1, 2 * record + 5, 2 * record + 14}) {
    SCOPED_TRACE(cut);
    const std::string path = Write("cut.tfrecord", whole.substr(0, cut));
    EXPECT_THAT(ErrorOf(path),
                AllOf(HasSubstr("record 2: file '" + path + "' at byte offset " +
                                std::to_string(2 * record)),
                      HasSubstr("truncated")));
  }
  // Cut inside the GZIP stream: the file and the compression are named.
  config_.compression = DataCompression::kGzip;
  const std::string gz = Gzip(whole);
  const std::string path = Write("cut.tfrecord.gz", gz.substr(0, gz.size() / 2));
  EXPECT_THAT(ErrorOf(path), AllOf(HasSubstr(path), HasSubstr("GZIP"), HasSubstr("truncated")));
}

TEST_F(TfRecordDatasetTest, FlippedByteIsACrcErrorWithRecordAndOffset) {
  const std::string whole = Framed({ImageExample(0, FeatureEncoding::kUint8Bytes),
                                    ImageExample(1, FeatureEncoding::kUint8Bytes)});
  const size_t second = whole.size() / 2;
  std::string data_flip = whole;
  data_flip[second + 20] ^= 0x01;  // inside record 1's Example bytes
  std::string path = Write("flip.tfrecord", data_flip);
  EXPECT_THAT(ErrorOf(path), AllOf(HasSubstr("record 1: file '" + path + "' at byte offset " +
                                             std::to_string(second)),
                                   HasSubstr("data CRC mismatch")));
  std::string length_flip = whole;
  length_flip[second + 1] ^= 0x40;  // record 1's length
  path = Write("flip_length.tfrecord", length_flip);
  EXPECT_THAT(ErrorOf(path),
              AllOf(HasSubstr("record 1: file '" + path + "' at byte offset " +
                              std::to_string(second)),
                    HasSubstr("length CRC mismatch")));
}

TEST_F(TfRecordDatasetTest, RecordsThatAreNotExamplesOrNoRecordsAreErrors) {
  const std::string path =
      Write("text.tfrecord", TfRecordWriter::Frame(std::string("\xff\xff\xff", 3)));
  EXPECT_THAT(ErrorOf(path), AllOf(HasSubstr("record 0 (file '" + path + "' at byte offset 0)"),
                                   HasSubstr("is not a tf.train.Example")));
  EXPECT_THAT(ErrorOf(Write("empty.tfrecord", "")), HasSubstr("holds no records"));
  EXPECT_THAT(ErrorOf(dir_ + "/absent.tfrecord"), HasSubstr("absent.tfrecord"));
}

// Arbitrary bytes never crash the loader: every prefix of a valid file and
// every single-byte corruption of it is either read or reported.
TEST_F(TfRecordDatasetTest, NoPrefixOrCorruptionCrashes) {
  const std::string whole = Framed({ImageExample(0, FeatureEncoding::kUint8Bytes),
                                    ImageExample(1, FeatureEncoding::kUint8Bytes)});
  const size_t first_record = whole.size() / 2;
  for (size_t n = 0; n < whole.size(); ++n) {
    SCOPED_TRACE(n);
    // A prefix is read only when it ends where a record ends (then it is a
    // valid one-record file); every other prefix is empty or cut short.
    auto prefix = LoadTfRecordDataset(Write("p.tfrecord", whole.substr(0, n)), config_, 0);
    EXPECT_EQ(prefix.ok(), n == first_record) << prefix.status();
    // Every byte is covered by a CRC: any corruption is caught.
    std::string bad = whole;
    bad[n] = static_cast<char>(bad[n] ^ 0xa5);
    EXPECT_FALSE(LoadTfRecordDataset(Write("c.tfrecord", bad), config_, 0).ok());
  }
}

TEST_F(TfRecordDatasetTest, PatternsExpandSortedAndFileShardingSplitsTheExpandedFiles) {
  // Written out of order; shard s gets files s, s + 3 of the sorted list.
  for (int f : {4, 0, 3, 1, 2}) {
    WriteExamples(absl::StrCat("train-0000", f, "-of-00005.tfrecord"), 2 * f, 2);
  }
  config_.train_files = {dir_ + "/train-*-of-00005.tfrecord"};
  config_.scale = 1.0f;
  config_.num_classes = 4;
  config_.auto_shard_policy = AutoShardPolicy::kFile;
  auto shard1 = OpenTrainingInput(config_, 1, 1, 3);
  ASSERT_TRUE(shard1.ok()) << shard1.status();
  EXPECT_EQ(shard1->effective_policy, AutoShardPolicy::kFile);
  EXPECT_THAT(RecordIds(*shard1->dataset, 1.0f), ElementsAre(2, 3, 8, 9));
  EXPECT_THAT(shard1->dataset->example_shape(), ElementsAre(2, 3, 1));
  EXPECT_EQ(shard1->dataset->num_classes(), 4);

  // AUTO: FILE while every shard gets a file (5 files, 5 shards), else DATA.
  config_.auto_shard_policy = AutoShardPolicy::kAuto;
  auto five = OpenTrainingInput(config_, 1, 4, 5);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->effective_policy, AutoShardPolicy::kFile);
  EXPECT_THAT(RecordIds(*five->dataset, 1.0f), ElementsAre(8, 9));
  auto six = OpenTrainingInput(config_, 1, 5, 6);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(six->effective_policy, AutoShardPolicy::kData);
  EXPECT_THAT(RecordIds(*six->dataset, 1.0f), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));

  // FILE with fewer files than pipelines counts the expanded files.
  config_.auto_shard_policy = AutoShardPolicy::kFile;
  auto too_many = OpenTrainingInput(config_, 1, 0, 6);
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(std::string(too_many.status().message()),
              HasSubstr("spec.training.dataset.trainFiles has 5 for 6"));
}

TEST_F(TfRecordDatasetTest, DataShardingKeepsEveryNthExampleOfTheConcatenation) {
  for (int f = 0; f < 2; ++f) WriteExamples(absl::StrCat("part-", f, ".tfrecord"), 3 * f, 3);
  config_.train_files = {dir_ + "/part-*.tfrecord"};
  config_.scale = 1.0f;
  config_.auto_shard_policy = AutoShardPolicy::kData;
  std::vector<int> seen;
  for (int shard = 0; shard < 2; ++shard) {
    auto input = OpenTrainingInput(config_, 7, shard, 2);
    ASSERT_TRUE(input.ok()) << input.status();
    EXPECT_EQ(input->effective_policy, AutoShardPolicy::kData);
    EXPECT_THAT(RecordIds(*input->dataset, 1.0f), ElementsAre(0, 1, 2, 3, 4, 5));
    // The batcher keeps positions p with p % 2 == shard: the two shards'
    // first batch of 3 together is the single pipeline's first batch of 6.
    ShardedBatcher batcher(std::shared_ptr<const Dataset>(std::move(input->dataset)),
                           input->effective_policy, shard, 2, 3, 7, /*shuffle=*/false, 0);
    Batch batch = batcher.Next();
    for (int64_t i = 0; i < 3; ++i) {
      seen.push_back(static_cast<int>(batch.features[i * 6] / 10 + 0.5f));
    }
  }
  EXPECT_THAT(seen, ElementsAre(0, 2, 4, 1, 3, 5));
}

TEST_F(TfRecordDatasetTest, ErrorsFromOpenTrainingInputNameTheFieldAndTheFile) {
  WriteExamples("good.tfrecord", 0, 2);
  std::vector<v1::TfExample> bad = {ImageExample(5, FeatureEncoding::kUint8Bytes)};
  (*bad[0].mutable_features()->mutable_feature())["image"].mutable_bytes_list()->add_value("x");
  const std::string bad_path = Write("z-bad.tfrecord", Framed(bad));
  config_.train_files = {dir_ + "/*.tfrecord"};
  auto input = OpenTrainingInput(config_, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              AllOf(HasSubstr("spec.training.dataset.trainFiles (file 1 of 2 the patterns match)"),
                    HasSubstr("record 0 (file '" + bad_path + "' at byte offset 0)"),
                    HasSubstr("has 2 bytes values")));

  config_.train_files = {dir_ + "/nothing-*.tfrecord"};
  input = OpenTrainingInput(config_, 1, 0, 1);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              HasSubstr("spec.training.dataset.trainFiles[0]: the pattern"));

  config_.train_files = {dir_ + "/good.tfrecord"};
  config_.eval_files = {dir_ + "/good.tfrecord", dir_ + "/z-bad.tfrecord"};
  auto eval = OpenEvalDataset(config_, 1);
  ASSERT_FALSE(eval.ok());
  EXPECT_THAT(std::string(eval.status().message()),
              AllOf(HasSubstr("spec.training.dataset.evalFiles[1]"), HasSubstr(bad_path)));
}

}  // namespace
}  // namespace distrain

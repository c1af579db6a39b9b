// Fuzz target: a TFRecord file of tf.train.Example records loaded as a
// dataset (worker/data/tfrecord_dataset.cc LoadTfRecordDataset): Example
// parsing, feature lookup, every featureEncoding, labels, and the GZIP/ZLIB
// inflation in front of the framing.
//
// The loader reads a path, so each input is written to one file per fuzzing
// process (under $TMPDIR) and loaded from there. Input (fuzz_input.h): a
// configuration byte, then
//   mode 0: messages, each one record's bytes (a serialised Example),
//           framed into the file with valid CRCs by TfRecordWriter so that
//           mutations reach the Example decoding instead of failing a CRC;
//   mode 1-3: the rest of the input is the whole file, read with
//           compression NONE, GZIP or ZLIB.
// Configuration byte: bits 0-1 featureEncoding (uint8Bytes, floatList,
// int64List), bit 2 numClasses 10 (else derived), bits 3-4 featureShape
// ([28, 28, 1], [4], [2, 2], [1]), bits 5-6 the mode.
// Corpus: tests/fuzz/corpus/tfrecord_dataset/ (MNIST records TensorFlow
// wrote, scripts/mnist_tfrecord.sh, as mode 0 and as a gzipped file).

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/job_config.h"
#include "tests/fuzz/fuzz_input.h"
#include "worker/data/dataset.h"
#include "worker/data/tfrecord.h"

namespace {

const std::string& FilePath() {
  static const std::string path = [] {
    const char* dir = getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/distrain-fuzz-" +
           std::to_string(getpid()) + ".tfrecord";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  distrain::fuzz::FuzzInput in(data, size);
  const uint8_t config_byte = in.Byte();
  distrain::DatasetConfig config;
  config.type = distrain::DatasetType::kTfRecord;
  switch (config_byte & 3) {
    case 0: config.feature_encoding = distrain::FeatureEncoding::kUint8Bytes; break;
    case 1: config.feature_encoding = distrain::FeatureEncoding::kFloatList; break;
    default: config.feature_encoding = distrain::FeatureEncoding::kInt64List; break;
  }
  const int num_classes = (config_byte & 4) != 0 ? 10 : 0;
  switch ((config_byte >> 3) & 3) {
    case 0: config.feature_shape = {28, 28, 1}; break;
    case 1: config.feature_shape = {4}; break;
    case 2: config.feature_shape = {2, 2}; break;
    default: config.feature_shape = {1}; break;
  }
  const int mode = (config_byte >> 5) & 3;
  const std::string& path = FilePath();
  if (mode == 0) {
    absl::StatusOr<distrain::TfRecordWriter> writer = distrain::TfRecordWriter::Create(path);
    if (!writer.ok()) abort();  // the temp directory is not writable: nothing to fuzz
    while (!in.empty()) {
      if (!writer->Write(in.Message()).ok()) abort();
    }
    if (!writer->Flush().ok()) abort();
  } else {
    config.compression = mode == 1   ? distrain::DataCompression::kNone
                         : mode == 2 ? distrain::DataCompression::kGzip
                                     : distrain::DataCompression::kZlib;
    FILE* f = fopen(path.c_str(), "wb");
    if (f == nullptr) abort();
    const std::string_view rest = in.Rest();
    if (fwrite(rest.data(), 1, rest.size(), f) != rest.size()) abort();
    fclose(f);
  }
  absl::StatusOr<std::unique_ptr<distrain::Dataset>> dataset =
      distrain::LoadTfRecordDataset(path, config, num_classes);
  (void)dataset;
  return 0;
}

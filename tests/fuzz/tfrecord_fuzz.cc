// Fuzz target: TFRecord framing (worker/data/tfrecord.h TfRecordReader, the
// in-memory constructor): lengths, both masked CRC-32Cs, truncation. Every
// record is read until the end or the first error. The reader verifies the
// CRCs, so most mutations stop at the first record; libFuzzer's comparison
// tracing still reaches past them, and the corpus holds whole files.
// Corpus: tests/fuzz/corpus/tfrecord/ (records of the MNIST shards that
// TensorFlow wrote, scripts/mnist_tfrecord.sh).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "worker/data/tfrecord.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  distrain::TfRecordReader reader(
      "fuzz", std::string(reinterpret_cast<const char*>(data), size), /*decompressed=*/false);
  std::string_view record;
  volatile uint64_t checksum = 0;  // volatile: the loop below is not optimised out
  while (true) {
    absl::StatusOr<bool> more = reader.Next(&record);
    if (!more.ok() || !*more) break;
    // Touch every byte the reader hands out, so ASan sees a view past its buffer.
    for (char c : record) checksum += static_cast<uint8_t>(c);
    (void)reader.Where(reader.record_offset());
  }
  return 0;
}

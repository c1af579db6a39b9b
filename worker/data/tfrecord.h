#ifndef DISTRAIN_WORKER_DATA_TFRECORD_H_
#define DISTRAIN_WORKER_DATA_TFRECORD_H_

// TFRecord framing, the container TensorFlow uses for tf.train.Example data and
// for TensorBoard event files (docs/architecture.md, "TensorFlow formats").
// Each record is
//   uint64 length (little-endian)
//   uint32 masked CRC-32C of those 8 length bytes
//   `length` bytes of data
//   uint32 masked CRC-32C of the data
// where mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. A file may be GZIP- or
// ZLIB-compressed as a whole (tf.io.TFRecordOptions compression_type).

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace distrain {

// CRC-32C (Castagnoli), with SSE4.2 when the CPU has it; `crc` chains calls.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked form of a CRC-32C (so CRCs of CRCs do not degenerate).
uint32_t MaskCrc32c(uint32_t crc);

enum class TfRecordCompression { kNone, kGzip, kZlib };
// "NONE"/"" | "GZIP" | "ZLIB" (case-insensitive), as tf.data spells them.
absl::StatusOr<TfRecordCompression> ParseTfRecordCompression(std::string_view name);

// Walks the records of one file held in memory (decompressed first when the
// file is compressed). Every length is checked against what remains and both
// CRCs are verified, so a truncated or corrupt file is reported with the file
// name and the byte offset of the bad record, never read out of bounds.
// Offsets are into the decompressed stream for compressed files (the message
// says so). Not thread-safe; the records it returns view its own buffer.
class TfRecordReader {
 public:
  static absl::StatusOr<TfRecordReader> Open(const std::string& path,
                                             TfRecordCompression compression);
  // For tests and in-memory data; `description` names it in errors.
  TfRecordReader(std::string description, std::string bytes, bool decompressed);

  // The next record in *record: OK with true, OK with false at a clean end of
  // file, or DataLoss naming the file and offset.
  absl::StatusOr<bool> Next(std::string_view* record);
  // Byte offset of the record Next() returned last.
  uint64_t record_offset() const { return record_offset_; }
  // "file 'x' (decompressed) at byte offset N", for callers' own errors about a record.
  std::string Where(uint64_t offset) const;

 private:
  std::string description_;
  std::string bytes_;
  bool decompressed_ = false;
  uint64_t pos_ = 0;
  uint64_t record_offset_ = 0;
};

// Appends records to a new file (created or truncated) with no compression;
// what the TensorBoard event writer uses. Flush() makes records visible to a
// reader (TensorBoard polls the file). Not thread-safe; owns the FILE*.
class TfRecordWriter {
 public:
  static absl::StatusOr<TfRecordWriter> Create(const std::string& path);
  TfRecordWriter(TfRecordWriter&& other) noexcept;
  TfRecordWriter& operator=(TfRecordWriter&& other) noexcept;
  TfRecordWriter(const TfRecordWriter&) = delete;
  TfRecordWriter& operator=(const TfRecordWriter&) = delete;
  ~TfRecordWriter();

  absl::Status Write(std::string_view record);
  absl::Status Flush();
  const std::string& path() const { return path_; }

  // One framed record, for tests and writers that build files in memory.
  static std::string Frame(std::string_view record);

 private:
  TfRecordWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_DATA_TFRECORD_H_

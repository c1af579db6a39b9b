#include "worker/data/tfrecord.h"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace distrain {
namespace {

constexpr uint32_t kCrc32cPolyReflected = 0x82f63b78u;

std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPolyReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t Crc32cTable(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeCrc32cTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
#endif

uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
void StoreLe64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void StoreLe32(uint32_t v, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Inflates a whole GZIP (possibly several concatenated members, as `cat a.gz
// b.gz` makes) or ZLIB stream.
absl::StatusOr<std::string> Decompress(const std::string& path, const std::string& in,
                                       TfRecordCompression compression) {
  const char* kind = compression == TfRecordCompression::kGzip ? "GZIP" : "ZLIB";
  const int window_bits = compression == TfRecordCompression::kGzip ? 16 + MAX_WBITS : MAX_WBITS;
  z_stream zs{};
  if (inflateInit2(&zs, window_bits) != Z_OK) {
    return absl::InternalError(absl::StrCat("file '", path, "': cannot start zlib"));
  }
  std::string out;
  std::array<char, 1 << 16> chunk;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  absl::Status status;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk.data());
    zs.avail_out = static_cast<uInt>(chunk.size());
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk.data(), chunk.size() - zs.avail_out);
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0 || compression != TfRecordCompression::kGzip) break;
      inflateReset(&zs);  // the next GZIP member
      continue;
    }
    if (rc == Z_OK) {
      if (zs.avail_in == 0 && zs.avail_out != 0) {
        status = absl::DataLossError(absl::StrFormat(
            "file '%s' ends inside its %s stream (after %d compressed bytes): the file is "
            "truncated; re-copy it, or set compression to match how it was written",
            path, kind, in.size()));
        break;
      }
      continue;
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      status = absl::DataLossError(absl::StrFormat(
          "file '%s' ends inside its %s stream (after %d compressed bytes): the file is "
          "truncated; re-copy it",
          path, kind, in.size()));
      break;
    }
    status = absl::DataLossError(absl::StrFormat(
        "file '%s' is not a valid %s stream (zlib: %s at compressed byte offset %d); check "
        "dataset.compression matches how the file was written",
        path, kind, zs.msg != nullptr ? zs.msg : "error", zs.total_in));
    break;
  }
  inflateEnd(&zs);
  if (!status.ok()) return status;
  return out;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool have_sse42 = __builtin_cpu_supports("sse4.2");
  crc = have_sse42 ? Crc32cSse42(p, size, crc) : Crc32cTable(p, size, crc);
#else
  crc = Crc32cTable(p, size, crc);
#endif
  return ~crc;
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

absl::StatusOr<TfRecordCompression> ParseTfRecordCompression(std::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(std::string(name));
  if (upper.empty() || upper == "NONE") return TfRecordCompression::kNone;
  if (upper == "GZIP") return TfRecordCompression::kGzip;
  if (upper == "ZLIB") return TfRecordCompression::kZlib;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown TFRecord compression '", std::string(name), "': use NONE, GZIP or ZLIB (as tf.data names them)"));
}

absl::StatusOr<TfRecordReader> TfRecordReader::Open(const std::string& path,
                                                    TfRecordCompression compression) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open TFRecord file '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read TFRecord file '", path, "'"));
  }
  std::string bytes = std::move(buffer).str();
  if (compression == TfRecordCompression::kNone) return TfRecordReader(path, std::move(bytes), false);
  absl::StatusOr<std::string> plain = Decompress(path, bytes, compression);
  if (!plain.ok()) return plain.status();
  return TfRecordReader(path, std::move(*plain), true);
}

TfRecordReader::TfRecordReader(std::string description, std::string bytes, bool decompressed)
    : description_(std::move(description)), bytes_(std::move(bytes)), decompressed_(decompressed) {}

std::string TfRecordReader::Where(uint64_t offset) const {
  return absl::StrCat("file '", description_, "'", decompressed_ ? " (decompressed)" : "",
                      " at byte offset ", offset);
}

absl::StatusOr<bool> TfRecordReader::Next(std::string_view* record) {
  record_offset_ = pos_;
  const uint64_t remaining = bytes_.size() - pos_;
  if (remaining == 0) return false;
  if (remaining < 12) {
    return absl::DataLossError(absl::StrCat(
        Where(pos_), ": truncated record header (", remaining,
        " of 12 bytes); the file was cut short — re-copy it or drop the partial record"));
  }
  const char* header = bytes_.data() + pos_;
  const uint64_t length = LoadLe64(header);
  const uint32_t length_crc = LoadLe32(header + 8);
  if (MaskCrc32c(Crc32c(header, 8)) != length_crc) {
    return absl::DataLossError(absl::StrCat(
        Where(pos_), ": corrupt record header (length CRC mismatch); this is not a TFRecord file ",
        "or it is damaged", decompressed_ ? "" : " (if it is compressed, set dataset.compression)"));
  }
  if (length > remaining - 12 || remaining - 12 - length < 4) {
    return absl::DataLossError(absl::StrCat(
        Where(pos_), ": truncated record (header says ", length, " data bytes, ",
        remaining - 12 < 4 ? 0 : remaining - 16, " remain); the file was cut short"));
  }
  const char* data = header + 12;
  const uint32_t data_crc = LoadLe32(data + length);
  if (MaskCrc32c(Crc32c(data, length)) != data_crc) {
    return absl::DataLossError(
        absl::StrCat(Where(pos_), ": corrupt record (data CRC mismatch over ", length, " bytes)"));
  }
  *record = std::string_view(data, length);
  pos_ += 16 + length;
  return true;
}

absl::StatusOr<TfRecordWriter> TfRecordWriter::Create(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
  return TfRecordWriter(path, file);
}

TfRecordWriter::TfRecordWriter(TfRecordWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(other.file_) {
  other.file_ = nullptr;
}

TfRecordWriter& TfRecordWriter::operator=(TfRecordWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    other.file_ = nullptr;
  }
  return *this;
}

TfRecordWriter::~TfRecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string TfRecordWriter::Frame(std::string_view record) {
  std::string out(16 + record.size(), '\0');
  StoreLe64(record.size(), out.data());
  StoreLe32(MaskCrc32c(Crc32c(out.data(), 8)), out.data() + 8);
  std::memcpy(out.data() + 12, record.data(), record.size());
  StoreLe32(MaskCrc32c(Crc32c(record.data(), record.size())), out.data() + 12 + record.size());
  return out;
}

absl::Status TfRecordWriter::Write(std::string_view record) {
  const std::string framed = Frame(record);
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size()) {
    return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TfRecordWriter::Flush() {
  if (std::fflush(file_) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace distrain

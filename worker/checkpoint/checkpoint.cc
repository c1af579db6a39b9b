// Checkpoint file format, version 1 (all integers little-endian):
//
//   offset      size  field
//   0           8     magic "DTRNCKPT"
//   8           4     uint32 format version (1)
//   12          8     uint64 L = length of the index
//   20          L     distrain.v1.CheckpointIndex, serialised (step, metadata,
//                     and per tensor: name, shape, offset, byte_size, crc32)
//   20+L        4     uint32 zlib CRC-32 of the L index bytes
//   24+L        D     data section: each tensor's float32 values, row-major,
//                     little-endian, at entry.offset from the section start;
//                     written back to back in index order, so D is the sum of
//                     the byte sizes
//   24+L+D      8     trailer magic "DTRNEND1"
//
// The trailer is written last, so a file cut short at any point lacks it (or
// fails a length check first). ReadFile checks every field against the file
// size before reading, and each tensor against its CRC, so corruption is an
// error naming the file and the field, never a crash or silently wrong values.

#include "worker/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "distrain/v1/tensor.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint tensors are written as raw host floats, which must be little-endian");

constexpr char kMagic[8] = {'D', 'T', 'R', 'N', 'C', 'K', 'P', 'T'};
constexpr char kTrailer[8] = {'D', 'T', 'R', 'N', 'E', 'N', 'D', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderSize = 20;  // magic + version + index length
constexpr uint64_t kCrcSize = 4;
constexpr uint64_t kTrailerSize = 8;
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".dtc";
constexpr char kTmpMarker[] = ".tmp-";

uint32_t Crc32(const void* data, uint64_t len) {
  return static_cast<uint32_t>(
      crc32_z(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(data), static_cast<z_size_t>(len)));
}

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return v;
}
uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return v;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error (close can report a failed write-back).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status Errno(const std::string& path, const std::string& what) {
  return absl::InternalError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& path, const void* data, uint64_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, std::min<uint64_t>(len, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(path, "write failed");
    p += n;
    len -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly len bytes at offset; the caller has checked the range
// against the file size, so a short read means the file changed under us.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, void* out, uint64_t len) {
  char* p = static_cast<char*>(out);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, std::min<uint64_t>(len, 1 << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(path, absl::StrCat("read failed at byte ", offset));
    if (n == 0)
      return absl::DataLossError(
          absl::StrCat(path, ": truncated at byte ", offset, " while reading"));
    p += n;
    offset += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(dir, "cannot open directory to fsync it");
  Fd closer(fd);
  if (::fsync(fd) != 0) return Errno(dir, "fsync of directory failed");
  return absl::OkStatus();
}

// Step of a final checkpoint file name "ckpt-<digits>.dtc", or -1.
int64_t StepOfName(std::string_view name) {
  const std::string_view prefix = kPrefix, suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix)) {
    return -1;
  }
  const std::string_view digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  int64_t step = -1;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  return ec == std::errc() && ptr == digits.data() + digits.size() ? step : -1;
}

// Removes temporary files a crashed Save left behind ("ckpt-*.dtc.tmp-<pid>").
void RemoveStaleTmpFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kPrefix) &&
        name.find(std::string(kSuffix) + kTmpMarker) != std::string::npos) {
      std::error_code rm_ec;
      if (std::filesystem::remove(entry.path(), rm_ec)) {
        spdlog::info("checkpoint: removed leftover temporary file {}", entry.path().string());
      }
    }
  }
}

// proto3 `string` fields must hold UTF-8 (the parser rejects anything else),
// so names and metadata are checked before they are written.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    int extra;
    uint32_t min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, min = 0x10000;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    uint32_t code = c & (0x3f >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      code = (code << 6) | (cc & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(keep) {}

std::string CheckpointManager::PathForStep(int64_t step) const {
  return absl::StrFormat("%s/%s%012d%s", dir_, kPrefix, step, kSuffix);
}

std::vector<int64_t> CheckpointManager::ListSteps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = StepOfName(name);
    // Only the canonical spelling, so PathForStep(step) names this file.
    if (step >= 0 && std::filesystem::path(PathForStep(step)).filename() == name)
      steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status CheckpointManager::WriteFile(const std::string& path, const CheckpointState& state) {
  for (const auto& [key, value] : state.metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": checkpoint metadata must be UTF-8 text; the entry for key \"",
                       absl::CHexEscape(key), "\" is not"));
    }
  }
  for (const auto& [name, tensor] : state.tensors) {
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name \"", absl::CHexEscape(name), "\" is not UTF-8 text"));
    }
  }
  distrain::v1::CheckpointIndex index;
  index.set_step(state.step);
  for (const auto& [key, value] : state.metadata) (*index.mutable_metadata())[key] = value;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : state.tensors) {
    auto* entry = index.add_entries();
    entry->set_name(name);
    for (int64_t d : tensor.shape()) entry->add_shape(d);
    entry->set_offset(offset);
    entry->set_byte_size(static_cast<uint64_t>(tensor.bytes()));
    entry->set_crc32(Crc32(tensor.data(), tensor.bytes()));
    offset += static_cast<uint64_t>(tensor.bytes());
  }
  std::string index_bytes;
  {
    // Deterministic so equal states give byte-identical files (map order).
    google::protobuf::io::StringOutputStream raw(&index_bytes);
    google::protobuf::io::CodedOutputStream coded(&raw);
    coded.SetSerializationDeterministic(true);
    if (!index.SerializeToCodedStream(&coded)) {
      return absl::InternalError(absl::StrCat(path, ": cannot serialise the checkpoint index"));
    }
  }

  std::string head(kHeaderSize, '\0');
  std::memcpy(head.data(), kMagic, sizeof(kMagic));
  PutU32(head.data() + 8, kFormatVersion);
  PutU64(head.data() + 12, index_bytes.size());
  head += index_bytes;
  char crc[kCrcSize];
  PutU32(crc, Crc32(index_bytes.data(), index_bytes.size()));
  head.append(crc, kCrcSize);

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path, "cannot create checkpoint file");
  Fd file(fd);
  absl::Status status = WriteAll(fd, path, head.data(), head.size());
  // Tensors go straight from their storage to the file: no second copy of
  // the model in memory.
  for (auto it = state.tensors.begin(); status.ok() && it != state.tensors.end(); ++it) {
    status = WriteAll(fd, path, it->second.data(), static_cast<uint64_t>(it->second.bytes()));
  }
  if (status.ok()) status = WriteAll(fd, path, kTrailer, kTrailerSize);
  if (status.ok() && ::fsync(fd) != 0) status = Errno(path, "fsync failed");
  if (file.Close() != 0 && status.ok()) status = Errno(path, "close failed");
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

absl::StatusOr<CheckpointState> CheckpointManager::ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  Fd file(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno(path, "stat failed");
  const uint64_t size = static_cast<uint64_t>(st.st_size);

  if (size < kHeaderSize + kCrcSize + kTrailerSize) {
    return Corrupt(path,
                   absl::StrCat("truncated: ", size, " bytes is smaller than the ",
                                kHeaderSize + kCrcSize + kTrailerSize, "-byte minimum checkpoint"));
  }
  char head[kHeaderSize];
  if (auto s = ReadAt(fd, path, 0, head, kHeaderSize); !s.ok()) return s;
  if (std::memcmp(head, kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "bad magic at byte 0: not a distrain checkpoint (expected \"DTRNCKPT\")");
  }
  const uint32_t version = GetU32(head + 8);
  if (version != kFormatVersion) {
    return Corrupt(path, absl::StrCat("unsupported format version ", version,
                                      " at byte 8 (this build reads ", kFormatVersion, ")"));
  }
  char trailer[kTrailerSize];
  if (auto s = ReadAt(fd, path, size - kTrailerSize, trailer, kTrailerSize); !s.ok()) return s;
  if (std::memcmp(trailer, kTrailer, kTrailerSize) != 0) {
    return Corrupt(path, absl::StrCat("missing end marker at byte ", size - kTrailerSize,
                                      ": the file is truncated or was not completely written"));
  }
  const uint64_t index_len = GetU64(head + 12);
  const uint64_t max_index_len = size - kHeaderSize - kCrcSize - kTrailerSize;
  if (index_len > max_index_len) {
    return Corrupt(
        path, absl::StrCat("index length ", index_len, " (at byte 12) runs past the end of the ",
                           size, "-byte file"));
  }
  std::string index_bytes(index_len, '\0');
  if (auto s = ReadAt(fd, path, kHeaderSize, index_bytes.data(), index_len); !s.ok()) return s;
  char crc_bytes[kCrcSize];
  if (auto s = ReadAt(fd, path, kHeaderSize + index_len, crc_bytes, kCrcSize); !s.ok()) return s;
  const uint32_t stored_crc = GetU32(crc_bytes);
  const uint32_t actual_crc = Crc32(index_bytes.data(), index_len);
  if (stored_crc != actual_crc) {
    return Corrupt(
        path, absl::StrFormat("index checksum mismatch (stored %08x at byte %d, computed %08x)",
                              stored_crc, kHeaderSize + index_len, actual_crc));
  }
  distrain::v1::CheckpointIndex index;
  if (!index.ParseFromString(index_bytes))
    return Corrupt(path, "the index does not parse as CheckpointIndex");

  const uint64_t data_start = kHeaderSize + index_len + kCrcSize;
  const uint64_t data_size = size - kTrailerSize - data_start;
  // Validate every entry before allocating anything it describes.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [offset, end)
  for (const auto& entry : index.entries()) {
    const std::string what = absl::StrCat("tensor \"", entry.name(), "\"");
    uint64_t elements = 1;
    for (int64_t d : entry.shape()) {
      if (d < 0) return Corrupt(path, absl::StrCat(what, " has negative dimension ", d));
      if (d != 0 && elements > data_size / static_cast<uint64_t>(d)) {
        return Corrupt(path, absl::StrCat(what, " has a shape larger than the file"));
      }
      elements *= static_cast<uint64_t>(d);
    }
    // A default-constructed Tensor has rank 0 and no storage.
    const bool empty_scalar = entry.shape_size() == 0 && entry.byte_size() == 0;
    if (!empty_scalar && elements * sizeof(float) != entry.byte_size()) {
      return Corrupt(path,
                     absl::StrCat(what, " has ", entry.byte_size(), " bytes but its shape holds ",
                                  elements, " floats (", elements * sizeof(float), " bytes)"));
    }
    if (entry.offset() > data_size || entry.byte_size() > data_size - entry.offset()) {
      return Corrupt(
          path, absl::StrCat(what, " at data offset ", entry.offset(), " (+", entry.byte_size(),
                             " bytes) runs past the ", data_size, "-byte data section"));
    }
    ranges.emplace_back(entry.offset(), entry.offset() + entry.byte_size());
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0 && ranges[i].first < ranges[i - 1].second) {
      return Corrupt(path, absl::StrCat("tensors overlap at data offset ", ranges[i].first));
    }
    covered = std::max(covered, ranges[i].second);
  }
  if (covered != data_size) {
    return Corrupt(path, absl::StrCat("the data section has ", data_size,
                                      " bytes but the index describes ", covered));
  }

  CheckpointState state;
  state.step = index.step();
  for (const auto& [key, value] : index.metadata()) state.metadata[key] = value;
  for (const auto& entry : index.entries()) {
    const std::string what = absl::StrCat("tensor \"", entry.name(), "\"");
    std::vector<int64_t> shape(entry.shape().begin(), entry.shape().end());
    Tensor tensor = shape.empty() && entry.byte_size() == 0 ? Tensor() : Tensor(std::move(shape));
    if (auto s = ReadAt(fd, path, data_start + entry.offset(), tensor.data(), entry.byte_size());
        !s.ok()) {
      return s;
    }
    const uint32_t crc = Crc32(tensor.data(), entry.byte_size());
    if (crc != entry.crc32()) {
      return Corrupt(path, absl::StrFormat(
                               "%s: checksum mismatch (stored %08x, computed %08x) in bytes %d..%d",
                               what, entry.crc32(), crc, data_start + entry.offset(),
                               data_start + entry.offset() + entry.byte_size()));
    }
    if (!state.tensors.emplace(entry.name(), std::move(tensor)).second) {
      return Corrupt(path, absl::StrCat(what, " appears twice in the index"));
    }
  }
  return state;
}

absl::Status CheckpointManager::Save(const CheckpointState& state) {
  if (state.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step must be >= 0, got ", state.step));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(dir_, ": cannot create checkpoint directory: ", ec.message()));
  }
  RemoveStaleTmpFiles(dir_);

  // 1. Serialise to a temporary name and fsync it.
  const std::string final_path = PathForStep(state.step);
  const std::string tmp_path = absl::StrCat(final_path, kTmpMarker, ::getpid());
  if (auto s = WriteFile(tmp_path, state); !s.ok()) return s;
  // 2. Atomically replace the final name.
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    absl::Status s = Errno(final_path, absl::StrCat("cannot rename ", tmp_path, " to it"));
    ::unlink(tmp_path.c_str());
    return s;
  }
  // 3. Make the rename durable.
  if (auto s = FsyncDir(dir_); !s.ok()) return s;
  // 4. Retention. The checkpoint just written always survives, even when older
  //    runs left higher-numbered files behind; the other keep-1 slots go to
  //    the newest of the rest.
  if (keep_ > 0) {
    std::vector<int64_t> others;
    for (int64_t step : ListSteps()) {
      if (step != state.step) others.push_back(step);
    }
    const size_t keep_others = static_cast<size_t>(keep_ - 1);
    if (others.size() > keep_others) {
      for (size_t i = 0; i < others.size() - keep_others; ++i) {
        std::error_code rm_ec;
        std::filesystem::remove(PathForStep(others[i]), rm_ec);
        if (rm_ec) {
          spdlog::warn("checkpoint: cannot delete old checkpoint {}: {}", PathForStep(others[i]),
                       rm_ec.message());
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CheckpointState>> CheckpointManager::RestoreLatest() {
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) {
    if (ec)
      return absl::InternalError(
          absl::StrCat(dir_, ": cannot access checkpoint directory: ", ec.message()));
    return std::optional<CheckpointState>();
  }
  if (!std::filesystem::is_directory(dir_, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir_, ": checkpoint path exists but is not a directory"));
  }
  std::filesystem::directory_iterator probe(dir_, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat(dir_, ": cannot list checkpoint directory: ", ec.message()));
  RemoveStaleTmpFiles(dir_);

  std::vector<int64_t> steps = ListSteps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string path = PathForStep(*it);
    absl::StatusOr<CheckpointState> state = ReadFile(path);
    if (!state.ok()) {
      spdlog::warn("checkpoint: skipping {}: {}", path, std::string(state.status().message()));
      continue;
    }
    if (state->step != *it) {
      spdlog::warn("checkpoint: skipping {}: it holds step {} but its name says {}", path,
                   state->step, *it);
      continue;
    }
    return std::optional<CheckpointState>(*std::move(state));
  }
  return std::optional<CheckpointState>();
}

}  // namespace distrain

// MNIST-format IDX files (http://yann.lecun.com/exdb/mnist/):
//   magic: 0x00 0x00 <type> <ndims>, type 0x08 = unsigned byte;
//   ndims big-endian uint32 dimension sizes;
//   the values, row-major.
// Images are 0x00000803 [n, rows, cols], labels 0x00000801 [n]. Every length
// is checked against the file size before reading, so a truncated or
// mislabelled file gives an error naming the byte offset, never a crash.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

// Closes the descriptor on every return path.
class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  ~FileCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileCloser(const FileCloser&) = delete;
  FileCloser& operator=(const FileCloser&) = delete;

 private:
  int fd_;
};

absl::Status ReadExactly(int fd, const std::string& path, uint64_t offset, uint8_t* out,
                         uint64_t len) {
  uint64_t done = 0;
  while (done < len) {
    const ssize_t n =
        ::pread(fd, out + done, std::min<uint64_t>(len - done, 1 << 30), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(
          absl::StrCat(path, ": read failed at byte ", offset + done, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated at byte ", offset + done, " while reading"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> values;
};

// Reads an unsigned-byte IDX file with `ndims` dimensions. `what` names the
// content for messages ("image", "label").
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int ndims, const char* what,
                                 const char* shape_doc) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  FileCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": stat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);

  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(ndims);
  if (size < 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: truncated at byte %d, expected a 4-byte IDX magic 0x%08x (%s)", path,
                        size, expected_magic, shape_doc));
  }
  std::array<uint8_t, 4> magic_bytes;
  if (auto s = ReadExactly(fd, path, 0, magic_bytes.data(), 4); !s.ok()) return s;
  if (magic_bytes[0] == 0x1f && magic_bytes[1] == 0x8b) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is gzip-compressed (magic 1f 8b at byte 0); decompress it first (gunzip ", path,
        ") and point the config at the uncompressed file"));
  }
  const uint32_t magic = (uint32_t{magic_bytes[0]} << 24) | (uint32_t{magic_bytes[1]} << 16) |
                         (uint32_t{magic_bytes[2]} << 8) | uint32_t{magic_bytes[3]};
  if (magic != expected_magic) {
    std::string hint;
    if (magic == 0x00000801u) hint = "; this looks like a labels file";
    if (magic == 0x00000803u) hint = "; this looks like an images file";
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad IDX magic 0x%08x at byte 0, expected 0x%08x (%s)%s", path, magic,
                        expected_magic, shape_doc, hint));
  }

  const uint64_t header_len = 4 + 4 * static_cast<uint64_t>(ndims);
  if (size < header_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated at byte %d, expected a %d-byte IDX header", path, size, header_len));
  }
  std::vector<uint8_t> raw_dims(4 * ndims);
  if (auto s = ReadExactly(fd, path, 4, raw_dims.data(), raw_dims.size()); !s.ok()) return s;
  IdxArray out;
  // Product of the dimensions, saturating so a garbage header cannot overflow.
  uint64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = raw_dims.data() + 4 * d;
    const uint32_t dim =
        (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
    if (dim == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: dimension %d (at byte %d) is 0; the file holds no %ss", path, d, 4 + 4 * d, what));
    }
    out.dims.push_back(dim);
    count = count > (uint64_t{1} << 40) / dim ? (uint64_t{1} << 40) : count * dim;
  }
  const uint64_t expected_size = header_len + count;
  if (size < expected_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated at byte %d, expected %d bytes of %s data (%d-byte header + [%s] values)",
        path, size, expected_size, what, header_len, absl::StrJoin(out.dims, ", ")));
  }
  if (size > expected_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d unexpected bytes after the end of the %s data at byte %d (header says [%s]); the "
        "file is "
        "not a single IDX array",
        path, size - expected_size, what, expected_size, absl::StrJoin(out.dims, ", ")));
  }
  out.values.resize(count);
  if (auto s = ReadExactly(fd, path, header_len, out.values.data(), count); !s.ok()) return s;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadIdxDataset(const std::string& images_path,
                                                        const std::string& labels_path,
                                                        float scale) {
  auto images = ReadIdx(images_path, 3, "image", "uint8 images [n, rows, cols]");
  if (!images.ok()) return images.status();
  auto labels = ReadIdx(labels_path, 1, "label", "uint8 labels [n]");
  if (!labels.ok()) return labels.status();
  const uint64_t n = images->dims[0];
  if (labels->dims[0] != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", n, " images but ", labels_path, " has ", labels->dims[0],
                     " labels; the files must describe the same examples"));
  }
  const uint64_t num_features = uint64_t{images->dims[1]} * images->dims[2];
  if (num_features > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": ", num_features, " pixels per image is more than supported"));
  }

  std::array<float, 256> lut;
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v) * scale;
  std::vector<float> features(images->values.size());
  std::transform(images->values.begin(), images->values.end(), features.begin(),
                 [&lut](uint8_t v) { return lut[v]; });
  images->values = {};

  std::vector<int32_t> label_values(n);
  int32_t max_label = 0;
  for (uint64_t i = 0; i < n; ++i) {
    label_values[i] = labels->values[i];
    max_label = std::max(max_label, label_values[i]);
  }
  // NHWC without the batch dimension, one channel: what a Conv2D expects.
  std::vector<int64_t> shape = {int64_t{images->dims[1]}, int64_t{images->dims[2]}, 1};
  return std::make_unique<InMemoryDataset>(images_path, static_cast<int>(num_features),
                                           std::max(2, max_label + 1), std::move(features),
                                           std::move(label_values), std::move(shape));
}

}  // namespace distrain

#include "worker/model/keras_archive.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace distrain {
namespace {

absl::Status Hdf5Error(const std::string& what) {
  return absl::InternalError(absl::StrCat("HDF5: cannot ", what));
}

// Closes an HDF5 id of any kind on every return path.
class HidCloser {
 public:
  HidCloser(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~HidCloser() {
    if (id_ >= 0) close_(id_);
  }
  HidCloser(const HidCloser&) = delete;
  HidCloser& operator=(const HidCloser&) = delete;

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void PutLe16(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
}
void PutLe32(std::string* out, uint32_t v) {
  PutLe16(out, v & 0xffff);
  PutLe16(out, v >> 16);
}

}  // namespace

absl::StatusOr<Hdf5Image> Hdf5Image::Create() {
  // Failures come back as return codes with our own messages; HDF5's stack
  // dumps on stderr would only confuse a user.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return Hdf5Error("create file access properties");
  HidCloser fapl_closer(fapl, H5Pclose);
  if (H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/0) < 0) {
    return Hdf5Error("select the in-memory driver");
  }
  const hid_t file = H5Fcreate("model.weights.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) return Hdf5Error("create an in-memory file");
  return Hdf5Image(file);
}

Hdf5Image::Hdf5Image(Hdf5Image&& other) noexcept : file_(other.file_) { other.file_ = -1; }

Hdf5Image::~Hdf5Image() {
  if (file_ >= 0) H5Fclose(file_);
}

absl::Status Hdf5Image::AddGroup(const std::string& path, const std::string& name_attr) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&prefix, "/", part);
    if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) > 0) continue;
    const hid_t group = H5Gcreate2(file_, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (group < 0) return Hdf5Error(absl::StrCat("create group ", prefix));
    H5Gclose(group);
  }
  if (name_attr.empty()) return absl::OkStatus();
  const hid_t group = H5Gopen2(file_, path.c_str(), H5P_DEFAULT);
  if (group < 0) return Hdf5Error(absl::StrCat("open group ", path));
  HidCloser group_closer(group, H5Gclose);
  // A variable-length UTF-8 string, what h5py stores for a Python str.
  const hid_t type = H5Tcopy(H5T_C_S1);
  HidCloser type_closer(type, H5Tclose);
  if (type < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
    return Hdf5Error("make a string type");
  }
  const hid_t space = H5Screate(H5S_SCALAR);
  HidCloser space_closer(space, H5Sclose);
  const hid_t attr = H5Acreate2(group, "name", type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (attr < 0) return Hdf5Error(absl::StrCat("create the name attribute of ", path));
  HidCloser attr_closer(attr, H5Aclose);
  const char* value = name_attr.c_str();
  if (H5Awrite(attr, type, &value) < 0) return Hdf5Error(absl::StrCat("write the name of ", path));
  return absl::OkStatus();
}

absl::Status Hdf5Image::AddFloats(const std::string& path, const std::vector<int64_t>& shape,
                                  const float* values) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const hid_t space = shape.empty() ? H5Screate(H5S_SCALAR)
                                    : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                       nullptr);
  if (space < 0) return Hdf5Error(absl::StrCat("make the shape of ", path));
  HidCloser space_closer(space, H5Sclose);
  const hid_t set =
      H5Dcreate2(file_, path.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (set < 0) return Hdf5Error(absl::StrCat("create dataset ", path));
  HidCloser set_closer(set, H5Dclose);
  if (H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
    return Hdf5Error(absl::StrCat("write dataset ", path));
  }
  return absl::OkStatus();
}

absl::Status Hdf5Image::AddInt64Scalar(const std::string& path, int64_t value) {
  const hid_t space = H5Screate(H5S_SCALAR);
  HidCloser space_closer(space, H5Sclose);
  const hid_t set =
      H5Dcreate2(file_, path.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (set < 0) return Hdf5Error(absl::StrCat("create dataset ", path));
  HidCloser set_closer(set, H5Dclose);
  if (H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value) < 0) {
    return Hdf5Error(absl::StrCat("write dataset ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Hdf5Image::Bytes() {
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) return Hdf5Error("flush the in-memory file");
  const ssize_t size = H5Fget_file_image(file_, nullptr, 0);
  if (size < 0) return Hdf5Error("size the in-memory file");
  std::string bytes(static_cast<size_t>(size), '\0');
  if (H5Fget_file_image(file_, bytes.data(), bytes.size()) != size) {
    return Hdf5Error("copy out the in-memory file");
  }
  return bytes;
}

absl::StatusOr<Hdf5Image> Hdf5Image::OpenBytes(const std::string& bytes) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return Hdf5Error("create file access properties");
  HidCloser fapl_closer(fapl, H5Pclose);
  if (H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/0) < 0 ||
      H5Pset_file_image(fapl, const_cast<char*>(bytes.data()), bytes.size()) < 0) {
    return Hdf5Error("hand the weights file to the in-memory driver");
  }
  const hid_t file = H5Fopen("model.weights.h5", H5F_ACC_RDONLY, fapl);
  if (file < 0) {
    return absl::InvalidArgumentError(
        "model.weights.h5 is not an HDF5 file (the .keras archive is damaged)");
  }
  return Hdf5Image(file);
}

bool Hdf5Image::Exists(const std::string& path) const {
  // H5Lexists needs every parent to exist; walk down.
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&prefix, "/", part);
    if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

absl::StatusOr<std::pair<std::vector<int64_t>, std::vector<float>>> Hdf5Image::ReadFloats(
    const std::string& path) const {
  if (!Exists(path)) {
    return absl::NotFoundError(absl::StrCat("model.weights.h5 has no dataset ", path));
  }
  const hid_t set = H5Dopen2(file_, path.c_str(), H5P_DEFAULT);
  if (set < 0) return absl::InvalidArgumentError(absl::StrCat(path, " is not a dataset"));
  HidCloser set_closer(set, H5Dclose);
  const hid_t type = H5Dget_type(set);
  HidCloser type_closer(type, H5Tclose);
  if (H5Tget_class(type) != H5T_FLOAT) {
    return absl::InvalidArgumentError(absl::StrCat(path, " does not hold floats"));
  }
  const hid_t space = H5Dget_space(set);
  HidCloser space_closer(space, H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0 || rank > 8) return absl::InvalidArgumentError(absl::StrCat(path, ": bad rank"));
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && elements > (int64_t{1} << 34) / d)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": too large"));
    }
    elements *= d;
  }
  std::vector<float> values(static_cast<size_t>(elements));
  if (elements > 0 &&
      H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    return Hdf5Error(absl::StrCat("read ", path));
  }
  return std::make_pair(std::move(shape), std::move(values));
}

absl::StatusOr<std::string> StoredZip(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  constexpr uint64_t kLimit = 0xffffffffull;
  // DOS date and time of now (local time, as zip tools expect).
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const uint32_t dos_time =
      (local.tm_hour << 11) | (local.tm_min << 5) | (local.tm_sec / 2);
  const uint32_t dos_date =
      ((local.tm_year > 80 ? local.tm_year - 80 : 0) << 9) | ((local.tm_mon + 1) << 5) | local.tm_mday;

  std::string out;
  std::string central;
  for (const auto& [name, data] : entries) {
    if (data.size() >= kLimit || out.size() + data.size() + name.size() + 30 >= kLimit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the .keras archive would exceed 4 GiB at '", name,
                       "'; zip64 is not supported, so the model is too large to export"));
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    // 1. The local header, then the bytes as they are (method 0: stored).
    PutLe32(&out, 0x04034b50);
    PutLe16(&out, 20);  // version needed: 2.0
    PutLe16(&out, 0);   // flags
    PutLe16(&out, 0);   // method: stored
    PutLe16(&out, dos_time);
    PutLe16(&out, dos_date);
    PutLe32(&out, crc);
    PutLe32(&out, static_cast<uint32_t>(data.size()));
    PutLe32(&out, static_cast<uint32_t>(data.size()));
    PutLe16(&out, static_cast<uint32_t>(name.size()));
    PutLe16(&out, 0);  // extra field length
    out += name;
    out += data;
    // 2. Its central directory record.
    PutLe32(&central, 0x02014b50);
    PutLe16(&central, (3 << 8) | 20);  // made by: Unix, zip 2.0
    PutLe16(&central, 20);
    PutLe16(&central, 0);
    PutLe16(&central, 0);
    PutLe16(&central, dos_time);
    PutLe16(&central, dos_date);
    PutLe32(&central, crc);
    PutLe32(&central, static_cast<uint32_t>(data.size()));
    PutLe32(&central, static_cast<uint32_t>(data.size()));
    PutLe16(&central, static_cast<uint32_t>(name.size()));
    PutLe16(&central, 0);  // extra
    PutLe16(&central, 0);  // comment
    PutLe16(&central, 0);  // disk number
    PutLe16(&central, 0);  // internal attributes
    PutLe32(&central, 0644u << 16);  // external attributes: a regular file, rw-r--r--
    PutLe32(&central, offset);
    central += name;
  }
  if (out.size() + central.size() >= kLimit) {
    return absl::ResourceExhaustedError(
        "the .keras archive would exceed 4 GiB; zip64 is not supported");
  }
  // 3. The end of central directory record.
  const uint32_t central_offset = static_cast<uint32_t>(out.size());
  out += central;
  PutLe32(&out, 0x06054b50);
  PutLe16(&out, 0);
  PutLe16(&out, 0);
  PutLe16(&out, static_cast<uint32_t>(entries.size()));
  PutLe16(&out, static_cast<uint32_t>(entries.size()));
  PutLe32(&out, static_cast<uint32_t>(central.size()));
  PutLe32(&out, central_offset);
  PutLe16(&out, 0);  // comment length
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ReadZip(const std::string& zip,
                                                           const std::string& description) {
  auto le = [&](size_t at, int bytes) {
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(zip[at + i]);
    return v;
  };
  auto damaged = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", description, "' is not a readable zip archive (", what,
                     "); a .keras file is a zip of config.json, metadata.json and "
                     "model.weights.h5"));
  };
  // 1. The end-of-central-directory record: the last 22 bytes, unless the
  //    archive has a comment (at most 64 KiB) after it.
  if (zip.size() < 22) return damaged("too short");
  size_t eocd = std::string::npos;
  for (size_t at = zip.size() - 22;; --at) {
    if (le(at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0 || zip.size() - at > 22 + 0xffff) break;
  }
  if (eocd == std::string::npos) return damaged("no end-of-central-directory record");
  const uint32_t count = le(eocd + 10, 2);
  const uint32_t dir_size = le(eocd + 12, 4);
  const uint32_t dir_offset = le(eocd + 16, 4);
  if (uint64_t{dir_offset} + dir_size > eocd) return damaged("central directory out of range");
  // 2. Each central record names an entry and where its local header is.
  std::map<std::string, std::string> entries;
  size_t at = dir_offset;
  for (uint32_t i = 0; i < count; ++i) {
    if (at + 46 > eocd || le(at, 4) != 0x02014b50) return damaged("bad central record");
    const uint32_t method = le(at + 10, 2);
    const uint32_t crc = le(at + 16, 4);
    const uint32_t packed = le(at + 20, 4);
    const uint32_t size = le(at + 24, 4);
    const uint32_t name_len = le(at + 28, 2);
    const uint32_t extra_len = le(at + 30, 2);
    const uint32_t comment_len = le(at + 32, 2);
    const uint32_t local = le(at + 42, 4);
    if (at + 46 + name_len > eocd) return damaged("bad central record");
    const std::string name = zip.substr(at + 46, name_len);
    at += 46 + name_len + extra_len + comment_len;
    // 3. The local header has its own name and extra lengths.
    if (uint64_t{local} + 30 > zip.size() || le(local, 4) != 0x04034b50) {
      return damaged(absl::StrCat("bad local header for ", name));
    }
    const uint64_t data_at = uint64_t{local} + 30 + le(local + 26, 2) + le(local + 28, 2);
    if (data_at + packed > zip.size()) return damaged(absl::StrCat(name, " is truncated"));
    std::string data;
    if (method == 0) {
      if (packed != size) return damaged(absl::StrCat(name, ": stored sizes differ"));
      data = zip.substr(data_at, packed);
    } else if (method == 8) {
      if (size > (1u << 31)) return damaged(absl::StrCat(name, " is too large"));
      data.resize(size);
      z_stream zs{};
      if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return Hdf5Error("start zlib");
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(zip.data() + data_at));
      zs.avail_in = packed;
      zs.next_out = reinterpret_cast<Bytef*>(data.data());
      zs.avail_out = size;
      const int rc = inflate(&zs, Z_FINISH);
      const bool complete = rc == Z_STREAM_END && zs.total_out == size;
      inflateEnd(&zs);
      if (!complete) return damaged(absl::StrCat(name, " does not inflate to its size"));
    } else {
      return damaged(absl::StrCat(name, " uses compression method ", method,
                                  " (only stored and deflated are read)"));
    }
    if (crc32(0, reinterpret_cast<const Bytef*>(data.data()), data.size()) != crc) {
      return damaged(absl::StrCat(name, " fails its CRC-32"));
    }
    entries[name] = std::move(data);
  }
  return entries;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create '", tmp, "': ",
                                                    std::strerror(errno),
                                                    "; check that the directory exists and is "
                                                    "writable"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::DataLossError(absl::StrCat("cannot write '", tmp, "': ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write '", tmp, "': ", std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace distrain

#ifndef DISTRAIN_WORKER_MODEL_KERAS_ARCHIVE_H_
#define DISTRAIN_WORKER_MODEL_KERAS_ARCHIVE_H_

// The two containers of a .keras file (docs/keras.md): an HDF5 weights file
// built in memory, and the zip around it. keras_format.cc decides what goes
// in; these only write bytes.

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace distrain {

// An HDF5 file assembled in memory (the core driver, no backing file) and
// handed out as bytes, so a .keras zip never needs a temporary weights file.
// Paths are absolute HDF5 paths ("/layers/conv2d/vars"). Owns its HDF5
// handles; not thread-safe (HDF5 itself is built without thread safety).
class Hdf5Image {
 public:
  static absl::StatusOr<Hdf5Image> Create();
  Hdf5Image(Hdf5Image&& other) noexcept;
  Hdf5Image& operator=(Hdf5Image&&) = delete;
  Hdf5Image(const Hdf5Image&) = delete;
  Hdf5Image& operator=(const Hdf5Image&) = delete;
  ~Hdf5Image();

  // Creates the group (parents first as needed) with a string attribute
  // name=`name_attr` when that is not empty, as h5py writes Keras' "name".
  absl::Status AddGroup(const std::string& path, const std::string& name_attr);
  // A float32 dataset of `shape` (empty: a scalar) under an existing group.
  absl::Status AddFloats(const std::string& path, const std::vector<int64_t>& shape,
                         const float* values);
  absl::Status AddInt64Scalar(const std::string& path, int64_t value);
  // The finished file's bytes; the image stays usable.
  absl::StatusOr<std::string> Bytes();

  // Reading a file handed over as bytes (a .keras file's model.weights.h5).
  static absl::StatusOr<Hdf5Image> OpenBytes(const std::string& bytes);
  bool Exists(const std::string& path) const;
  // A float dataset's shape ({} for a scalar) and values; an error naming the
  // path when it is missing or not a float array.
  absl::StatusOr<std::pair<std::vector<int64_t>, std::vector<float>>> ReadFloats(
      const std::string& path) const;

 private:
  explicit Hdf5Image(hid_t file) : file_(file) {}
  hid_t file_ = -1;
};

// A zip archive of stored (uncompressed) entries, as Keras itself writes
// .keras files; no zip64, so every entry and the whole archive stay < 4 GiB
// (an error otherwise).
absl::StatusOr<std::string> StoredZip(const std::vector<std::pair<std::string, std::string>>& entries);

// The entries of a zip archive (stored or deflated, no zip64), by name, read
// through its central directory with every offset and size checked against
// the archive and every CRC-32 verified. `description` names it in errors.
absl::StatusOr<std::map<std::string, std::string>> ReadZip(const std::string& bytes,
                                                           const std::string& description);

// Writes `bytes` to "<path>.tmp-<pid>", fsyncs, renames over `path`: a reader
// sees the old file or the whole new one.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_KERAS_ARCHIVE_H_

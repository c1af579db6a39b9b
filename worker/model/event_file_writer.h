#ifndef DISTRAIN_WORKER_MODEL_EVENT_FILE_WRITER_H_
#define DISTRAIN_WORKER_MODEL_EVENT_FILE_WRITER_H_

// TensorBoard event files (docs/tensorboard.md): what `tensorboard --logdir`
// reads to plot a run, written the way TensorFlow 2 writes them so a
// TensorFlow user's TensorBoard shows a distrain job like a Keras one.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/tfrecord.h"

namespace distrain {

// One point of a scalar curve: the tag names the curve within its run.
struct Scalar {
  std::string tag;
  double value = 0;  // written as float32, as tf.summary.scalar does
};

// Writes one TensorFlow event file: TFRecord records (worker/data/tfrecord.h),
// each a serialized tensorflow.Event (proto/distrain/v1/tf_event.proto). The
// first record carries file_version "brain.Event:2"; scalars are written as
// TensorFlow 2's tf.summary.scalar writes them (a rank-0 DT_FLOAT tensor whose
// metadata names the "scalars" plugin), byte for byte, so TensorBoard's
// scalar dashboard reads them without migrating anything. Every Write* ends
// with a flush: TensorBoard polls the file and must see each step as soon as
// it is logged. Errors are returned; the best-effort policy of a training job
// is SummaryRun's, below.
// Owns its file. Not thread-safe.
class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and a new file in it named as TensorFlow
  // 2.21's tf.summary.create_file_writer names its files:
  //   events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>.v2
  // where n counts the writers this process created. The name sorts after
  // every event file already in `dir` (TensorBoard reads a run's files in
  // name order): when one is named with this second or a later one, the
  // seconds are that one's plus 1. So a restarted container, with the same
  // hostname and pid and maybe within the same second, never reuses a name.
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& dir);
  // The same at an exact path, created or truncated (tests; tools).
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> CreateAt(const std::string& path);

  // One event at `step` holding every scalar (what one tf.summary.scalar
  // call per tag writes, in one record).
  absl::Status WriteScalars(int64_t step, absl::Span<const Scalar> scalars);
  // A SessionLog START at `step`: TensorBoard reads a START after the first
  // one of a run as a restart and drops the points of steps >= `step` that
  // the previous process wrote after its last checkpoint (TensorFlow's
  // MonitoredSession writes the same on every start).
  absl::Status WriteSessionStart(int64_t step);

  const std::string& path() const { return file_.path(); }

 private:
  explicit EventFileWriter(TfRecordWriter file) : file_(std::move(file)) {}
  // Writes the file_version record; its wall_time is the whole seconds of
  // the file's name, as in TensorFlow.
  absl::Status Start(int64_t unix_seconds);
  absl::Status WriteAndFlush(const std::string& serialized_event);

  TfRecordWriter file_;
};

// One TensorBoard run — a directory such as <checkpoint dir>/train — that this
// process appends scalars to, best effort: the curves are a convenience, so a
// job never fails because they cannot be written. The event file is created
// on the first write; the first error (creating the directory or the file,
// writing, flushing) is logged once as a warning naming the file, and the run
// then writes nothing more. Each written event is also logged at debug level
// ("tensorboard: <dir> step S: tag=value ...", values in full precision).
// An empty directory makes a disabled run that ignores every call.
// Owns its writer. Not thread-safe.
class SummaryRun {
 public:
  SummaryRun() = default;
  explicit SummaryRun(std::string dir) : dir_(std::move(dir)) {}

  void WriteScalars(int64_t step, const std::vector<Scalar>& scalars);
  void WriteSessionStart(int64_t step);

  bool enabled() const { return !dir_.empty() && !failed_; }
  const std::string& dir() const { return dir_; }

 private:
  // The writer, created on first use; null once anything failed.
  EventFileWriter* Writer();
  void Failed(const absl::Status& status);

  std::string dir_;
  std::unique_ptr<EventFileWriter> writer_;
  bool failed_ = false;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_EVENT_FILE_WRITER_H_

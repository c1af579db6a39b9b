#include "worker/model/event_file_writer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "distrain/v1/tf_event.pb.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

// TensorFlow's EventsWriter::kVersionPrefix + kCurrentVersion.
constexpr char kFileVersion[] = "brain.Event:2";
// TensorBoard's scalars plugin (tensorboard/plugins/scalar/metadata.py).
constexpr char kScalarsPlugin[] = "scalars";
constexpr char kSourceWriter[] = "distrain";

// TensorFlow's ids for its writers: one counter per process.
std::atomic<int> next_writer_id{0};

double WallTime() { return static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6; }

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

constexpr char kFileNamePrefix[] = "events.out.tfevents.";

// The largest <unix seconds> in the names of the event files in `dir`; -1 when none.
int64_t NewestNamedSecond(const std::string& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kFileNamePrefix, 0) != 0) continue;
    const std::string rest = name.substr(std::strlen(kFileNamePrefix));
    int64_t seconds = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &seconds)) {
      newest = std::max(newest, seconds);
    }
  }
  return newest;
}

// tensor_content is the values' little-endian bytes, whatever the host's order.
std::string LittleEndianFloat(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  }
  // TensorBoard reads a run's files in name order and, by default, follows
  // only the last one, so a restarted process's file must sort after its
  // predecessor's: when that one's name has this second (a quick restart) or
  // a later one (a node whose clock runs ahead), take the second after it.
  // The first record's wall_time is the same number, as in TensorFlow.
  const int64_t seconds = std::max(absl::ToUnixSeconds(absl::Now()), NewestNamedSecond(dir) + 1);
  const std::string prefix =
      absl::StrCat(dir, "/", kFileNamePrefix, seconds, ".", HostName(), ".", ::getpid(), ".");
  std::string path;
  do {
    path = absl::StrCat(prefix, next_writer_id.fetch_add(1), ".v2");
  } while (std::filesystem::exists(path, ec));
  auto file = TfRecordWriter::Create(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<EventFileWriter> writer(new EventFileWriter(std::move(*file)));
  if (absl::Status s = writer->Start(seconds); !s.ok()) return s;
  return writer;
}

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::CreateAt(
    const std::string& path) {
  auto file = TfRecordWriter::Create(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<EventFileWriter> writer(new EventFileWriter(std::move(*file)));
  if (absl::Status s = writer->Start(absl::ToUnixSeconds(absl::Now())); !s.ok()) return s;
  return writer;
}

absl::Status EventFileWriter::Start(int64_t unix_seconds) {
  v1::TfEvent event;
  event.set_wall_time(static_cast<double>(unix_seconds));
  event.set_file_version(kFileVersion);
  event.mutable_source_metadata()->set_writer(kSourceWriter);
  return WriteAndFlush(event.SerializeAsString());
}

absl::Status EventFileWriter::WriteScalars(int64_t step, absl::Span<const Scalar> scalars) {
  v1::TfEvent event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  v1::TfSummary* summary = event.mutable_summary();
  for (const Scalar& scalar : scalars) {
    v1::TfSummary::Value* value = summary->add_value();
    value->set_tag(scalar.tag);
    v1::TfTensor* tensor = value->mutable_tensor();
    tensor->set_dtype(v1::TF_DT_FLOAT);
    tensor->mutable_tensor_shape();  // present and empty: rank 0, as TensorFlow writes it
    tensor->set_tensor_content(LittleEndianFloat(static_cast<float>(scalar.value)));
    value->mutable_metadata()->mutable_plugin_data()->set_plugin_name(kScalarsPlugin);
  }
  return WriteAndFlush(event.SerializeAsString());
}

absl::Status EventFileWriter::WriteSessionStart(int64_t step) {
  v1::TfEvent event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  event.mutable_session_log()->set_status(v1::TfSessionLog::START);
  return WriteAndFlush(event.SerializeAsString());
}

absl::Status EventFileWriter::WriteAndFlush(const std::string& serialized_event) {
  if (absl::Status s = file_.Write(serialized_event); !s.ok()) return s;
  return file_.Flush();
}

EventFileWriter* SummaryRun::Writer() {
  if (!enabled()) return nullptr;
  if (writer_ == nullptr) {
    auto writer = EventFileWriter::Create(dir_);
    if (!writer.ok()) {
      Failed(writer.status());
      return nullptr;
    }
    writer_ = std::move(*writer);
  }
  return writer_.get();
}

void SummaryRun::Failed(const absl::Status& status) {
  failed_ = true;
  writer_.reset();
  spdlog::warn("TensorBoard events: {}; no more events are written to {} (training goes on)",
               status.message(), dir_);
}

void SummaryRun::WriteScalars(int64_t step, const std::vector<Scalar>& scalars) {
  EventFileWriter* writer = Writer();
  if (writer == nullptr || scalars.empty()) return;
  if (absl::Status s = writer->WriteScalars(step, scalars); !s.ok()) {
    Failed(s);
    return;
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    std::string values;
    // fmt's shortest round-trip form: the exact double that was written.
    for (const Scalar& scalar : scalars) {
      absl::StrAppend(&values, " ", scalar.tag, "=", fmt::format("{}", scalar.value));
    }
    spdlog::debug("tensorboard: {} step {}:{}", dir_, step, values);
  }
}

void SummaryRun::WriteSessionStart(int64_t step) {
  EventFileWriter* writer = Writer();
  if (writer == nullptr) return;
  if (absl::Status s = writer->WriteSessionStart(step); !s.ok()) Failed(s);
}

}  // namespace distrain

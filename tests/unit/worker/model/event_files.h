#ifndef DISTRAIN_TESTS_UNIT_WORKER_MODEL_EVENT_FILES_H_
#define DISTRAIN_TESTS_UNIT_WORKER_MODEL_EVENT_FILES_H_

// Reading TensorBoard event files back in tests with distrain's own TFRecord
// reader (which checks both CRCs of every record) and the tf_event proto;
// the integration test reads the same files with TensorBoard itself.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distrain/v1/tf_event.pb.h"
#include "worker/data/tfrecord.h"

namespace distrain::testing {

// Every event of one file, in order; a test failure when a record is bad.
inline std::vector<v1::TfEvent> ReadEventFile(const std::string& path) {
  std::vector<v1::TfEvent> events;
  auto reader = TfRecordReader::Open(path, TfRecordCompression::kNone);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return events;
  std::string_view record;
  while (true) {
    auto more = reader->Next(&record);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    v1::TfEvent event;
    EXPECT_TRUE(event.ParseFromArray(record.data(), static_cast<int>(record.size())))
        << path << " at byte " << reader->record_offset();
    events.push_back(std::move(event));
  }
  return events;
}

// The event files of a run directory, sorted by name (TensorBoard's order).
inline std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The value of a scalar as tf.summary.scalar writes it: a rank-0 float tensor.
inline float ScalarValue(const v1::TfSummary::Value& value) {
  EXPECT_EQ(value.tensor().dtype(), v1::TF_DT_FLOAT) << value.tag();
  EXPECT_EQ(value.tensor().tensor_shape().dim_size(), 0) << value.tag();
  EXPECT_EQ(value.metadata().plugin_data().plugin_name(), "scalars") << value.tag();
  float f = 0;
  EXPECT_EQ(value.tensor().tensor_content().size(), sizeof f) << value.tag();
  if (value.tensor().tensor_content().size() == sizeof f) {
    std::memcpy(&f, value.tensor().tensor_content().data(), sizeof f);  // little-endian hosts
  }
  return f;
}

// tag -> step -> value over every file of a run directory.
using ScalarCurves = std::map<std::string, std::map<int64_t, float>>;
inline ScalarCurves ReadScalars(const std::string& dir) {
  ScalarCurves curves;
  for (const std::string& file : EventFiles(dir)) {
    for (const v1::TfEvent& event : ReadEventFile(file)) {
      for (const auto& value : event.summary().value()) {
        curves[value.tag()][event.step()] = ScalarValue(value);
      }
    }
  }
  return curves;
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_MODEL_EVENT_FILES_H_

// Times distrain's TFRecord loader (worker/data/tfrecord_dataset.cc) on the
// given files: every record read, CRC-checked, parsed as tf.train.Example and
// decoded into the in-memory float dataset a worker trains from. Prints one
// JSON line; bench/tfrecord_input.py runs it next to tf.data doing the same.
//   tfrecord_input --compression GZIP --shape 28,28,1 --reps 7 FILE...
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "worker/data/dataset.h"

int main(int argc, char** argv) {
  CLI::App app{"distrain's TFRecord loader on FILE..., timed"};
  std::string compression = "NONE";
  std::string shape = "28,28,1";
  int reps = 7;
  std::vector<std::string> files;
  app.add_option("--compression", compression, "NONE, GZIP or ZLIB");
  app.add_option("--shape", shape, "featureShape, comma-separated");
  app.add_option("--reps", reps, "timed passes (after one warm-up)");
  app.add_option("files", files, "TFRecord files")->required();
  CLI11_PARSE(app, argc, argv);

  distrain::DatasetConfig config;
  config.type = distrain::DatasetType::kTfRecord;
  config.compression = compression == "GZIP"   ? distrain::DataCompression::kGzip
                       : compression == "ZLIB" ? distrain::DataCompression::kZlib
                                               : distrain::DataCompression::kNone;
  for (absl::string_view d : absl::StrSplit(shape, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(d, &v)) {
      std::fprintf(stderr, "bad --shape %s\n", shape.c_str());
      return 2;
    }
    config.feature_shape.push_back(v);
  }
  std::vector<double> ms;
  int64_t examples = 0;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    examples = 0;
    for (const std::string& file : files) {
      auto data = distrain::LoadTfRecordDataset(file, config, 10);
      if (!data.ok()) {
        std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
        return 1;
      }
      examples += (*data)->size();
    }
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) ms.push_back(elapsed);  // rep 0 warms the page cache and allocator
  }
  std::printf("{\"examples\": %lld, \"ms\": [", static_cast<long long>(examples));
  for (size_t i = 0; i < ms.size(); ++i) std::printf("%s%.3f", i ? ", " : "", ms[i]);
  std::printf("]}\n");
  return 0;
}

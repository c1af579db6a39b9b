// Fuzz target: a job's YAML as `distrain run` and the operator read it
// (common/job_config.h ParseJobYaml), then ValidateJobConfig on what parses.
// Corpus: tests/fuzz/corpus/job_yaml/ (the examples/*.yaml jobs).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job_config.h"
#include "common/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<distrain::JobConfig> config = distrain::ParseJobYaml(text);
  if (config.ok()) (void)distrain::ValidateJobConfig(*config);
  return 0;
}

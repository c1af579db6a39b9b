// Fuzz target: DISTRAIN_JOB_CONFIG, the job's spec as JSON in every worker's
// environment (common/job_config.h ParseJobConfigJson), then
// ValidateJobConfig on what parses. Corpus: tests/fuzz/corpus/job_json/ (the
// examples' specs as the operator writes them).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<distrain::JobConfig> config = distrain::ParseJobConfigJson(text);
  if (config.ok()) (void)distrain::ValidateJobConfig(*config);
  return 0;
}

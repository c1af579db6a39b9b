// Fuzz target: the Prometheus text the operator scrapes from each chief's
// /metrics (operator/progress_reporter.h ParseProgressMetrics), then
// MergeProgress into a job's status.progress as the reporter does. The page
// comes from a tenant's process: every byte is untrusted. Corpus:
// tests/fuzz/corpus/prometheus_text/ (pages `distrain run` workers served).

#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "operator/progress_reporter.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string page(reinterpret_cast<const char*>(data), size);
  const distrain::ScrapedProgress scraped = distrain::ParseProgressMetrics(page);
  const nlohmann::json current = {{"step", 3}, {"totalSteps", 100}};
  const nlohmann::json merged = distrain::MergeProgress(current, scraped);
  (void)merged.dump();  // what the reporter patches: must serialise (no NaN surprises)
  return 0;
}

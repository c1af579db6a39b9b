// Fuzz target: TF_CONFIG, the cluster spec in every pod's environment
// (common/cluster_spec.h ClusterSpec::Parse), then the accessors a worker
// calls on what parses. Corpus: tests/fuzz/corpus/tf_config/ (TF_CONFIG
// strings as the operator and `distrain run` write them).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<distrain::ClusterSpec> spec = distrain::ClusterSpec::Parse(text);
  if (!spec.ok()) return 0;
  (void)spec->address(spec->task());
  for (const char* job : {"chief", "worker", "ps", "evaluator"}) {
    (void)spec->num_tasks(job);
    (void)spec->addresses(job);
  }
  return 0;
}

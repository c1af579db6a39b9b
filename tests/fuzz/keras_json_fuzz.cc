// Fuzz target: a Keras Sequential's model JSON (`distrain import-keras`,
// worker/model/keras_format.h ImportKerasModelJson), then KerasImportYaml on
// what imports. Corpus: tests/fuzz/corpus/keras_json/
// (examples/keras/guide_cnn.json and smaller models).

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/model/keras_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<distrain::KerasImport> imported = distrain::ImportKerasModelJson(text);
  if (imported.ok()) (void)distrain::KerasImportYaml(*imported, "fuzz.json");
  return 0;
}

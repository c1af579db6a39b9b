#ifndef DISTRAIN_COMMON_YAML_JSON_H_
#define DISTRAIN_COMMON_YAML_JSON_H_

// YAML text -> JSON value, read the way Kubernetes reads a manifest, so that
// one JSON decoder serves YAML files and the JSON the operator writes:
//   * plain scalars follow the YAML 1.2 core schema: null (~, null, empty),
//     booleans (true/false in any of the three spellings), integers (decimal,
//     0x, 0o), floats; everything else is a string;
//   * quoted and block scalars are always strings ("256" stays a string);
//   * explicit tags !!str, !!int, !!float, !!bool, !!null are honoured;
//   * duplicate keys and non-scalar keys are errors;
//   * exactly one document (a leading or trailing "---" is fine).
// Errors carry the 1-based line and column. Object keys keep document order.
//
// Pure functions; thread-safe.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace distrain {

struct YamlLocation {
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

struct YamlJson {
  nlohmann::ordered_json value;
  // Where each value sits in the text, keyed by its path: "spec.training.steps",
  // "spec.training.model.hiddenUnits[1]" (the root is ""). Map entries point at
  // their key, which is where an editor should jump.
  std::map<std::string, YamlLocation> locations;
};

absl::StatusOr<YamlJson> YamlToJson(const std::string& yaml_text);

// Appends one path component the way YamlJson::locations spells paths.
std::string JoinYamlPath(const std::string& parent, const std::string& key);
std::string JoinYamlPath(const std::string& parent, size_t index);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_YAML_JSON_H_

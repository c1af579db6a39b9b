#include "common/yaml_json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
// yaml-cpp 0.7's node headers trip GCC 12's -Wdangling-pointer (a false
// positive in yaml-cpp's own code).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace distrain {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kTagStr[] = "tag:yaml.org,2002:str";
constexpr char kTagInt[] = "tag:yaml.org,2002:int";
constexpr char kTagFloat[] = "tag:yaml.org,2002:float";
constexpr char kTagBool[] = "tag:yaml.org,2002:bool";
constexpr char kTagNull[] = "tag:yaml.org,2002:null";

YamlLocation ToLocation(const YAML::Mark& mark) { return {mark.line + 1, mark.column + 1}; }

std::string At(const YAML::Mark& mark) {
  return absl::StrCat("line ", mark.line + 1, ", column ", mark.column + 1);
}

std::optional<Json> ParseNull(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return Json(nullptr);
  return std::nullopt;
}

std::optional<Json> ParseBool(const std::string& s) {
  if (s == "true" || s == "True" || s == "TRUE") return Json(true);
  if (s == "false" || s == "False" || s == "FALSE") return Json(false);
  return std::nullopt;
}

// YAML 1.2 core schema integers: [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+.
std::optional<Json> ParseInt(const std::string& s) {
  static const std::regex kDecimal("[-+]?[0-9]+");
  static const std::regex kOctal("0o[0-7]+");
  static const std::regex kHex("0x[0-9a-fA-F]+");
  int base = 10;
  std::string digits = s;
  if (std::regex_match(s, kOctal)) {
    base = 8;
    digits = s.substr(2);
  } else if (std::regex_match(s, kHex)) {
    base = 16;
    digits = s.substr(2);
  } else if (!std::regex_match(s, kDecimal)) {
    return std::nullopt;
  }
  bool negative = false;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    negative = digits[0] == '-';
    digits = digits.substr(1);
  }
  uint64_t magnitude = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (ec == std::errc() && ptr == digits.data() + digits.size()) {
    if (!negative) {
      return magnitude <= static_cast<uint64_t>(INT64_MAX) ? Json(static_cast<int64_t>(magnitude))
                                                           : Json(magnitude);
    }
    if (magnitude <= static_cast<uint64_t>(INT64_MAX) + 1) {
      return Json(magnitude == static_cast<uint64_t>(INT64_MAX) + 1
                      ? INT64_MIN
                      : -static_cast<int64_t>(magnitude));
    }
  }
  // Too large for 64 bits: keep the magnitude as a float, like JSON would.
  return Json(std::strtod(s.c_str(), nullptr));
}

// YAML 1.2 core schema floats. .inf and .nan stay strings: JSON has no
// spelling for them and no distrain field accepts them.
std::optional<Json> ParseFloat(const std::string& s) {
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (!std::regex_match(s, kFloat)) return std::nullopt;
  const double value = std::strtod(s.c_str(), nullptr);
  if (!std::isfinite(value)) return std::nullopt;
  return Json(value);
}

absl::Status Convert(const YAML::Node& node, const std::string& path, YamlJson* out, Json* value);

absl::Status ConvertScalar(const YAML::Node& node, Json* value) {
  const std::string& s = node.Scalar();
  const std::string& tag = node.Tag();
  if (tag == "!" || tag == kTagStr) {  // quoted, block or !!str: always a string
    *value = s;
    return absl::OkStatus();
  }
  std::optional<Json> parsed;
  if (tag == kTagInt) {
    parsed = ParseInt(s);
  } else if (tag == kTagFloat) {
    parsed = ParseFloat(s);
    if (!parsed) parsed = ParseInt(s);
    if (parsed) parsed = Json(parsed->get<double>());
  } else if (tag == kTagBool) {
    parsed = ParseBool(s);
  } else if (tag == kTagNull) {
    parsed = ParseNull(s);
  } else {
    // Plain scalar (tag "?") or an application tag we do not know: infer.
    if (!(parsed = ParseNull(s)) && !(parsed = ParseBool(s)) && !(parsed = ParseInt(s))) {
      parsed = ParseFloat(s);
    }
    if (!parsed) parsed = Json(s);
  }
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(At(node.Mark()), ": \"", s, "\" is not a valid ",
                                                   tag.substr(tag.rfind(':') + 1)));
  }
  *value = std::move(*parsed);
  return absl::OkStatus();
}

absl::Status Convert(const YAML::Node& node, const std::string& path, YamlJson* out, Json* value) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      *value = nullptr;
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      return ConvertScalar(node, value);
    case YAML::NodeType::Sequence: {
      *value = Json::array();
      size_t i = 0;
      for (const YAML::Node& item : node) {
        const std::string item_path = JoinYamlPath(path, i++);
        out->locations[item_path] = ToLocation(item.Mark());
        Json converted;
        if (absl::Status s = Convert(item, item_path, out, &converted); !s.ok()) return s;
        value->push_back(std::move(converted));
      }
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      *value = Json::object();
      for (auto it = node.begin(); it != node.end(); ++it) {
        // A copy (a Node is a handle): it->first is a member of the proxy
        // the iterator's operator-> returns, gone at the end of this statement.
        const YAML::Node key = it->first;
        if (!key.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(
              At(key.Mark()), ": mapping keys must be plain strings, not lists or mappings"));
        }
        const std::string& name = key.Scalar();
        if (value->contains(name)) {
          return absl::InvalidArgumentError(absl::StrCat(At(key.Mark()), ": duplicate key \"", name,
                                                         "\"", path.empty() ? "" : " in ", path,
                                                         "; each key may appear once"));
        }
        const std::string child_path = JoinYamlPath(path, name);
        out->locations[child_path] = ToLocation(key.Mark());
        Json converted;
        if (absl::Status s = Convert(it->second, child_path, out, &converted); !s.ok()) return s;
        (*value)[name] = std::move(converted);
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown YAML node type");
}

// Receives a document's parse events and ignores them: only how many
// documents the parser reports matters (StuckParser).
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// yaml-cpp 0.7 (Debian 12) reports a document without consuming anything
// when a "," stands outside a [...] or {...} list (", a"), so LoadAll loops
// for ever (found by tests/fuzz/job_yaml_fuzz, corpus regression-stray-comma).
// Every real document consumes at least one byte: more documents than bytes
// means the parser is stuck. May throw YAML::Exception, like LoadAll.
bool StuckParser(const std::string& yaml_text) {
  std::istringstream in(yaml_text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  for (size_t documents = 0; documents <= yaml_text.size() + 1; ++documents) {
    if (!parser.HandleNextDocument(ignore)) return false;
  }
  return true;
}

}  // namespace

std::string JoinYamlPath(const std::string& parent, const std::string& key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

std::string JoinYamlPath(const std::string& parent, size_t index) {
  return absl::StrCat(parent, "[", index, "]");
}

absl::StatusOr<YamlJson> YamlToJson(const std::string& yaml_text) {
  std::vector<YAML::Node> documents;
  try {
    if (StuckParser(yaml_text)) {
      return absl::InvalidArgumentError(
          "YAML syntax error: a ',' outside a [...] or {...} list (or another token the parser "
          "cannot place); check the line where a list or mapping begins");
    }
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("YAML syntax error at ", At(e.mark), ": ", e.msg));
  }
  const YAML::Node* document = nullptr;
  int count = 0;
  for (const YAML::Node& d : documents) {
    if (d.IsNull()) continue;  // "---" with nothing after it
    if (count++ == 0) document = &d;
  }
  if (count > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the file has ", count, " YAML documents; expected exactly one"));
  }
  YamlJson result;
  if (document == nullptr) return result;  // value stays null: an empty file
  result.locations[""] = ToLocation(document->Mark());
  try {
    if (absl::Status s = Convert(*document, "", &result, &result.value); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML error at ", At(e.mark), ": ", e.msg));
  }
  return result;
}

}  // namespace distrain

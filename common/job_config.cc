#include "common/job_config.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/yaml_json.h"
#include "nlohmann/json.hpp"

namespace distrain {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kApiVersion[] = "distrain.io/v1alpha1";
constexpr char kKind[] = "DistributedTrainingJob";

// ---------------------------------------------------------------------------
// Enum spellings, exactly as in crds/ (case-sensitive).

template <typename E>
struct EnumName {
  const char* name;
  E value;
};

constexpr EnumName<StrategyKind> kStrategies[] = {
    {"OneDevice", StrategyKind::kOneDevice},
    {"Mirrored", StrategyKind::kMirrored},
    {"MultiWorkerMirrored", StrategyKind::kMultiWorkerMirrored},
    {"ParameterServer", StrategyKind::kParameterServer},
    {"CentralStorage", StrategyKind::kCentralStorage},
    {"TPU", StrategyKind::kTPU},
    {"Auto", StrategyKind::kAuto},
};
constexpr EnumName<ReplicaType> kReplicaTypes[] = {
    {"Chief", ReplicaType::kChief},
    {"Worker", ReplicaType::kWorker},
    {"PS", ReplicaType::kPS},
    {"Evaluator", ReplicaType::kEvaluator},
};
constexpr EnumName<RestartPolicy> kRestartPolicies[] = {
    {"Never", RestartPolicy::kNever},
    {"OnFailure", RestartPolicy::kOnFailure},
    {"Always", RestartPolicy::kAlways},
    {"ExitCode", RestartPolicy::kExitCode},
};
constexpr EnumName<DatasetType> kDatasetTypes[] = {
    {"synthetic", DatasetType::kSynthetic},
    {"idx", DatasetType::kIdx},
    {"csv", DatasetType::kCsv},
    {"tfrecord", DatasetType::kTfRecord},
};
constexpr EnumName<DataCompression> kDataCompressions[] = {
    {"NONE", DataCompression::kNone},
    {"GZIP", DataCompression::kGzip},
    {"ZLIB", DataCompression::kZlib},
};
constexpr EnumName<FeatureEncoding> kFeatureEncodings[] = {
    {"uint8Bytes", FeatureEncoding::kUint8Bytes},
    {"floatList", FeatureEncoding::kFloatList},
    {"int64List", FeatureEncoding::kInt64List},
};
constexpr EnumName<AutoShardPolicy> kAutoShardPolicies[] = {
    {"AUTO", AutoShardPolicy::kAuto},
    {"DATA", AutoShardPolicy::kData},
    {"FILE", AutoShardPolicy::kFile},
    {"OFF", AutoShardPolicy::kOff},
};
constexpr EnumName<OptimizerType> kOptimizerTypes[] = {
    {"sgd", OptimizerType::kSgd},
    {"momentum", OptimizerType::kMomentum},
    {"adam", OptimizerType::kAdam},
    {"adamw", OptimizerType::kAdamW},
    {"rmsprop", OptimizerType::kRmsprop},
};
constexpr EnumName<LearningRateScheduleType> kScheduleTypes[] = {
    {"Constant", LearningRateScheduleType::kConstant},
    {"ExponentialDecay", LearningRateScheduleType::kExponentialDecay},
    {"InverseTimeDecay", LearningRateScheduleType::kInverseTimeDecay},
    {"PolynomialDecay", LearningRateScheduleType::kPolynomialDecay},
    {"PiecewiseConstantDecay", LearningRateScheduleType::kPiecewiseConstantDecay},
    {"CosineDecay", LearningRateScheduleType::kCosineDecay},
};
// Keras' policy names (keras.mixed_precision.set_global_policy).
constexpr EnumName<Precision> kPrecisions[] = {
    {"float32", Precision::kFloat32},
    {"mixed_bfloat16", Precision::kMixedBfloat16},
    {"mixed_float16", Precision::kMixedFloat16},
};
constexpr EnumName<CollectiveImplementation> kImplementations[] = {
    {"Auto", CollectiveImplementation::kAuto},
    {"Ring", CollectiveImplementation::kRing},
    {"NCCL", CollectiveImplementation::kNccl},
};
constexpr EnumName<CleanPodPolicy> kCleanPodPolicies[] = {
    {"None", CleanPodPolicy::kNone},
    {"Running", CleanPodPolicy::kRunning},
    {"All", CleanPodPolicy::kAll},
};
constexpr EnumName<RecoveryPolicy> kRecoveryPolicies[] = {
    {"InPlace", RecoveryPolicy::kInPlace},
    {"RestartGroup", RecoveryPolicy::kRestartGroup},
};
constexpr EnumName<LossKind> kLossKinds[] = {
    {"SparseCategoricalCrossentropy", LossKind::kSparseCategoricalCrossentropy},
    {"CategoricalCrossentropy", LossKind::kCategoricalCrossentropy},
    {"BinaryCrossentropy", LossKind::kBinaryCrossentropy},
    {"MeanSquaredError", LossKind::kMeanSquaredError},
};
constexpr EnumName<SuccessPolicy> kSuccessPolicies[] = {
    {"Default", SuccessPolicy::kDefault},
    {"AllWorkers", SuccessPolicy::kAllWorkers},
};
constexpr EnumName<TransportMode> kTransportModes[] = {
    {"MutualTLS", TransportMode::kMutualTls},
    {"Plaintext", TransportMode::kPlaintext},
};

template <typename E, size_t N>
std::vector<std::string> Names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.name);
  return names;
}

template <typename E, size_t N>
std::optional<E> FromName(const EnumName<E> (&table)[N], const std::string& name) {
  for (const auto& entry : table) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

template <typename E, size_t N>
const char* ToName(const EnumName<E> (&table)[N], E value) {
  for (const auto& entry : table) {
    if (value == entry.value) return entry.name;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Errors: every problem found, each with the path of the field.

std::string Show(const Json& value) {
  std::string s = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string Quote(const std::string& s) { return Show(Json(s)); }

struct Issue {
  std::string path;  // "spec.training.steps"; "" for the whole document
  std::string message;
};

class Issues {
 public:
  void Add(std::string path, std::string message) {
    issues_.push_back({std::move(path), std::move(message)});
  }
  bool empty() const { return issues_.empty(); }
  size_t size() const { return issues_.size(); }
  void Append(const Issues& other) {
    issues_.insert(issues_.end(), other.issues_.begin(), other.issues_.end());
  }

  // One line per issue; with `locations`, each line starts with the YAML line
  // of the field (or of its nearest parent that the document has).
  absl::Status ToStatus(const std::map<std::string, YamlLocation>* locations) const {
    std::vector<std::string> lines;
    for (const Issue& issue : issues_) {
      std::string line =
          issue.path.empty() ? issue.message : absl::StrCat(issue.path, ": ", issue.message);
      if (locations != nullptr) {
        if (std::optional<YamlLocation> at = Find(*locations, issue.path)) {
          line = absl::StrCat("line ", at->line, ": ", line);
        }
      }
      lines.push_back(std::move(line));
    }
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }

 private:
  static std::optional<YamlLocation> Find(const std::map<std::string, YamlLocation>& locations,
                                          std::string path) {
    while (true) {
      if (auto it = locations.find(path); it != locations.end()) return it->second;
      if (path.empty()) return std::nullopt;
      const size_t cut = path.find_last_of(".[");
      path = cut == std::string::npos ? "" : path.substr(0, cut);
    }
  }

  std::vector<Issue> issues_;
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The candidate (a relative dotted path such as "optimizer.learningRate")
// whose last component is closest to `key`, or "" when none is close.
std::string ClosestName(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string lower_key = Lower(key);
  const size_t allowed = std::max<size_t>(1, std::min<size_t>(3, key.size() / 3));
  std::string best;
  size_t best_score = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const size_t dot = candidate.rfind('.');
    const std::string last =
        Lower(dot == std::string::npos ? candidate : candidate.substr(dot + 1));
    size_t distance = EditDistance(lower_key, last);
    if (distance > allowed && lower_key.size() >= 4 &&
        (last.find(lower_key) != std::string::npos || lower_key.find(last) != std::string::npos)) {
      distance = allowed;  // "batchSize" for "globalBatchSize"
    }
    if (distance > allowed) continue;
    // Prefer closer names, then siblings over nested fields.
    const size_t depth = static_cast<size_t>(std::count(candidate.begin(), candidate.end(), '.'));
    const size_t score = distance * 16 + depth;
    if (score < best_score) {
      best_score = score;
      best = candidate;
    }
  }
  return best;
}

std::string UnknownFieldMessage(const std::string& key, const std::vector<std::string>& candidates,
                                const std::vector<std::string>& siblings) {
  std::string closest = ClosestName(key, candidates);
  if (!closest.empty()) return absl::StrCat("unknown field; did you mean \"", closest, "\"?");
  return absl::StrCat("unknown field; known fields here: ", absl::StrJoin(siblings, ", "));
}

// ---------------------------------------------------------------------------
// Value rules: the type and bounds of one field, checked the same way for a
// YAML document, DISTRAIN_JOB_CONFIG and a JobConfig built in code.

enum class Kind { kInteger, kNumber, kBoolean, kString, kArray, kObject };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kInteger:
      return "integer";
    case Kind::kNumber:
      return "number";
    case Kind::kBoolean:
      return "boolean";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "";
}

struct Rule {
  Kind kind = Kind::kString;
  Kind item_kind = Kind::kString;  // arrays
  // Declared bounds (also in the CRD); for arrays they apply to each item.
  std::optional<double> min;
  std::optional<double> max;
  bool exclusive_min = false;
  bool exclusive_max = false;
  std::vector<std::string> enum_values;
  // Bounds of the C++ type the value lands in (int, int64_t, float).
  int64_t int_min = INT64_MIN;
  int64_t int_max = INT64_MAX;
  double number_abs_max = DBL_MAX;
};

std::string FormatNumber(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// "a positive integer", "one of \"sgd\", \"adam\"", ...
std::string Describe(const Rule& rule, Kind kind) {
  switch (kind) {
    case Kind::kInteger:
      if (rule.min && rule.max) {
        return absl::StrCat("an integer in [", FormatNumber(*rule.min), ", ",
                            FormatNumber(*rule.max), "]");
      }
      if (rule.min && *rule.min == 1) return "a positive integer";
      if (rule.min && *rule.min == 0) return "a non-negative integer";
      if (rule.min) return absl::StrCat("an integer >= ", FormatNumber(*rule.min));
      if (rule.max) return absl::StrCat("an integer <= ", FormatNumber(*rule.max));
      return "an integer";
    case Kind::kNumber:
      if (rule.min && rule.max) {
        return absl::StrCat("a number in ", rule.exclusive_min ? "(" : "[", FormatNumber(*rule.min),
                            ", ", FormatNumber(*rule.max), rule.exclusive_max ? ")" : "]");
      }
      if (rule.min && *rule.min == 0)
        return rule.exclusive_min ? "a positive number" : "a non-negative number";
      if (rule.min)
        return absl::StrCat("a number ",
                            rule.exclusive_min ? "> " : ">= ", FormatNumber(*rule.min));
      if (rule.max)
        return absl::StrCat("a number ",
                            rule.exclusive_max ? "< " : "<= ", FormatNumber(*rule.max));
      return "a number";
    case Kind::kBoolean:
      return "true or false";
    case Kind::kString:
      if (!rule.enum_values.empty()) {
        std::vector<std::string> quoted;
        for (const std::string& v : rule.enum_values) quoted.push_back(Quote(v));
        return absl::StrCat("one of ", absl::StrJoin(quoted, ", "));
      }
      return "a string";
    case Kind::kArray: {
      if (rule.item_kind == Kind::kString) return "a list of strings";
      if (rule.item_kind == Kind::kInteger && rule.min && *rule.min == 1 && !rule.max) {
        return "a list of positive integers";
      }
      return absl::StrCat("a list of ", KindName(rule.item_kind), "s");
    }
    case Kind::kObject:
      return "a mapping";
  }
  return "";
}

bool ParsesAsNumber(const std::string& s) {
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+' ||
                     s[0] == '.')) {
    return false;  // also keeps "nan" and "inf" out
  }
  char* end = nullptr;
  errno = 0;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && !std::isspace(static_cast<unsigned char>(s[0]));
}

// Checks a scalar against `rule` as `kind`; returns "" or the problem.
std::string ScalarProblem(const Rule& rule, Kind kind, const Json& v) {
  const std::string expected = absl::StrCat("must be ", Describe(rule, kind), ", got ", Show(v));
  switch (kind) {
    case Kind::kInteger: {
      if (!v.is_number_integer()) {
        if (v.is_string() && ParsesAsNumber(v.get<std::string>())) {
          return absl::StrCat(expected, "; remove the quotes so it is read as a number");
        }
        if (v.is_number_float() && std::isfinite(v.get<double>()) &&
            v.get<double>() == std::floor(v.get<double>())) {
          return absl::StrCat(expected, "; write it without a decimal point");
        }
        if (v.is_array() && v.size() == 1)
          return absl::StrCat(expected, "; write a single value, not a list");
        return expected;
      }
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(rule.int_max)) {
        return absl::StrCat(expected, "; the largest allowed value is ", rule.int_max);
      }
      const int64_t i = v.get<int64_t>();
      if (i > rule.int_max)
        return absl::StrCat(expected, "; the largest allowed value is ", rule.int_max);
      if (i < rule.int_min)
        return absl::StrCat(expected, "; the smallest allowed value is ", rule.int_min);
      const double d = static_cast<double>(i);
      if ((rule.min && d < *rule.min) || (rule.max && d > *rule.max)) return expected;
      return "";
    }
    case Kind::kNumber: {
      if (!v.is_number()) {
        if (v.is_string() && ParsesAsNumber(v.get<std::string>())) {
          return absl::StrCat(expected, "; remove the quotes so it is read as a number");
        }
        return expected;
      }
      const double d = v.get<double>();
      if (!std::isfinite(d)) return expected;
      if (std::fabs(d) > rule.number_abs_max) {
        return absl::StrCat(expected, "; the largest allowed magnitude is ",
                            FormatNumber(rule.number_abs_max));
      }
      if (rule.min && (rule.exclusive_min ? d <= *rule.min : d < *rule.min)) return expected;
      if (rule.max && (rule.exclusive_max ? d >= *rule.max : d > *rule.max)) return expected;
      return "";
    }
    case Kind::kBoolean: {
      if (v.is_boolean()) return "";
      if (v.is_string()) {
        const std::string s = Lower(v.get<std::string>());
        if (s == "true" || s == "false") return absl::StrCat(expected, "; remove the quotes");
        if (s == "yes" || s == "no" || s == "on" || s == "off" || s == "y" || s == "n") {
          return absl::StrCat(expected, "; write true or false");
        }
      }
      return expected;
    }
    case Kind::kString: {
      if (!v.is_string()) {
        if (v.is_number() || v.is_boolean()) return absl::StrCat(expected, "; put it in quotes");
        return expected;
      }
      if (rule.enum_values.empty()) return "";
      const std::string s = v.get<std::string>();
      for (const std::string& allowed : rule.enum_values) {
        if (s == allowed) return "";
      }
      for (const std::string& allowed : rule.enum_values) {
        if (Lower(s) == Lower(allowed))
          return absl::StrCat(expected, "; values are case-sensitive: write \"", allowed, "\"");
      }
      return expected;
    }
    case Kind::kArray:
    case Kind::kObject:
      break;
  }
  return expected;
}

// Checks `v` against `rule`; reports each problem under `path`. Returns
// whether `v` is fine.
bool Check(const Rule& rule, const Json& v, const std::string& path, Issues* issues) {
  if (rule.kind != Kind::kArray) {
    std::string problem = ScalarProblem(rule, rule.kind, v);
    if (problem.empty()) return true;
    issues->Add(path, std::move(problem));
    return false;
  }
  if (!v.is_array()) {
    std::string problem = absl::StrCat("must be ", Describe(rule, Kind::kArray), ", got ", Show(v));
    if (v.is_primitive()) absl::StrAppend(&problem, "; write a list such as [", Show(v), "]");
    issues->Add(path, std::move(problem));
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string problem = ScalarProblem(rule, rule.item_kind, v[i]);
    if (!problem.empty()) {
      issues->Add(JoinYamlPath(path, i), std::move(problem));
      ok = false;
    }
  }
  return ok;
}

// Shortest decimal that reads back as the same float, so that 0.001f is
// written as 0.001 and not 0.0010000000474974513.
Json FloatJson(float f) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), f);
  return Json(std::strtod(std::string(buffer, result.ptr).c_str(), nullptr));
}

// ---------------------------------------------------------------------------
// The field table: every leaf of spec except replicaSpecs and elasticPolicy,
// with its rule and its place in JobConfig. Decoding, encoding, validation
// of configs built in code and JobSpecFields() all read this one table.

struct FieldSpec {
  std::string path;  // relative to spec: "training.dataset.numExamples"
  Rule rule;
  bool optional_value = false;                       // lands in a std::optional; absent means unset
  std::function<void(const Json&, JobConfig*)> set;  // called with checked values only
  std::function<std::optional<Json>(const JobConfig&)> get;  // nullopt: unset
  // Fields with a structure of their own (model.layers) decode themselves;
  // `rule` still describes them to JobSpecFields.
  std::function<void(const Json&, const std::string& display, JobConfig*, Issues*)> decode;
  // No default in the CRD: the parser's default depends on other fields
  // (model.type is sequential when layers are given), and a default the API
  // server filled in would look like the user's choice.
  bool derived_default = false;
};

template <typename T>
constexpr bool kIsOptionalInt =
    std::is_same_v<T, std::optional<int>> || std::is_same_v<T, std::optional<int64_t>>;

template <typename T>
void SetIntegerBounds(Rule* rule) {
  rule->kind = Kind::kInteger;
  rule->int_min = std::numeric_limits<T>::min();
  rule->int_max = std::numeric_limits<T>::max();
}

// `ref` is a generic lambda returning a reference into JobConfig (const or not).
template <typename Ref>
FieldSpec Field(std::string path, Ref ref, Rule rule = {}) {
  using T = std::remove_cvref_t<decltype(ref(std::declval<JobConfig&>()))>;
  FieldSpec f;
  f.path = std::move(path);
  f.rule = std::move(rule);
  if constexpr (std::is_same_v<T, bool>) {
    f.rule.kind = Kind::kBoolean;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<bool>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) {
    SetIntegerBounds<T>(&f.rule);
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<T>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    // Kubernetes integers are int64, so a seed is one too.
    SetIntegerBounds<int64_t>(&f.rule);
    f.set = [ref](const Json& v, JobConfig* c) {
      ref(*c) = static_cast<uint64_t>(v.get<int64_t>());
    };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
    f.rule.kind = Kind::kBoolean;
    f.optional_value = true;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<bool>(); };
    f.get = [ref](const JobConfig& c) -> std::optional<Json> {
      if (!ref(c).has_value()) return std::nullopt;
      return Json(*ref(c));
    };
  } else if constexpr (kIsOptionalInt<T>) {
    using V = typename T::value_type;
    SetIntegerBounds<V>(&f.rule);
    f.optional_value = true;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<V>(); };
    f.get = [ref](const JobConfig& c) -> std::optional<Json> {
      if (!ref(c).has_value()) return std::nullopt;
      return Json(*ref(c));
    };
  } else if constexpr (std::is_same_v<T, std::optional<float>>) {
    f.rule.kind = Kind::kNumber;
    f.rule.number_abs_max = FLT_MAX;
    f.optional_value = true;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = static_cast<float>(v.get<double>()); };
    f.get = [ref](const JobConfig& c) -> std::optional<Json> {
      if (!ref(c).has_value()) return std::nullopt;
      return FloatJson(*ref(c));
    };
  } else if constexpr (std::is_same_v<T, float>) {
    f.rule.kind = Kind::kNumber;
    f.rule.number_abs_max = FLT_MAX;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = static_cast<float>(v.get<double>()); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(FloatJson(ref(c))); };
  } else if constexpr (std::is_same_v<T, double>) {
    f.rule.kind = Kind::kNumber;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<double>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.rule.kind = Kind::kString;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<std::string>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    f.rule.kind = Kind::kArray;
    f.rule.item_kind = Kind::kInteger;
    f.rule.int_min = INT_MIN;
    f.rule.int_max = INT_MAX;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<std::vector<int>>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else if constexpr (std::is_same_v<T, std::vector<float>>) {
    f.rule.kind = Kind::kArray;
    f.rule.item_kind = Kind::kNumber;
    f.rule.number_abs_max = FLT_MAX;
    f.set = [ref](const Json& v, JobConfig* c) {
      std::vector<float>& out = ref(*c);
      out.clear();
      for (const Json& x : v) out.push_back(static_cast<float>(x.get<double>()));
    };
    f.get = [ref](const JobConfig& c) {
      Json out = Json::array();
      for (float x : ref(c)) out.push_back(FloatJson(x));
      return std::optional<Json>(std::move(out));
    };
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    f.rule.kind = Kind::kArray;
    f.rule.item_kind = Kind::kString;
    f.set = [ref](const Json& v, JobConfig* c) { ref(*c) = v.get<std::vector<std::string>>(); };
    f.get = [ref](const JobConfig& c) { return std::optional<Json>(Json(ref(c))); };
  } else {
    static_assert(sizeof(T) == 0, "no JSON binding for this field type");
  }
  return f;
}

template <typename Ref, typename E, size_t N>
FieldSpec EnumField(std::string path, Ref ref, const EnumName<E> (&table)[N]) {
  FieldSpec f;
  f.path = std::move(path);
  f.rule.kind = Kind::kString;
  f.rule.enum_values = Names(table);
  f.set = [ref, &table](const Json& v, JobConfig* c) {
    ref(*c) = *FromName(table, v.get<std::string>());
  };
  f.get = [ref, &table](const JobConfig& c) {
    const char* name = ToName(table, ref(c));
    // An out-of-range enum built in code: show it so that Check rejects it.
    return std::optional<Json>(
        name ? Json(name) : Json(absl::StrCat("<invalid ", static_cast<int>(ref(c)), ">")));
  };
  return f;
}

Rule Min(double min) {
  Rule r;
  r.min = min;
  return r;
}
Rule Above(double min) {
  Rule r;
  r.min = min;
  r.exclusive_min = true;
  return r;
}
Rule UnitInterval() {  // [0, 1)
  Rule r;
  r.min = 0;
  r.max = 1;
  r.exclusive_max = true;
  return r;
}
Rule OneOf(std::vector<std::string> values) {
  Rule r;
  r.enum_values = std::move(values);
  return r;
}

FieldSpec Derived(FieldSpec f) {
  f.derived_default = true;
  return f;
}

// The mlp shorthand's own fields: written out only for mlp models, so that a
// sequential model's JSON carries no hiddenUnits to conflict with its layers.
FieldSpec MlpOnly(FieldSpec f) {
  f.get = [get = std::move(f.get)](const JobConfig& c) -> std::optional<Json> {
    if (c.training.model.type != "mlp") return std::nullopt;
    return get(c);
  };
  return f;
}

// ---------------------------------------------------------------------------
// spec.training.model.layers: a list of single-key mappings
// {<Keras class>: {<arguments in camelCase>}}.

enum class LayerArg {
  kFilters,
  kKernelSize,
  kStrides,
  kPoolSize,
  kPadding,
  kActivation,
  kUseBias,
  kUnits,
  kRate,
  kMomentum,
  kEpsilon,
  kTargetShape,
  kShape,
  kNegativeSlope,
  kMaxValue,
  kThreshold,
  kAlpha,
  kAxis,
  kScale,
  kOffset,
  kCenter,
  kScaleOutput,
  kInputDim,
  kOutputDim,  // LayerNormalization's boolean `scale` (Rescaling's kScale is a number)
  kName,
};

struct LayerArgInfo {
  LayerArg arg;
  const char* name;  // camelCase, as in the CRD
  const char* keras_name;  // Keras' own spelling, for "did you mean"
};

constexpr LayerArgInfo kLayerArgs[] = {
    {LayerArg::kFilters, "filters", "filters"},
    {LayerArg::kKernelSize, "kernelSize", "kernel_size"},
    {LayerArg::kStrides, "strides", "strides"},
    {LayerArg::kPoolSize, "poolSize", "pool_size"},
    {LayerArg::kPadding, "padding", "padding"},
    {LayerArg::kActivation, "activation", "activation"},
    {LayerArg::kUseBias, "useBias", "use_bias"},
    {LayerArg::kUnits, "units", "units"},
    {LayerArg::kRate, "rate", "rate"},
    {LayerArg::kMomentum, "momentum", "momentum"},
    {LayerArg::kEpsilon, "epsilon", "epsilon"},
    {LayerArg::kTargetShape, "targetShape", "target_shape"},
    {LayerArg::kShape, "shape", "shape"},
    {LayerArg::kNegativeSlope, "negativeSlope", "negative_slope"},
    {LayerArg::kMaxValue, "maxValue", "max_value"},
    {LayerArg::kThreshold, "threshold", "threshold"},
    {LayerArg::kAlpha, "alpha", "alpha"},
    {LayerArg::kAxis, "axis", "axis"},
    {LayerArg::kScale, "scale", "scale"},
    {LayerArg::kOffset, "offset", "offset"},
    {LayerArg::kCenter, "center", "center"},
    {LayerArg::kScaleOutput, "scale", "scale"},
    {LayerArg::kInputDim, "inputDim", "input_dim"},
    {LayerArg::kOutputDim, "outputDim", "output_dim"},
    {LayerArg::kName, "name", "name"},
};

const char* LayerArgName(LayerArg arg) {
  for (const LayerArgInfo& info : kLayerArgs) {
    if (info.arg == arg) return info.name;
  }
  return "";
}

// The arguments each class takes, in the order the docs and the JSON list
// them.
std::vector<LayerArg> LayerArgsOf(LayerKind kind) {
  using A = LayerArg;
  switch (kind) {
    case LayerKind::kInput:
      return {A::kShape, A::kName};
    case LayerKind::kReshape:
      return {A::kTargetShape, A::kName};
    case LayerKind::kConv2D:
    case LayerKind::kConv1D:
      return {A::kFilters, A::kKernelSize, A::kStrides, A::kPadding,
              A::kActivation, A::kUseBias, A::kName};
    case LayerKind::kMaxPooling2D:
    case LayerKind::kAveragePooling2D:
    case LayerKind::kMaxPooling1D:
    case LayerKind::kAveragePooling1D:
      return {A::kPoolSize, A::kStrides, A::kPadding, A::kName};
    case LayerKind::kGlobalAveragePooling2D:
    case LayerKind::kGlobalAveragePooling1D:
    case LayerKind::kGlobalMaxPooling2D:
    case LayerKind::kGlobalMaxPooling1D:
    case LayerKind::kFlatten:
      return {A::kName};
    case LayerKind::kDense:
      return {A::kUnits, A::kActivation, A::kUseBias, A::kName};
    case LayerKind::kDropout:
      return {A::kRate, A::kName};
    case LayerKind::kBatchNormalization:
      return {A::kAxis, A::kMomentum, A::kEpsilon, A::kName};
    case LayerKind::kLayerNormalization:
      return {A::kAxis, A::kEpsilon, A::kCenter, A::kScaleOutput, A::kName};
    case LayerKind::kRMSNormalization:
      return {A::kAxis, A::kEpsilon, A::kName};
    case LayerKind::kEmbedding:
      return {A::kInputDim, A::kOutputDim, A::kName};
    case LayerKind::kActivation:
      return {A::kActivation, A::kName};
    case LayerKind::kReLU:
      return {A::kMaxValue, A::kNegativeSlope, A::kThreshold, A::kName};
    case LayerKind::kLeakyReLU:
      return {A::kNegativeSlope, A::kName};
    case LayerKind::kELU:
      return {A::kAlpha, A::kName};
    case LayerKind::kSoftmax:
      return {A::kAxis, A::kName};
    case LayerKind::kRescaling:
      return {A::kScale, A::kOffset, A::kName};
  }
  return {A::kName};
}

// Arguments Keras requires (no default) and an example of each.
std::vector<std::pair<LayerArg, const char*>> RequiredArgsOf(LayerKind kind) {
  using A = LayerArg;
  switch (kind) {
    case LayerKind::kInput:
      return {{A::kShape, "shape: [28, 28, 1]"}};
    case LayerKind::kReshape:
      return {{A::kTargetShape, "targetShape: [28, 28, 1]"}};
    case LayerKind::kConv2D:
      return {{A::kFilters, "filters: 32"}, {A::kKernelSize, "kernelSize: [3, 3]"}};
    case LayerKind::kConv1D:
      return {{A::kFilters, "filters: 32"}, {A::kKernelSize, "kernelSize: 3"}};
    case LayerKind::kDense:
      return {{A::kUnits, "units: 64"}};
    case LayerKind::kDropout:
      return {{A::kRate, "rate: 0.5"}};
    case LayerKind::kActivation:
      return {{A::kActivation, "activation: relu"}};
    case LayerKind::kRescaling:
      return {{A::kScale, "scale: 0.00392156862745098"}};
    case LayerKind::kEmbedding:
      return {{A::kInputDim, "inputDim: 10000"}, {A::kOutputDim, "outputDim: 16"}};
    default:
      return {};
  }
}

Rule LayerIntRule() {  // filters, units; int32 like every count in the CRD
  Rule r = Min(1);
  SetIntegerBounds<int>(&r);
  return r;
}

Rule ClosedUnitInterval() {  // [0, 1]
  Rule r;
  r.kind = Kind::kNumber;
  r.min = 0;
  r.max = 1;
  return r;
}

// Keras' spelling of a few class names that distrain spells otherwise.
std::string KerasAliasOf(const std::string& name) {
  static const std::map<std::string, std::string> kAliases = {
      {"MaxPool2D", "MaxPooling2D"},
      {"AvgPool2D", "AveragePooling2D"},
      {"AveragePool2D", "AveragePooling2D"},
      {"GlobalAvgPool2D", "GlobalAveragePooling2D"},
      {"GlobalAveragePool2D", "GlobalAveragePooling2D"},
      {"Convolution2D", "Conv2D"},
      {"InputLayer", "Input"},
      {"BatchNorm", "BatchNormalization"},
  };
  auto it = kAliases.find(name);
  return it == kAliases.end() ? "" : it->second;
}

std::string UnknownLayerClassMessage(const std::string& name) {
  std::string closest = KerasAliasOf(name);
  if (closest.empty()) closest = ClosestName(name, LayerKindNames());
  return absl::StrCat("unknown layer class \"", name, "\"",
                      closest.empty() ? "." : absl::StrCat("; did you mean \"", closest, "\"?"),
                      " Supported layer classes: ", absl::StrJoin(LayerKindNames(), ", "));
}

// "kernel_size" -> "kernelSize".
std::string SnakeToCamel(const std::string& s) {
  std::string out;
  bool upper = false;
  for (char c : s) {
    if (c == '_') {
      upper = !out.empty();
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}

// The argument of `kind` that an unknown `key` most likely means, or "".
std::string SuggestedLayerArg(LayerKind kind, const std::string& key) {
  std::vector<std::string> names;
  for (LayerArg arg : LayerArgsOf(kind)) names.push_back(LayerArgName(arg));
  const std::string camel = SnakeToCamel(key);
  if (std::find(names.begin(), names.end(), camel) != names.end()) return camel;
  return ClosestName(camel, names);
}

std::string UnknownLayerArgMessage(LayerKind kind, const std::string& key) {
  std::vector<std::string> names;
  for (LayerArg arg : LayerArgsOf(kind)) names.push_back(LayerArgName(arg));
  const std::string known = absl::StrCat(LayerKindName(kind), "'s arguments: ",
                                         absl::StrJoin(names, ", "));
  const std::string camel = SnakeToCamel(key);
  if (camel != key && std::find(names.begin(), names.end(), camel) != names.end()) {
    return absl::StrCat("unknown argument of ", LayerKindName(kind), "; did you mean \"", camel,
                        "\"? (Keras' arguments, spelled in camelCase)");
  }
  std::string closest = ClosestName(camel, names);
  if (!closest.empty()) {
    return absl::StrCat("unknown argument of ", LayerKindName(kind), "; did you mean \"",
                        closest, "\"?");
  }
  return absl::StrCat(LayerKindName(kind), " takes no argument \"", key, "\" in distrain; ",
                      known);
}

// kernelSize, poolSize, strides: an integer (both axes, as in Keras) or
// [rows, cols].
std::optional<std::array<int64_t, 2>> DecodePair(const Json& v, const std::string& path,
                                                 Issues* issues) {
  Rule item = LayerIntRule();
  if (v.is_array()) {
    if (v.size() != 2) {
      issues->Add(path, absl::StrCat("must be an integer or a list of 2 integers [rows, cols], "
                                     "got ",
                                     Show(v)));
      return std::nullopt;
    }
    Rule list = item;
    list.kind = Kind::kArray;
    list.item_kind = Kind::kInteger;
    if (!Check(list, v, path, issues)) return std::nullopt;
    return std::array<int64_t, 2>{v[0].get<int64_t>(), v[1].get<int64_t>()};
  }
  std::string problem = ScalarProblem(item, Kind::kInteger, v);
  if (!problem.empty()) {
    if (!v.is_number()) problem += "; or a list of 2 integers [rows, cols]";
    issues->Add(path, std::move(problem));
    return std::nullopt;
  }
  const int64_t n = v.get<int64_t>();
  return std::array<int64_t, 2>{n, n};
}

// A 1-D layer's kernelSize, poolSize or strides: an integer or [length]
// (Keras takes a tuple of one), kept as {length, 1}.
std::optional<std::array<int64_t, 2>> DecodeLength(const Json& v, const std::string& path,
                                                   Issues* issues) {
  const Json* value = &v;
  if (v.is_array()) {
    if (v.size() != 1) {
      issues->Add(path, absl::StrCat("must be an integer or a list of 1 integer [length] (a "
                                     "1-D layer), got ",
                                     Show(v)));
      return std::nullopt;
    }
    value = &v[0];
  }
  std::string problem = ScalarProblem(LayerIntRule(), Kind::kInteger, *value);
  if (!problem.empty()) {
    issues->Add(path, std::move(problem));
    return std::nullopt;
  }
  return std::array<int64_t, 2>{value->get<int64_t>(), 1};
}

// Limits the CRD states too (maxItems, maxLength), so both reject the same.
constexpr size_t kMaxShapeRank = 8;
constexpr size_t kMaxLayers = 128;
constexpr size_t kMaxLayerNameLength = 128;

std::optional<std::vector<int64_t>> DecodeShapeList(const Json& v, const std::string& path,
                                                    bool allow_unknown, Issues* issues) {
  Rule list;
  list.kind = Kind::kArray;
  list.item_kind = Kind::kInteger;
  list.min = allow_unknown ? -1 : 1;
  SetIntegerBounds<int>(&list);
  list.kind = Kind::kArray;
  if (!Check(list, v, path, issues)) return std::nullopt;
  bool ok = true;
  if (v.empty()) {
    issues->Add(path, "must list at least one dimension");
    ok = false;
  } else if (v.size() > kMaxShapeRank) {
    issues->Add(path, absl::StrCat("has ", v.size(), " dimensions; at most ", kMaxShapeRank,
                                   " (the CRD's limit)"));
    ok = false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].get<int64_t>() == 0) {
      issues->Add(JoinYamlPath(path, i),
                  "must be a positive integer (or -1 for the one inferred dimension), got 0");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return v.get<std::vector<int64_t>>();
}

// Decodes one argument into `layer`; reports problems under `path`.
void DecodeLayerArg(LayerArg arg, const Json& v, const std::string& path, LayerConfig* layer,
                    Issues* issues) {
  switch (arg) {
    case LayerArg::kFilters:
    case LayerArg::kUnits:
    case LayerArg::kInputDim:
    case LayerArg::kOutputDim:
      if (Check(LayerIntRule(), v, path, issues)) {
        (arg == LayerArg::kFilters     ? layer->filters
         : arg == LayerArg::kUnits     ? layer->units
         : arg == LayerArg::kInputDim ? layer->input_dim
                                       : layer->output_dim) = v.get<int64_t>();
      }
      break;
    case LayerArg::kKernelSize:
    case LayerArg::kPoolSize:
    case LayerArg::kStrides: {
      auto pair = IsOneDimensional(layer->kind) ? DecodeLength(v, path, issues)
                                                : DecodePair(v, path, issues);
      if (!pair) break;
      if (arg == LayerArg::kKernelSize) {
        layer->kernel_size = *pair;
      } else if (arg == LayerArg::kPoolSize) {
        layer->pool_size = *pair;
      } else {
        layer->strides = *pair;
      }
      break;
    }
    case LayerArg::kPadding:
      // Keras pads causally in Conv1D only.
      if (Check(layer->kind == LayerKind::kConv1D ? OneOf({"valid", "same", "causal"})
                                                  : OneOf({"valid", "same"}),
                v, path, issues)) {
        const std::string padding = v.get<std::string>();
        layer->padding = padding == "same"     ? PaddingKind::kSame
                         : padding == "causal" ? PaddingKind::kCausal
                                               : PaddingKind::kValid;
      }
      break;
    case LayerArg::kActivation:
      if (Check(OneOf(ActivationNames(/*with_aliases=*/true)), v, path, issues)) {
        layer->activation = *ParseActivationName(v.get<std::string>());
      }
      break;
    case LayerArg::kUseBias:
    case LayerArg::kCenter:
    case LayerArg::kScaleOutput: {
      Rule r;
      r.kind = Kind::kBoolean;
      if (!Check(r, v, path, issues)) break;
      (arg == LayerArg::kUseBias  ? layer->use_bias
       : arg == LayerArg::kCenter ? layer->center
                                  : layer->scale_output) = v.get<bool>();
      break;
    }
    case LayerArg::kRate: {
      Rule r = UnitInterval();
      r.kind = Kind::kNumber;
      if (Check(r, v, path, issues)) layer->rate = v.get<double>();
      break;
    }
    case LayerArg::kMomentum:
      if (Check(ClosedUnitInterval(), v, path, issues)) layer->momentum = v.get<double>();
      break;
    case LayerArg::kEpsilon: {
      Rule r = Above(0);
      r.kind = Kind::kNumber;
      if (Check(r, v, path, issues)) layer->epsilon = v.get<double>();
      break;
    }
    case LayerArg::kTargetShape:
      if (auto shape = DecodeShapeList(v, path, /*allow_unknown=*/true, issues)) {
        layer->shape = *shape;
        if (std::count(shape->begin(), shape->end(), -1) > 1) {
          issues->Add(path, absl::StrCat("has more than one -1, got ", Show(v),
                                         "; at most one dimension can be inferred"));
        }
      }
      break;
    case LayerArg::kShape:
      if (auto shape = DecodeShapeList(v, path, /*allow_unknown=*/false, issues)) {
        layer->shape = *shape;
      }
      break;
    case LayerArg::kNegativeSlope:
    case LayerArg::kMaxValue: {
      Rule r = Min(0);
      r.kind = Kind::kNumber;
      if (!Check(r, v, path, issues)) break;
      (arg == LayerArg::kNegativeSlope ? layer->negative_slope : layer->max_value) =
          v.get<double>();
      break;
    }
    case LayerArg::kThreshold:
    case LayerArg::kAlpha:
    case LayerArg::kScale:
    case LayerArg::kOffset: {
      Rule r = arg == LayerArg::kAlpha ? Min(0) : Rule();
      r.kind = Kind::kNumber;
      if (!Check(r, v, path, issues)) break;
      const double x = v.get<double>();
      if (arg == LayerArg::kThreshold) {
        layer->threshold = x;
      } else if (arg == LayerArg::kAlpha) {
        layer->alpha = x;
      } else if (arg == LayerArg::kScale) {
        layer->scale = x;
      } else {
        layer->offset = x;
      }
      break;
    }
    case LayerArg::kAxis: {
      Rule r;
      r.kind = Kind::kInteger;
      SetIntegerBounds<int>(&r);
      if (Check(r, v, path, issues)) layer->axis = v.get<int64_t>();
      break;
    }
    case LayerArg::kName: {
      Rule r;
      r.kind = Kind::kString;
      if (!Check(r, v, path, issues)) break;
      const std::string name = v.get<std::string>();
      if (name.empty()) {
        issues->Add(path, "must not be empty; remove it to get Keras' automatic name");
      } else if (name.size() > kMaxLayerNameLength) {
        issues->Add(path, absl::StrCat("has ", name.size(), " characters; at most ",
                                       kMaxLayerNameLength));
      } else if (name.find('/') != std::string::npos) {
        issues->Add(path, absl::StrCat("must not contain '/' (it separates a layer's name from "
                                       "its variables', \"<name>/kernel\"), got ",
                                       Show(v)));
      } else {
        layer->name = name;
      }
      break;
    }
  }
}

// One entry of the list: {<Class>: {<arguments>}}.
std::optional<LayerConfig> DecodeLayer(const Json& entry, const std::string& path,
                                       Issues* issues) {
  const std::string example = "such as {Dense: {units: 10}} or {Flatten: {}}";
  if (!entry.is_object()) {
    std::string problem = absl::StrCat(
        "must be a mapping with one key, the layer class, ", example, ", got ", Show(entry));
    if (entry.is_string() && ParseLayerKind(entry.get<std::string>())) {
      absl::StrAppend(&problem, "; write {", entry.get<std::string>(), ": {}}");
    }
    issues->Add(path, std::move(problem));
    return std::nullopt;
  }
  if (entry.empty()) {
    issues->Add(path, absl::StrCat("is empty; name one layer class, ", example));
    return std::nullopt;
  }
  if (entry.size() > 1) {
    std::vector<std::string> keys;
    std::vector<std::string> classes;
    for (const auto& [key, value] : entry.items()) {
      keys.push_back(key);
      if (ParseLayerKind(key)) classes.push_back(key);
    }
    if (classes.size() == 1) {
      // `- Conv2D:` with its arguments at the level of the class name: an
      // indentation slip.
      std::vector<std::string> args;
      for (const std::string& key : keys) {
        if (key != classes[0]) args.push_back(key);
      }
      issues->Add(path, absl::StrCat("has keys ", absl::StrJoin(keys, ", "), "; the arguments ",
                                     absl::StrJoin(args, ", "), " belong under ", classes[0],
                                     ": write {", classes[0], ": {", args[0],
                                     ": ...}} (indent them below ", classes[0], ":)"));
    } else {
      issues->Add(path, absl::StrCat("has ", keys.size(), " keys (", absl::StrJoin(keys, ", "),
                                     "); each list entry is one layer with one key, the layer "
                                     "class; put each layer in its own entry"));
    }
    return std::nullopt;
  }
  const std::string class_name = entry.begin().key();
  const Json& args = entry.begin().value();
  const std::string class_path = JoinYamlPath(path, class_name);
  std::optional<LayerKind> kind = ParseLayerKind(class_name);
  if (!kind) {
    issues->Add(class_path, UnknownLayerClassMessage(class_name));
    return std::nullopt;
  }
  LayerConfig layer;
  layer.kind = *kind;
  if (*kind == LayerKind::kMaxPooling1D || *kind == LayerKind::kAveragePooling1D) {
    layer.pool_size = {2, 1};  // Keras' pool_size=2 of a 1-D layer
  }
  layer.epsilon = DefaultEpsilon(*kind);
  if (args.is_null()) return layer;  // `- Flatten:` with nothing after it
  if (!args.is_object()) {
    issues->Add(class_path, absl::StrCat("must be a mapping of ", class_name,
                                         "'s arguments (use {} for none), got ", Show(args)));
    return std::nullopt;
  }
  const std::vector<LayerArg> allowed = LayerArgsOf(*kind);
  const size_t before = issues->size();
  std::set<std::string> suggested;  // "kernelSize" for kernel_size: not also "required"
  for (const auto& [key, value] : args.items()) {
    const std::string arg_path = JoinYamlPath(class_path, key);
    auto arg = std::find_if(allowed.begin(), allowed.end(),
                            [&key = key](LayerArg a) { return key == LayerArgName(a); });
    if (arg == allowed.end()) {
      issues->Add(arg_path, UnknownLayerArgMessage(*kind, key));
      suggested.insert(SuggestedLayerArg(*kind, key));
    } else if (!value.is_null()) {
      DecodeLayerArg(*arg, value, arg_path, &layer, issues);
    }
  }
  for (const auto& [arg, sample] : RequiredArgsOf(*kind)) {
    auto it = args.find(LayerArgName(arg));
    if ((it == args.end() || it->is_null()) && !suggested.count(LayerArgName(arg))) {
      issues->Add(JoinYamlPath(class_path, LayerArgName(arg)),
                  absl::StrCat("required; ", class_name, " has no default for it (e.g. ", sample,
                               ")"));
    }
  }
  if (issues->size() != before) return std::nullopt;
  return layer;
}

void DecodeLayers(const Json& v, const std::string& path, JobConfig* config, Issues* issues) {
  if (!v.is_array()) {
    issues->Add(path, absl::StrCat("must be a list of layers, each {<LayerClass>: {<arguments>}} "
                                   "such as [{Flatten: {}}, {Dense: {units: 10}}], got ",
                                   Show(v)));
    return;
  }
  std::vector<LayerConfig> layers;
  bool ok = true;
  if (v.size() > kMaxLayers) {
    issues->Add(path, absl::StrCat("has ", v.size(), " layers; at most ", kMaxLayers,
                                   " (the CRD's limit)"));
    ok = false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    std::optional<LayerConfig> layer = DecodeLayer(v[i], JoinYamlPath(path, i), issues);
    if (layer) {
      layers.push_back(std::move(*layer));
    } else {
      ok = false;
    }
  }
  if (ok) config->training.model.layers = std::move(layers);
}

Json PairJson(const std::array<int64_t, 2>& pair) { return Json::array({pair[0], pair[1]}); }

// One layer as the user would write it: required arguments and poolSize
// always, the others only where they differ from Keras' defaults, the name
// only where it is not the automatic one (`automatic_name`). So the spec the
// operator writes back reads like the user's, and parsing it gives the same
// LayerConfig.
Json LayerToJson(const LayerConfig& layer, bool automatic_name) {
  const LayerConfig defaults;
  const bool one_d = IsOneDimensional(layer.kind);
  Json args = Json::object();
  for (LayerArg arg : LayerArgsOf(layer.kind)) {
    const char* name = LayerArgName(arg);
    switch (arg) {
      case LayerArg::kFilters:
        args[name] = layer.filters;
        break;
      case LayerArg::kUnits:
        args[name] = layer.units;
        break;
      case LayerArg::kInputDim:
        args[name] = layer.input_dim;
        break;
      case LayerArg::kOutputDim:
        args[name] = layer.output_dim;
        break;
      case LayerArg::kKernelSize:
        args[name] = one_d ? Json(layer.kernel_size[0]) : PairJson(layer.kernel_size);
        break;
      case LayerArg::kPoolSize:
        args[name] = one_d ? Json(layer.pool_size[0]) : PairJson(layer.pool_size);
        break;
      case LayerArg::kStrides:
        if (layer.strides) args[name] = one_d ? Json((*layer.strides)[0]) : PairJson(*layer.strides);
        break;
      case LayerArg::kPadding:
        if (layer.padding != defaults.padding) {
          args[name] = PaddingName(layer.padding);
        }
        break;
      case LayerArg::kActivation:
        if (layer.activation != defaults.activation || layer.kind == LayerKind::kActivation) {
          args[name] = ActivationName(layer.activation);
        }
        break;
      case LayerArg::kUseBias:
        if (layer.use_bias != defaults.use_bias) args[name] = layer.use_bias;
        break;
      case LayerArg::kRate:
        args[name] = layer.rate;
        break;
      case LayerArg::kMomentum:
        if (layer.momentum != defaults.momentum) args[name] = layer.momentum;
        break;
      case LayerArg::kEpsilon:
        if (layer.epsilon != DefaultEpsilon(layer.kind)) args[name] = layer.epsilon;
        break;
      case LayerArg::kCenter:
        if (layer.center != defaults.center) args[name] = layer.center;
        break;
      case LayerArg::kScaleOutput:
        if (layer.scale_output != defaults.scale_output) args[name] = layer.scale_output;
        break;
      case LayerArg::kTargetShape:
      case LayerArg::kShape:
        args[name] = layer.shape;
        break;
      case LayerArg::kNegativeSlope:
        if (layer.negative_slope) args[name] = *layer.negative_slope;
        break;
      case LayerArg::kMaxValue:
        if (layer.max_value) args[name] = *layer.max_value;
        break;
      case LayerArg::kThreshold:
        if (layer.threshold != defaults.threshold) args[name] = layer.threshold;
        break;
      case LayerArg::kAlpha:
        if (layer.alpha != defaults.alpha) args[name] = layer.alpha;
        break;
      case LayerArg::kAxis:
        if (layer.axis != defaults.axis) args[name] = layer.axis;
        break;
      case LayerArg::kScale:
        args[name] = layer.scale;
        break;
      case LayerArg::kOffset:
        if (layer.offset != defaults.offset) args[name] = layer.offset;
        break;
      case LayerArg::kName:
        if (!layer.name.empty() && !automatic_name) args[name] = layer.name;
        break;
    }
  }
  Json entry = Json::object();
  entry[LayerKindName(layer.kind)] = std::move(args);
  return entry;
}

// The layers as JSON, leaving out names that AssignLayerNames gives anyway.
Json LayersToJson(const std::vector<LayerConfig>& layers) {
  // Try leaving out every name; where the automatic names differ from the
  // given ones, keep those given names and try again (a kept name can move
  // the automatic ones past it).
  std::vector<bool> keep(layers.size(), false);
  for (size_t round = 0; round <= layers.size(); ++round) {
    std::vector<LayerConfig> renamed = layers;
    for (size_t i = 0; i < renamed.size(); ++i) {
      if (!keep[i]) renamed[i].name.clear();
    }
    AssignLayerNames(&renamed);
    bool changed = false;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!keep[i] && renamed[i].name != layers[i].name) {
        keep[i] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  Json out = Json::array();
  for (size_t i = 0; i < layers.size(); ++i) out.push_back(LayerToJson(layers[i], !keep[i]));
  return out;
}

FieldSpec LayersField(std::string path) {
  FieldSpec f;
  f.path = std::move(path);
  f.rule.kind = Kind::kArray;
  f.rule.item_kind = Kind::kObject;
  f.decode = DecodeLayers;
  f.get = [](const JobConfig& c) -> std::optional<Json> {
    if (c.training.model.layers.empty()) return std::nullopt;
    return LayersToJson(c.training.model.layers);
  };
  return f;
}

// After the table's fields: what model.type is when absent, the fields that
// exclude each other, and Keras' automatic layer names. `model` is the
// document's spec.training.model (nullptr when absent).
void FinishModel(const Json* model, const std::string& display, JobConfig* config,
                 Issues* issues) {
  ModelConfig& m = config->training.model;
  if (model != nullptr && model->is_object()) {
    auto present = [&](const char* key) {
      auto it = model->find(key);
      return it != model->end() && !it->is_null();
    };
    const bool has_layers = present("layers") && (*model)["layers"].is_array() &&
                            !(*model)["layers"].empty();
    if (has_layers && present("hiddenUnits")) {
      issues->Add(JoinYamlPath(display, "hiddenUnits"),
                  absl::StrCat("given together with ", display,
                               ".layers; hiddenUnits sizes the mlp shorthand, layers describe a "
                               "sequential model: remove one of them"));
    }
    if (has_layers && present("type") && m.type == "mlp") {
      issues->Add(JoinYamlPath(display, "type"),
                  absl::StrCat("is mlp but ", display,
                               ".layers is given; mlp builds its layers from hiddenUnits: set "
                               "type: sequential (or remove type) to train the layers"));
    }
    if (has_layers && !present("type")) m.type = "sequential";
  }
  AssignLayerNames(&m.layers);
}

// spec.training.checkpoint.volume: a core/v1 VolumeSource with exactly one
// source that can hold writable files. Only its shape is checked here; the
// API server checks the source's own fields when the operator creates a pod.
void CheckCheckpointVolume(const Json& v, const std::string& path, Issues* issues) {
  const std::vector<std::string>& kinds = CheckpointVolumeSourceKinds();
  if (!v.is_object() || v.size() != 1) {
    issues->Add(path, absl::StrCat(
                          "must be a Kubernetes volume source with exactly one source, e.g. "
                          "{persistentVolumeClaim: {claimName: my-checkpoints}} or {nfs: {server: "
                          "..., path: ...}}, got ",
                          Show(v)));
    return;
  }
  const std::string& kind = v.begin().key();
  const Json& source = v.begin().value();
  if (kind == "configMap" || kind == "secret" || kind == "downwardAPI" || kind == "projected" ||
      kind == "image") {
    issues->Add(JoinYamlPath(path, kind),
                "is a read-only volume; checkpoints need a writable one such as "
                "persistentVolumeClaim, nfs or csi");
    return;
  }
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    const std::string closest = ClosestName(kind, kinds);
    issues->Add(JoinYamlPath(path, kind),
                absl::StrCat("is not a Kubernetes volume source",
                             closest.empty() ? "" : absl::StrCat(" (did you mean \"", closest, "\"?)"),
                             "; one of ", absl::StrJoin(kinds, ", ")));
    return;
  }
  if (!source.is_object()) {
    issues->Add(JoinYamlPath(path, kind), absl::StrCat("must be a mapping, got ", Show(source)));
    return;
  }
  if (kind == "persistentVolumeClaim") {
    auto claim = source.find("claimName");
    if (claim == source.end() || !claim->is_string() || claim->get<std::string>().empty()) {
      issues->Add(JoinYamlPath(JoinYamlPath(path, kind), "claimName"),
                  "must name an existing PersistentVolumeClaim of the job's namespace");
    }
  }
}

FieldSpec CheckpointVolumeField(std::string path) {
  FieldSpec f;
  f.path = std::move(path);
  f.rule.kind = Kind::kObject;
  f.decode = [](const Json& v, const std::string& display, JobConfig* config, Issues* issues) {
    Issues own;
    CheckCheckpointVolume(v, display, &own);
    if (own.empty()) config->training.checkpoint.volume = v;
    issues->Append(own);
  };
  f.get = [](const JobConfig& c) -> std::optional<Json> {
    if (c.training.checkpoint.volume.is_null()) return std::nullopt;
    return c.training.checkpoint.volume;
  };
  return f;
}

// A string field whose empty value means "unset" (the operator's default):
// written out only when set, so no empty string reaches the CRD's enum.
FieldSpec OmitEmpty(FieldSpec f) {
  f.get = [get = std::move(f.get)](const JobConfig& c) -> std::optional<Json> {
    std::optional<Json> v = get(c);
    if (v && v->is_string() && v->get<std::string>().empty()) return std::nullopt;
    return v;
  };
  return f;
}

#define DISTRAIN_REF(member) [](auto& c) -> auto& { return c.member; }

const std::vector<FieldSpec>& SpecFields() {
  static const std::vector<FieldSpec>* const kFields = new std::vector<FieldSpec>{
      EnumField("strategy", DISTRAIN_REF(strategy), kStrategies),
      EnumField("successPolicy", DISTRAIN_REF(success_policy), kSuccessPolicies),
      EnumField("security.transport", DISTRAIN_REF(transport), kTransportModes),
      Field("runPolicy.backoffLimit", DISTRAIN_REF(run_policy.backoff_limit), Min(0)),
      Field("runPolicy.activeDeadlineSeconds", DISTRAIN_REF(run_policy.active_deadline_seconds),
            Min(1)),
      Field("runPolicy.progressDeadlineSeconds",
            DISTRAIN_REF(run_policy.progress_deadline_seconds), Min(1)),
      Field("runPolicy.ttlSecondsAfterFinished",
            DISTRAIN_REF(run_policy.ttl_seconds_after_finished), Min(0)),
      EnumField("runPolicy.cleanPodPolicy", DISTRAIN_REF(run_policy.clean_pod_policy),
                kCleanPodPolicies),
      EnumField("runPolicy.recoveryPolicy", DISTRAIN_REF(run_policy.recovery_policy),
                kRecoveryPolicies),
      Field("runPolicy.recoveryTimeoutSeconds", DISTRAIN_REF(run_policy.recovery_timeout_seconds),
            Min(1)),
      Field("runPolicy.suspend", DISTRAIN_REF(run_policy.suspend)),
      Field("runPolicy.scheduling.gang", DISTRAIN_REF(run_policy.scheduling.gang)),
      Field("runPolicy.scheduling.minAvailable", DISTRAIN_REF(run_policy.scheduling.min_available),
            Min(1)),
      Field("runPolicy.scheduling.queue", DISTRAIN_REF(run_policy.scheduling.queue)),
      Field("runPolicy.scheduling.priorityClass",
            DISTRAIN_REF(run_policy.scheduling.priority_class)),
      Field("runPolicy.scheduling.schedulerName",
            DISTRAIN_REF(run_policy.scheduling.scheduler_name)),

      Derived(Field("training.model.type", DISTRAIN_REF(training.model.type),
                    OneOf({"mlp", "sequential"}))),
      Derived(MlpOnly(
          Field("training.model.hiddenUnits", DISTRAIN_REF(training.model.hidden_units), Min(1)))),
      Derived(MlpOnly(Field("training.model.activation", DISTRAIN_REF(training.model.activation),
                            OneOf({"relu"})))),
      LayersField("training.model.layers"),
      EnumField("training.model.loss.type", DISTRAIN_REF(training.model.loss.kind), kLossKinds),
      Field("training.model.loss.fromLogits", DISTRAIN_REF(training.model.loss.from_logits)),

      EnumField("training.dataset.type", DISTRAIN_REF(training.dataset.type), kDatasetTypes),
      Field("training.dataset.numExamples", DISTRAIN_REF(training.dataset.num_examples), Min(1)),
      Field("training.dataset.numEvalExamples", DISTRAIN_REF(training.dataset.num_eval_examples),
            Min(0)),
      Field("training.dataset.numFeatures", DISTRAIN_REF(training.dataset.num_features), Min(1)),
      Field("training.dataset.numClasses", DISTRAIN_REF(training.dataset.num_classes), Min(2)),
      Field("training.dataset.noise", DISTRAIN_REF(training.dataset.noise), Min(0)),
      Field("training.dataset.trainFiles", DISTRAIN_REF(training.dataset.train_files)),
      Field("training.dataset.trainLabelFiles", DISTRAIN_REF(training.dataset.train_label_files)),
      Field("training.dataset.evalFiles", DISTRAIN_REF(training.dataset.eval_files)),
      Field("training.dataset.evalLabelFiles", DISTRAIN_REF(training.dataset.eval_label_files)),
      Field("training.dataset.labelColumn", DISTRAIN_REF(training.dataset.label_column), Min(0)),
      Field("training.dataset.csvHeader", DISTRAIN_REF(training.dataset.csv_header)),
      Field("training.dataset.scale", DISTRAIN_REF(training.dataset.scale), Above(0)),
      EnumField("training.dataset.compression", DISTRAIN_REF(training.dataset.compression),
                kDataCompressions),
      Field("training.dataset.featureKey", DISTRAIN_REF(training.dataset.feature_key)),
      Field("training.dataset.featureShape", DISTRAIN_REF(training.dataset.feature_shape),
            Min(1)),
      EnumField("training.dataset.featureEncoding",
                DISTRAIN_REF(training.dataset.feature_encoding), kFeatureEncodings),
      Field("training.dataset.labelKey", DISTRAIN_REF(training.dataset.label_key)),
      EnumField("training.dataset.autoShardPolicy",
                DISTRAIN_REF(training.dataset.auto_shard_policy), kAutoShardPolicies),
      Field("training.dataset.shuffle", DISTRAIN_REF(training.dataset.shuffle)),
      Field("training.dataset.prefetchBatches", DISTRAIN_REF(training.dataset.prefetch_batches),
            Min(0)),

      EnumField("training.optimizer.type", DISTRAIN_REF(training.optimizer.type), kOptimizerTypes),
      Field("training.optimizer.learningRate", DISTRAIN_REF(training.optimizer.learning_rate),
            Above(0)),
      Field("training.optimizer.momentum", DISTRAIN_REF(training.optimizer.momentum),
            UnitInterval()),
      Field("training.optimizer.nesterov", DISTRAIN_REF(training.optimizer.nesterov)),
      Field("training.optimizer.beta1", DISTRAIN_REF(training.optimizer.beta1), UnitInterval()),
      Field("training.optimizer.beta2", DISTRAIN_REF(training.optimizer.beta2), UnitInterval()),
      Field("training.optimizer.epsilon", DISTRAIN_REF(training.optimizer.epsilon), Above(0)),
      Field("training.optimizer.rho", DISTRAIN_REF(training.optimizer.rho), UnitInterval()),
      Field("training.optimizer.centered", DISTRAIN_REF(training.optimizer.centered)),
      Field("training.optimizer.weightDecay", DISTRAIN_REF(training.optimizer.weight_decay),
            Min(0)),
      EnumField("training.optimizer.schedule.type", DISTRAIN_REF(training.optimizer.schedule.type),
                kScheduleTypes),
      Field("training.optimizer.schedule.decaySteps",
            DISTRAIN_REF(training.optimizer.schedule.decay_steps), Min(0)),
      Field("training.optimizer.schedule.decayRate",
            DISTRAIN_REF(training.optimizer.schedule.decay_rate), Min(0)),
      Field("training.optimizer.schedule.staircase",
            DISTRAIN_REF(training.optimizer.schedule.staircase)),
      Field("training.optimizer.schedule.endLearningRate",
            DISTRAIN_REF(training.optimizer.schedule.end_learning_rate), Min(0)),
      Field("training.optimizer.schedule.power", DISTRAIN_REF(training.optimizer.schedule.power),
            Min(0)),
      Field("training.optimizer.schedule.cycle", DISTRAIN_REF(training.optimizer.schedule.cycle)),
      Field("training.optimizer.schedule.alpha", DISTRAIN_REF(training.optimizer.schedule.alpha),
            ClosedUnitInterval()),
      Field("training.optimizer.schedule.warmupSteps",
            DISTRAIN_REF(training.optimizer.schedule.warmup_steps), Min(0)),
      Field("training.optimizer.schedule.warmupTarget",
            DISTRAIN_REF(training.optimizer.schedule.warmup_target), Above(0)),
      Field("training.optimizer.schedule.boundaries",
            DISTRAIN_REF(training.optimizer.schedule.boundaries), Min(1)),
      Field("training.optimizer.schedule.values",
            DISTRAIN_REF(training.optimizer.schedule.values), Above(0)),

      Field("training.checkpoint.dir", DISTRAIN_REF(training.checkpoint.dir)),
      Field("training.checkpoint.everySteps", DISTRAIN_REF(training.checkpoint.every_steps),
            Min(0)),
      Field("training.checkpoint.keep", DISTRAIN_REF(training.checkpoint.keep), Min(1)),
      CheckpointVolumeField("training.checkpoint.volume"),
      OmitEmpty(Field("training.checkpoint.storage.storageClassName",
                      DISTRAIN_REF(training.checkpoint.storage.storage_class_name))),
      OmitEmpty(Field("training.checkpoint.storage.size",
                      DISTRAIN_REF(training.checkpoint.storage.size))),
      OmitEmpty(Field("training.checkpoint.storage.accessMode",
                      DISTRAIN_REF(training.checkpoint.storage.access_mode),
                      OneOf({"ReadWriteOnce", "ReadWriteMany"}))),
      Field("training.export.path", DISTRAIN_REF(training.export_model.path)),

      EnumField("training.communication.implementation",
                DISTRAIN_REF(training.communication.implementation), kImplementations),
      Field("training.communication.timeoutSeconds",
            DISTRAIN_REF(training.communication.timeout_seconds), Above(0)),
      Field("training.communication.bytesPerPack",
            DISTRAIN_REF(training.communication.bytes_per_pack), Min(1)),

      Field("training.globalBatchSize", DISTRAIN_REF(training.global_batch_size), Min(1)),
      Field("training.steps", DISTRAIN_REF(training.steps), Min(1)),
      Field("training.seed", DISTRAIN_REF(training.seed), Min(0)),
      Field("training.logEverySteps", DISTRAIN_REF(training.log_every_steps), Min(0)),
      Field("training.evalEverySteps", DISTRAIN_REF(training.eval_every_steps), Min(0)),
      Field("training.localReplicas", DISTRAIN_REF(training.local_replicas), Min(0)),
      Field("training.maxStaleness", DISTRAIN_REF(training.max_staleness), Min(0)),
      EnumField("training.precision", DISTRAIN_REF(training.model.precision), kPrecisions),
  };
  return *kFields;
}

#undef DISTRAIN_REF

// Rules of the fields that the table does not hold.
Rule ReplicasRule() {
  Rule r = Min(0);
  SetIntegerBounds<int>(&r);
  return r;
}
Rule RestartPolicyRule() { return OneOf(Names(kRestartPolicies)); }
Rule ElasticBoundRule() {
  Rule r = Min(1);
  SetIntegerBounds<int>(&r);
  return r;
}

const FieldSpec* FindField(const std::string& path) {
  static const auto* const kIndex = [] {
    auto* index = new std::map<std::string, const FieldSpec*>;
    for (const FieldSpec& f : SpecFields()) (*index)[f.path] = &f;
    return index;
  }();
  auto it = kIndex->find(path);
  return it == kIndex->end() ? nullptr : it->second;
}

// Relative paths of every field and object below `prefix` ("" for spec).
std::vector<std::string> PathsBelow(const std::string& prefix) {
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const FieldSpec& f : SpecFields()) {
    if (!prefix.empty() && f.path.rfind(prefix + ".", 0) != 0) continue;
    const std::string rel = prefix.empty() ? f.path : f.path.substr(prefix.size() + 1);
    // Every object on the way is a candidate too ("optimizer" for "optimizer.type").
    for (size_t dot = rel.find('.'); dot != std::string::npos; dot = rel.find('.', dot + 1)) {
      if (seen.insert(rel.substr(0, dot)).second) paths.push_back(rel.substr(0, dot));
    }
    if (seen.insert(rel).second) paths.push_back(rel);
  }
  return paths;
}

bool IsObjectPath(const std::string& path) {
  for (const FieldSpec& f : SpecFields()) {
    if (f.path.rfind(path + ".", 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> DirectChildren(const std::vector<std::string>& paths) {
  std::vector<std::string> children;
  for (const std::string& p : paths) {
    if (p.find('.') == std::string::npos) children.push_back(p);
  }
  return children;
}

// Decodes the table's fields below `rel` from `object` into `config`.
// `display` is the user's path of `object`; `extras` are keys of `object`
// that the caller decodes itself.
void DecodeObject(const Json& object, const std::string& rel, const std::string& display,
                  const std::vector<std::string>& extras, JobConfig* config, Issues* issues) {
  for (const auto& [key, value] : object.items()) {
    const std::string child_display = JoinYamlPath(display, key);
    if (rel.empty() && std::find(extras.begin(), extras.end(), key) != extras.end()) continue;
    const std::string child_rel = rel.empty() ? key : absl::StrCat(rel, ".", key);
    if (value.is_null()) continue;  // like the API server: null is absent
    if (const FieldSpec* field = FindField(child_rel)) {
      if (field->decode) {
        field->decode(value, child_display, config, issues);
      } else if (Check(field->rule, value, child_display, issues)) {
        field->set(value, config);
      }
    } else if (IsObjectPath(child_rel)) {
      if (!value.is_object()) {
        issues->Add(child_display, absl::StrCat("must be a mapping, got ", Show(value)));
      } else {
        DecodeObject(value, child_rel, child_display, {}, config, issues);
      }
    } else {
      std::vector<std::string> candidates = PathsBelow(rel);
      if (rel.empty()) candidates.insert(candidates.end(), extras.begin(), extras.end());
      issues->Add(child_display, UnknownFieldMessage(key, candidates, DirectChildren(candidates)));
    }
  }
}

std::vector<std::string> ReplicaTypeNames() { return Names(kReplicaTypes); }

std::optional<ReplicaType> ReplicaTypeFromKey(const std::string& key, const std::string& path,
                                              Issues* issues) {
  std::optional<ReplicaType> type = FromName(kReplicaTypes, key);
  if (!type) {
    std::string closest = ClosestName(key, ReplicaTypeNames());
    issues->Add(
        path, absl::StrCat(
                  "unknown replica type; expected one of ", absl::StrJoin(ReplicaTypeNames(), ", "),
                  closest.empty() ? "" : absl::StrCat(" (did you mean \"", closest, "\"?)")));
  }
  return type;
}

// spec.replicaSpecs: {Worker: {replicas, restartPolicy, template}, ...}
void DecodeReplicaSpecs(const Json& specs, const std::string& path, JobConfig* config,
                        Issues* issues) {
  if (!specs.is_object()) {
    issues->Add(path, absl::StrCat("must be a mapping of replica type (",
                                   absl::StrJoin(ReplicaTypeNames(), ", "), ") to its spec, got ",
                                   Show(specs)));
    return;
  }
  const std::vector<std::string> known = {"replicas", "restartPolicy", "template"};
  for (const auto& [key, value] : specs.items()) {
    const std::string type_path = JoinYamlPath(path, key);
    std::optional<ReplicaType> type = ReplicaTypeFromKey(key, type_path, issues);
    if (!type || value.is_null()) continue;
    if (!value.is_object()) {
      issues->Add(type_path,
                  absl::StrCat("must be a mapping with replicas, restartPolicy and template, got ",
                               Show(value)));
      continue;
    }
    ReplicaSpec spec;
    for (const auto& [field, v] : value.items()) {
      const std::string field_path = JoinYamlPath(type_path, field);
      if (v.is_null()) continue;
      if (field == "replicas") {
        if (Check(ReplicasRule(), v, field_path, issues)) spec.replicas = v.get<int>();
      } else if (field == "restartPolicy") {
        if (Check(RestartPolicyRule(), v, field_path, issues)) {
          spec.restart_policy = *FromName(kRestartPolicies, v.get<std::string>());
        }
      } else if (field == "template") {
        // A PodTemplateSpec: the operator reads it; here it only has to be one.
        if (!v.is_object()) {
          issues->Add(
              field_path,
              absl::StrCat("must be a pod template (a mapping with metadata and spec), got ",
                           Show(v)));
        }
      } else {
        issues->Add(field_path, UnknownFieldMessage(field, known, known));
      }
    }
    config->replicas[*type] = spec;
  }
}

// spec.elasticPolicy: {minReplicas, maxReplicas}, both required.
void DecodeElasticPolicy(const Json& policy, const std::string& path, JobConfig* config,
                         Issues* issues) {
  if (policy.is_null()) return;
  if (!policy.is_object()) {
    issues->Add(path, absl::StrCat("must be a mapping with minReplicas and maxReplicas, got ",
                                   Show(policy)));
    return;
  }
  const std::vector<std::string> known = {"minReplicas", "maxReplicas"};
  for (const auto& [key, value] : policy.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      issues->Add(JoinYamlPath(path, key), UnknownFieldMessage(key, known, known));
    }
  }
  ElasticPolicy elastic;
  bool ok = true;
  for (const auto& [name, target] : {std::pair{"minReplicas", &elastic.min_replicas},
                                     std::pair{"maxReplicas", &elastic.max_replicas}}) {
    auto it = policy.find(name);
    if (it == policy.end() || it->is_null()) {
      issues->Add(JoinYamlPath(path, name), "required when elasticPolicy is set");
      ok = false;
    } else if (Check(ElasticBoundRule(), *it, JoinYamlPath(path, name), issues)) {
      *target = it->get<int>();
    } else {
      ok = false;
    }
  }
  if (ok) config->elastic_policy = elastic;
}

// DNS-1123 label: what Kubernetes needs for names that become host names.
bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

std::string DnsLabelProblem(const Json& v) {
  return absl::StrCat(
      "must be a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a "
      "letter or digit, at most 63 characters), got ",
      Show(v));
}

// Decodes metadata.name / metadata.namespace into `out`.
void DecodeName(const Json& v, const std::string& path, std::string* out, Issues* issues) {
  if (!v.is_string() || !IsDnsLabel(v.get<std::string>())) {
    issues->Add(path, DnsLabelProblem(v));
    return;
  }
  *out = v.get<std::string>();
}

// spec.training.model of a spec (or of DISTRAIN_JOB_CONFIG's root), if any.
const Json* ModelOf(const Json& spec) {
  auto training = spec.find("training");
  if (training == spec.end() || !training->is_object()) return nullptr;
  auto model = training->find("model");
  return model == training->end() ? nullptr : &*model;
}

// The whole DistributedTrainingJob document.
JobConfig DecodeDocument(const Json& root, Issues* issues) {
  JobConfig config;
  if (root.is_null()) {
    issues->Add("",
                "the document is empty; expected a DistributedTrainingJob with apiVersion, kind, "
                "metadata and spec");
    return config;
  }
  if (!root.is_object()) {
    issues->Add("",
                absl::StrCat(
                    "the document must be a mapping with apiVersion, kind, metadata and spec, got ",
                    Show(root)));
    return config;
  }
  const std::vector<std::string> known = {"apiVersion", "kind", "metadata", "spec", "status"};
  for (const auto& [key, value] : root.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      issues->Add(key, UnknownFieldMessage(key, known, known));
    }
  }
  for (const auto& [field, expected] :
       {std::pair{"apiVersion", kApiVersion}, std::pair{"kind", kKind}}) {
    auto it = root.find(field);
    if (it == root.end() || it->is_null()) {
      issues->Add(field, absl::StrCat("required; add \"", field, ": ", expected, "\""));
    } else if (!it->is_string() || it->get<std::string>() != expected) {
      issues->Add(field, absl::StrCat("must be \"", expected, "\", got ", Show(*it), "; set ",
                                      field, ": ", expected));
    }
  }

  auto metadata = root.find("metadata");
  if (metadata == root.end() || metadata->is_null()) {
    issues->Add("metadata", "required; add metadata: {name: <job name>}");
  } else if (!metadata->is_object()) {
    issues->Add("metadata",
                absl::StrCat("must be a mapping with name (and namespace), got ", Show(*metadata)));
  } else {
    // Other ObjectMeta fields (labels, uid, ...) are the API server's business.
    auto name = metadata->find("name");
    if (name == metadata->end() || name->is_null()) {
      issues->Add("metadata.name",
                  "required; name the job with a DNS-1123 label such as \"mnist\"");
    } else {
      DecodeName(*name, "metadata.name", &config.name, issues);
    }
    if (auto ns = metadata->find("namespace"); ns != metadata->end() && !ns->is_null()) {
      DecodeName(*ns, "metadata.namespace", &config.namespace_, issues);
    }
  }

  auto spec = root.find("spec");
  if (spec == root.end() || spec->is_null()) {
    issues->Add("spec", "required; add spec with strategy, replicaSpecs and training");
    return config;
  }
  if (!spec->is_object()) {
    issues->Add("spec", absl::StrCat("must be a mapping, got ", Show(*spec)));
    return config;
  }
  auto replica_specs = spec->find("replicaSpecs");
  if (replica_specs == spec->end() || replica_specs->is_null()) {
    issues->Add("spec.replicaSpecs",
                "required; add at least replicaSpecs: {Worker: {replicas: 1}}");
  } else {
    DecodeReplicaSpecs(*replica_specs, "spec.replicaSpecs", &config, issues);
  }
  if (auto elastic = spec->find("elasticPolicy"); elastic != spec->end()) {
    DecodeElasticPolicy(*elastic, "spec.elasticPolicy", &config, issues);
  }
  DecodeObject(*spec, "", "spec", {"replicaSpecs", "elasticPolicy"}, &config, issues);
  FinishModel(ModelOf(*spec), "spec.training.model", &config, issues);
  return config;
}

std::string StripJsonExceptionPrefix(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

// Sets root[a][b][c] for the path "a.b.c", creating objects on the way in
// insertion order.
void SetPath(Json* root, const std::string& path, Json value) {
  Json* node = root;
  for (absl::string_view part : absl::StrSplit(path, '.')) node = &(*node)[std::string(part)];
  *node = std::move(value);
}

std::string SpecPath(const std::string& rel) { return absl::StrCat("spec.", rel); }

// The model's rules between fields and against the data. `example_shape`:
// one example's shape when known (synthetic data, or read from the files);
// `num_classes` > 0 when known.
void ValidateModel(const TrainingConfig& t,
                   const std::optional<std::vector<int64_t>>& example_shape, int num_classes,
                   Issues* issues) {
  const ModelConfig& m = t.model;
  const std::string path = "spec.training.model";
  if (m.loss.kind == LossKind::kMeanSquaredError && m.loss.from_logits) {
    issues->Add(path + ".loss.fromLogits",
                "MeanSquaredError takes no fromLogits (Keras' MeanSquaredError has no such "
                "argument); remove it");
  }
  if (m.type == "mlp") {
    if (!m.layers.empty()) {
      issues->Add(path + ".layers",
                  "given with spec.training.model.type: mlp, which builds its layers from "
                  "hiddenUnits; set type: sequential to train the layers");
    }
    if (m.loss.from_logits == false) {
      issues->Add(path + ".loss.fromLogits",
                  "is false, but the mlp shorthand ends in a Dense layer without activation, so "
                  "its outputs are logits; remove fromLogits or set it to true");
    }
    if (m.loss.kind == LossKind::kBinaryCrossentropy) {
      issues->Add(path + ".loss.type",
                  "BinaryCrossentropy needs a model with one output, but the mlp shorthand ends "
                  "in one logit per class; use SparseCategoricalCrossentropy, or layers ending "
                  "in Dense: {units: 1}");
    }
    return;
  }
  if (m.type != "sequential") return;  // the field's own check reports it
  if (m.layers.empty()) {
    issues->Add(path + ".layers",
                "required for spec.training.model.type: sequential; list the layers, e.g. "
                "[{Flatten: {}}, {Dense: {units: 10}}]");
    return;
  }
  // A config built in code meets the YAML's rules, with the YAML's messages:
  // its layers go through the same decoder.
  Issues argument_issues;
  JobConfig scratch;
  Json layers_json = Json::array();
  for (const LayerConfig& layer : m.layers) layers_json.push_back(LayerToJson(layer, false));
  DecodeLayers(layers_json, path + ".layers", &scratch, &argument_issues);
  if (!argument_issues.empty()) {
    issues->Append(argument_issues);
    return;
  }
  const size_t first = m.layers.front().kind == LayerKind::kInput ? 1 : 0;
  if (t.dataset.type == DatasetType::kSynthetic && first < m.layers.size() &&
      m.layers[first].kind == LayerKind::kEmbedding) {
    issues->Add(absl::StrCat(path, ".layers[", first, "]"),
                "(Embedding) looks up integer token ids, but synthetic data are real-valued "
                "features; train it on csv or tfrecord data whose features are the ids");
  }
  const bool scaled_ids = t.dataset.type == DatasetType::kIdx ||
                          (t.dataset.type == DatasetType::kTfRecord &&
                           t.dataset.feature_encoding != FeatureEncoding::kFloatList);
  if (scaled_ids && t.dataset.scale != 1.0f && first < m.layers.size() &&
      m.layers[first].kind == LayerKind::kEmbedding) {
    issues->Add("spec.training.dataset.scale",
                absl::StrCat("is ", t.dataset.scale, ", so the values reach spec.training.model."
                             "layers[", first, "] (Embedding) as fractions, not token ids; set "
                             "scale: 1"));
  }
  std::optional<std::vector<int64_t>> shape = example_shape;
  // Without the data, an Input layer still says what the model expects.
  if (!shape && m.layers.front().kind == LayerKind::kInput) shape = m.layers.front().shape;
  if (!shape) return;
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = InferLayerShapes(m.layers, *shape);
  if (!shapes.ok()) {
    for (absl::string_view line : absl::StrSplit(shapes.status().message(), '\n')) {
      issues->Add("", std::string(line));
    }
    return;
  }
  if (absl::Status s = CheckModelOutput(m.layers, *shape, *shapes, num_classes, m.loss);
      !s.ok()) {
    issues->Add("", std::string(s.message()));
  }
}

// First non-blank line of a text file, at most 1 MiB of it.
absl::StatusOr<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) return line;
    if (in.tellg() > (1 << 20)) break;
  }
  return absl::DataLossError(absl::StrCat(path, ": no data lines"));
}

}  // namespace

// ---------------------------------------------------------------------------

const char* StrategyName(StrategyKind kind) {
  const char* name = ToName(kStrategies, kind);
  return name ? name : "Unknown";
}

const char* PrecisionName(Precision precision) {
  const char* name = ToName(kPrecisions, precision);
  return name ? name : "Unknown";
}

std::optional<Precision> ParsePrecisionName(const std::string& name) {
  return FromName(kPrecisions, name);
}

std::optional<StrategyKind> ParseStrategyName(const std::string& name) {
  return FromName(kStrategies, name);
}

const char* ReplicaTypeName(ReplicaType type) {
  const char* name = ToName(kReplicaTypes, type);
  return name ? name : "Unknown";
}

const char* ReplicaTaskType(ReplicaType type) {
  switch (type) {
    case ReplicaType::kChief:
      return "chief";
    case ReplicaType::kWorker:
      return "worker";
    case ReplicaType::kPS:
      return "ps";
    case ReplicaType::kEvaluator:
      return "evaluator";
  }
  return "unknown";
}

absl::StatusOr<JobConfig> ParseJobYaml(const std::string& yaml_text) {
  absl::StatusOr<YamlJson> yaml = YamlToJson(yaml_text);
  if (!yaml.ok()) return yaml.status();
  Issues issues;
  JobConfig config = DecodeDocument(yaml->value, &issues);
  if (!issues.empty()) return issues.ToStatus(&yaml->locations);
  return config;
}

absl::StatusOr<JobConfig> LoadJobYamlFile(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is a directory; give a job YAML file such as examples/onedevice.yaml"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    std::string message = absl::StrCat(path, ": cannot read the job file: ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<JobConfig> config = ParseJobYaml(buffer.str());
  if (config.ok()) return config;
  std::vector<std::string> lines = absl::StrSplit(config.status().message(), '\n');
  for (std::string& line : lines) line = absl::StrCat(path, ": ", line);
  return absl::Status(config.status().code(), absl::StrJoin(lines, "\n"));
}

std::string JobConfigToJson(const JobConfig& config) {
  Json root = Json::object();
  root["name"] = config.name;
  root["namespace"] = config.namespace_;
  root["strategy"] = StrategyName(config.strategy);
  Json replicas = Json::object();
  Json restart_policies = Json::object();
  for (const auto& [type, spec] : config.replicas) {
    replicas[ReplicaTypeName(type)] = spec.replicas;
    const char* policy = ToName(kRestartPolicies, spec.restart_policy);
    restart_policies[ReplicaTypeName(type)] = policy ? policy : "<invalid>";
  }
  root["replicas"] = std::move(replicas);
  root["restartPolicies"] = std::move(restart_policies);
  for (const FieldSpec& field : SpecFields()) {
    if (std::optional<Json> value = field.get(config))
      SetPath(&root, field.path, std::move(*value));
  }
  if (config.elastic_policy) {
    root["elasticPolicy"] = {{"minReplicas", config.elastic_policy->min_replicas},
                             {"maxReplicas", config.elastic_policy->max_replicas}};
  }
  return root.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<JobConfig> ParseJobConfigJson(const std::string& json_text) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    const auto* parse_error = dynamic_cast<const nlohmann::json::parse_error*>(&e);
    return absl::InvalidArgumentError(
        absl::StrCat("DISTRAIN_JOB_CONFIG: invalid JSON",
                     parse_error ? absl::StrCat(" at byte ", parse_error->byte) : "", ": ",
                     StripJsonExceptionPrefix(e.what())));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DISTRAIN_JOB_CONFIG: must be a JSON object with strategy, replicas and training, got ",
        Show(root)));
  }
  Issues issues;
  JobConfig config;
  if (auto name = root.find("name"); name != root.end() && !name->is_null()) {
    DecodeName(*name, "metadata.name", &config.name, &issues);
  }
  if (auto ns = root.find("namespace"); ns != root.end() && !ns->is_null()) {
    DecodeName(*ns, "metadata.namespace", &config.namespace_, &issues);
  }
  auto replicas = root.find("replicas");
  if (replicas == root.end() || replicas->is_null()) {
    issues.Add("spec.replicaSpecs", "required; DISTRAIN_JOB_CONFIG has no \"replicas\"");
  } else if (!replicas->is_object()) {
    issues.Add("spec.replicaSpecs",
               absl::StrCat("\"replicas\" must map replica type to count, got ", Show(*replicas)));
  } else {
    for (const auto& [key, value] : replicas->items()) {
      const std::string path = absl::StrCat("spec.replicaSpecs.", key);
      std::optional<ReplicaType> type = ReplicaTypeFromKey(key, path, &issues);
      if (type && Check(ReplicasRule(), value, path + ".replicas", &issues)) {
        config.replicas[*type].replicas = value.get<int>();
      }
    }
  }
  if (auto policies = root.find("restartPolicies");
      policies != root.end() && !policies->is_null()) {
    if (!policies->is_object()) {
      issues.Add("spec.replicaSpecs",
                 absl::StrCat("\"restartPolicies\" must map replica type to policy, got ",
                              Show(*policies)));
    } else {
      for (const auto& [key, value] : policies->items()) {
        const std::string path = absl::StrCat("spec.replicaSpecs.", key);
        std::optional<ReplicaType> type = ReplicaTypeFromKey(key, path, &issues);
        if (!type) continue;
        auto spec = config.replicas.find(*type);
        if (spec == config.replicas.end()) {
          issues.Add(path + ".restartPolicy", "has a policy but no replica count in \"replicas\"");
        } else if (Check(RestartPolicyRule(), value, path + ".restartPolicy", &issues)) {
          spec->second.restart_policy = *FromName(kRestartPolicies, value.get<std::string>());
        }
      }
    }
  }
  if (auto elastic = root.find("elasticPolicy"); elastic != root.end()) {
    DecodeElasticPolicy(*elastic, "spec.elasticPolicy", &config, &issues);
  }
  DecodeObject(root, "", "spec",
               {"name", "namespace", "replicas", "restartPolicies", "elasticPolicy"}, &config,
               &issues);
  FinishModel(ModelOf(root), "spec.training.model", &config, &issues);
  if (!issues.empty()) return issues.ToStatus(nullptr);
  return config;
}

absl::StatusOr<std::vector<std::string>> ExpandDatasetFiles(
    const std::vector<std::string>& entries, const std::string& field) {
  std::vector<std::string> files;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& entry = entries[i];
    // Only entries with a wildcard are patterns, so a plain path keeps the
    // loader's own "cannot open" error (with errno) instead of "no match".
    if (entry.find_first_of("*?[") == std::string::npos) {
      files.push_back(entry);
      continue;
    }
    glob_t matches{};
    // glob(3) sorts its matches (LC_COLLATE; C in the worker and in tests):
    // the order FILE sharding and the example order depend on.
    const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &matches);
    std::vector<std::string> found;
    if (rc == 0) {
      for (size_t k = 0; k < matches.gl_pathc; ++k) found.emplace_back(matches.gl_pathv[k]);
    }
    ::globfree(&matches);
    if (rc == GLOB_NOMATCH || (rc == 0 && found.empty())) {
      return absl::NotFoundError(absl::StrCat(
          field, "[", i, "]: the pattern '", entry, "' matches no file",
          entry.front() == '/' ? "" : " (relative patterns are read from the working directory)",
          "; check the path, or list the files by name"));
    }
    if (rc != 0) {
      return absl::PermissionDeniedError(absl::StrCat(field, "[", i, "]: cannot expand '", entry,
                                                      "': a directory on the way is unreadable"));
    }
    // Plain std::sort on top of glob's collation: byte order, the same in
    // every locale, so every process agrees on which file is number i.
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

absl::StatusOr<std::vector<int64_t>> ExampleShapeOf(const DatasetConfig& dataset) {
  std::vector<std::string> train_files;
  if (dataset.type != DatasetType::kSynthetic) {
    absl::StatusOr<std::vector<std::string>> expanded =
        ExpandDatasetFiles(dataset.train_files, "spec.training.dataset.trainFiles");
    if (!expanded.ok()) return expanded.status();
    train_files = *std::move(expanded);
  }
  switch (dataset.type) {
    case DatasetType::kSynthetic:
      return std::vector<int64_t>{dataset.num_features};
    case DatasetType::kTfRecord: {
      if (dataset.feature_shape.empty()) {
        return absl::InvalidArgumentError(
            "spec.training.dataset.featureShape: required for dataset type tfrecord");
      }
      if (train_files.empty()) {
        return absl::InvalidArgumentError("spec.training.dataset.trainFiles: no TFRecord file");
      }
      // The records themselves are the worker's to check (each against
      // featureShape, exit code 4); here only that the data is there.
      std::ifstream in(train_files.front(), std::ios::binary);
      if (!in) {
        return absl::NotFoundError(
            absl::StrCat(train_files.front(), ": cannot open: ", std::strerror(errno)));
      }
      return std::vector<int64_t>(dataset.feature_shape.begin(), dataset.feature_shape.end());
    }
    case DatasetType::kCsv: {
      if (train_files.empty()) {
        return absl::InvalidArgumentError("spec.training.dataset.trainFiles: no CSV file");
      }
      const std::string& path = train_files.front();
      absl::StatusOr<std::string> line = FirstLine(path);
      if (!line.ok()) return line.status();
      const int64_t columns = static_cast<int64_t>(std::count(line->begin(), line->end(), ',')) + 1;
      if (columns < 2 || dataset.label_column >= columns) {
        return absl::DataLossError(
            absl::StrCat(path, ": the first line has ", columns,
                         " columns; expected the features and the label column ",
                         dataset.label_column));
      }
      return std::vector<int64_t>{columns - 1};
    }
    case DatasetType::kIdx: {
      if (train_files.empty()) {
        return absl::InvalidArgumentError("spec.training.dataset.trainFiles: no IDX image file");
      }
      // Only the header: magic 0x00000803 and three big-endian uint32
      // dimensions [n, rows, cols].
      const std::string& path = train_files.front();
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
      }
      unsigned char header[16] = {};
      in.read(reinterpret_cast<char*>(header), sizeof(header));
      if (in.gcount() >= 2 && header[0] == 0x1f && header[1] == 0x8b) {
        return absl::DataLossError(
            absl::StrCat(path, ": is gzip-compressed; gunzip it first"));
      }
      if (in.gcount() != sizeof(header)) {
        return absl::DataLossError(absl::StrCat(path, ": shorter than an IDX header (16 bytes)"));
      }
      if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] != 3) {
        return absl::DataLossError(absl::StrCat(
            path, ": not an IDX image file (magic 0x00000803 for unsigned bytes [n, rows, cols])"));
      }
      auto dim = [&](int i) {
        return (int64_t{header[4 * i]} << 24) | (int64_t{header[4 * i + 1]} << 16) |
               (int64_t{header[4 * i + 2]} << 8) | int64_t{header[4 * i + 3]};
      };
      return std::vector<int64_t>{dim(2), dim(3), 1};
    }
  }
  return absl::InvalidArgumentError("spec.training.dataset.type: unknown");
}

namespace {

// A model that starts with Keras' pixel Rescaling (1/255) on pixels the
// dataset already scaled: each alone is right, together the model sees
// values below 0.004 and trains badly without any error. Said when the
// largest pixel would reach the first non-Rescaling layer below 0.05.
std::optional<std::string> PixelsScaledTwice(const TrainingConfig& t) {
  const DatasetConfig& d = t.dataset;
  const bool scales_pixels =
      d.type == DatasetType::kIdx ||
      (d.type == DatasetType::kTfRecord && d.feature_encoding != FeatureEncoding::kFloatList);
  if (!scales_pixels || d.scale == 1.0f) return std::nullopt;
  double largest = 255.0 * std::abs(d.scale);
  size_t i = 0;
  for (; i < t.model.layers.size(); ++i) {
    const LayerConfig& layer = t.model.layers[i];
    if (layer.kind == LayerKind::kInput) continue;
    if (layer.kind != LayerKind::kRescaling) break;
    largest = std::abs(largest * layer.scale) + std::abs(layer.offset);
  }
  if (i == 0 || t.model.layers[i - 1].kind != LayerKind::kRescaling || largest >= 0.05) {
    return std::nullopt;
  }
  return absl::StrCat("spec.training.model.layers[", i - 1,
                      "] (Rescaling): the pixels are scaled twice, by spec.training.dataset.scale (",
                      d.scale, ") and by the model, so they reach layers[", i, "] as at most ",
                      largest, "; set spec.training.dataset.scale: 1 (a Keras model with "
                      "Rescaling expects raw 0-255 pixels)");
}

}  // namespace

absl::Status ValidateModelWithData(const JobConfig& config, std::vector<std::string>* notes) {
  const TrainingConfig& t = config.training;
  Issues issues;
  std::optional<std::vector<int64_t>> shape;
  int num_classes = 0;
  const bool layers = t.model.type == "sequential" && !t.model.layers.empty();
  if (t.dataset.type == DatasetType::kSynthetic) {
    shape = std::vector<int64_t>{t.dataset.num_features};
    num_classes = t.dataset.num_classes;
  } else if (layers) {
    absl::StatusOr<std::vector<int64_t>> read = ExampleShapeOf(t.dataset);
    if (read.ok()) {
      shape = *read;
    } else if (notes != nullptr) {
      notes->push_back(absl::StrCat(
          "spec.training.model.layers: shape checks against the data skipped: ",
          read.status().message(), " (the worker reports data problems with exit code 4)"));
    }
  }
  ValidateModel(t, shape, num_classes, &issues);
  if (!issues.empty()) return issues.ToStatus(nullptr);
  if (layers && notes != nullptr) {
    for (std::string& warning : ModelWarnings(t.model.layers, t.model.loss)) {
      notes->push_back(std::move(warning));
    }
    if (std::optional<std::string> note = PixelsScaledTwice(t)) notes->push_back(std::move(*note));
  }
  return absl::OkStatus();
}

// What each schedule needs besides the single-field rules (Keras raises the
// same at construction).
void CheckSchedule(const LearningRateScheduleConfig& s, Issues* issues) {
  const std::string path = "spec.training.optimizer.schedule";
  const char* type = ToName(kScheduleTypes, s.type);
  using T = LearningRateScheduleType;
  const bool decays = s.type == T::kExponentialDecay || s.type == T::kInverseTimeDecay ||
                      s.type == T::kPolynomialDecay || s.type == T::kCosineDecay;
  if (decays && s.decay_steps < 1) {
    issues->Add(path + ".decaySteps",
                absl::StrCat("required for ", type, ": the number of steps the decay takes, >= 1"));
  }
  if ((s.type == T::kExponentialDecay || s.type == T::kInverseTimeDecay) && !(s.decay_rate > 0)) {
    issues->Add(path + ".decayRate",
                absl::StrCat("required for ", type, ": a positive number, e.g. 0.96"));
  }
  if (s.type == T::kCosineDecay && s.warmup_steps > 0 && !s.warmup_target) {
    issues->Add(path + ".warmupTarget",
                "required with warmupSteps: the rate the warmup climbs to from learningRate");
  }
  if (s.type == T::kPiecewiseConstantDecay) {
    if (s.values.size() != s.boundaries.size() + 1) {
      issues->Add(path + ".values",
                  absl::StrCat("needs one more entry than boundaries (a rate before the first "
                               "boundary, between each two, and after the last): got ",
                               s.values.size(), " values for ", s.boundaries.size(),
                               " boundaries"));
    }
    for (size_t i = 1; i < s.boundaries.size(); ++i) {
      if (s.boundaries[i] <= s.boundaries[i - 1]) {
        issues->Add(JoinYamlPath(path + ".boundaries", i),
                    absl::StrCat("must be greater than the boundary before it (",
                                 s.boundaries[i - 1], "), got ", s.boundaries[i]));
      }
    }
  }
}

absl::Status ValidateJobConfig(const JobConfig& config) {
  Issues issues;
  if (!IsDnsLabel(config.name)) issues.Add("metadata.name", DnsLabelProblem(Json(config.name)));
  if (!IsDnsLabel(config.namespace_))
    issues.Add("metadata.namespace", DnsLabelProblem(Json(config.namespace_)));

  // Single-field rules, for configs that did not come through a parser.
  for (const FieldSpec& field : SpecFields()) {
    if (field.decode) continue;  // checked below, with the rules between fields
    if (std::optional<Json> value = field.get(config))
      Check(field.rule, *value, SpecPath(field.path), &issues);
  }
  for (const auto& [type, spec] : config.replicas) {
    const std::string path = absl::StrCat("spec.replicaSpecs.", ReplicaTypeName(type));
    Check(ReplicasRule(), Json(spec.replicas), path + ".replicas", &issues);
    if (!ToName(kRestartPolicies, spec.restart_policy)) {
      issues.Add(path + ".restartPolicy",
                 absl::StrCat("must be ", Describe(RestartPolicyRule(), Kind::kString)));
    }
  }

  // Replica counts per strategy.
  const int chiefs = config.replicas_of(ReplicaType::kChief);
  const int workers = config.replicas_of(ReplicaType::kWorker);
  const int ps = config.replicas_of(ReplicaType::kPS);
  const int evaluators = config.replicas_of(ReplicaType::kEvaluator);
  const std::string strategy = StrategyName(config.strategy);
  if (!config.replicas.count(ReplicaType::kWorker)) {
    issues.Add("spec.replicaSpecs.Worker", "required; every strategy needs at least one Worker");
  } else if (workers < 1) {
    issues.Add("spec.replicaSpecs.Worker.replicas",
               absl::StrCat("every strategy needs at least 1 Worker, got ", workers));
  }
  if (chiefs > 1) {
    issues.Add("spec.replicaSpecs.Chief.replicas",
               absl::StrCat("must be 0 or 1, got ", chiefs, "; TensorFlow allows one chief"));
  }
  if (evaluators > 1) {
    issues.Add(
        "spec.replicaSpecs.Evaluator.replicas",
        absl::StrCat("must be 0 or 1, got ", evaluators, "; TensorFlow allows one evaluator"));
  }
  switch (config.strategy) {
    case StrategyKind::kOneDevice:
    case StrategyKind::kMirrored:
    case StrategyKind::kCentralStorage:
      if (workers > 1) {
        issues.Add(
            "spec.replicaSpecs.Worker.replicas",
            absl::StrCat(strategy, " runs in one pod and needs exactly 1 Worker, got ", workers,
                         "; use MultiWorkerMirrored or ParameterServer for several workers"));
      }
      if (chiefs > 0) {
        issues.Add("spec.replicaSpecs.Chief",
                   absl::StrCat(strategy, " takes no Chief, got ", chiefs,
                                "; remove it or use MultiWorkerMirrored"));
      }
      if (ps > 0) {
        issues.Add("spec.replicaSpecs.PS", absl::StrCat(strategy, " takes no PS, got ", ps,
                                                        "; remove it or use ParameterServer"));
      }
      break;
    case StrategyKind::kMultiWorkerMirrored:
      if (ps > 0) {
        issues.Add("spec.replicaSpecs.PS", absl::StrCat("MultiWorkerMirrored takes no PS, got ", ps,
                                                        "; remove it or use ParameterServer"));
      }
      break;
    case StrategyKind::kParameterServer:
      if (ps < 1) {
        issues.Add(
            "spec.replicaSpecs.PS.replicas",
            absl::StrCat("ParameterServer needs at least 1 PS to hold the variables, got ", ps));
      }
      if (chiefs == 0) {
        issues.Add("spec.replicaSpecs.Chief.replicas",
                   "ParameterServer needs exactly 1 Chief (the coordinator), got 0; add Chief: "
                   "{replicas: 1}");
      }
      // Dynamic loss scaling needs every update to see the scale its
      // gradient was computed with; asynchronous pushes from workers with
      // their own scales would mix them.
      if (config.training.model.precision == Precision::kMixedFloat16) {
        issues.Add("spec.training.precision",
                   "mixed_float16 needs dynamic loss scaling, which distrain runs only in the "
                   "synchronous strategies; use mixed_bfloat16 (no loss scaling needed) or a "
                   "synchronous strategy");
      }
      break;
    case StrategyKind::kTPU:
      if (ps > 0)
        issues.Add("spec.replicaSpecs.PS",
                   absl::StrCat("TPU takes no PS, got ", ps, "; remove it"));
      break;
    case StrategyKind::kAuto:
      break;
  }

  // The job's name prefixes its replicas' pod and Service names,
  // <job>-<type>-<index>, and a Service name is a DNS-1035 label: a letter
  // first, at most 63 characters. Caught here, not when the first Service is
  // refused mid-creation. (The CRD's CEL rules say the same.)
  if (IsDnsLabel(config.name)) {
    if (config.name.front() < 'a' || config.name.front() > 'z') {
      issues.Add("metadata.name",
                 absl::StrCat("must start with a letter: it prefixes the job's Service names "
                              "(<job>-<type>-<index>), which are DNS-1035 labels; got \"",
                              config.name, "\""));
    }
    for (const auto& [type, spec] : config.replicas) {
      int count = spec.replicas;
      if (type == ReplicaType::kWorker && config.elastic_policy)
        count = std::max(count, config.elastic_policy->max_replicas);
      if (count < 1) continue;
      const std::string longest =
          absl::StrCat(config.name, "-", ReplicaTaskType(type), "-", count - 1);
      if (longest.size() > 63) {
        issues.Add("metadata.name",
                   absl::StrCat("too long for its replicas' pod and Service names: \"", longest,
                                "\" has ", longest.size(),
                                " characters (at most 63); shorten the name to at most ",
                                63 - (longest.size() - config.name.size()), " characters"));
        break;
      }
    }
  }

  if (config.elastic_policy) {
    const ElasticPolicy& elastic = *config.elastic_policy;
    Check(ElasticBoundRule(), Json(elastic.min_replicas), "spec.elasticPolicy.minReplicas",
          &issues);
    Check(ElasticBoundRule(), Json(elastic.max_replicas), "spec.elasticPolicy.maxReplicas",
          &issues);
    if (config.strategy != StrategyKind::kMultiWorkerMirrored &&
        config.strategy != StrategyKind::kParameterServer) {
      issues.Add("spec.elasticPolicy",
                 absl::StrCat("only MultiWorkerMirrored and ParameterServer jobs can be elastic, "
                              "got strategy ",
                              strategy, "; remove elasticPolicy"));
    }
    if (elastic.min_replicas > elastic.max_replicas) {
      issues.Add("spec.elasticPolicy.minReplicas",
                 absl::StrCat("must be <= maxReplicas, got minReplicas ", elastic.min_replicas,
                              " > maxReplicas ", elastic.max_replicas));
    } else if (workers < elastic.min_replicas || workers > elastic.max_replicas) {
      issues.Add(
          "spec.replicaSpecs.Worker.replicas",
          absl::StrCat("must be within spec.elasticPolicy [minReplicas, maxReplicas] = [",
                       elastic.min_replicas, ", ", elastic.max_replicas, "], got ", workers));
    }
  }

  // The global batch is split evenly across the replicas that step together.
  const TrainingConfig& t = config.training;
  CheckSchedule(t.optimizer.schedule, &issues);
  // keras.saving.load_model refuses any other extension.
  if (!t.export_model.path.empty() && !absl::EndsWith(t.export_model.path, ".keras")) {
    issues.Add("spec.training.export.path",
               absl::StrCat("must end in .keras (Keras 3 loads no other name), got '",
                            t.export_model.path, "'"));
  }
  if (t.global_batch_size >= 1) {
    int64_t in_sync = 0;
    std::string how;
    const int local = t.local_replicas > 0 ? t.local_replicas : 1;
    if (config.strategy == StrategyKind::kMultiWorkerMirrored && workers >= 1) {
      const int chief = chiefs > 0 ? 1 : 0;
      in_sync = static_cast<int64_t>(chief + workers) * local;
      how = absl::StrCat("(", chief, chief == 1 ? " Chief + " : " Chiefs + ", workers,
                         workers == 1 ? " Worker) x " : " Workers) x ", local,
                         local == 1 ? " local replica" : " local replicas");
    } else if ((config.strategy == StrategyKind::kMirrored ||
                config.strategy == StrategyKind::kCentralStorage) &&
               t.local_replicas > 0) {
      in_sync = t.local_replicas;
      how = "spec.training.localReplicas";
    }
    if (in_sync > 1 && t.global_batch_size % in_sync != 0) {
      const int64_t lower = t.global_batch_size / in_sync * in_sync;
      issues.Add(
          "spec.training.globalBatchSize",
          absl::StrCat(t.global_batch_size, " is not divisible by the ", in_sync,
                       " replicas in sync (", how, "); use a multiple of ", in_sync, " such as ",
                       lower > 0 ? absl::StrCat(lower, " or ") : "", lower + in_sync));
    }
  }

  // The model: what needs no file (synthetic data, tfrecord's declared
  // featureShape, or an Input layer).
  {
    const bool synthetic = t.dataset.type == DatasetType::kSynthetic;
    std::optional<std::vector<int64_t>> shape;
    if (synthetic) shape = std::vector<int64_t>{t.dataset.num_features};
    if (t.dataset.type == DatasetType::kTfRecord && !t.dataset.feature_shape.empty()) {
      shape = std::vector<int64_t>(t.dataset.feature_shape.begin(), t.dataset.feature_shape.end());
    }
    ValidateModel(t, shape, synthetic ? t.dataset.num_classes : 0, &issues);
  }

  // Files per dataset type.
  const DatasetConfig& d = t.dataset;
  // The job's checkpoint storage (operator/controller/checkpoint_volume.h).
  const CheckpointConfig& ckpt = config.training.checkpoint;
  if (!ckpt.volume.is_null()) CheckCheckpointVolume(ckpt.volume, "spec.training.checkpoint.volume", &issues);
  if (!ckpt.storage.size.empty() && !IsStorageQuantity(ckpt.storage.size)) {
    issues.Add("spec.training.checkpoint.storage.size",
               absl::StrCat("must be a Kubernetes storage quantity such as 10Gi or 500Mi, got \"",
                            ckpt.storage.size, "\""));
  }
  if (!ckpt.volume.is_null() && ckpt.storage != CheckpointStorageConfig{}) {
    issues.Add("spec.training.checkpoint.storage",
               "describes the PersistentVolumeClaim the operator provisions, but "
               "spec.training.checkpoint.volume names the job's own storage: remove one of them");
  }

  const std::string ds = "spec.training.dataset.";
  switch (d.type) {
    case DatasetType::kIdx:
      if (d.train_files.empty()) {
        issues.Add(ds + "trainFiles", "required for dataset type idx; list the IDX image files");
      }
      if (d.train_label_files.empty()) {
        issues.Add(ds + "trainLabelFiles",
                   "required for dataset type idx; list the IDX label files");
      }
      if (!d.train_files.empty() && !d.train_label_files.empty() &&
          d.train_files.size() != d.train_label_files.size()) {
        issues.Add(ds + "trainLabelFiles",
                   absl::StrCat("has ", d.train_label_files.size(), " files but trainFiles has ",
                                d.train_files.size(), "; give one label file per image file"));
      }
      if (d.eval_files.size() != d.eval_label_files.size()) {
        issues.Add(ds + "evalLabelFiles",
                   absl::StrCat("has ", d.eval_label_files.size(), " files but evalFiles has ",
                                d.eval_files.size(), "; give one label file per image file"));
      }
      break;
    case DatasetType::kCsv:
      if (d.train_files.empty())
        issues.Add(ds + "trainFiles", "required for dataset type csv; list the CSV files");
      if (!d.train_label_files.empty() || !d.eval_label_files.empty()) {
        issues.Add(ds + (d.train_label_files.empty() ? "evalLabelFiles" : "trainLabelFiles"),
                   "csv files carry their labels in labelColumn; remove the label files");
      }
      break;
    case DatasetType::kTfRecord:
      if (d.train_files.empty()) {
        issues.Add(ds + "trainFiles",
                   "required for dataset type tfrecord; list the TFRecord files or patterns "
                   "such as data/train-*.tfrecord.gz");
      }
      if (!d.train_label_files.empty() || !d.eval_label_files.empty()) {
        issues.Add(ds + (d.train_label_files.empty() ? "evalLabelFiles" : "trainLabelFiles"),
                   "tfrecord examples carry their labels in the labelKey feature; remove the "
                   "label files");
      }
      if (d.feature_shape.empty()) {
        issues.Add(ds + "featureShape",
                   absl::StrCat("required for dataset type tfrecord: the shape of one example's '",
                                d.feature_key,
                                "' feature, e.g. [28, 28, 1] for MNIST images (NHWC without the "
                                "batch) or [784] for flat vectors"));
      }
      if (d.feature_key.empty()) {
        issues.Add(ds + "featureKey",
                   "is empty; name the tf.train.Example feature that holds the input, e.g. image");
      }
      if (d.label_key.empty()) {
        issues.Add(ds + "labelKey",
                   "is empty; name the tf.train.Example feature that holds the label, e.g. label");
      }
      if (!d.feature_key.empty() && d.feature_key == d.label_key) {
        issues.Add(ds + "labelKey",
                   absl::StrCat("is the same feature as featureKey ('", d.label_key,
                                "'); the input and the label must be different features"));
      }
      break;
    case DatasetType::kSynthetic:
      if (!d.train_files.empty() || !d.train_label_files.empty() || !d.eval_files.empty() ||
          !d.eval_label_files.empty()) {
        issues.Add(ds + "type",
                   "synthetic reads no files; remove the file lists or set type to idx, csv or "
                   "tfrecord");
      }
      break;
  }
  if (d.type != DatasetType::kTfRecord && !d.feature_shape.empty()) {
    issues.Add(ds + "featureShape",
               absl::StrCat("is for dataset type tfrecord only; ", ToName(kDatasetTypes, d.type),
                            " data has its own shape (the IDX header, the CSV columns, "
                            "numFeatures): remove it"));
  }

  if (issues.empty()) return absl::OkStatus();
  return issues.ToStatus(nullptr);
}

bool IsStorageQuantity(const std::string& s) {
  static const std::regex kQuantity("^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$");
  return std::regex_match(s, kQuantity);
}

const std::vector<std::string>& CheckpointVolumeSourceKinds() {
  static const std::vector<std::string>* const kKinds = new std::vector<std::string>{
      "persistentVolumeClaim", "ephemeral",      "emptyDir",     "hostPath",
      "nfs",                   "csi",            "awsElasticBlockStore", "azureDisk",
      "azureFile",             "cephfs",         "cinder",       "fc",
      "flexVolume",            "flocker",        "gcePersistentDisk",    "glusterfs",
      "iscsi",                 "photonPersistentDisk", "portworxVolume", "quobyte",
      "rbd",                   "scaleIO",        "storageos",    "vsphereVolume"};
  return *kKinds;
}

const std::vector<JobSpecField>& JobSpecFields() {
  static const std::vector<JobSpecField>* const kFields = [] {
    auto* fields = new std::vector<JobSpecField>;
    auto add = [fields](const std::string& path, const Rule& rule,
                        std::optional<Json> default_value) {
      JobSpecField f;
      f.path = SpecPath(path);
      f.type = KindName(rule.kind);
      if (rule.kind == Kind::kArray) f.item_type = KindName(rule.item_kind);
      f.enum_values = rule.enum_values;
      f.minimum = rule.min;
      f.maximum = rule.max;
      f.exclusive_minimum = rule.exclusive_min;
      f.exclusive_maximum = rule.exclusive_max;
      if (default_value) f.default_json = default_value->dump();
      fields->push_back(std::move(f));
    };
    const JobConfig defaults;
    const ReplicaSpec replica_defaults;
    for (const FieldSpec& field : SpecFields()) {
      add(field.path, field.rule,
          field.derived_default ? std::nullopt : field.get(defaults));
      if (field.path == "strategy") {
        add("replicaSpecs.*.replicas", ReplicasRule(), Json(replica_defaults.replicas));
        add("replicaSpecs.*.restartPolicy", RestartPolicyRule(),
            Json(ToName(kRestartPolicies, replica_defaults.restart_policy)));
      }
      if (field.path == "runPolicy.scheduling.schedulerName") {
        add("elasticPolicy.minReplicas", ElasticBoundRule(), std::nullopt);
        add("elasticPolicy.maxReplicas", ElasticBoundRule(), std::nullopt);
      }
    }
    return fields;
  }();
  return *kFields;
}

float LearningRateAt(const LearningRateScheduleConfig& s, float initial, int64_t step) {
  // Keras computes in the initial rate's dtype, float32, op by op.
  const float t = static_cast<float>(step);
  const float decay_steps = static_cast<float>(s.decay_steps);
  switch (s.type) {
    case LearningRateScheduleType::kConstant:
      return initial;
    case LearningRateScheduleType::kExponentialDecay: {
      float p = t / decay_steps;
      if (s.staircase) p = std::floor(p);
      return initial * std::pow(s.decay_rate, p);
    }
    case LearningRateScheduleType::kInverseTimeDecay: {
      float p = t / decay_steps;
      if (s.staircase) p = std::floor(p);
      return initial / (1.0f + s.decay_rate * p);
    }
    case LearningRateScheduleType::kPolynomialDecay: {
      float steps = decay_steps;
      float at = t;
      if (s.cycle) {
        steps *= t == 0.0f ? 1.0f : std::ceil(t / decay_steps);
      } else {
        at = std::min(at, decay_steps);
      }
      const float p = at / steps;
      return (initial - s.end_learning_rate) * std::pow(1.0f - p, s.power) + s.end_learning_rate;
    }
    case LearningRateScheduleType::kPiecewiseConstantDecay: {
      // values[i] for boundaries[i - 1] < step <= boundaries[i].
      size_t i = 0;
      while (i < s.boundaries.size() && step > s.boundaries[i]) ++i;
      return i < s.values.size() ? s.values[i] : initial;
    }
    case LearningRateScheduleType::kCosineDecay: {
      auto decay = [&](float at, float from) {
        const float fraction = at / decay_steps;
        const float cosine = 0.5f * (1.0f + std::cos(static_cast<float>(M_PI) * fraction));
        return from * ((1.0f - s.alpha) * cosine + s.alpha);
      };
      if (!s.warmup_target) return decay(std::min(t, decay_steps), initial);
      const float warmup_steps = static_cast<float>(s.warmup_steps);
      const float at = std::min(t, decay_steps + warmup_steps);
      if (at < warmup_steps) {
        return (*s.warmup_target - initial) * (at / warmup_steps) + initial;
      }
      return decay(at - warmup_steps, *s.warmup_target);
    }
  }
  return initial;
}

}  // namespace distrain

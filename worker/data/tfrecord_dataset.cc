// TFRecord files of tf.train.Example records, the format TensorFlow users'
// data is in (tf.io.TFRecordWriter + tf.train.Example). Every record of the
// file is read through TfRecordReader (framing and both CRCs checked,
// GZIP/ZLIB inflated first) and parsed as an Example (proto/distrain/v1/
// tf_example.proto, wire-compatible with TensorFlow's). Two features are
// picked by name: the input (featureKey, decoded per featureEncoding into
// prod(featureShape) floats) and the label (labelKey, an int64_list with one
// value). Every problem is an error naming the record's index, the file and
// the byte offset, the feature and the YAML field that fixes it; nothing a
// file holds can crash the loader.

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distrain/v1/tf_example.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/tfrecord.h"

namespace distrain {
namespace {

constexpr char kField[] = "spec.training.dataset.";

const char* EncodingName(FeatureEncoding e) {
  switch (e) {
    case FeatureEncoding::kUint8Bytes:
      return "uint8Bytes";
    case FeatureEncoding::kFloatList:
      return "floatList";
    case FeatureEncoding::kInt64List:
      return "int64List";
  }
  return "?";
}

// What a Feature holds, as TensorFlow names the list types.
const char* KindName(const v1::TfFeature& f) {
  switch (f.kind_case()) {
    case v1::TfFeature::kBytesList:
      return "a bytes_list";
    case v1::TfFeature::kFloatList:
      return "a float_list";
    case v1::TfFeature::kInt64List:
      return "an int64_list";
    case v1::TfFeature::KIND_NOT_SET:
      return "an empty feature (no list set)";
  }
  return "?";
}

// The encoding that reads a feature of f's kind, for "set featureEncoding: X".
const char* EncodingFor(const v1::TfFeature& f) {
  switch (f.kind_case()) {
    case v1::TfFeature::kBytesList:
      return "uint8Bytes";
    case v1::TfFeature::kFloatList:
      return "floatList";
    case v1::TfFeature::kInt64List:
      return "int64List";
    case v1::TfFeature::KIND_NOT_SET:
      break;
  }
  return nullptr;
}

// A hint when raw pixels were expected but the bytes are an encoded image
// (tf.io.encode_png / encode_jpeg output, a common way to store images).
std::string EncodedImageHint(const std::string& bytes) {
  const auto starts = [&bytes](std::string_view magic) {
    return bytes.size() >= magic.size() && bytes.compare(0, magic.size(), magic) == 0;
  };
  const char* format = nullptr;
  if (starts("\x89PNG")) format = "PNG";
  if (starts("\xff\xd8\xff")) format = "JPEG";
  if (format == nullptr) return "";
  return absl::StrCat("; the bytes are a ", format,
                      "-encoded image, but uint8Bytes reads raw pixels: write "
                      "image.astype(numpy.uint8).tobytes() (or tf.io.decode_image(...).numpy()"
                      ".tobytes()) instead");
}

std::string ShapeText(const std::vector<int>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Decodes one record into `features` (appending num_features floats) and
// `label`; `where` prefixes every error ("record 3 (file 'x' at byte offset 812)").
absl::Status DecodeExample(const v1::TfExample& example, const DatasetConfig& config,
                           int64_t num_features, const std::array<float, 256>& byte_lut,
                           const std::string& where, std::vector<float>* features,
                           int64_t* label) {
  const auto& map = example.features().feature();
  const auto find = [&](const std::string& key, const char* field,
                        const char* what) -> absl::StatusOr<const v1::TfFeature*> {
    auto it = map.find(key);
    if (it != map.end()) return &it->second;
    std::vector<std::string> keys;
    for (const auto& [k, unused] : map) keys.push_back(absl::StrCat("'", k, "'"));
    std::sort(keys.begin(), keys.end());
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": has no feature '", key, "' (", kField, field, ", the ", what, "); ",
        keys.empty() ? "the record has no features at all"
                     : absl::StrCat("its features are ", absl::StrJoin(keys, ", "), "; set ",
                                    kField, field, " to the one that holds the ", what)));
  };

  absl::StatusOr<const v1::TfFeature*> input = find(config.feature_key, "featureKey", "input");
  if (!input.ok()) return input.status();
  const v1::TfFeature& f = **input;
  const std::string feature = absl::StrCat("feature '", config.feature_key, "'");
  const std::string needs = absl::StrCat(kField, "featureShape ", ShapeText(config.feature_shape),
                                         " needs ", num_features);
  const auto wrong_kind = [&](const char* wanted) {
    const char* fix = EncodingFor(f);
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", feature, " is ", KindName(f), ", but ", kField, "featureEncoding ",
        EncodingName(config.feature_encoding), " reads ", wanted,
        fix != nullptr ? absl::StrCat("; set featureEncoding: ", fix) : std::string()));
  };
  const size_t base = features->size();
  switch (config.feature_encoding) {
    case FeatureEncoding::kUint8Bytes: {
      if (f.kind_case() != v1::TfFeature::kBytesList) return wrong_kind("a bytes_list");
      const auto& values = f.bytes_list().value();
      if (values.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", feature, " has ", values.size(),
            " bytes values; uint8Bytes reads exactly one value of raw pixels (numpy's tobytes() "
            "of the whole image)"));
      }
      const std::string& bytes = values.Get(0);
      if (static_cast<int64_t>(bytes.size()) != num_features) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", feature, " has ", bytes.size(),
                                                       " bytes, ", needs, EncodedImageHint(bytes)));
      }
      features->resize(base + num_features);
      float* out = features->data() + base;
      for (int64_t i = 0; i < num_features; ++i) out[i] = byte_lut[static_cast<uint8_t>(bytes[i])];
      break;
    }
    case FeatureEncoding::kFloatList: {
      if (f.kind_case() != v1::TfFeature::kFloatList) return wrong_kind("a float_list");
      const auto& values = f.float_list().value();
      if (values.size() != num_features) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", feature, " has ", values.size(), " floats, ", needs));
      }
      features->insert(features->end(), values.begin(), values.end());
      break;
    }
    case FeatureEncoding::kInt64List: {
      if (f.kind_case() != v1::TfFeature::kInt64List) return wrong_kind("an int64_list");
      const auto& values = f.int64_list().value();
      if (values.size() != num_features) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", feature, " has ", values.size(), " int64 values, ", needs));
      }
      features->resize(base + num_features);
      float* out = features->data() + base;
      for (int64_t i = 0; i < num_features; ++i) {
        out[i] = static_cast<float>(values.Get(i)) * config.scale;
      }
      break;
    }
  }

  absl::StatusOr<const v1::TfFeature*> label_feature =
      find(config.label_key, "labelKey", "label");
  if (!label_feature.ok()) return label_feature.status();
  const v1::TfFeature& l = **label_feature;
  const std::string label_name = absl::StrCat("label feature '", config.label_key, "'");
  if (l.kind_case() != v1::TfFeature::kInt64List) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", label_name, " is ", KindName(l),
                     ", but labels are class indices in an int64_list (tf.train.Int64List); "
                     "check ",
                     kField, "labelKey"));
  }
  if (l.int64_list().value_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", label_name, " has ", l.int64_list().value_size(),
        " values; a label is one class index (one-hot or multi-label lists are not supported)"));
  }
  *label = l.int64_list().value(0);
  if (*label < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", label_name, " is ", *label,
        "; labels are class indices 0..numClasses-1 (SparseCategoricalCrossentropy's)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadTfRecordDataset(const std::string& path,
                                                             const DatasetConfig& config,
                                                             int num_classes) {
  if (config.feature_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, "featureShape: required for dataset type tfrecord: the shape of one example's '",
        config.feature_key, "' feature, e.g. [28, 28, 1]"));
  }
  int64_t num_features = 1;
  for (int d : config.feature_shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat(kField, "featureShape ",
                                                     ShapeText(config.feature_shape),
                                                     ": every dimension must be at least 1"));
    }
    num_features *= d;
    if (num_features > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(kField, "featureShape ",
                                                     ShapeText(config.feature_shape),
                                                     ": more values per example than supported"));
    }
  }

  TfRecordCompression compression = TfRecordCompression::kNone;
  if (config.compression == DataCompression::kGzip) compression = TfRecordCompression::kGzip;
  if (config.compression == DataCompression::kZlib) compression = TfRecordCompression::kZlib;
  if (compression == TfRecordCompression::kNone) {
    // A GZIP file read as plain fails the first length CRC; say what it is.
    std::ifstream probe(path, std::ios::binary);
    char magic[2] = {};
    if (probe.read(magic, 2) && static_cast<uint8_t>(magic[0]) == 0x1f &&
        static_cast<uint8_t>(magic[1]) == 0x8b) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file '", path, "' is GZIP-compressed (bytes 1f 8b at byte offset 0) but ", kField,
          "compression is NONE; set compression: GZIP"));
    }
  }
  absl::StatusOr<TfRecordReader> reader = TfRecordReader::Open(path, compression);
  if (!reader.ok()) return reader.status();

  std::array<float, 256> byte_lut;
  for (int v = 0; v < 256; ++v) byte_lut[v] = static_cast<float>(v) * config.scale;

  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t max_label = 0;
  v1::TfExample example;
  std::string_view record;
  for (int64_t index = 0;; ++index) {
    absl::StatusOr<bool> more = reader->Next(&record);
    if (!more.ok()) {
      return absl::Status(more.status().code(),
                          absl::StrCat("record ", index, ": ", more.status().message()));
    }
    if (!*more) break;
    const std::string where =
        absl::StrCat("record ", index, " (", reader->Where(reader->record_offset()), ")");
    if (record.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
        !example.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": is not a tf.train.Example (", record.size(),
          " bytes that do not parse as one); dataset type tfrecord reads records written with "
          "tf.train.Example(...).SerializeToString()"));
    }
    int64_t label = 0;
    if (absl::Status s =
            DecodeExample(example, config, num_features, byte_lut, where, &features, &label);
        !s.ok()) {
      return s;
    }
    if (num_classes > 0 && label >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": label feature '", config.label_key, "' is ", label, ", not below ", kField,
          "numClasses ", num_classes, "; set numClasses to at least ", label + 1));
    }
    if (label > std::numeric_limits<int32_t>::max() - 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": label feature '", config.label_key,
                                                     "' is ", label, ", too large a class index"));
    }
    max_label = std::max(max_label, label);
    labels.push_back(static_cast<int32_t>(label));
  }
  if (labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file '", path, "' holds no records; remove it from the file list (an empty shard would "
        "leave an input pipeline without examples)"));
  }
  const int classes = num_classes > 0 ? num_classes : std::max<int>(2, max_label + 1);
  std::vector<int64_t> shape(config.feature_shape.begin(), config.feature_shape.end());
  return std::make_unique<InMemoryDataset>(path, static_cast<int>(num_features), classes,
                                           std::move(features), std::move(labels),
                                           std::move(shape));
}

}  // namespace distrain

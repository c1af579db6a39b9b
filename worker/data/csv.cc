// CSV datasets: one example per line, comma-separated numeric columns, one of
// which (label_column, 0-based) is the integer class; the rest, in order, are
// the features. Blank lines are skipped; "\r\n" line ends are accepted.
// Errors are "<file>:<line>: column <c>: ..." with 1-based line and column,
// the way editors count.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace distrain {
namespace {

bool ParseFloat(absl::string_view text, double* out) {
  if (text.empty()) return false;
  const char* begin = text.data();
  if (*begin == '+') ++begin;  // from_chars rejects a leading '+'
  auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size() && std::isfinite(*out);
}

// Splits `line` on commas into `fields` (views into `line`), trimming spaces.
void SplitFields(absl::string_view line, std::vector<absl::string_view>* fields) {
  fields->clear();
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    const size_t end = comma == absl::string_view::npos ? line.size() : comma;
    fields->push_back(absl::StripAsciiWhitespace(line.substr(start, end - start)));
    if (comma == absl::string_view::npos) break;
    start = comma + 1;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadCsvDataset(const std::string& path, int label_column,
                                                        bool header, int num_classes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  const std::string text = buffer.str();
  if (text.size() >= 2 && static_cast<uint8_t>(text[0]) == 0x1f &&
      static_cast<uint8_t>(text[1]) == 0x8b) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is gzip-compressed; decompress it first (gunzip ", path, ")"));
  }
  if (label_column < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": labelColumn must be a 0-based column index, got ", label_column));
  }

  std::vector<float> features;
  std::vector<int32_t> labels;
  std::vector<absl::string_view> fields;
  size_t num_columns = 0;  // set by the header or the first data line
  int64_t max_label = -1;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    absl::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    SplitFields(line, &fields);

    const std::string where = absl::StrCat(path, ":", line_no);
    if (num_columns == 0) {
      num_columns = fields.size();
      if (num_columns < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         ": found 1 column; a CSV dataset needs the label column and at least one "
                         "feature column"));
      }
      if (static_cast<size_t>(label_column) >= num_columns) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": labelColumn ", label_column, " is out of range; the file has ",
                         num_columns, " columns (0-based indexes 0..", num_columns - 1, ")"));
      }
      if (header) continue;
    } else if (fields.size() != num_columns) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": found ", fields.size(), " columns, expected ", num_columns,
                       " like the ", header ? "header" : "first line"));
    }

    for (size_t c = 0; c < fields.size(); ++c) {
      double value;
      if (c == static_cast<size_t>(label_column)) {
        if (!ParseFloat(fields[c], &value) || value != std::floor(value) || value < 0 ||
            value > std::numeric_limits<int32_t>::max()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": column ", c + 1, ": label \"", fields[c],
                           "\" is not a non-negative integer class id"));
        }
        if (num_classes > 0 && value >= num_classes) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": column ", c + 1, ": label ",
                                                         fields[c], " is not below numClasses ",
                                                         num_classes));
        }
        labels.push_back(static_cast<int32_t>(value));
        max_label = std::max<int64_t>(max_label, labels.back());
      } else {
        if (!ParseFloat(fields[c], &value)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": column ", c + 1, ": \"",
                                                         fields[c], "\" is not a finite number"));
        }
        features.push_back(static_cast<float>(value));
      }
    }
  }
  if (labels.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": has no data rows"));
  const int classes =
      num_classes > 0 ? num_classes : static_cast<int>(std::max<int64_t>(2, max_label + 1));
  return std::make_unique<InMemoryDataset>(path, static_cast<int>(num_columns - 1), classes,
                                           std::move(features), std::move(labels));
}

}  // namespace distrain

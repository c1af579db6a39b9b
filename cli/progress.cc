#include "cli/progress.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace distrain {

absl::StatusOr<Progress> ParseProgress(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("status file: not a JSON object");
  }
  Progress p;
  try {
    p.state = j.value("state", "");
    p.step = j.value("step", int64_t{0});
    p.total_steps = j.value("totalSteps", int64_t{0});
    p.loss = j.value("loss", 0.0);
    p.examples_per_second = j.value("examplesPerSecond", 0.0);
    p.wall_seconds = j.value("wallSeconds", 0.0);
    p.message = j.value("message", "");
    if (j.contains("evalAccuracy")) p.eval_accuracy = j["evalAccuracy"].get<double>();
    if (j.contains("evalLoss")) p.eval_loss = j["evalLoss"].get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("status file: %s", e.what()));
  }
  return p;
}

std::optional<Progress> ReadProgressFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  auto p = ParseProgress(buf.str());
  if (!p.ok()) return std::nullopt;
  return *p;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

namespace {
std::string Eta(const Progress& p) {
  if (p.step <= 0 || p.total_steps <= p.step || p.wall_seconds <= 0) return "";
  double per_step = p.wall_seconds / p.step;
  return "ETA " + FormatDuration(per_step * (p.total_steps - p.step));
}
}  // namespace

std::string RenderProgressBar(const Progress& p, int width) {
  const double frac =
      p.total_steps > 0 ? std::clamp(static_cast<double>(p.step) / p.total_steps, 0.0, 1.0) : 0.0;
  std::string stats = absl::StrFormat(" %d/%d %3d%% loss %.4f %6.0f ex/s %s", p.step, p.total_steps,
                                      static_cast<int>(frac * 100), p.loss, p.examples_per_second,
                                      Eta(p));
  int bar_width = std::clamp(width - static_cast<int>(stats.size()) - 2, 0, 40);
  std::string bar;
  if (bar_width >= 5) {
    int filled = static_cast<int>(frac * bar_width);
    // StrCat, not operator+: GCC 12 -Wrestrict misreads "literal" + std::string.
    bar = absl::StrCat("[", std::string(filled, '#'), std::string(bar_width - filled, '.'), "]");
  }
  std::string line = bar + stats;
  if (static_cast<int>(line.size()) > width) line.resize(std::max(width, 0));
  return line;
}

std::string RenderProgressLine(const Progress& p) {
  return absl::StrFormat("progress: step %d/%d loss %.4f examples/s %.0f %s", p.step, p.total_steps,
                         p.loss, p.examples_per_second, Eta(p));
}

}  // namespace distrain

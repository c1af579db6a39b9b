#ifndef DISTRAIN_COMMON_LOGGING_H_
#define DISTRAIN_COMMON_LOGGING_H_

#include <string>

#include "absl/strings/string_view.h"
#include "spdlog/fmt/fmt.h"

// Debian's abseil defines absl::string_view as its own class (not an alias of
// std::string_view), which fmt cannot print; absl::Status::message() returns
// one. Include this header to log it directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

namespace distrain {

// Configures spdlog's default logger for a distrain process: stderr, one line
// per record "2026-11-22T05:09:33.123Z info  message". `level` is one of
// trace, debug, info, warn, error (DISTRAIN_LOG_LEVEL overrides it).
// Call once at start-up, before other threads log.
void InitLogging(const std::string& level = "info");

}  // namespace distrain

#endif  // DISTRAIN_COMMON_LOGGING_H_

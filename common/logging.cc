#include "common/logging.h"

#include <cstdlib>

#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace distrain {

void InitLogging(const std::string& level) {
  std::string effective = level;
  if (const char* env = std::getenv("DISTRAIN_LOG_LEVEL"); env != nullptr && *env != '\0') {
    effective = env;
  }
  // Unbuffered stderr: `distrain run` and kubelet interleave lines from many
  // processes and must see each line as soon as it is written.
  auto logger = spdlog::stderr_logger_mt("distrain");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %-5l %v", spdlog::pattern_time_type::utc);
  spdlog::set_level(spdlog::level::from_str(effective));
  spdlog::flush_on(spdlog::level::trace);
}

}  // namespace distrain

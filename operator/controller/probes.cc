#include "operator/controller/probes.h"

#include <string>
#include <vector>

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

// "registry:5000/distrain/worker:v1" -> "registry:5000/distrain/worker";
// a digest ("@sha256:...") goes too.
std::string Repository(std::string image) {
  if (const size_t at = image.find('@'); at != std::string::npos) image.resize(at);
  const size_t slash = image.rfind('/');
  const size_t colon = image.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    image.resize(colon);
  }
  return image;
}

Json HealthGet(int port, int failure_threshold) {
  return {{"httpGet", {{"path", kHealthPath}, {"port", port}, {"scheme", "HTTP"}}},
          {"periodSeconds", 10},
          {"timeoutSeconds", 5},
          {"successThreshold", 1},
          {"failureThreshold", failure_threshold}};
}

}  // namespace

bool RunsDistrainWorker(const Json& container, const ControllerOptions& options) {
  if (!container.is_object()) return false;
  const Json& command = container.value("command", Json());
  if (command.is_array() && !command.empty()) {
    if (!command[0].is_string()) return false;
    const std::string first = command[0].get<std::string>();
    const size_t slash = first.rfind('/');
    return (slash == std::string::npos ? first : first.substr(slash + 1)) == "distrain-worker";
  }
  const Json& image = container.value("image", Json());
  if (!image.is_string()) return false;
  const std::string repository = Repository(image.get<std::string>());
  return repository == Repository(options.default_image) ||
         repository == Repository(options.default_gpu_image);
}

void AddHealthProbes(Json* main, int metrics_port, const ControllerOptions& options) {
  if (!RunsDistrainWorker(*main, options)) return;
  // Each kind only when the template has none (its own win).
  if (!main->contains("startupProbe")) (*main)["startupProbe"] = HealthGet(metrics_port, 30);
  if (!main->contains("livenessProbe")) (*main)["livenessProbe"] = HealthGet(metrics_port, 3);
  if (!main->contains("readinessProbe")) (*main)["readinessProbe"] = HealthGet(metrics_port, 3);
}

}  // namespace distrain::controller

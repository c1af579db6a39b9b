#include "operator/controller/final_progress.h"

#include <cmath>

#include "operator/api/distributed_training_job.h"
#include "operator/controller/observed.h"
#include "operator/controller/pods.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

// The string at `pointer` in `j`, or "".
std::string StringAt(const Json& j, const char* pointer) {
  const Json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
}

}  // namespace

std::string TerminationMessagePath(const Json& main_container) {
  const Json& path = main_container.value("terminationMessagePath", Json());
  return path.is_string() && !path.get<std::string>().empty() ? path.get<std::string>()
                                                              : kDefaultTerminationMessagePath;
}

std::optional<Json> FinalFiguresOf(const Json& pod) {
  const Json* status = MainContainerStatus(pod);
  if (status == nullptr) return std::nullopt;
  const std::string message = StringAt(*status, "/state/terminated/message");
  if (message.empty()) return std::nullopt;
  const Json parsed = Json::parse(message, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  Json figures = Json::object();
  // Counts as integers within int64; a page of a tenant's process can say
  // anything, so values that do not fit are dropped, like non-numbers.
  for (const char* key : {"step", "totalSteps"}) {
    const Json& v = parsed.value(key, Json());
    if (v.is_number_integer()) {
      figures[key] = v.get<int64_t>();
    }
  }
  for (const char* key : {"loss", "accuracy", "examplesPerSecond"}) {
    const Json& v = parsed.value(key, Json());
    if (v.is_number() && std::isfinite(v.get<double>())) figures[key] = v.get<double>();
  }
  if (figures.empty()) return std::nullopt;
  return figures;
}

Json FinalProgress(const Json& current, const std::vector<ObjectRef>& pods, int64_t total_steps) {
  Json progress = current.is_object() ? current : Json::object();
  std::optional<int64_t> master_total;  // the master's own count wins over the spec's
  for (const ObjectRef& pod : pods) {
    const Json& labels = pod->value("metadata", Json::object()).value("labels", Json::object());
    if (!labels.is_object() || labels.value(api::kLabelJobRole, "") != "master") continue;
    if (EffectivePhase(*pod) != "Succeeded") continue;
    if (std::optional<Json> figures = FinalFiguresOf(*pod)) {
      for (const auto& [key, value] : figures->items()) progress[key] = value;
      if (figures->contains("totalSteps")) master_total = (*figures)["totalSteps"].get<int64_t>();
    }
  }
  // A user's image may count its steps its own way (epochs x steps per epoch):
  // what it says it ran is the total, not spec.training.steps.
  if (master_total && *master_total > 0) total_steps = *master_total;
  // A job succeeds only once its master ran every step (success.h), so the
  // step is known even without a message.
  if (!progress.contains("step") || !progress["step"].is_number_integer() ||
      progress["step"].get<int64_t>() < total_steps) {
    progress["step"] = total_steps;
  }
  progress["totalSteps"] = total_steps;
  return progress;
}

}  // namespace distrain::controller

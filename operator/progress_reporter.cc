#include "operator/progress_reporter.h"

// cpprestsdk's U() macro collides with fmt (spdlog).
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <cmath>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/paths.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

std::string Str(const Json& j, const char* pointer) {
  Json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
}

bool ConditionTrue(const Json& job, const char* type) {
  if (!job.contains("status") || !job["status"].contains("conditions")) return false;
  for (const Json& c : job["status"]["conditions"]) {
    if (c.value("type", "") == type && c.value("status", "") == "True") return true;
  }
  return false;
}

bool RunningConditionTrue(const Json& job) {
  if (!job.contains("status") || !job["status"].contains("conditions")) return false;
  bool running = false;
  for (const Json& c : job["status"]["conditions"]) {
    const std::string type = c.value("type", "");
    const bool is_true = c.value("status", "") == "True";
    if ((type == api::kConditionSucceeded || type == api::kConditionFailed) && is_true) return false;
    if (type == api::kConditionRunning && is_true) running = true;
  }
  return running;
}

// The metrics port of a pod's main container: its DISTRAIN_METRICS_PORT.
std::optional<int> MetricsPort(const Json& pod) {
  const Json& containers = pod["spec"]["containers"];
  const Json* main = nullptr;
  for (const Json& c : containers) {
    if (c.value("name", "") == "distrain") main = &c;
  }
  if (main == nullptr && !containers.empty()) main = &containers[0];
  if (main == nullptr || !main->contains("env")) return std::nullopt;
  for (const Json& e : (*main)["env"]) {
    int port = 0;
    if (e.value("name", "") == "DISTRAIN_METRICS_PORT" && e.contains("value") &&
        absl::SimpleAtoi(e["value"].get<std::string>(), &port) && port > 0 && port < 65536) {
      return port;
    }
  }
  return std::nullopt;
}

}  // namespace

ScrapedProgress ParseProgressMetrics(const std::string& exposition) {
  ScrapedProgress out;
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    // "name value" or "name{labels} value": these metrics carry no labels.
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string name = line.substr(0, space);
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value) || !std::isfinite(value)) continue;
    if (name == "distrain_steps_total") out.step = value;
    else if (name == "distrain_total_steps") out.total_steps = value;
    else if (name == "distrain_examples_per_second") out.examples_per_second = value;
    else if (name == "distrain_loss") out.loss = value;
  }
  return out;
}

Json MergeProgress(const Json& current, const ScrapedProgress& scraped) {
  Json progress = current.is_object() ? current : Json::object();
  if (scraped.step) progress["step"] = static_cast<int64_t>(*scraped.step);
  if (scraped.total_steps && *scraped.total_steps > 0) {
    progress["totalSteps"] = static_cast<int64_t>(*scraped.total_steps);
  }
  // Rounded so that noise in the last digits does not cause a write per round.
  if (scraped.examples_per_second) {
    progress["examplesPerSecond"] = std::round(*scraped.examples_per_second * 10) / 10;
  }
  if (scraped.loss) progress["loss"] = std::round(*scraped.loss * 1e4) / 1e4;
  return progress;
}

ProgressReporter::ProgressReporter(kube::Client* client, Sources sources, absl::Duration interval)
    : client_(client), sources_(std::move(sources)), interval_(interval) {}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Start() {
  thread_ = std::jthread([this](std::stop_token stop) {
    while (!stop.stop_requested()) {
      ReportOnce();
      const absl::Time next = absl::Now() + interval_;
      while (!stop.stop_requested() && absl::Now() < next) absl::SleepFor(absl::Milliseconds(100));
    }
  });
}

void ProgressReporter::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void ProgressReporter::ReportOnce() {
  for (const Json& job : sources_.jobs()) {
    const std::string ns = Str(job, "/metadata/namespace");
    const std::string name = Str(job, "/metadata/name");
    if (ConditionTrue(job, api::kConditionSucceeded)) {
      // A job succeeds only when its chief (or every worker) finished all
      // its steps, so the final step is known even when the job ended
      // between two scrapes.
      const Json current = job["status"].value("progress", Json());
      if (current.is_object() && current.contains("totalSteps") &&
          current.value("step", Json()) != current["totalSteps"]) {
        Json patch = {{"status", {{"progress", {{"step", current["totalSteps"]}}}}}};
        (void)client_->Request(
            "PATCH",
            kube::ResourcePath({api::kGroup, api::kVersion, api::kPlural, true}, ns, name, "status"),
            &patch, "application/merge-patch+json");
      }
      continue;
    }
    if (!RunningConditionTrue(job)) continue;
    for (const Json& pod : sources_.pods(ns, name)) {
      const Json& labels = pod["metadata"].value("labels", Json::object());
      if (labels.value(api::kLabelJobRole, "") != "master") continue;
      const std::string ip = Str(pod, "/status/podIP");
      std::optional<int> port = MetricsPort(pod);
      if (Str(pod, "/status/phase") != "Running" || ip.empty() || !port) continue;
      std::string body;
      try {
        web::http::client::http_client_config config;
        config.set_timeout(std::chrono::seconds(2));
        web::http::client::http_client http(
            utility::conversions::to_string_t(absl::StrCat("http://", ip, ":", *port)), config);
        web::http::http_response response = http.request(web::http::methods::GET, "/metrics").get();
        if (response.status_code() != 200) continue;
        body = response.extract_utf8string(true).get();
      } catch (const std::exception& e) {
        spdlog::debug("progress of {}/{}: {}:{}: {}", ns, name, ip, *port, e.what());
        continue;
      }
      const Json current = job.contains("status") ? job["status"].value("progress", Json()) : Json();
      Json progress = MergeProgress(current, ParseProgressMetrics(body));
      if (progress == current) continue;
      Json patch = {{"status", {{"progress", progress}}}};
      auto r = client_->Request(
          "PATCH",
          kube::ResourcePath({api::kGroup, api::kVersion, api::kPlural, true}, ns, name, "status"),
          &patch, "application/merge-patch+json");
      if (!r.ok() || !r->ok()) {
        spdlog::debug("progress of {}/{}: {}", ns, name,
                      r.ok() ? r->message() : std::string(r.status().message()));
      }
    }
  }
}

}  // namespace distrain

#include "operator/progress_reporter.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/stall.h"
#include "operator/kube/paths.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

std::string Str(const Json& j, const char* pointer) {
  Json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
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


// The labels of a sample, `{a="x",b="y\\"z"}` without the braces, unescaped
// as the text format escapes them (\\, \", \n); nullopt when malformed.
std::optional<std::vector<std::pair<std::string, std::string>>> ParseLabels(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> labels;
  size_t i = 0;
  while (i < text.size()) {
    const size_t eq = text.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= text.size() || text[eq + 1] != '"') {
      return std::nullopt;
    }
    std::string name(text.substr(i, eq - i)), value;
    size_t j = eq + 2;
    for (; j < text.size() && text[j] != '"'; ++j) {
      if (text[j] != '\\') {
        value += text[j];
        continue;
      }
      if (++j == text.size()) return std::nullopt;
      value += text[j] == 'n' ? '\n' : text[j];
    }
    if (j == text.size()) return std::nullopt;  // no closing quote
    labels.emplace_back(std::move(name), std::move(value));
    i = j + 1;
    if (i < text.size() && text[i] == ',') ++i;
  }
  return labels;
}

}  // namespace

ScrapedProgress ParseProgressMetrics(const std::string& exposition) {
  ScrapedProgress out;
  std::optional<double> job_rate;
  std::optional<double> job_step;
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    constexpr std::string_view kAutoInfo = "distrain_auto_strategy_info{";
    if (line.compare(0, kAutoInfo.size(), kAutoInfo) == 0) {
      const size_t close = line.rfind('}');
      if (close == std::string::npos || close < kAutoInfo.size()) continue;
      auto labels = ParseLabels(std::string_view(line).substr(kAutoInfo.size(),
                                                              close - kAutoInfo.size()));
      if (!labels) continue;
      std::optional<std::string> strategy, reason;
      for (auto& [name, value] : *labels) {
        if (name == "strategy") strategy = value;
        if (name == "reason") reason = value;
      }
      if (strategy && reason && !strategy->empty()) {
        out.auto_strategy = std::move(strategy);
        out.auto_reason = std::move(reason);
      }
      continue;
    }
    // "name value" or "name{labels} value": the others carry no labels.
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string name = line.substr(0, space);
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value) || !std::isfinite(value)) continue;
    if (name == "distrain_step") job_step = value;
    else if (name == "distrain_steps_total") out.step = value;
    else if (name == "distrain_total_steps") out.total_steps = value;
    else if (name == "distrain_job_examples_per_second") job_rate = value;
    else if (name == "distrain_examples_per_second") out.examples_per_second = value;
    else if (name == "distrain_loss") out.loss = value;
    else if (name == "distrain_eval_accuracy") out.accuracy = value;
    else if (name == "distrain_progress_deadline_seconds") out.progress_deadline = value;
  }
  // The job's rate when the chief says it (a MultiWorkerMirrored chief's own
  // rate is 1/W of it); its own rate from older workers and other images.
  if (job_rate) out.examples_per_second = job_rate;
  // The job's step when the chief says it: its own step counter restarts at
  // 0 when a process resumes from a checkpoint.
  if (job_step) out.step = job_step;
  return out;
}

Json MergeStrategy(const Json& current, const ScrapedProgress& scraped) {
  if (!scraped.auto_strategy) return current;
  // A page can say anything: bounded, like every other status string.
  constexpr size_t kMaxReason = 1024;
  return Json{{"name", scraped.auto_strategy->substr(0, 64)},
              {"reason", scraped.auto_reason->substr(0, kMaxReason)},
              {"decidedBy", "worker"}};
}

Json MergeProgress(const Json& current, const ScrapedProgress& scraped, absl::Time now) {
  Json progress = current.is_object() ? current : Json::object();
  // A page can say anything: a count beyond int64 is dropped (converting it
  // would be undefined behaviour), like a value that does not parse.
  const auto fits = [](double v) { return v > -0x1p63 && v < 0x1p63; };
  if (scraped.step && fits(*scraped.step)) {
    const int64_t step = static_cast<int64_t>(*scraped.step);
    const Json& before = progress.value("step", Json());
    if (step > 0 && !(before.is_number_integer() && before.get<int64_t>() == step)) {
      progress[controller::kProgressLastStepTime] = api::FormatKubeTime(now);
    }
    progress["step"] = step;
  }
  // Whole seconds, at least 1 (the CRD's integer; a deadline of 0 means none was set).
  if (scraped.progress_deadline && *scraped.progress_deadline >= 1 &&
      fits(*scraped.progress_deadline)) {
    progress[controller::kProgressDeadlineSeconds] =
        static_cast<int64_t>(std::ceil(*scraped.progress_deadline));
  }
  if (scraped.total_steps && *scraped.total_steps > 0 && fits(*scraped.total_steps)) {
    progress["totalSteps"] = static_cast<int64_t>(*scraped.total_steps);
  }
  // Rounded so that noise in the last digits does not cause a write per round.
  if (scraped.examples_per_second) {
    progress["examplesPerSecond"] = std::round(*scraped.examples_per_second * 10) / 10;
  }
  if (scraped.loss) progress["loss"] = std::round(*scraped.loss * 1e4) / 1e4;
  // Only once the chief has evaluated (the gauge starts at 0 before that).
  if (scraped.accuracy && *scraped.accuracy > 0) {
    progress["accuracy"] = std::round(*scraped.accuracy * 1e4) / 1e4;
  }
  return progress;
}

ProgressReporter::ProgressReporter(kube::Client* client, Sources sources, Options options)
    : client_(client), sources_(std::move(sources)), options_(std::move(options)) {}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Start() {
  thread_ = std::jthread([this](std::stop_token stop) {
    while (!stop.stop_requested()) {
      const absl::Time next = absl::Now() + options_.interval;
      ReportOnce(stop);
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

ProgressReporter::RoundStats ProgressReporter::ReportOnce(std::stop_token stop) {
  RoundStats stats;
  // The job's resourceVersion as seen before the scrape is the patch's
  // precondition: a job that finished meanwhile has had its final figures
  // written by the reconcile (controller/final_progress.h), and a scrape
  // from before must not overwrite them (409; the next round skips it).
  auto patch_progress = [&](const std::string& ns, const std::string& name,
                            const std::string& resource_version, const Json& progress,
                            const Json* strategy) {
    Json patch = {{"status", {{"progress", progress}}}};
    if (strategy != nullptr) patch["status"]["strategy"] = *strategy;
    if (!resource_version.empty()) patch["metadata"] = {{"resourceVersion", resource_version}};
    auto r = client_->Request(
        "PATCH",
        kube::ResourcePath({api::kGroup, api::kVersion, api::kPlural, true}, ns, name, "status"),
        &patch, "application/merge-patch+json");
    if (!r.ok() || !r->ok()) {
      spdlog::debug("progress of {}/{}: {}", ns, name,
                    r.ok() ? r->message() : std::string(r.status().message()));
    } else {
      ++stats.patched;
    }
  };

  // 1. The master pods of running jobs.
  struct Scrape {
    std::string ns, name, resource_version;
    Json current;           // the job's status.progress
    Json current_strategy;  // its status.strategy
  };
  std::vector<Scrape> scrapes;
  std::vector<ScrapeTarget> targets;
  for (const Json& job : sources_.jobs()) {
    const std::string ns = Str(job, "/metadata/namespace");
    const std::string name = Str(job, "/metadata/name");
    // A finished job's progress is the reconcile's (step 4).
    if (!RunningConditionTrue(job)) continue;
    for (const Json& pod : sources_.pods(ns, name)) {
      const Json& labels = pod["metadata"].value("labels", Json::object());
      if (labels.value(api::kLabelJobRole, "") != "master") continue;
      const std::string ip = Str(pod, "/status/podIP");
      std::optional<int> port = MetricsPort(pod);
      if (Str(pod, "/status/phase") != "Running" || ip.empty() || !port) continue;
      const Json& status = job.contains("status") && job["status"].is_object() ? job["status"]
                                                                              : Json::object();
      scrapes.push_back({ns, name, Str(job, "/metadata/resourceVersion"),
                         status.value("progress", Json()), status.value("strategy", Json())});
      targets.push_back({ip, *port, "/metrics"});
    }
  }
  // 2. All of them at once, each within its own deadline and byte limit.
  std::vector<ScrapeResult> results = ScrapeAll(targets, options_.scrape, stop);
  // 3. The patches, once no scrape is waiting.
  for (size_t i = 0; i < scrapes.size(); ++i) {
    const Scrape& s = scrapes[i];
    const ScrapeResult& r = results[i];
    ++stats.scraped;
    stats.max_bytes_read = std::max(stats.max_bytes_read, r.bytes_read);
    stats.longest_scrape = std::max(stats.longest_scrape, r.elapsed);
    if (!r.status.ok()) {
      ++stats.failed;
      spdlog::debug("progress of {}/{}: {}:{}: {}", s.ns, s.name, targets[i].host,
                    targets[i].port, std::string(r.status.message()));
      continue;
    }
    const ScrapedProgress scraped = ParseProgressMetrics(r.body);
    Json progress = MergeProgress(s.current, scraped);
    Json strategy = MergeStrategy(s.current_strategy, scraped);
    const bool strategy_changed = strategy != s.current_strategy;
    if (progress == s.current && !strategy_changed) continue;
    patch_progress(s.ns, s.name, s.resource_version, progress,
                   strategy_changed ? &strategy : nullptr);
  }
  return stats;
}

}  // namespace distrain

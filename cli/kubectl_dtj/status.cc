// `kubectl dtj status <job>`.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/kubectl_dtj/kubectl_dtj.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/paths.h"

namespace distrain::kubectl_dtj {
namespace {

using Json = nlohmann::json;

constexpr int kMaxEvents = 10;
constexpr const char* kReplicaOrder[] = {"Chief", "Worker", "PS", "Evaluator"};

std::string Str(const Json& object, const char* key) {
  if (!object.is_object() || !object.contains(key)) return "";
  const Json& v = object[key];
  return v.is_string() ? v.get<std::string>() : (v.is_null() ? "" : v.dump());
}

int64_t Int(const Json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number()) return 0;
  return object[key].get<int64_t>();
}

std::optional<absl::Time> TimeOf(const std::string& text) {
  if (text.empty()) return std::nullopt;
  auto t = api::ParseKubeTime(text, "time");
  if (!t.ok()) return std::nullopt;
  return *t;
}

// kubectl's ages: 45s, 12m, 3h, 5d.
std::string Age(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 2 * 3600) return absl::StrCat(s / 60, "m");
  if (s < 2 * 86400) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string TimeLine(const std::string& text, absl::Time now) {
  std::optional<absl::Time> t = TimeOf(text);
  if (!t) return text.empty() ? "-" : text;
  return absl::StrCat(text, " (", Age(now - *t), " ago)");
}

// The time an event last happened (series, eventTime, the deprecated
// fields some reporters still fill, creation as the last resort).
absl::Time EventTime(const Json& event) {
  for (const std::string& text :
       {event.contains("series") ? Str(event["series"], "lastObservedTime") : std::string(),
        Str(event, "eventTime"), Str(event, "deprecatedLastTimestamp"),
        event.contains("metadata") ? Str(event["metadata"], "creationTimestamp") : std::string()}) {
    if (std::optional<absl::Time> t = TimeOf(text)) return *t;
  }
  return absl::InfinitePast();
}

int64_t EventCount(const Json& event) {
  if (event.contains("series") && event["series"].is_object()) {
    return std::max<int64_t>(1, Int(event["series"], "count"));
  }
  return std::max<int64_t>(1, Int(event, "deprecatedCount"));
}

// Rows padded to the widest cell of each column, indented by two.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 3, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Number(const Json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return absl::StrFormat("%g", v.get<double>());
  return v.is_null() ? "" : v.dump();
}

std::string ProgressLine(const Json& progress) {
  if (!progress.is_object() || progress.empty()) return "-";
  std::string out;
  if (!progress.contains("step") && progress.contains("totalSteps")) {
    absl::StrAppend(&out, "no step reported yet (of ", Number(progress["totalSteps"]), ")");
  }
  if (progress.contains("step")) {
    absl::StrAppend(&out, "step ", Number(progress["step"]));
    if (progress.contains("totalSteps") && progress["totalSteps"].is_number()) {
      absl::StrAppend(&out, "/", Number(progress["totalSteps"]));
      const double total = progress["totalSteps"].get<double>();
      if (total > 0 && progress["step"].is_number()) {
        absl::StrAppend(&out, absl::StrFormat(" (%.1f%%)", 100.0 * progress["step"].get<double>() / total));
      }
    }
  }
  if (progress.contains("loss") && progress["loss"].is_number()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "loss ",
                    absl::StrFormat("%.4g", progress["loss"].get<double>()));
  }
  if (progress.contains("examplesPerSecond") && progress["examplesPerSecond"].is_number()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ",
                    absl::StrFormat("%.1f", progress["examplesPerSecond"].get<double>()), " examples/s");
  }
  return out.empty() ? progress.dump() : out;
}

}  // namespace

std::string RenderStatus(const Json& job, const Json& pods, const Json& events,
                         std::chrono::system_clock::time_point now_point) {
  const absl::Time now = absl::FromChrono(now_point);
  const Json& meta = job.contains("metadata") ? job["metadata"] : Json::object();
  const Json& spec = job.contains("spec") ? job["spec"] : Json::object();
  const Json& status = job.contains("status") && job["status"].is_object() ? job["status"] : Json::object();
  std::string out;
  auto field = [&](const std::string& name, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-12s %s\n", name + ":", value));
  };
  field("Name", Str(meta, "name"));
  field("Namespace", Str(meta, "namespace"));
  {
    // Auto: what it chose and why, from status.strategy.
    std::string strategy = spec.contains("strategy") ? Str(spec, "strategy") : "-";
    if (status.contains("strategy") && status["strategy"].is_object()) {
      const Json& chosen = status["strategy"];
      absl::StrAppend(&strategy, " -> ", Str(chosen, "name"), " (", Str(chosen, "reason"),
                      Str(chosen, "decidedBy") == "worker" ? "; measured by the master" : "", ")");
    }
    field("Strategy", strategy);
  }
  field("State", StateOf(job).ToString());
  field("Progress", ProgressLine(status.contains("progress") ? status["progress"] : Json()));
  field("Restarts", std::to_string(Int(status, "restartCount")));
  field("Started", TimeLine(Str(status, "startTime"), now));
  field("Completed", TimeLine(Str(status, "completionTime"), now));

  absl::StrAppend(&out, "Replicas:\n");
  std::vector<std::vector<std::string>> rows = {
      {"TYPE", "DESIRED", "ACTIVE", "SUCCEEDED", "FAILED", "RESTARTS"}};
  const Json& specs = spec.contains("replicaSpecs") && spec["replicaSpecs"].is_object()
                          ? spec["replicaSpecs"] : Json::object();
  const Json& statuses = status.contains("replicaStatuses") && status["replicaStatuses"].is_object()
                             ? status["replicaStatuses"] : Json::object();
  for (const char* type : kReplicaOrder) {
    if (!specs.contains(type) && !statuses.contains(type)) continue;
    const Json& s = statuses.contains(type) ? statuses[type] : Json::object();
    rows.push_back({type,
                    specs.contains(type) ? std::to_string(Int(specs[type], "replicas")) : "-",
                    std::to_string(Int(s, "active")), std::to_string(Int(s, "succeeded")),
                    std::to_string(Int(s, "failed")), std::to_string(Int(s, "restarts"))});
  }
  absl::StrAppend(&out, Table(rows));

  absl::StrAppend(&out, "Pods:\n");
  if (!pods.is_array() || pods.empty()) {
    absl::StrAppend(&out, "  <none>\n");
  } else {
    std::vector<Json> sorted = pods.get<std::vector<Json>>();
    std::sort(sorted.begin(), sorted.end(), [](const Json& a, const Json& b) {
      return Str(a["metadata"], "name") < Str(b["metadata"], "name");
    });
    rows = {{"NAME", "PHASE", "RESTARTS", "NODE", "AGE"}};
    for (const Json& pod : sorted) {
      const Json& ps = pod.contains("status") ? pod["status"] : Json::object();
      int64_t restarts = 0;
      if (ps.contains("containerStatuses") && ps["containerStatuses"].is_array()) {
        for (const Json& c : ps["containerStatuses"]) restarts += Int(c, "restartCount");
      }
      std::optional<absl::Time> created = TimeOf(Str(pod["metadata"], "creationTimestamp"));
      const std::string node = pod.contains("spec") ? Str(pod["spec"], "nodeName") : "";
      std::string phase = Str(ps, "phase");
      if (pod["metadata"].contains("deletionTimestamp")) phase = "Terminating";
      rows.push_back({Str(pod["metadata"], "name"), phase.empty() ? "Pending" : phase,
                      std::to_string(restarts), node.empty() ? "<none>" : node,
                      created ? Age(now - *created) : "-"});
    }
    absl::StrAppend(&out, Table(rows));
  }

  absl::StrAppend(&out, "Events:\n");
  if (!events.is_array() || events.empty()) {
    absl::StrAppend(&out, "  <none>\n");
  } else {
    std::vector<Json> sorted = events.get<std::vector<Json>>();
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const Json& a, const Json& b) { return EventTime(a) < EventTime(b); });
    if (sorted.size() > kMaxEvents) sorted.erase(sorted.begin(), sorted.end() - kMaxEvents);
    rows = {{"AGE", "TYPE", "REASON", "MESSAGE"}};
    for (const Json& e : sorted) {
      const absl::Time t = EventTime(e);
      std::string age = t == absl::InfinitePast() ? "-" : Age(now - t);
      if (int64_t n = EventCount(e); n > 1) absl::StrAppend(&age, " (x", n, ")");
      std::string note = Str(e, "note");
      if (note.empty()) note = Str(e, "deprecatedMessage");  // not in events.k8s.io/v1, but harmless
      rows.push_back({age, Str(e, "type"), Str(e, "reason"), note});
    }
    absl::StrAppend(&out, Table(rows));
  }
  return out;
}

int RunStatus(kube::Client& client, const Target& target, std::ostream& out, std::ostream& err) {
  auto job = GetJob(client, target);
  if (!job.ok()) {
    err << "error: " << job.status().message() << "\n";
    return kExitFailed;
  }
  Json pods = Json::array();
  auto listed = client.Request(
      "GET", kube::WithQuery(kube::ResourcePath(kube::PodsResource(), target.namespace_name),
                             {.label_selector = absl::StrCat(api::kLabelJobName, "=", target.job)}));
  if (listed.ok() && listed->ok() && listed->body.contains("items")) {
    pods = listed->body["items"];
  } else {
    err << "warning: cannot list the pods of " << target.namespace_name << "/" << target.job << ": "
        << (listed.ok() ? listed->message() : std::string(listed.status().message())) << "\n";
  }

  // events.k8s.io/v1 supports these field selectors; an older or stricter
  // server that refuses them gets the namespace's events filtered here.
  Json events = Json::array();
  const std::string events_path = kube::ResourcePath(kube::EventsResource(), target.namespace_name);
  auto selected = client.Request(
      "GET", kube::WithQuery(events_path,
                             {.field_selector = absl::StrCat("regarding.name=", target.job,
                                                             ",regarding.kind=", api::kKind)}));
  if (selected.ok() && selected->ok() && selected->body.contains("items")) {
    events = selected->body["items"];
  } else if (selected.ok() && selected->status_code == 400) {
    auto all = client.Request("GET", events_path);
    if (all.ok() && all->ok() && all->body.contains("items")) {
      for (const Json& e : all->body["items"]) {
        if (!e.contains("regarding")) continue;
        if (Str(e["regarding"], "name") == target.job && Str(e["regarding"], "kind") == api::kKind) {
          events.push_back(e);
        }
      }
    }
  } else {
    err << "warning: cannot list the events of " << target.namespace_name << "/" << target.job << ": "
        << (selected.ok() ? selected->message() : std::string(selected.status().message())) << "\n";
  }
  out << RenderStatus(*job, pods, events, std::chrono::system_clock::now());
  return kExitOk;
}

}  // namespace distrain::kubectl_dtj

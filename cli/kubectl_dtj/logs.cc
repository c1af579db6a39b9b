// `kubectl dtj logs <job>`.

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/kubectl_dtj/kubectl_dtj.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/paths.h"

namespace distrain::kubectl_dtj {
namespace {

using Json = nlohmann::json;

std::string Label(const Json& pod, const char* key) {
  const Json& meta = pod["metadata"];
  if (!meta.contains("labels") || !meta["labels"].is_object()) return "";
  return meta["labels"].value(key, "");
}

int TypeRank(const std::string& type) {
  static constexpr const char* kOrder[] = {"chief", "worker", "ps", "evaluator"};
  for (int i = 0; i < 4; ++i) {
    if (type == kOrder[i]) return i;
  }
  return 4;
}

int IndexOf(const Json& pod) {
  const std::string index = Label(pod, api::kLabelReplicaIndex);
  int value = 0;
  for (char c : index) {
    if (c < '0' || c > '9') return 0;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::string ContainerOf(const Json& pod, const std::string& wanted) {
  if (!wanted.empty()) return wanted;
  const Json& containers = pod["spec"]["containers"];
  if (!containers.is_array() || containers.empty()) return "";
  for (const Json& c : containers) {
    if (c.value("name", "") == "distrain") return "distrain";
  }
  return containers[0].value("name", "");
}

// Writes whole prefixed lines of several concurrent streams to one ostream.
// Thread-safe.
class LineWriter {
 public:
  explicit LineWriter(std::ostream& out) : out_(out) {}
  void Write(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    out_ << text << std::flush;
  }

 private:
  std::mutex mu_;
  std::ostream& out_;
};

// Streams one pod's log; returns false (after a message on err) when it
// could not be read.
bool StreamPod(kube::RestClient& client, const Target& target, const LogsOptions& options,
               const Json& pod, LineWriter& out, LineWriter& err) {
  const std::string name = pod["metadata"].value("name", "");
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "Pending") : "Pending";
  if (!pod.contains("spec") || pod["spec"].value("nodeName", "").empty()) {
    err.Write(absl::StrCat("pod ", name, " is not running on a node yet (phase ", phase,
                           "); its log is there once it is scheduled and started: kubectl dtj status ",
                           target.job, " -n ", target.namespace_name, "\n"));
    return false;
  }
  std::string query = absl::StrCat("?container=", kube::QueryEscape(ContainerOf(pod, options.container)));
  if (options.follow) absl::StrAppend(&query, "&follow=true");
  if (options.tail_lines) absl::StrAppend(&query, "&tailLines=", *options.tail_lines);
  const std::string prefix = LogPrefix(pod);
  std::string pending;
  auto response = client.Stream(
      absl::StrCat(kube::ResourcePath(kube::PodsResource(), target.namespace_name, name, "log"), query),
      [&](std::string_view data) {
        pending.append(data);
        const size_t last = pending.rfind('\n');
        if (last == std::string::npos) return true;
        std::string lines;
        size_t start = 0;
        while (start <= last) {
          const size_t end = pending.find('\n', start);
          lines.append(prefix).append(pending, start, end + 1 - start);
          start = end + 1;
        }
        pending.erase(0, last + 1);
        out.Write(lines);
        return true;
      },
      {});
  if (!pending.empty()) out.Write(absl::StrCat(prefix, pending, "\n"));
  if (!response.ok()) {
    err.Write(absl::StrCat("error: logs of pod ", name, ": ", response.status().message(), "\n"));
    return false;
  }
  if (!response->ok()) {
    err.Write(absl::StrCat("error: logs of pod ", name, " on node ", pod["spec"].value("nodeName", ""),
                           " (phase ", phase, "): HTTP ",
                           response->status_code, ": ", response->message(), "\n"));
    return false;
  }
  return true;
}

}  // namespace

std::string LogPrefix(const Json& pod) {
  const std::string type = Label(pod, api::kLabelReplicaType);
  const std::string index = Label(pod, api::kLabelReplicaIndex);
  if (type.empty() || index.empty()) return absl::StrCat("[", pod["metadata"].value("name", "?"), "] ");
  return absl::StrCat("[", type, "-", index, "] ");
}

int RunLogs(kube::RestClient& client, const Target& target, const LogsOptions& options,
            std::ostream& out, std::ostream& err) {
  auto job = GetJob(client, target);
  if (!job.ok()) {
    err << "error: " << job.status().message() << "\n";
    return kExitFailed;
  }
  std::string selector = absl::StrCat(api::kLabelJobName, "=", target.job);
  if (!options.replica_type.empty()) {
    absl::StrAppend(&selector, ",", api::kLabelReplicaType, "=", options.replica_type);
  }
  auto listed = client.Request(
      "GET", kube::WithQuery(kube::ResourcePath(kube::PodsResource(), target.namespace_name),
                             {.label_selector = selector}));
  if (!listed.ok() || !listed->ok()) {
    err << "error: cannot list the pods of " << target.namespace_name << "/" << target.job << ": "
        << (listed.ok() ? listed->message() : std::string(listed.status().message())) << "\n";
    return kExitFailed;
  }
  std::vector<Json> pods = listed->body.value("items", Json::array()).get<std::vector<Json>>();
  if (pods.empty()) {
    err << "error: DistributedTrainingJob " << target.namespace_name << "/" << target.job << " has no "
        << (options.replica_type.empty() ? "" : options.replica_type + " ")
        << "pods (yet); kubectl dtj status " << target.job << " -n " << target.namespace_name << "\n";
    return kExitFailed;
  }
  std::sort(pods.begin(), pods.end(), [](const Json& a, const Json& b) {
    const int ta = TypeRank(Label(a, api::kLabelReplicaType));
    const int tb = TypeRank(Label(b, api::kLabelReplicaType));
    if (ta != tb) return ta < tb;
    return IndexOf(a) < IndexOf(b);
  });
  LineWriter out_lines(out);
  LineWriter err_lines(err);
  bool all_ok = true;
  if (!options.follow) {
    for (const Json& pod : pods) all_ok &= StreamPod(client, target, options, pod, out_lines, err_lines);
  } else {
    std::vector<char> ok(pods.size(), 1);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < pods.size(); ++i) {
      threads.emplace_back([&, i] { ok[i] = StreamPod(client, target, options, pods[i], out_lines, err_lines); });
    }
    for (std::thread& t : threads) t.join();
    all_ok = std::all_of(ok.begin(), ok.end(), [](char v) { return v != 0; });
  }
  return all_ok ? kExitOk : kExitFailed;
}

}  // namespace distrain::kubectl_dtj

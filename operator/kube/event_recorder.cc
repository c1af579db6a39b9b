#include "operator/kube/event_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/logging.h"
#include "operator/kube/paths.h"
#include "spdlog/spdlog.h"

namespace distrain::kube {
namespace {

// Kubernetes object names are at most 253 bytes (DNS subdomain).
constexpr size_t kMaxNameBytes = 253;

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string Truncate(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end));
}

std::string DefaultReportingInstance() {
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && pod[0] != '\0') return pod;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "unknown";
}

std::string StringAt(const nlohmann::json& obj, const char* a, const char* b = nullptr) {
  if (!obj.is_object()) return "";
  auto it = obj.find(a);
  if (it == obj.end()) return "";
  if (b != nullptr) {
    if (!it->is_object()) return "";
    auto jt = it->find(b);
    return jt != it->end() && jt->is_string() ? jt->get<std::string>() : "";
  }
  return it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

nlohmann::json ObjectReference(const nlohmann::json& object) {
  nlohmann::json ref = nlohmann::json::object();
  const auto put = [&ref](const char* field, std::string value) {
    if (!value.empty()) ref[field] = std::move(value);
  };
  put("apiVersion", StringAt(object, "apiVersion"));
  put("kind", StringAt(object, "kind"));
  put("name", StringAt(object, "metadata", "name"));
  put("namespace", StringAt(object, "metadata", "namespace"));
  put("uid", StringAt(object, "metadata", "uid"));
  put("resourceVersion", StringAt(object, "metadata", "resourceVersion"));
  return ref;
}

EventRecorder::EventRecorder(Client* client, EventRecorderOptions options)
    : client_(client), options_(std::move(options)), clock_(options_.clock) {
  DISTRAIN_CHECK(client_ != nullptr);
  DISTRAIN_CHECK(clock_ != nullptr);
  DISTRAIN_CHECK_GT(options_.queue_capacity, 0u);
  if (options_.reporting_instance.empty()) options_.reporting_instance = DefaultReportingInstance();
  options_.reporting_instance = Truncate(options_.reporting_instance, kMaxShortFieldBytes);
  options_.reporting_controller = Truncate(options_.reporting_controller, kMaxShortFieldBytes);
  last_sweep_ = clock_->Now();
  sender_ = std::thread([this] { SendLoop(); });
}

EventRecorder::~EventRecorder() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sender_.join();
}

void EventRecorder::Event(const nlohmann::json& object, EventType type, std::string_view reason,
                          std::string_view action, std::string_view note) {
  nlohmann::json regarding = ObjectReference(object);
  const std::string name = StringAt(object, "metadata", "name");
  if (name.empty()) {
    spdlog::error("event {} ({}) not recorded: the object has no metadata.name: {}",
                  std::string(reason), std::string(note), object.dump().substr(0, 200));
    return;
  }
  std::string namespace_name = StringAt(object, "metadata", "namespace");
  // Events about cluster-scoped objects live in "default", as client-go puts them.
  if (namespace_name.empty()) namespace_name = "default";
  const absl::Time now = clock_->Now();

  nlohmann::json key_fields = regarding;
  key_fields.erase("resourceVersion");  // a job's repeated failure is one series
  const char* type_name = type == EventType::kWarning ? "Warning" : "Normal";
  nlohmann::json event = {
      {"apiVersion", "events.k8s.io/v1"},
      {"kind", "Event"},
      {"metadata", {{"namespace", namespace_name}}},
      {"eventTime", FormatMicroTime(now)},
      {"reportingController", options_.reporting_controller},
      {"reportingInstance", options_.reporting_instance},
      {"action", Truncate(action, kMaxShortFieldBytes)},
      {"reason", Truncate(reason, kMaxShortFieldBytes)},
      {"note", Truncate(note, kMaxNoteBytes)},
      {"type", type_name},
      {"regarding", std::move(regarding)},
  };
  std::string key = nlohmann::json{{"regarding", key_fields},
                                   {"type", type_name},
                                   {"reason", event["reason"]},
                                   {"action", event["action"]},
                                   {"note", event["note"]}}
                        .dump();

  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (queue_.size() >= options_.queue_capacity) {
    if (dropped_++ % 100 == 0) {
      spdlog::warn("event queue full ({} events waiting for the API server); dropped {} {} on {} "
                   "({} dropped so far)",
                   queue_.size(), type_name, std::string(reason), name, dropped_);
    }
    return;
  }
  // "<name>.<hex>", unique even for events recorded in the same nanosecond.
  last_unique_ = std::max(absl::ToUnixNanos(now), last_unique_ + 1);
  const std::string suffix = absl::StrFormat(".%x", last_unique_);
  event["metadata"]["name"] = Truncate(name, kMaxNameBytes - suffix.size()) + suffix;
  ++queued_per_key_[key];
  queue_.push_back(Pending{std::move(key), std::move(event), now});
}

bool EventRecorder::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !sending_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int64_t EventRecorder::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void EventRecorder::SendLoop() {
  while (true) {
    Pending item;
    bool more_of_key_queued = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      auto it = queued_per_key_.find(item.key);
      if (--it->second == 0) {
        queued_per_key_.erase(it);
      } else {
        more_of_key_queued = true;
      }
      sending_ = true;
    }
    Send(std::move(item), more_of_key_queued);
    absl::MutexLock lock(&mu_);
    sending_ = false;
  }
}

void EventRecorder::Send(Pending item, bool more_of_key_queued) {
  const absl::Time now = clock_->Now();
  if (now - last_sweep_ > options_.series_window) {
    for (auto it = sent_.begin(); it != sent_.end();) {
      if (now - it->second.last_observed > options_.series_window) {
        sent_.erase(it++);
      } else {
        ++it;
      }
    }
    last_sweep_ = now;
  }
  auto it = sent_.find(item.key);
  if (it == sent_.end() || item.observed - it->second.last_observed > options_.series_window) {
    if (it != sent_.end()) sent_.erase(it);
    Create(item);
    return;
  }
  Sent& sent = it->second;
  ++sent.count;
  sent.last_observed = item.observed;
  // A repeat still queued will carry this one's count in its own PATCH.
  if (more_of_key_queued) return;
  const nlohmann::json patch = {
      {"series", {{"count", sent.count}, {"lastObservedTime", FormatMicroTime(sent.last_observed)}}}};
  absl::StatusOr<ApiResponse> r =
      client_->Request("PATCH", ResourcePath(EventsResource(), sent.namespace_name, sent.name),
                       &patch, "application/merge-patch+json");
  if (r.ok() && r->ok()) return;
  if (r.ok() && r->not_found()) {
    // The Event expired (the API server's event TTL): start a new one.
    sent_.erase(it);
    Create(item);
    return;
  }
  spdlog::warn("event {}/{}: cannot update its series to count {}: {}", sent.namespace_name,
               sent.name, sent.count,
               r.ok() ? absl::StrFormat("HTTP %d: %s", r->status_code, r->message())
                      : r.status().ToString());
}

void EventRecorder::Create(const Pending& item) {
  const std::string namespace_name = item.event["metadata"]["namespace"].get<std::string>();
  const std::string name = item.event["metadata"]["name"].get<std::string>();
  absl::StatusOr<ApiResponse> r =
      client_->Request("POST", ResourcePath(EventsResource(), namespace_name), &item.event);
  if (!r.ok() || !r->ok()) {
    spdlog::warn("event {}/{} ({} {}) not recorded: {}", namespace_name, name,
                 item.event["reason"].get<std::string>(), item.event["note"].get<std::string>(),
                 r.ok() ? absl::StrFormat("HTTP %d: %s", r->status_code, r->message())
                        : r.status().ToString());
    return;
  }
  sent_[item.key] = Sent{namespace_name, name, 1, item.observed};
}

}  // namespace distrain::kube

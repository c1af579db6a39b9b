#include "operator/kube/informer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/logging.h"
#include "operator/kube/rate_limiter.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace distrain::kube {
namespace {


using Json = nlohmann::json;

// metadata.managedFields (server-side apply bookkeeping) is often the largest
// part of an object and no reader of the cache uses it; dropping it is what
// controller-runtime does by default, and keeps the operator's footprint
// within its budget (bench/operator_scale.py).
void StripForCache(Json& object) {
  if (auto m = object.find("metadata"); m != object.end() && m->is_object()) m->erase("managedFields");
}

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// The status code of an ERROR event's metav1.Status (0 when absent).
int StatusCode(const Json& status) {
  if (!status.is_object()) return 0;
  auto it = status.find("code");
  return (it != status.end() && it->is_number_integer()) ? it->get<int>() : 0;
}

}  // namespace

struct Informer::Metrics {
  prometheus::Counter* lists = nullptr;
  prometheus::Counter* relists_after_gone = nullptr;
  prometheus::Counter* watch_errors = nullptr;
  prometheus::Family<prometheus::Counter>* events = nullptr;
  std::string resource;
};

Informer::Informer(Client* client, InformerOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {
  DISTRAIN_CHECK(client_ != nullptr);
  if (options_.registry) {
    metrics_ = std::make_unique<Metrics>();
    metrics_->resource = options_.resource.plural;
    auto counter = [&](const char* name, const char* help) {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(*options_.registry).Add(
          {{"resource", metrics_->resource}});
    };
    metrics_->lists = counter("distrain_informer_lists_total", "LISTs completed by informers");
    metrics_->relists_after_gone = counter("distrain_informer_relists_after_gone_total",
                                           "LISTs forced by 410 Gone on a watch");
    metrics_->watch_errors =
        counter("distrain_informer_watch_errors_total", "Informer watches that failed or broke");
    metrics_->events = &prometheus::BuildCounter()
                            .Name("distrain_informer_watch_events_total")
                            .Help("Watch events applied by informers, by type")
                            .Register(*options_.registry);
  }
}

Informer::~Informer() { Stop(); }

void Informer::AddIndex(const std::string& name, IndexFunc fn) {
  DISTRAIN_CHECK(!thread_.joinable()) << "AddIndex after Start";
  index_funcs_[name] = std::move(fn);
  absl::MutexLock lock(&mu_);
  indexes_[name];
}

void Informer::AddLabelIndex(const std::string& label_key) {
  AddIndex(label_key, [label_key](const Json& object) -> std::vector<std::string> {
    const Json* labels = nullptr;
    if (object.is_object() && object.contains("metadata") && object["metadata"].is_object() &&
        object["metadata"].contains("labels")) {
      labels = &object["metadata"]["labels"];
    }
    if (labels == nullptr || !labels->is_object()) return {};
    auto it = labels->find(label_key);
    if (it == labels->end() || !it->is_string()) return {};
    return {it->get<std::string>()};
  });
}

void Informer::AddHandlers(ResourceEventHandlers handlers) {
  DISTRAIN_CHECK(!thread_.joinable()) << "AddHandlers after Start";
  handlers_.push_back(std::move(handlers));
}

void Informer::Start() {
  DISTRAIN_CHECK(!thread_.joinable()) << "Start called twice";
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void Informer::Stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
}

bool Informer::HasSynced() const {
  absl::MutexLock lock(&mu_);
  return synced_;
}

bool Informer::WaitForSync(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&synced_), timeout);
}

std::optional<Json> Informer::Get(std::string_view key) const {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(std::string(key));
  if (it == objects_.end()) return std::nullopt;
  return *it->second;
}

std::vector<Json> Informer::List() const {
  std::vector<ObjectPtr> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot.reserve(objects_.size());
    for (const auto& [key, object] : objects_) snapshot.push_back(object);
  }
  // Copy outside the lock: the shared pointers keep the objects alive.
  std::vector<Json> out;
  out.reserve(snapshot.size());
  for (const auto& object : snapshot) out.push_back(*object);
  return out;
}

std::vector<std::string> Informer::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  keys.reserve(objects_.size());
  for (const auto& [key, object] : objects_) keys.push_back(key);
  return keys;
}

std::vector<Informer::ObjectPtr> Informer::ByIndexShared(const std::string& index_name,
                                                         const std::string& value) const {
  std::vector<ObjectPtr> snapshot;
  absl::MutexLock lock(&mu_);
  auto index = indexes_.find(index_name);
  DISTRAIN_CHECK(index != indexes_.end()) << "no index \"" << index_name << "\"; AddIndex first";
  auto keys = index->second.find(value);
  if (keys != index->second.end()) {
    for (const std::string& key : keys->second) snapshot.push_back(objects_.at(key));
  }
  return snapshot;
}

std::vector<Json> Informer::ByIndex(const std::string& index_name, const std::string& value) const {
  // Copy outside the lock: the shared pointers keep the objects alive.
  std::vector<ObjectPtr> snapshot = ByIndexShared(index_name, value);
  std::vector<Json> out;
  out.reserve(snapshot.size());
  for (const auto& object : snapshot) out.push_back(*object);
  return out;
}

size_t Informer::size() const {
  absl::MutexLock lock(&mu_);
  return objects_.size();
}

std::string Informer::LastResourceVersion() const {
  absl::MutexLock lock(&mu_);
  return resource_version_;
}

Informer::Stats Informer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Informer::IndexLocked(const std::string& key, const ObjectPtr& object, bool add) {
  for (const auto& [name, fn] : index_funcs_) {
    auto& index = indexes_[name];
    for (const std::string& value : fn(*object)) {
      if (add) {
        index[value].insert(key);
      } else if (auto it = index.find(value); it != index.end()) {
        it->second.erase(key);
        if (it->second.empty()) index.erase(it);
      }
    }
  }
}

std::string Informer::ListPath(const std::string& continue_token, bool paginate) const {
  ListOptions list;
  list.label_selector = options_.label_selector;
  list.field_selector = options_.field_selector;
  if (paginate) {
    list.limit = options_.page_size;
    list.continue_token = continue_token;
  }
  return WithQuery(ResourcePath(options_.resource, options_.namespace_name), list);
}

std::string Informer::WatchPath(const std::string& resource_version) const {
  ListOptions watch;
  watch.label_selector = options_.label_selector;
  watch.field_selector = options_.field_selector;
  watch.watch = true;
  watch.allow_watch_bookmarks = true;
  watch.resource_version = resource_version;
  const int64_t min = std::max<int64_t>(1, options_.min_watch_timeout.count());
  watch.timeout_seconds = std::uniform_int_distribution<int64_t>(min, 2 * min - 1)(Rng());
  return WithQuery(ResourcePath(options_.resource, options_.namespace_name), watch);
}

void Informer::Run(std::stop_token stop) {
  const std::string what = options_.namespace_name.empty()
                               ? options_.resource.plural
                               : options_.resource.plural + " in " + options_.namespace_name;
  int failures = 0;
  bool need_list = true;
  auto backoff = [&] {
    double base = std::chrono::duration<double>(options_.initial_backoff).count() *
                  std::pow(2.0, std::min(failures, 30));
    base = std::min(base, std::chrono::duration<double>(options_.max_backoff).count());
    ++failures;
    double jittered = base * std::uniform_real_distribution<double>(0.5, 1.0)(Rng());
    SleepOn(clock_, absl::Seconds(jittered), stop);
  };
  while (!stop.stop_requested()) {
    if (need_list) {
      absl::Status st = ListAndReplace(stop);
      if (stop.stop_requested()) return;
      if (!st.ok()) {
        spdlog::warn("informer {}: list failed (retrying with backoff): {}", what, st.message());
        backoff();
        continue;
      }
      need_list = false;
      failures = 0;
    }
    bool delivered = false;
    const auto started = std::chrono::steady_clock::now();
    switch (WatchOnce(stop, &delivered)) {
      case WatchEnd::kStopped:
        return;
      case WatchEnd::kTimedOut:
        // A watch that ends at once with nothing in it is not a timeout but a
        // server (or proxy) closing streams: back off rather than spin.
        if (!delivered && std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) {
          backoff();
        } else {
          failures = 0;
        }
        break;
      case WatchEnd::kGone: {
        spdlog::info("informer {}: resourceVersion {} expired (410 Gone); relisting", what,
                     LastResourceVersion());
        absl::MutexLock lock(&mu_);
        ++stats_.relists_after_gone;
        if (metrics_) metrics_->relists_after_gone->Increment();
        need_list = true;
        break;
      }
      case WatchEnd::kError:
        if (delivered) failures = 0;
        backoff();
        break;
    }
  }
}

absl::Status Informer::ListAndReplace(std::stop_token stop) {
  std::vector<ObjectPtr> objects;
  std::string continue_token;
  std::string resource_version;
  bool paginate = options_.page_size > 0;
  while (!stop.stop_requested()) {
    const std::string path = ListPath(continue_token, paginate);
    absl::StatusOr<ApiResponse> page = client_->Request("GET", path);
    if (!page.ok()) return page.status();
    if (page->gone() && !continue_token.empty()) {
      // The continue token outlived etcd's compaction window: start over, unpaginated.
      objects.clear();
      continue_token.clear();
      paginate = false;
      continue;
    }
    if (!page->ok()) {
      return absl::UnavailableError(absl::StrCat("LIST ", path, ": HTTP ", page->status_code, ": ",
                                                 page->message()));
    }
    const Json& body = page->body;
    const std::string api_version = body.value("apiVersion", "");
    std::string kind = body.value("kind", "");
    if (kind.size() > 4 && kind.compare(kind.size() - 4, 4, "List") == 0) {
      kind.resize(kind.size() - 4);
    }
    if (auto items = body.find("items"); items != body.end() && items->is_array()) {
      for (const Json& item : *items) {
        auto object = std::make_shared<Json>(item);
        if (!api_version.empty() && !object->contains("apiVersion")) {
          (*object)["apiVersion"] = api_version;
        }
        if (!kind.empty() && !object->contains("kind")) (*object)["kind"] = kind;
        StripForCache(*object);
        objects.push_back(std::move(object));
      }
    }
    const Json metadata = body.value("metadata", Json::object());
    resource_version = metadata.value("resourceVersion", "");
    continue_token = metadata.value("continue", "");
    if (continue_token.empty()) {
      Replace(std::move(objects), std::move(resource_version));
      return absl::OkStatus();
    }
  }
  return absl::CancelledError("stopped");
}

void Informer::Replace(std::vector<ObjectPtr> objects, std::string resource_version) {
  std::map<std::string, ObjectPtr> fresh;
  for (auto& object : objects) {
    std::string key = ObjectKey(*object);
    if (!key.empty()) fresh[key] = std::move(object);
  }
  // The notifications to send, computed under the lock, sent after it.
  struct Notice {
    ObjectPtr old_object, new_object;
  };
  std::vector<Notice> notices;
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = !synced_;
    for (const auto& [key, object] : fresh) {
      auto it = objects_.find(key);
      if (it == objects_.end()) {
        notices.push_back({nullptr, object});
      } else if (ResourceVersionOf(*it->second) != ResourceVersionOf(*object)) {
        notices.push_back({it->second, object});
      }
    }
    for (const auto& [key, object] : objects_) {
      if (!fresh.count(key)) notices.push_back({object, nullptr});
    }
    for (const auto& [key, object] : objects_) IndexLocked(key, object, false);
    objects_ = std::move(fresh);
    for (const auto& [key, object] : objects_) IndexLocked(key, object, true);
    resource_version_ = std::move(resource_version);
    ++stats_.lists;
    if (metrics_) metrics_->lists->Increment();
  }
  for (const Notice& n : notices) {
    for (const auto& h : handlers_) {
      if (n.old_object == nullptr) {
        if (h.on_add) h.on_add(*n.new_object);
      } else if (n.new_object == nullptr) {
        if (h.on_delete) h.on_delete(*n.old_object);
      } else if (h.on_update) {
        h.on_update(*n.old_object, *n.new_object);
      }
    }
  }
  if (first) {
    absl::MutexLock lock(&mu_);
    synced_ = true;
  }
}

void Informer::Apply(const WatchEvent& event) {
  Json stripped = event.object;
  StripForCache(stripped);
  auto object = std::make_shared<const Json>(std::move(stripped));
  const std::string key = ObjectKey(*object);
  const std::string rv = ResourceVersionOf(*object);
  ObjectPtr old_object;
  bool deleted = event.type == "DELETED";
  {
    absl::MutexLock lock(&mu_);
    if (!rv.empty()) resource_version_ = rv;
    if (event.type == "BOOKMARK" || key.empty()) return;
    ++stats_.events;
    auto it = objects_.find(key);
    if (it != objects_.end()) {
      old_object = it->second;
      IndexLocked(key, old_object, false);
    }
    if (deleted) {
      if (it == objects_.end()) return;  // never seen: nothing to tell
      objects_.erase(it);
    } else {
      objects_[key] = object;
      IndexLocked(key, object, true);
    }
  }
  if (metrics_) metrics_->events->Add({{"resource", metrics_->resource}, {"type", event.type}}).Increment();
  for (const auto& h : handlers_) {
    if (deleted) {
      if (h.on_delete) h.on_delete(*object);
    } else if (old_object == nullptr) {
      if (h.on_add) h.on_add(*object);
    } else if (h.on_update) {
      h.on_update(*old_object, *object);
    }
  }
}

Informer::WatchEnd Informer::WatchOnce(std::stop_token stop, bool* delivered) {
  std::optional<WatchEnd> ended;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.watches;
  }
  const std::string path = WatchPath(LastResourceVersion());
  absl::Status st = client_->Watch(
      path,
      [&](const WatchEvent& event) {
        if (event.type == "ERROR") {
          const int code = StatusCode(event.object);
          if (code == 410) {
            ended = WatchEnd::kGone;
          } else {
            spdlog::warn("informer: watch {} answered {}: {}", path, code,
                         event.object.value("message", event.object.dump()));
            ended = WatchEnd::kError;
          }
          return false;
        }
        *delivered = true;
        Apply(event);
        return true;
      },
      stop);
  if (stop.stop_requested()) return WatchEnd::kStopped;
  if (!st.ok() && !ended) {
    spdlog::warn("informer: watch {} failed: {}", path, st.message());
    ended = WatchEnd::kError;
  }
  if (ended == WatchEnd::kError) {
    absl::MutexLock lock(&mu_);
    ++stats_.watch_errors;
    if (metrics_) metrics_->watch_errors->Increment();
  }
  return ended.value_or(WatchEnd::kTimedOut);
}

}  // namespace distrain::kube

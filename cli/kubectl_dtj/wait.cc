// `kubectl dtj wait <job>`.
//
// Protocol:
//   1. LIST the job with fieldSelector metadata.name=<job> (so the list's
//      resourceVersion is where a watch of exactly this object can start).
//      Not there: exit 4 naming the job and namespace.
//   2. Report its state; Succeeded or Failed ends the wait at once.
//   3. WATCH from that resourceVersion (bookmarks on, timeoutSeconds so a
//      silently dead connection is replaced). Every ADDED/MODIFIED is reported;
//      a change of state is printed; DELETED ends the wait with exit 4.
//   4. A stream that ends is re-opened from the last resourceVersion seen; one
//      that breaks is re-opened after a pause; a 410 Gone (or any other ERROR
//      event) goes back to 1.
//   The watch runs on its own thread so the timeout (exit 3) interrupts it
//   promptly through its stop_token.

#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/kubectl_dtj/kubectl_dtj.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/paths.h"

namespace distrain::kubectl_dtj {
namespace {

using Json = nlohmann::json;

constexpr int64_t kWatchTimeoutSeconds = 300;

// Sleeps `d`, or less when stop is requested.
void SleepFor(std::chrono::milliseconds d, std::stop_token stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, stop, d, [] { return false; });
}

class Waiter {
 public:
  Waiter(kube::Client& client, const Target& target, const WaitOptions& options, std::ostream& out,
         std::ostream& err)
      : client_(client), target_(target), options_(options), out_(out), err_(err) {}

  // Steps 1-4; returns the exit code, or nullopt when stopped.
  std::optional<int> Run(std::stop_token stop) {
    const kube::Resource jobs{api::kGroup, api::kVersion, api::kPlural, true};
    const std::string path = kube::ResourcePath(jobs, target_.namespace_name);
    const std::string selector = absl::StrCat("metadata.name=", target_.job);
    std::string resource_version;
    bool need_list = true;
    while (!stop.stop_requested()) {
      if (need_list) {
        auto listed = client_.Request("GET", kube::WithQuery(path, {.field_selector = selector}));
        if (!listed.ok()) {
          err_ << "warning: cannot reach the API server (" << listed.status().message()
               << "); retrying\n";
          SleepFor(options_.reconnect_backoff, stop);
          continue;
        }
        if (listed->status_code == 404) {
          err_ << "error: the API server " << client_.server()
               << " does not serve distributedtrainingjobs.distrain.io; install the CRDs "
                  "(kubectl apply -f crds/ or helm install distrain charts/distrain)\n";
          return kExitError;
        }
        if (!listed->ok()) {
          err_ << "error: LIST DistributedTrainingJobs in namespace " << target_.namespace_name << ": HTTP "
               << listed->status_code << ": " << listed->message() << "\n";
          return kExitError;
        }
        const Json& items = listed->body["items"];
        if (!items.is_array() || items.empty()) {
          err_ << "error: no DistributedTrainingJob " << target_.job << " in namespace "
               << target_.namespace_name << "; kubectl get dtj -n " << target_.namespace_name << "\n";
          return kExitError;
        }
        if (std::optional<int> code = Report(items[0])) return code;
        resource_version = listed->body["metadata"].value("resourceVersion", "");
        need_list = false;
      }
      std::optional<int> code;
      absl::Status watched = client_.Watch(
          kube::WithQuery(path, {.field_selector = selector,
                                 .resource_version = resource_version,
                                 .watch = true,
                                 .allow_watch_bookmarks = true,
                                 .timeout_seconds = kWatchTimeoutSeconds}),
          [&](const kube::WatchEvent& event) {
            if (event.type == "ADDED" || event.type == "MODIFIED") {
              resource_version = kube::ResourceVersionOf(event.object);
              code = Report(event.object);
              return !code.has_value();
            }
            if (event.type == "BOOKMARK") {
              resource_version = kube::ResourceVersionOf(event.object);
              return true;
            }
            if (event.type == "DELETED") {
              err_ << "error: DistributedTrainingJob " << target_.job << " in namespace "
                   << target_.namespace_name << " was deleted while waiting (last state "
                   << last_state_ << ")\n";
              code = kExitError;
              return false;
            }
            // ERROR: 410 Gone (the resourceVersion is too old) or anything else
            // the server says: start again from a fresh LIST.
            if (event.object.value("code", 0) != 410) {
              err_ << "warning: watch: " << event.object.value("message", event.object.dump())
                   << "; listing again\n";
              SleepFor(options_.reconnect_backoff, stop);
            }
            need_list = true;
            return false;
          },
          stop);
      if (code) return code;
      if (!watched.ok() && !stop.stop_requested()) {
        err_ << "warning: " << watched.message() << "; reconnecting\n";
        SleepFor(options_.reconnect_backoff, stop);
      }
    }
    return std::nullopt;
  }

  const std::string& last_state() const { return last_state_; }

 private:
  // Prints a change of state; returns the exit code once the job is done.
  std::optional<int> Report(const Json& job) {
    const JobState state = StateOf(job);
    const std::string text = state.ToString();
    if (text != last_state_) {
      out_ << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()) << " "
           << target_.namespace_name << "/" << target_.job << ": " << text << std::endl;
      last_state_ = text;
    }
    if (state.succeeded) return kExitOk;
    if (state.failed) return kExitFailed;
    return std::nullopt;
  }

  kube::Client& client_;
  const Target target_;
  const WaitOptions options_;
  std::ostream& out_;
  std::ostream& err_;
  std::string last_state_;
};

}  // namespace

int RunWait(kube::Client& client, const Target& target, const WaitOptions& options,
            std::ostream& out, std::ostream& err) {
  Waiter waiter(client, target, options, out, err);
  std::mutex mu;
  std::condition_variable cv;
  std::optional<int> result;
  bool finished = false;
  std::jthread thread([&](std::stop_token stop) {
    std::optional<int> code = waiter.Run(stop);
    std::lock_guard<std::mutex> lock(mu);
    result = code;
    finished = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    if (options.timeout.count() > 0) {
      cv.wait_for(lock, options.timeout, [&] { return finished; });
    } else {
      cv.wait(lock, [&] { return finished; });
    }
  }
  thread.request_stop();
  thread.join();  // the waiter writes to out/err only on its thread, until here
  if (result) return *result;
  err << "error: timed out after " << absl::FormatDuration(absl::FromChrono(options.timeout))
      << " waiting for DistributedTrainingJob " << target.namespace_name << "/" << target.job
      << " to succeed or fail (last state: " << waiter.last_state() << "); raise --timeout\n";
  return kExitTimeout;
}

}  // namespace distrain::kubectl_dtj

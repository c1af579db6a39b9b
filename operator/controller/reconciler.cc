#include "operator/controller/reconciler.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "operator/controller/gang.h"
#include "operator/controller/reconcile.h"
#include "operator/kube/paths.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

kube::Resource JobsResource() { return {api::kGroup, api::kVersion, api::kPlural}; }
kube::Resource PodGroupsResource() { return {"scheduling.x-k8s.io", "v1alpha1", "podgroups"}; }

std::string Describe(const absl::StatusOr<kube::ApiResponse>& r) {
  if (!r.ok()) return std::string(r.status().message());
  return absl::StrCat("HTTP ", r->status_code, ": ", r->message());
}

Json DeleteOptions(const std::string& uid) {
  Json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"},
               {"propagationPolicy", "Background"}};
  if (!uid.empty()) body["preconditions"] = {{"uid", uid}};
  return body;
}

// Keeps the first error; later ones only add to the count in the message.
class Errors {
 public:
  void Add(absl::Status s) {
    if (s.ok()) return;
    if (first_.ok()) first_ = std::move(s);
    ++count_;
  }
  absl::Status Result() const {
    if (count_ <= 1) return first_;
    return absl::Status(first_.code(),
                        absl::StrCat(first_.message(), " (and ", count_ - 1, " more errors)"));
  }

 private:
  absl::Status first_;
  int count_ = 0;
};

}  // namespace

JobReconciler::JobReconciler(kube::Client* client, kube::Expectations* expectations,
                             ReconcilerHooks hooks, ControllerOptions options,
                             const kube::Clock* clock)
    : client_(client),
      expectations_(expectations),
      hooks_(std::move(hooks)),
      options_(std::move(options)),
      clock_(clock) {}

absl::Status JobReconciler::CreateAll(const std::string& key, const kube::Resource& resource,
                                      const std::vector<Json>& pods) {
  if (pods.empty()) return absl::OkStatus();
  // Only pods are tracked by expectations: they are what must never be
  // created twice (a second Service POST is a harmless 409).
  const bool expect = resource.plural == "pods";
  const std::string ns = pods.front()["metadata"]["namespace"];
  const std::string path = kube::ResourcePath(resource, ns);
  if (expect) expectations_->ExpectCreations(key, static_cast<int>(pods.size()));
  size_t next = 0;
  int batch = 1;
  Errors errors;
  while (next < pods.size()) {
    const size_t n = std::min(pods.size() - next, static_cast<size_t>(batch));
    std::vector<absl::Status> results(n);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        const Json& pod = pods[next + i];
        absl::StatusOr<kube::ApiResponse> r = client_->Request("POST", path, &pod);
        if (r.ok() && r->ok()) return;
        if (expect) expectations_->CreationObserved(key);  // no ADDED event will come for it
        if (r.ok() && r->conflict()) return;   // already there: the cache will show it
        results[i] = absl::UnavailableError(absl::StrCat(
            "creating ", resource.plural, " ", pod["metadata"]["name"].get<std::string>(), ": ",
            Describe(r)));
      });
    }
    for (std::thread& t : threads) t.join();
    bool failed = false;
    for (absl::Status& s : results) {
      failed = failed || !s.ok();
      errors.Add(std::move(s));
    }
    next += n;
    if (failed) {
      // Do not repeat a quota or admission error for every remaining pod.
      for (; next < pods.size(); ++next) {
        if (expect) expectations_->CreationObserved(key);
      }
      break;
    }
    batch = std::min(batch * 2, kMaxBatch);
  }
  return errors.Result();
}

absl::Status JobReconciler::DeleteObject(const std::string& path, const Deletion& deletion,
                                         bool* gone_or_stale) {
  const Json body = DeleteOptions(deletion.uid);
  absl::StatusOr<kube::ApiResponse> r = client_->Request("DELETE", path, &body);
  *gone_or_stale = r.ok() && (r->not_found() || r->conflict());
  if (r.ok() && (r->ok() || *gone_or_stale)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("deleting ", path, ": ", Describe(r)));
}

absl::StatusOr<std::optional<absl::Duration>> JobReconciler::Reconcile(const std::string& key) {
  std::optional<Json> job = hooks_.get_job(key);
  if (!job) {
    expectations_->DeleteExpectations(key);
    return std::optional<absl::Duration>();
  }
  if (!expectations_->SatisfiedExpectations(key)) return std::optional<absl::Duration>();

  const Json& metadata = (*job)["metadata"];
  const std::string ns = metadata.value("namespace", "default");
  const std::string name = metadata.value("name", "");
  const Observed observed = hooks_.observe(*job);
  const Facts facts{clock_->Now(), hooks_.pod_group_crd_installed()};
  Plan plan = ReconcileObject(*job, observed, facts, options_);

  if (plan.delete_job) {
    Deletion d{name, metadata.value("uid", ""), "TTLExpired"};
    bool gone = false;
    absl::Status s = DeleteObject(kube::ResourcePath(JobsResource(), ns, name), d, &gone);
    if (!s.ok()) return s;
    return std::optional<absl::Duration>();
  }

  Errors errors;
  if (plan.pod_group_to_create) {
    absl::StatusOr<kube::ApiResponse> r = client_->Request(
        "POST", kube::ResourcePath(PodGroupsResource(), ns), &*plan.pod_group_to_create);
    if (!(r.ok() && (r->ok() || r->conflict()))) {
      // Without the PodGroup the gang scheduler would hold the pods: stop here.
      return absl::UnavailableError(absl::StrCat("creating PodGroup ", ns, "/", name, ": ",
                                                 Describe(r)));
    }
  }
  errors.Add(CreateAll(key, kube::ServicesResource(), plan.services_to_create));
  errors.Add(CreateAll(key, kube::PodsResource(), plan.pods_to_create));

  if (!plan.pods_to_delete.empty()) {
    std::vector<std::string> uids;
    for (const Deletion& d : plan.pods_to_delete) uids.push_back(d.uid);
    expectations_->ExpectDeletions(key, uids);
    for (const Deletion& d : plan.pods_to_delete) {
      bool gone = false;
      absl::Status s =
          DeleteObject(kube::ResourcePath(kube::PodsResource(), ns, d.name), d, &gone);
      // Gone already, replaced, or not deleted: no event will lower it.
      if (gone || !s.ok()) expectations_->DeletionObserved(key, d.uid);
      errors.Add(std::move(s));
    }
  }
  for (const Deletion& d : plan.services_to_delete) {
    bool gone = false;
    errors.Add(DeleteObject(kube::ResourcePath(kube::ServicesResource(), ns, d.name), d, &gone));
  }

  bool status_written = !plan.status_changed;
  if (plan.status_changed) {
    Json object = *job;
    object["status"] = api::StatusToJson(plan.status);
    absl::StatusOr<kube::ApiResponse> r = client_->Request(
        "PUT", kube::ResourcePath(JobsResource(), ns, name, "status"), &object);
    if (r.ok() && r->ok()) {
      status_written = true;
    } else if (r.ok() && r->conflict()) {
      errors.Add(absl::AbortedError(absl::StrCat("writing the status of ", key,
                                                 ": the job changed meanwhile (", r->message(),
                                                 "); retrying with the new version")));
    } else {
      errors.Add(absl::UnavailableError(
          absl::StrCat("writing the status of ", key, ": ", Describe(r))));
    }
  }
  if (status_written) {
    for (const Event& e : plan.events) hooks_.record_event(*job, e);
  }
  if (absl::Status s = errors.Result(); !s.ok()) return s;
  return plan.requeue_after;
}

}  // namespace distrain::controller

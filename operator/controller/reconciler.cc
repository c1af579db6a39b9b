#include "operator/controller/reconciler.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "operator/controller/gang.h"
#include "operator/controller/job_identity_secret.h"
#include "operator/controller/reconcile.h"
#include "operator/kube/paths.h"

namespace distrain::controller {
namespace {

using Json = nlohmann::json;

kube::Resource JobsResource() { return {api::kGroup, api::kVersion, api::kPlural}; }
kube::Resource PodGroupsResource() { return {"scheduling.x-k8s.io", "v1alpha1", "podgroups"}; }
kube::Resource NetworkPoliciesResource() { return {"networking.k8s.io", "v1", "networkpolicies"}; }

std::string Describe(const absl::StatusOr<kube::ApiResponse>& r) {
  if (!r.ok()) return std::string(r.status().message());
  return absl::StrCat("HTTP ", r->status_code, ": ", r->message());
}

Json DeleteOptions(const std::string& uid, bool immediately) {
  Json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"},
               {"propagationPolicy", "Background"}};
  if (!uid.empty()) body["preconditions"] = {{"uid", uid}};
  if (immediately) body["gracePeriodSeconds"] = 0;
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

std::string ConfigMapExpectationsKey(const std::string& job_key) {
  return absl::StrCat(job_key, "#cluster-spec");
}

JobReconciler::JobReconciler(kube::Client* client, kube::Expectations* expectations,
                             ReconcilerHooks hooks, ControllerOptions options,
                             const kube::Clock* clock)
    : client_(client),
      expectations_(expectations),
      hooks_(std::move(hooks)),
      options_(std::move(options)),
      clock_(clock) {
  if (!hooks_.progress_watch_start) {
    hooks_.progress_watch_start = [made = clock_->Now()] { return made; };
  }
}

absl::Status JobReconciler::CreateAll(const std::string& key, const std::vector<Json>& services,
                                      const std::vector<Json>& pods) {
  // One stream, each pod after its Service, so that neither kind waits for
  // the other's slowest request.
  struct Item {
    const Json* object;
    bool pod;
  };
  std::vector<Item> items;
  items.reserve(services.size() + pods.size());
  for (size_t i = 0; i < std::max(services.size(), pods.size()); ++i) {
    if (i < services.size()) items.push_back({&services[i], false});
    if (i < pods.size()) items.push_back({&pods[i], true});
  }
  if (items.empty()) return absl::OkStatus();
  const std::string ns = (*items.front().object)["metadata"]["namespace"];
  const std::string pods_path = kube::ResourcePath(kube::PodsResource(), ns);
  const std::string services_path = kube::ResourcePath(kube::ServicesResource(), ns);
  // Only pods are tracked by expectations: they are what must never be
  // created twice (a second Service POST is a harmless 409).
  if (!pods.empty()) expectations_->ExpectCreations(key, static_cast<int>(pods.size()));

  // Slow start: one request in flight, one more allowed for every success
  // (so the window doubles with every round trip) up to kMaxBatch; the first
  // failure stops new requests. The requests run asynchronously
  // (RequestStatusOnlyAsync): this thread only hands them out as the window
  // opens, instead of a blocked thread per request in flight, whose hand-offs
  // were most of the operator's CPU in a large job's burst.
  // The window's state is shared with the callbacks, so the last one can
  // still release the mutex after this function has seen it done.
  struct Window {
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;
    int size = 1;
    bool failed = false;
  };
  auto window = std::make_shared<Window>();
  size_t next = 0;
  std::vector<absl::Status> results(items.size());
  auto finished = [&](size_t i, const absl::StatusOr<kube::ApiResponse>& r) {
    const Item& item = items[i];
    const bool ok = r.ok() && r->ok();
    if (!ok && item.pod) expectations_->CreationObserved(key);  // no ADDED event will come
    // 409: already there, the cache will show it.
    const bool error = !ok && !(r.ok() && r->conflict());
    if (error) {
      results[i] = absl::UnavailableError(
          absl::StrCat("creating ", item.pod ? "pods " : "services ",
                       (*item.object)["metadata"]["name"].get<std::string>(), ": ",
                       Describe(r)));
    }
  };
  {
    std::unique_lock<std::mutex> lock(window->mu);
    while (true) {
      window->cv.wait(lock, [&] {
        return window->failed || next >= items.size() || window->in_flight < window->size;
      });
      if (window->failed || next >= items.size()) break;
      const size_t i = next++;
      ++window->in_flight;
      lock.unlock();
      const Item& item = items[i];
      client_->RequestStatusOnlyAsync(
          "POST", item.pod ? pods_path : services_path, item.object,
          [window, &finished, i](absl::StatusOr<kube::ApiResponse> r) {
            finished(i, r);
            const bool error = !(r.ok() && (r->ok() || r->conflict()));
            std::lock_guard<std::mutex> lock(window->mu);
            --window->in_flight;
            // Do not repeat a quota or admission error for every remaining child.
            if (error) window->failed = true;
            if (!error) window->size = std::min(window->size + 1, kMaxBatch);
            window->cv.notify_one();
          });
      lock.lock();
    }
    window->cv.wait(lock, [&] { return window->in_flight == 0; });
  }
  // Pods never sent will never be observed either.
  for (size_t i = next; i < items.size(); ++i) {
    if (items[i].pod) expectations_->CreationObserved(key);
  }
  Errors errors;
  for (absl::Status& s : results) errors.Add(std::move(s));
  return errors.Result();
}

absl::Status JobReconciler::ApplyConfigMap(const std::string& key, const std::string& ns,
                                           const Plan& plan) {
  const bool create = plan.config_map_to_create.has_value();
  const Json* object = create ? &*plan.config_map_to_create : &*plan.config_map_to_update;
  const std::string name = (*object)["metadata"].value("name", "");
  const std::string expect_key = ConfigMapExpectationsKey(key);
  expectations_->ExpectCreations(expect_key, 1);
  absl::StatusOr<kube::ApiResponse> r =
      create ? client_->RequestStatusOnly("POST",
                                          kube::ResourcePath(kube::ConfigMapsResource(), ns), object)
             : client_->RequestStatusOnly(
                   "PUT", kube::ResourcePath(kube::ConfigMapsResource(), ns, name), object);
  if (r.ok() && r->ok()) return absl::OkStatus();
  expectations_->CreationObserved(expect_key);  // no informer event will come for it
  if (r.ok() && r->conflict()) {
    // Created or changed by someone else since the cache was filled: retry
    // once the informer shows the current object.
    return absl::AbortedError(absl::StrCat(create ? "creating" : "updating", " ConfigMap ", ns, "/",
                                           name, ": ", r->message(), "; retrying"));
  }
  return absl::UnavailableError(absl::StrCat(create ? "creating" : "updating", " ConfigMap ", ns,
                                             "/", name, ": ", Describe(r)));
}

absl::Status JobReconciler::DeleteObject(const std::string& path, const Deletion& deletion,
                                         bool* gone_or_stale) {
  const Json body = DeleteOptions(deletion.uid, deletion.finished);
  absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly("DELETE", path, &body);
  *gone_or_stale = r.ok() && (r->not_found() || r->conflict());
  if (r.ok() && (r->ok() || *gone_or_stale)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("deleting ", path, ": ", Describe(r)));
}

absl::StatusOr<std::optional<absl::Duration>> JobReconciler::Reconcile(const std::string& key) {
  std::optional<Json> job = hooks_.get_job(key);
  if (!job) {
    expectations_->DeleteExpectations(key);
    expectations_->DeleteExpectations(ConfigMapExpectationsKey(key));
    return std::optional<absl::Duration>();
  }
  if (!expectations_->SatisfiedExpectations(key) ||
      !expectations_->SatisfiedExpectations(ConfigMapExpectationsKey(key))) {
    return std::optional<absl::Duration>();
  }

  const Json& metadata = (*job)["metadata"];
  const std::string ns = metadata.value("namespace", "default");
  const std::string name = metadata.value("name", "");
  const Observed observed = hooks_.observe(*job);
  const Facts facts{clock_->Now(), hooks_.pod_group_crd_installed(),
                    hooks_.progress_watch_start()};
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
  if (plan.pod_group_to_update) {
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
        "PUT", kube::ResourcePath(PodGroupsResource(), ns, name), &*plan.pod_group_to_update);
    // A conflict means the PodGroup moved on; the next reconcile sees it.
    if (!(r.ok() && r->ok())) {
      errors.Add(absl::UnavailableError(
          absl::StrCat("updating PodGroup ", ns, "/", name, " minMember: ", Describe(r))));
    }
  }
  absl::Status config_map = absl::OkStatus();
  if (plan.config_map_to_create || plan.config_map_to_update) {
    config_map = ApplyConfigMap(key, ns, plan);
    errors.Add(config_map);
  }
  // The NetworkPolicy: a pod is only created once its policy exists (an
  // update that fails leaves the old policy, which still selects the pods).
  bool policy_in_place = true;
  if (plan.network_policy_to_create) {
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
        "POST", kube::ResourcePath(NetworkPoliciesResource(), ns), &*plan.network_policy_to_create);
    // 409: there already (a cache that has not seen our earlier create).
    policy_in_place = r.ok() && (r->ok() || r->conflict());
    if (!policy_in_place) {
      errors.Add(absl::UnavailableError(absl::StrCat(
          "creating NetworkPolicy ", ns, "/",
          (*plan.network_policy_to_create)["metadata"].value("name", ""), ": ", Describe(r),
          "; the job's pods are created once it exists")));
    }
  }
  if (plan.network_policy_to_update) {
    const std::string policy = (*plan.network_policy_to_update)["metadata"].value("name", "");
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
        "PUT", kube::ResourcePath(NetworkPoliciesResource(), ns, policy),
        &*plan.network_policy_to_update);
    if (r.ok() && r->conflict()) {
      errors.Add(absl::AbortedError(absl::StrCat("updating NetworkPolicy ", ns, "/", policy, ": ",
                                                 r->message(), "; retrying")));
    } else if (!(r.ok() && r->ok())) {
      errors.Add(absl::UnavailableError(
          absl::StrCat("updating NetworkPolicy ", ns, "/", policy, ": ", Describe(r))));
    }
  }
  // The checkpoint claim (checkpoint_volume.h): a pod that mounts a claim
  // that is not there would wait unschedulable, so none is created without it.
  bool claim_in_place = true;
  if (plan.checkpoint_claim_to_create) {
    const std::string claim = (*plan.checkpoint_claim_to_create)["metadata"].value("name", "");
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
        "POST", kube::ResourcePath(kube::PersistentVolumeClaimsResource(), ns),
        &*plan.checkpoint_claim_to_create);
    // 409: there already (a cache that has not seen our earlier create).
    claim_in_place = r.ok() && (r->ok() || r->conflict());
    if (!claim_in_place) {
      errors.Add(absl::UnavailableError(absl::StrCat(
          "creating PersistentVolumeClaim ", ns, "/", claim, " for the job's checkpoints: ",
          Describe(r), "; the job's pods are created once it exists")));
    }
  }
  // The job's identity Secret (job_identity_secret.h) holds a certificate
  // for every pod about to be created before any of them is.
  bool identity_in_place = true;
  if (!plan.pods_to_create.empty()) {
    absl::Status s = EnsureJobIdentity(*client_, *job, plan.pods_to_create);
    identity_in_place = s.ok();
    errors.Add(std::move(s));
  }
  // No pod without its ConfigMap (it would wait for it in the kubelet), its
  // NetworkPolicy, its checkpoint claim or its credentials.
  errors.Add(CreateAll(key, plan.services_to_create,
                       config_map.ok() && policy_in_place && claim_in_place && identity_in_place
                           ? plan.pods_to_create
                           : std::vector<Json>()));

  // Kueue's retriable-in-group annotation on a finished job's pods (kueue.h),
  // before the deletions below. 404: gone; 409: replaced (the uid in the patch).
  for (const PodPatch& p : plan.pods_to_patch) {
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
        "PATCH", kube::ResourcePath(kube::PodsResource(), ns, p.name), &p.patch,
        "application/merge-patch+json");
    if (!(r.ok() && (r->ok() || r->not_found() || r->conflict()))) {
      errors.Add(absl::UnavailableError(
          absl::StrCat("annotating pod ", ns, "/", p.name, " for Kueue: ", Describe(r))));
    }
  }

  // The status goes before pod deletions: a deletion is what a restart
  // counts, and once the pod is gone no later reconcile can count it again,
  // so a restart whose status write failed (a 409 from a stale cache) would
  // be lost and backoffLimit never reached. A failed write skips the
  // deletions; the retry decides them again from the fresh job.
  bool status_written = !plan.status_changed;
  auto write_status = [&] {
    Json object = *job;
    object["status"] = api::StatusToJson(plan.status);
    absl::StatusOr<kube::ApiResponse> r = client_->RequestStatusOnly(
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
  };
  if (plan.status_changed && !plan.pods_to_delete.empty()) write_status();

  if (!plan.pods_to_delete.empty() && status_written) {
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

  if (plan.status_changed && plan.pods_to_delete.empty()) write_status();
  if (status_written) {
    for (const Event& e : plan.events) hooks_.record_event(*job, e);
  }
  if (absl::Status s = errors.Result(); !s.ok()) return s;
  return plan.requeue_after;
}

}  // namespace distrain::controller

#include "operator/manager.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics_server.h"
#include "operator/api/distributed_training_job.h"
#include "operator/controller/checkpoint_volume.h"
#include "operator/controller/network_policy.h"
#include "operator/controller/pods.h"
#include "operator/controller/reconcile.h"
#include "operator/controller/reconciler.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/expectations.h"
#include "operator/kube/informer.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/leader_election.h"
#include "operator/kube/paths.h"
#include "operator/kube/rest_client.h"
#include "operator/kube/workqueue.h"
#include "operator/progress_reporter.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace distrain {
namespace {

using Json = nlohmann::json;
constexpr char kControllerName[] = "distributedtrainingjob";
// Index of the pod and Service informers: the owning job's "namespace/name".
constexpr char kJobIndex[] = "job";

kube::Resource JobsResource() { return {api::kGroup, api::kVersion, api::kPlural, true}; }
kube::Resource PodGroupsResource() { return {"scheduling.x-k8s.io", "v1alpha1", "podgroups", true}; }
kube::Resource NetworkPoliciesResource() { return {"networking.k8s.io", "v1", "networkpolicies", true}; }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The owning job's key of a child object: its namespace + the job-name label.
std::optional<std::string> OwnerJobKey(const Json& child) {
  const Json* labels = nullptr;
  if (child.contains("metadata") && child["metadata"].contains("labels")) {
    labels = &child["metadata"]["labels"];
  }
  if (labels == nullptr || !labels->contains(api::kLabelJobName) ||
      !(*labels)[api::kLabelJobName].is_string()) {
    return std::nullopt;
  }
  return kube::ObjectKey(child.value("/metadata/namespace"_json_pointer, std::string()),
                         (*labels)[api::kLabelJobName].get<std::string>());
}

std::string Uid(const Json& object) {
  return object.value("/metadata/uid"_json_pointer, std::string());
}

// Condition types that are True in a status JSON.
std::set<std::string> TrueConditions(const Json& status) {
  std::set<std::string> out;
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) {
    return out;
  }
  for (const Json& c : status["conditions"]) {
    if (c.value("status", "") == "True") out.insert(c.value("type", ""));
  }
  return out;
}

}  // namespace

struct Manager::Impl {
  ManagerOptions options;
  kube::RestConfig rest_config;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<kube::RestClient> client;
  std::unique_ptr<kube::WorkQueue> queue;
  std::unique_ptr<kube::Expectations> expectations;
  std::unique_ptr<kube::EventRecorder> recorder;
  controller::ControllerOptions controller_options;
  std::unique_ptr<controller::JobReconciler> reconciler;

  // One informer of each kind per watched namespace ("" = all namespaces).
  struct NamespaceInformers {
    std::unique_ptr<kube::Informer> jobs, pods, services, config_maps;
    std::unique_ptr<kube::Informer> network_policies;  // null with --network-policy=false
    std::unique_ptr<kube::Informer> checkpoint_claims;  // null with --checkpoint-volumes=false
  };
  std::map<std::string, NamespaceInformers> informers;

  std::atomic<bool> leading{false};
  std::atomic<bool> synced{false};
  std::atomic<bool> pod_group_crd{false};
  // When this process became leader and began scraping progress (unix ns).
  std::atomic<int64_t> leading_since_ns{0};
  std::atomic<bool> lost_lease{false};

  // Metrics.
  prometheus::Family<prometheus::Counter>* reconcile_total = nullptr;
  prometheus::Counter* reconcile_errors = nullptr;
  prometheus::Histogram* reconcile_seconds = nullptr;
  prometheus::Gauge* active_workers = nullptr;
  prometheus::Family<prometheus::Counter>* jobs_created = nullptr;
  prometheus::Family<prometheus::Counter>* jobs_succeeded = nullptr;
  prometheus::Family<prometheus::Counter>* jobs_failed = nullptr;
  prometheus::Family<prometheus::Counter>* jobs_restarted = nullptr;

  void InitMetrics();
  absl::Status Lead(std::stop_token stop);
  void StartInformers();
  void StopInformers();
  bool InformersSynced() const;
  void CheckPodGroupCrd();
  void Worker();
  kube::Informer* InformerFor(const std::string& ns, int kind);
  std::vector<Json> Children(const std::string& ns, const std::string& job, int kind);
  std::vector<controller::ObjectRef> ChildrenShared(const std::string& ns, const std::string& job,
                                                    int kind);
  void CountTransitions(const Json& job, const Json& old_status, const Json& new_status);
};

void Manager::Impl::InitMetrics() {
  const prometheus::Labels controller = {{"controller", kControllerName}};
  reconcile_total = &prometheus::BuildCounter()
                         .Name("controller_runtime_reconcile_total")
                         .Help("Total number of reconciliations per controller")
                         .Register(*registry);
  for (const char* result : {"success", "error", "requeue", "requeue_after"}) {
    reconcile_total->Add({{"controller", kControllerName}, {"result", result}});
  }
  reconcile_errors = &prometheus::BuildCounter()
                          .Name("controller_runtime_reconcile_errors_total")
                          .Help("Total number of reconciliation errors per controller")
                          .Register(*registry)
                          .Add(controller);
  reconcile_seconds =
      &prometheus::BuildHistogram()
           .Name("controller_runtime_reconcile_time_seconds")
           .Help("Length of time per reconciliation per controller")
           .Register(*registry)
           .Add(controller, prometheus::Histogram::BucketBoundaries{
                                0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4,
                                0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5,
                                3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60});
  prometheus::BuildGauge()
      .Name("controller_runtime_max_concurrent_reconciles")
      .Help("Maximum number of concurrent reconciles per controller")
      .Register(*registry)
      .Add(controller)
      .Set(options.concurrent_reconciles);
  active_workers = &prometheus::BuildGauge()
                        .Name("controller_runtime_active_workers")
                        .Help("Number of currently used workers per controller")
                        .Register(*registry)
                        .Add(controller);
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry);
  };
  jobs_created = counter("distrain_jobs_created_total", "Jobs whose pods were first created");
  jobs_succeeded = counter("distrain_jobs_succeeded_total", "Jobs that reached Succeeded");
  jobs_failed = counter("distrain_jobs_failed_total", "Jobs that reached Failed");
  jobs_restarted = counter("distrain_jobs_restarted_total", "Job restarts (pods recreated after a failure)");
}

kube::Informer* Manager::Impl::InformerFor(const std::string& ns, int kind) {
  auto it = informers.find(options.namespaces.empty() ? std::string() : ns);
  if (it == informers.end()) return nullptr;
  switch (kind) {
    case 0:
      return it->second.jobs.get();
    case 1:
      return it->second.pods.get();
    case 2:
      return it->second.services.get();
    case 4:
      return it->second.network_policies.get();
    case 5:
      return it->second.checkpoint_claims.get();
    default:
      return it->second.config_maps.get();
  }
}

std::vector<Json> Manager::Impl::Children(const std::string& ns, const std::string& job, int kind) {
  kube::Informer* informer = InformerFor(ns, kind);
  if (informer == nullptr) return {};
  std::vector<Json> out;
  for (Json& object : informer->ByIndex(kJobIndex, kube::ObjectKey(ns, job))) {
    out.push_back(std::move(object));
  }
  return out;
}

std::vector<controller::ObjectRef> Manager::Impl::ChildrenShared(const std::string& ns,
                                                                 const std::string& job, int kind) {
  kube::Informer* informer = InformerFor(ns, kind);
  if (informer == nullptr) return {};
  return informer->ByIndexShared(kJobIndex, kube::ObjectKey(ns, job));
}

void Manager::Impl::StartInformers() {
  std::vector<std::string> namespaces = options.namespaces;
  if (namespaces.empty()) namespaces.push_back("");
  const std::string selector = api::kLabelJobName;  // "has the label"
  for (const std::string& ns : namespaces) {
    NamespaceInformers& set = informers[ns];
    set.jobs = std::make_unique<kube::Informer>(
        client.get(), kube::InformerOptions{.resource = JobsResource(), .namespace_name = ns,
                                            .registry = registry});
    set.pods = std::make_unique<kube::Informer>(
        client.get(), kube::InformerOptions{.resource = kube::PodsResource(), .namespace_name = ns,
                                            .label_selector = selector, .registry = registry});
    set.services = std::make_unique<kube::Informer>(
        client.get(), kube::InformerOptions{.resource = kube::ServicesResource(),
                                            .namespace_name = ns, .label_selector = selector,
                                            .registry = registry});
    // The jobs' cluster-spec ConfigMaps (controller/pods.h), looked up by name.
    set.config_maps = std::make_unique<kube::Informer>(
        client.get(), kube::InformerOptions{.resource = kube::ConfigMapsResource(),
                                            .namespace_name = ns, .label_selector = selector,
                                            .registry = registry});
    // The jobs' NetworkPolicies (controller/network_policy.h), looked up by name.
    if (options.network_policy) {
      set.network_policies = std::make_unique<kube::Informer>(
          client.get(), kube::InformerOptions{.resource = NetworkPoliciesResource(),
                                              .namespace_name = ns, .label_selector = selector,
                                              .registry = registry});
      auto enqueue = [this](const Json& p) {
        if (auto key = OwnerJobKey(p)) queue->Add(*key);
      };
      set.network_policies->AddHandlers({
          .on_add = enqueue,
          .on_update = [enqueue](const Json&, const Json& p) { enqueue(p); },
          .on_delete = enqueue,
      });
    }
    // The jobs' checkpoint claims (controller/checkpoint_volume.h), looked up by name.
    if (options.checkpoint_volumes) {
      set.checkpoint_claims = std::make_unique<kube::Informer>(
          client.get(), kube::InformerOptions{.resource = kube::PersistentVolumeClaimsResource(),
                                              .namespace_name = ns, .label_selector = selector,
                                              .registry = registry});
      auto enqueue = [this](const Json& c) {
        if (auto key = OwnerJobKey(c)) queue->Add(*key);
      };
      set.checkpoint_claims->AddHandlers({
          .on_add = enqueue,
          .on_update = [enqueue](const Json&, const Json& c) { enqueue(c); },
          .on_delete = enqueue,
      });
    }
    for (kube::Informer* child : {set.pods.get(), set.services.get()}) {
      child->AddIndex(kJobIndex, [](const Json& object) {
        std::optional<std::string> key = OwnerJobKey(object);
        return key ? std::vector<std::string>{*key} : std::vector<std::string>{};
      });
    }
    set.jobs->AddHandlers({
        .on_add = [this](const Json& job) { queue->Add(kube::ObjectKey(job)); },
        .on_update =
            [this](const Json& old_job, const Json& job) {
              CountTransitions(job, old_job.value("status", Json()), job.value("status", Json()));
              queue->Add(kube::ObjectKey(job));
            },
        .on_delete =
            [this](const Json& job) {
              const std::string key = kube::ObjectKey(job);
              expectations->DeleteExpectations(key);
              expectations->DeleteExpectations(controller::ConfigMapExpectationsKey(key));
              queue->Add(key);
            },
    });
    set.pods->AddHandlers({
        .on_add =
            [this](const Json& pod) {
              if (auto key = OwnerJobKey(pod)) {
                expectations->CreationObserved(*key);
                queue->Add(*key);
              }
            },
        .on_update =
            [this](const Json&, const Json& pod) {
              if (auto key = OwnerJobKey(pod)) queue->Add(*key);
            },
        .on_delete =
            [this](const Json& pod) {
              if (auto key = OwnerJobKey(pod)) {
                expectations->DeletionObserved(*key, Uid(pod));
                queue->Add(*key);
              }
            },
    });
    set.services->AddHandlers({
        .on_add = [this](const Json& s) { if (auto key = OwnerJobKey(s)) queue->Add(*key); },
        .on_update = [this](const Json&, const Json& s) { if (auto key = OwnerJobKey(s)) queue->Add(*key); },
        .on_delete = [this](const Json& s) { if (auto key = OwnerJobKey(s)) queue->Add(*key); },
    });
    // A write of the reconciler is observed by an add (create) or an update (PUT).
    auto config_map_seen = [this](const Json& cm) {
      if (auto key = OwnerJobKey(cm)) {
        expectations->CreationObserved(controller::ConfigMapExpectationsKey(*key));
        queue->Add(*key);
      }
    };
    set.config_maps->AddHandlers({
        .on_add = config_map_seen,
        .on_update = [config_map_seen](const Json&, const Json& cm) { config_map_seen(cm); },
        .on_delete = [this](const Json& cm) { if (auto key = OwnerJobKey(cm)) queue->Add(*key); },
    });
    set.jobs->Start();
    set.pods->Start();
    set.services->Start();
    set.config_maps->Start();
    if (set.network_policies) set.network_policies->Start();
    if (set.checkpoint_claims) set.checkpoint_claims->Start();
  }
}

void Manager::Impl::StopInformers() {
  for (auto& [ns, set] : informers) {
    for (kube::Informer* i : {set.jobs.get(), set.pods.get(), set.services.get(),
                              set.config_maps.get(), set.network_policies.get(),
                              set.checkpoint_claims.get()}) {
      if (i != nullptr) i->Stop();
    }
  }
}

bool Manager::Impl::InformersSynced() const {
  for (const auto& [ns, set] : informers) {
    for (const kube::Informer* i :
         {set.jobs.get(), set.pods.get(), set.services.get(), set.config_maps.get()}) {
      if (i == nullptr || !i->HasSynced()) return false;
    }
    if (options.network_policy &&
        (set.network_policies == nullptr || !set.network_policies->HasSynced())) {
      return false;
    }
    if (options.checkpoint_volumes &&
        (set.checkpoint_claims == nullptr || !set.checkpoint_claims->HasSynced())) {
      return false;
    }
  }
  return !informers.empty();
}

void Manager::Impl::CheckPodGroupCrd() {
  auto r = client->Request(
      "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podgroups.scheduling.x-k8s.io");
  if (r.ok() && (r->ok() || r->not_found())) pod_group_crd = r->ok();
}

void Manager::Impl::CountTransitions(const Json& job, const Json& old_status, const Json& new_status) {
  const std::set<std::string> before = TrueConditions(old_status);
  const std::set<std::string> after = TrueConditions(new_status);
  const prometheus::Labels labels = {
      {"namespace", job.value("/metadata/namespace"_json_pointer, std::string())},
      {"strategy", job.value("/spec/strategy"_json_pointer, std::string("Auto"))}};
  auto became = [&](const char* type) { return after.count(type) && !before.count(type); };
  if (became(api::kConditionCreated)) jobs_created->Add(labels).Increment();
  if (became(api::kConditionSucceeded)) jobs_succeeded->Add(labels).Increment();
  if (became(api::kConditionFailed)) jobs_failed->Add(labels).Increment();
  const int64_t old_restarts = old_status.is_object() ? old_status.value("restartCount", int64_t{0}) : 0;
  const int64_t new_restarts = new_status.is_object() ? new_status.value("restartCount", int64_t{0}) : 0;
  if (new_restarts > old_restarts) jobs_restarted->Add(labels).Increment(double(new_restarts - old_restarts));
}

void Manager::Impl::Worker() {
  while (true) {
    std::optional<std::string> key = queue->Get();
    if (!key) return;
    active_workers->Increment();
    const absl::Time start = absl::Now();
    absl::StatusOr<std::optional<absl::Duration>> result = reconciler->Reconcile(*key);
    reconcile_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
    active_workers->Decrement();
    if (!result.ok()) {
      reconcile_total->Add({{"controller", kControllerName}, {"result", "error"}}).Increment();
      reconcile_errors->Increment();
      if (result.status().code() == absl::StatusCode::kAborted) {
        spdlog::debug("{}: {}", *key, result.status().message());
      } else {
        spdlog::warn("{}: reconcile failed (retrying with backoff): {}", *key, result.status().message());
      }
      queue->AddRateLimited(*key);
    } else if (result->has_value()) {
      reconcile_total->Add({{"controller", kControllerName}, {"result", "requeue_after"}}).Increment();
      queue->Forget(*key);
      queue->AddAfter(*key, **result);
    } else {
      reconcile_total->Add({{"controller", kControllerName}, {"result", "success"}}).Increment();
      queue->Forget(*key);
    }
    queue->Done(*key);
  }
}

absl::Status Manager::Impl::Lead(std::stop_token stop) {
  spdlog::info("leading: starting informers for {}",
               options.namespaces.empty() ? std::string("all namespaces")
                                          : absl::StrJoin(options.namespaces, ", "));
  leading_since_ns = absl::ToUnixNanos(absl::Now());
  leading = true;
  CheckPodGroupCrd();
  StartInformers();
  while (!InformersSynced()) {
    if (stop.stop_requested()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  synced = true;
  spdlog::info("caches synced; {} reconcile workers", options.concurrent_reconciles);
  std::vector<std::thread> workers;
  for (int i = 0; i < options.concurrent_reconciles; ++i) workers.emplace_back([this] { Worker(); });
  ProgressReporter progress(client.get(),
                            {.jobs =
                                 [this] {
                                   std::vector<Json> all;
                                   for (auto& [ns, set] : informers) {
                                     for (Json& j : set.jobs->List()) all.push_back(std::move(j));
                                   }
                                   return all;
                                 },
                             .pods = [this](const std::string& ns,
                                            const std::string& job) { return Children(ns, job, 1); }},
                            {.scrape = {.max_response_bytes = options.progress_scrape_max_bytes,
                                        .timeout = options.progress_scrape_timeout,
                                        .max_in_flight = options.progress_scrape_concurrency}});
  progress.Start();
  // Re-check the PodGroup CRD now and then: scheduler-plugins may be installed later.
  absl::Time next_crd_check = absl::Now() + absl::Minutes(1);
  while (!stop.stop_requested()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (absl::Now() >= next_crd_check) {
      CheckPodGroupCrd();
      next_crd_check = absl::Now() + absl::Minutes(1);
    }
  }
  progress.Stop();
  queue->ShutDown();
  for (std::thread& t : workers) t.join();
  StopInformers();
  leading = false;
  return absl::OkStatus();
}

Manager::Manager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Manager::~Manager() = default;

absl::StatusOr<std::unique_ptr<Manager>> Manager::Create(const ManagerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto config = kube::LoadRestConfig({.kubeconfig_path = options.kubeconfig, .context = options.context});
  if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
  impl->rest_config = *config;
  if (!config->ca_pem.empty()) {
    // cpprestsdk calls set_default_verify_paths on every new connection's
    // context, which parses the system CA bundle ($SSL_CERT_FILE or
    // OpenSSL's default, ~140 PEM certificates through OpenSSL 3's decoders)
    // only for RestClient to replace the store with the cluster's CA: two
    // thirds of the operator's CPU while creating a 500-pod job. With a CA
    // given the system store is never consulted (rest_client.h), so point
    // OpenSSL's default file at nothing. Set here, before the client's threads
    // exist; nothing else in this process uses OpenSSL's default paths.
    setenv("SSL_CERT_FILE", "/dev/null", /*overwrite=*/1);
  }
  auto client = kube::RestClient::Create(
      *config, {.qps = options.qps, .burst = options.burst, .registry = impl->registry});
  if (!client.ok()) return absl::InvalidArgumentError(client.status().message());
  impl->client = std::move(*client);
  impl->queue = std::make_unique<kube::WorkQueue>(
      kube::WorkQueueOptions{.name = kControllerName, .registry = impl->registry});
  impl->expectations = std::make_unique<kube::Expectations>();
  impl->recorder = std::make_unique<kube::EventRecorder>(impl->client.get());
  if (!options.default_worker_image.empty()) {
    impl->controller_options.default_image = options.default_worker_image;
  }
  if (!options.default_worker_cuda_image.empty()) {
    impl->controller_options.default_gpu_image = options.default_worker_cuda_image;
  }
  impl->controller_options.checkpoint_storage = {
      .provision = options.checkpoint_volumes,
      .storage_class = options.checkpoint_storage_class,
      .size = options.checkpoint_storage_size,
      .access_mode = options.checkpoint_access_mode,
  };
  impl->controller_options.cluster_domain = options.cluster_domain;
  impl->controller_options.network_policy.enabled = options.network_policy;
  for (const std::string& peer : options.network_policy_metrics_peers) {
    Json parsed = Json::parse(peer, nullptr, /*allow_exceptions=*/false);
    bool valid = parsed.is_object() && !parsed.empty();
    for (auto it = parsed.begin(); valid && it != parsed.end(); ++it) {
      valid = (it.key() == "podSelector" || it.key() == "namespaceSelector" ||
               it.key() == "ipBlock") && it.value().is_object();
    }
    if (!valid) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--network-policy-metrics-peer: want a NetworkPolicyPeer as JSON, an object of "
          "podSelector, namespaceSelector and/or ipBlock objects, got ", peer));
    }
    impl->controller_options.network_policy.metrics_peers.push_back(std::move(parsed));
  }
  if (options.network_policy_metrics_peers.empty() && !Env("POD_NAMESPACE").empty()) {
    // In a cluster without explicit peers: the operator's own namespace, so
    // the progress scrape keeps working.
    impl->controller_options.network_policy.metrics_peers.push_back(
        {{"namespaceSelector",
          {{"matchLabels", {{"kubernetes.io/metadata.name", Env("POD_NAMESPACE")}}}}}});
  }
  impl->InitMetrics();
  Impl* m = impl.get();
  impl->reconciler = std::make_unique<controller::JobReconciler>(
      impl->client.get(), impl->expectations.get(),
      controller::ReconcilerHooks{
          .get_job =
              [m](const std::string& key) -> std::optional<Json> {
                kube::Informer* jobs = m->InformerFor(kube::SplitObjectKey(key).first, 0);
                return jobs == nullptr ? std::nullopt : jobs->Get(key);
              },
          .observe =
              [m](const Json& job) {
                const std::string ns = job["metadata"].value("namespace", "");
                const std::string name = job["metadata"].value("name", "");
                controller::Observed observed;
                observed.pods = m->ChildrenShared(ns, name, 1);
                observed.services = m->ChildrenShared(ns, name, 2);
                if (kube::Informer* cms = m->InformerFor(ns, 3)) {
                  observed.cluster_config_map =
                      cms->Get(ns, controller::ClusterConfigMapName(name));
                }
                if (kube::Informer* policies = m->InformerFor(ns, 4)) {
                  observed.network_policy =
                      policies->Get(ns, controller::NetworkPolicyName(name));
                }
                if (kube::Informer* claims = m->InformerFor(ns, 5)) {
                  observed.checkpoint_claim =
                      claims->Get(ns, controller::CheckpointClaimName(name));
                }
                if (m->pod_group_crd && job.contains("spec") &&
                    job["spec"].value("/runPolicy/scheduling/gang"_json_pointer, false)) {
                  auto r = m->client->Request("GET", kube::ResourcePath(PodGroupsResource(), ns, name));
                  if (r.ok() && r->ok()) observed.pod_group = r->body;
                }
                return observed;
              },
          .pod_group_crd_installed = [m] { return m->pod_group_crd.load(); },
          .progress_watch_start =
              [m] {
                const int64_t ns = m->leading_since_ns.load();
                return ns == 0 ? absl::Now() : absl::FromUnixNanos(ns);
              },
          .record_event =
              [m](const Json& job, const controller::Event& e) {
                m->recorder->Event(job,
                                   e.type == "Warning" ? kube::EventType::kWarning
                                                       : kube::EventType::kNormal,
                                   e.reason, "Reconcile", e.note);
              },
      },
      impl->controller_options);
  return std::unique_ptr<Manager>(new Manager(std::move(impl)));
}

bool Manager::Healthy() const { return !impl_->lost_lease; }

// Ready once the caches are synced, or while standing by for the lease: a
// standby replica is healthy and must not be restarted or taken out of a
// Service for not leading.
bool Manager::Ready() const { return impl_->synced || (impl_->options.leader_elect && !impl_->leading); }

absl::Status Manager::Run(std::stop_token stop) {
  Impl& m = *impl_;
  std::unique_ptr<MetricsServer> metrics, health;
  if (m.options.metrics_port > 0) {
    auto s = MetricsServer::Start(m.options.metrics_host, m.options.metrics_port, m.registry);
    if (!s.ok()) return s.status();
    metrics = std::move(*s);
  }
  if (m.options.health_port > 0) {
    auto s = MetricsServer::Start(m.options.health_host, m.options.health_port, m.registry,
                                  [this] { return Healthy(); }, [this] { return Ready(); });
    if (!s.ok()) return s.status();
    health = std::move(*s);
  }
  spdlog::info("distrain-operator {} against {} as {} (metrics :{}, probes :{})", DISTRAIN_VERSION,
               m.client->server(), m.rest_config.source, m.options.metrics_port,
               m.options.health_port);

  absl::Status result = absl::OkStatus();
  if (!m.options.leader_elect) {
    result = m.Lead(stop);
  } else {
    std::string lease_ns = m.options.leader_election_namespace;
    if (lease_ns.empty()) lease_ns = Env("POD_NAMESPACE");
    if (lease_ns.empty()) lease_ns = m.client->default_namespace();
    absl::Status lead_status = absl::OkStatus();
    kube::LeaderElectionConfig config{
        .lease_namespace = lease_ns,
        .lease_name = m.options.leader_election_id,
        .lease_duration = m.options.lease_duration,
        .renew_deadline = m.options.renew_deadline,
        .retry_period = m.options.retry_period,
        .registry = m.registry,
        .on_started_leading = [&](std::stop_token leading) { lead_status = m.Lead(leading); },
        .on_stopped_leading = [&] {
          if (!stop.stop_requested()) m.lost_lease = true;
        },
        .on_new_leader = [](const std::string& id) { spdlog::info("leader is now {}", id); },
    };
    auto elector = kube::LeaderElector::Create(m.client.get(), std::move(config));
    if (!elector.ok()) return elector.status();
    spdlog::info("waiting to lead through Lease {}/{} as {}", lease_ns, m.options.leader_election_id,
                 (*elector)->identity());
    (*elector)->Run(stop);
    if (m.lost_lease) {
      result = absl::AbortedError("leader election lost: exiting so a fresh process starts clean");
    } else if (!lead_status.ok()) {
      result = lead_status;
    }
  }
  m.recorder->Flush(absl::Seconds(3));
  return result;
}

}  // namespace distrain

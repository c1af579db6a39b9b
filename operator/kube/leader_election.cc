#include "operator/kube/leader_election.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/logging.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/paths.h"
#include "operator/kube/rate_limiter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace distrain::kube {
namespace {

// client-go's JitterFactor for the acquire loop and the renew-deadline rule.
constexpr double kJitterFactor = 1.2;

std::string DurationString(absl::Duration d) { return absl::FormatDuration(d); }

int64_t IntOr(const nlohmann::json& obj, const char* field, int64_t fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(field);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

std::string StringOr(const nlohmann::json& obj, const char* field) {
  if (!obj.is_object()) return "";
  auto it = obj.find(field);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string DescribeFailure(const absl::StatusOr<ApiResponse>& r) {
  if (!r.ok()) return r.status().ToString();
  return absl::StrCat("HTTP ", r->status_code, ": ", r->message());
}

}  // namespace

std::string DefaultLeaderIdentity() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "unknown");
  }
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  const uint64_t hi = gen(), lo = gen();
  // A version-4 UUID.
  return absl::StrFormat("%s_%08x-%04x-4%03x-%04x-%012x", host, hi >> 32, (hi >> 16) & 0xffff,
                         hi & 0x0fff, ((lo >> 48) & 0x3fff) | 0x8000, lo & 0xffffffffffffULL);
}

absl::StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::Create(Client* client,
                                                                     LeaderElectionConfig config) {
  DISTRAIN_CHECK(client != nullptr);
  DISTRAIN_CHECK(config.clock != nullptr);
  if (config.lease_name.empty() || config.lease_namespace.empty()) {
    return absl::InvalidArgumentError(
        "leader election: lease_name and lease_namespace must both be set (the Lease that "
        "replicas compete for, e.g. distrain-operator in the operator's namespace)");
  }
  if (config.identity.empty()) config.identity = DefaultLeaderIdentity();
  const auto positive = [](absl::Duration d) { return d > absl::ZeroDuration(); };
  if (!positive(config.lease_duration) || !positive(config.renew_deadline) ||
      !positive(config.retry_period)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leader election: lease_duration (", DurationString(config.lease_duration),
        "), renew_deadline (", DurationString(config.renew_deadline), ") and retry_period (",
        DurationString(config.retry_period), ") must all be positive (defaults 15s/10s/2s)"));
  }
  if (config.lease_duration <= config.renew_deadline) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leader election: lease_duration (", DurationString(config.lease_duration),
        ") must be greater than renew_deadline (", DurationString(config.renew_deadline),
        "), or a successor could take the lease while the leader still acts on it"));
  }
  if (config.renew_deadline <= config.retry_period * kJitterFactor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leader election: renew_deadline (", DurationString(config.renew_deadline),
        ") must be greater than 1.2 x retry_period (", DurationString(config.retry_period),
        "), so that a renewal gets more than one try"));
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, std::move(config)));
}

LeaderElector::LeaderElector(Client* client, LeaderElectionConfig config)
    : client_(client), config_(std::move(config)), clock_(config_.clock) {
  if (config_.registry) {
    master_status_ = &prometheus::BuildGauge()
                          .Name("leader_election_master_status")
                          .Help("1 while this process holds the leader election lease, else 0")
                          .Register(*config_.registry)
                          .Add({{"name", config_.lease_name}});
    master_status_->Set(0);
  }
}

LeaderElector::~LeaderElector() {
  for (std::thread& t : stragglers_) t.join();
}

std::string LeaderElector::LeasePath() const {
  return ResourcePath(LeasesResource(), config_.lease_namespace, config_.lease_name);
}

nlohmann::json LeaderElector::NewSpec(absl::Time now, const nlohmann::json& acquire_time,
                                      int64_t transitions) const {
  const int64_t seconds = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(config_.lease_duration))));
  return nlohmann::json{{"holderIdentity", config_.identity},
                        {"leaseDurationSeconds", seconds},
                        {"acquireTime", acquire_time},
                        {"renewTime", FormatMicroTime(now)},
                        {"leaseTransitions", transitions}};
}

void LeaderElector::SetObservedLocked(const nlohmann::json& lease, absl::Time now) {
  lease_ = lease;
  observed_spec_ = lease.is_object() && lease.contains("spec") ? lease["spec"] : nlohmann::json();
  observed_time_ = now;
  observed_holder_ = StringOr(observed_spec_, "holderIdentity");
}

bool LeaderElector::TryAcquireOrRenew() {
  absl::MutexLock attempt(&attempt_mu_);
  const absl::Time now = clock_->Now();
  std::optional<std::string> new_leader;  // reported after the locks are dropped
  auto report = [&] {
    if (new_leader && config_.on_new_leader) config_.on_new_leader(*new_leader);
  };
  auto observe = [&](const nlohmann::json& lease) {
    absl::MutexLock lock(&mu_);
    const std::string before = observed_holder_;
    SetObservedLocked(lease, now);
    if (observed_holder_ != before) new_leader = observed_holder_;
  };

  // 1. Fast path: renew the lease we last wrote, trusting its resourceVersion.
  nlohmann::json mine;
  {
    absl::MutexLock lock(&mu_);
    const absl::Duration held_for =
        absl::Seconds(IntOr(observed_spec_, "leaseDurationSeconds", 0));
    if (observed_holder_ == config_.identity && lease_.is_object() &&
        observed_time_ + held_for > now) {
      mine = lease_;
      mine["spec"] = NewSpec(now, observed_spec_.value("acquireTime", nlohmann::json()),
                             IntOr(observed_spec_, "leaseTransitions", 0));
    }
  }
  if (!mine.is_null()) {
    absl::StatusOr<ApiResponse> put = client_->Request("PUT", LeasePath(), &mine);
    if (put.ok() && put->ok()) {
      observe(put->body);
      return true;
    }
    spdlog::debug("lease {}/{}: optimistic renewal failed ({}); re-reading it",
                  config_.lease_namespace, config_.lease_name, DescribeFailure(put));
  }

  // 2. Read (or create) the lease.
  absl::StatusOr<ApiResponse> got = client_->Request("GET", LeasePath());
  if (!got.ok() || (!got->ok() && !got->not_found())) {
    spdlog::warn("lease {}/{}: cannot read it: {}", config_.lease_namespace, config_.lease_name,
                 DescribeFailure(got));
    return false;
  }
  if (got->not_found()) {
    nlohmann::json lease = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
        {"spec", NewSpec(now, FormatMicroTime(now), 0)}};
    absl::StatusOr<ApiResponse> created = client_->Request(
        "POST", ResourcePath(LeasesResource(), config_.lease_namespace), &lease);
    if (!created.ok() || !created->ok()) {
      // 409: another candidate created it first; the next attempt reads theirs.
      spdlog::info("lease {}/{}: cannot create it: {}", config_.lease_namespace,
                   config_.lease_name, DescribeFailure(created));
      return false;
    }
    observe(created->body);
    report();
    return true;
  }

  // 3-4. Judge the current holder by when we saw the record change.
  nlohmann::json updated = got->body;
  bool held_by_other = false;
  {
    absl::MutexLock lock(&mu_);
    const nlohmann::json spec =
        updated.is_object() && updated.contains("spec") ? updated["spec"] : nlohmann::json();
    lease_ = updated;
    if (spec != observed_spec_) {
      const std::string before = observed_holder_;
      observed_spec_ = spec;
      observed_time_ = now;
      observed_holder_ = StringOr(spec, "holderIdentity");
      if (observed_holder_ != before) new_leader = observed_holder_;
    }
    const absl::Duration held_for = absl::Seconds(
        IntOr(spec, "leaseDurationSeconds", absl::ToInt64Seconds(config_.lease_duration)));
    const bool ours = observed_holder_ == config_.identity;
    held_by_other = !observed_holder_.empty() && !ours && observed_time_ + held_for > now;
    if (!held_by_other) {
      // 5. Renewing keeps acquireTime and the transition count; taking over
      // (from an expired holder or a released lease) starts a new term.
      updated["spec"] =
          ours ? NewSpec(now, spec.value("acquireTime", nlohmann::json()),
                         IntOr(spec, "leaseTransitions", 0))
               : NewSpec(now, FormatMicroTime(now), IntOr(spec, "leaseTransitions", 0) + 1);
    }
  }
  if (held_by_other) {
    report();
    return false;
  }
  absl::StatusOr<ApiResponse> put = client_->Request("PUT", LeasePath(), &updated);
  if (!put.ok() || !put->ok()) {
    // 409: somebody wrote the lease since our GET; the next attempt re-reads it.
    spdlog::info("lease {}/{}: cannot update it: {}", config_.lease_namespace, config_.lease_name,
                 DescribeFailure(put));
    report();
    return false;
  }
  observe(put->body);
  report();
  return true;
}

bool LeaderElector::Release() {
  absl::MutexLock attempt(&attempt_mu_);
  nlohmann::json lease;
  {
    absl::MutexLock lock(&mu_);
    if (observed_holder_ != config_.identity || !lease_.is_object()) return true;
    lease = lease_;
    // leaseDurationSeconds 1: whoever reads it next may take it a second later.
    const absl::Time now = clock_->Now();
    lease["spec"] = nlohmann::json{{"holderIdentity", ""},
                                   {"leaseDurationSeconds", 1},
                                   {"acquireTime", FormatMicroTime(now)},
                                   {"renewTime", FormatMicroTime(now)},
                                   {"leaseTransitions", IntOr(observed_spec_, "leaseTransitions", 0)}};
  }
  absl::StatusOr<ApiResponse> put = client_->Request("PUT", LeasePath(), &lease);
  if (!put.ok() || !put->ok()) {
    spdlog::warn("lease {}/{}: cannot release it ({}); a successor takes over when it expires",
                 config_.lease_namespace, config_.lease_name, DescribeFailure(put));
    return false;
  }
  absl::MutexLock lock(&mu_);
  SetObservedLocked(put->body, clock_->Now());
  leading_ = false;
  return true;
}

bool LeaderElector::AttemptBefore(absl::Time deadline, std::stop_token stop) {
  // Shared with the helper thread, which may outlive this call.
  struct Attempt {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    bool ok ABSL_GUARDED_BY(mu) = false;
    bool stopped ABSL_GUARDED_BY(mu) = false;
    bool Finished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done || stopped; }
  };
  auto attempt = std::make_shared<Attempt>();
  std::thread helper([this, attempt] {
    const bool ok = TryAcquireOrRenew();
    absl::MutexLock lock(&attempt->mu);
    attempt->done = true;
    attempt->ok = ok;
  });
  std::stop_callback on_stop(stop, [attempt] {
    absl::MutexLock lock(&attempt->mu);
    attempt->stopped = true;
  });
  bool done = false, ok = false;
  {
    absl::MutexLock lock(&attempt->mu);
    clock_->AwaitWithDeadline(attempt->mu, absl::Condition(attempt.get(), &Attempt::Finished),
                              deadline);
    done = attempt->done;
    ok = attempt->ok;
  }
  if (done) {
    helper.join();
    return ok;
  }
  spdlog::warn("lease {}/{}: a renewal is still waiting for the API server at the deadline",
               config_.lease_namespace, config_.lease_name);
  stragglers_.push_back(std::move(helper));
  return false;
}

void LeaderElector::SetLeading(bool leading) {
  {
    absl::MutexLock lock(&mu_);
    leading_ = leading;
  }
  if (master_status_ != nullptr) master_status_->Set(leading ? 1 : 0);
}

bool LeaderElector::IsLeader() const {
  absl::MutexLock lock(&mu_);
  return leading_;
}

std::string LeaderElector::GetLeader() const {
  absl::MutexLock lock(&mu_);
  return observed_holder_;
}

void LeaderElector::Run(std::stop_token stop) {
  const std::string lease = absl::StrCat(config_.lease_namespace, "/", config_.lease_name);
  // a. Acquire.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(1.0, kJitterFactor);
  spdlog::info("lease {}: {} is trying to become the leader", lease, config_.identity);
  while (true) {
    if (stop.stop_requested()) return;
    if (TryAcquireOrRenew()) break;
    if (!SleepOn(clock_, config_.retry_period * jitter(rng), stop)) return;
  }
  // b. Lead.
  spdlog::info("lease {}: {} is the leader", lease, config_.identity);
  SetLeading(true);
  std::stop_source leading;
  std::thread work;
  if (config_.on_started_leading) {
    work = std::thread([this, token = leading.get_token()] { config_.on_started_leading(token); });
  }
  // c. Renew: each round starts a retry period after the last success and
  // must succeed within renew_deadline.
  bool stopped = false;
  while (!stopped) {
    if (!SleepOn(clock_, config_.retry_period, stop)) {
      stopped = true;
      break;
    }
    const absl::Time deadline = clock_->Now() + config_.renew_deadline;
    bool renewed = false;
    while (true) {
      if (AttemptBefore(deadline, stop)) {
        renewed = true;
        break;
      }
      if (stop.stop_requested()) {
        stopped = true;
        break;
      }
      // Someone else holds it now: our lease expired in their eyes, so every
      // further moment we act is a moment with two leaders.
      if (const std::string holder = GetLeader(); !holder.empty() && holder != config_.identity) {
        spdlog::error("lease {}: taken over by {}", lease, holder);
        break;
      }
      if (clock_->Now() >= deadline) break;
      if (!SleepOn(clock_, std::min(config_.retry_period, deadline - clock_->Now()), stop)) {
        stopped = true;
        break;
      }
      if (clock_->Now() >= deadline) break;
    }
    if (!renewed && !stopped) {
      spdlog::error("lease {}: {} could not renew it within {}; leadership lost", lease,
                    config_.identity, DurationString(config_.renew_deadline));
      break;
    }
  }
  // d. Step down.
  SetLeading(false);
  leading.request_stop();
  if (!stopped) {
    // Lost: tell the owner at once (the operator exits), then wait for the work.
    if (config_.on_stopped_leading) config_.on_stopped_leading();
    if (work.joinable()) work.join();
  } else {
    // Clean stop: the work ends before the lease is handed on, so two leaders
    // never act at once.
    if (work.joinable()) work.join();
    if (config_.release_on_cancel && stragglers_.empty()) {
      if (Release()) spdlog::info("lease {}: released by {}", lease, config_.identity);
    }
    if (config_.on_stopped_leading) config_.on_stopped_leading();
  }
  for (std::thread& t : stragglers_) t.join();
  stragglers_.clear();
}

}  // namespace distrain::kube

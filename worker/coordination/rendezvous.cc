#include "worker/coordination/rendezvous.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/net.h"
#include "worker/coordination/task_ref.h"

namespace distrain {
namespace {

bool Contains(const std::vector<TaskId>& tasks, const TaskId& task) {
  for (const auto& t : tasks) {
    if (t == task) return true;
  }
  return false;
}

}  // namespace

Rendezvous::Rendezvous(const ClusterSpec& cluster, int num_unranked)
    : cluster_(cluster), task_(cluster.task()), num_unranked_(num_unranked) {}

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Start(const ClusterSpec& cluster,
                                                              std::vector<TaskId> members,
                                                              RendezvousOptions options) {
  const absl::Time deadline = absl::Now() + options.join_timeout;
  // Step 1.
  std::vector<TaskId> all = members;
  all.insert(all.end(), options.unranked.begin(), options.unranked.end());
  if (members.empty()) return absl::InvalidArgumentError("rendezvous: no members given");
  for (const auto& t : all) {
    if (!cluster.address(t).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous member ", t.ToString(), " is not in the cluster of TF_CONFIG"));
    }
  }
  const TaskId coordinator = cluster.chief_task();
  if (!Contains(all, cluster.task())) {
    return absl::InvalidArgumentError(absl::StrCat("this task ", cluster.task().ToString(),
                                                   " is not a rendezvous member (",
                                                   TaskList(all), ")"));
  }
  if (!Contains(all, coordinator)) {
    return absl::InvalidArgumentError(absl::StrCat("the coordinator ", coordinator.ToString(),
                                                   " must be a rendezvous member (",
                                                   TaskList(all), ")"));
  }
  const std::string coordinator_address = *cluster.address(coordinator);

  std::unique_ptr<Rendezvous> r(new Rendezvous(cluster, static_cast<int>(options.unranked.size())));
  std::string connect_address = coordinator_address;
  if (cluster.is_chief()) {
    // Step 2.
    absl::StatusOr<std::string> listen = CoordinatorListenAddress(coordinator_address);
    if (!listen.ok()) return listen.status();
    options.service.coordinator = coordinator;
    options.service.unranked = options.unranked;
    auto service = CoordinationService::Start(*listen, members, options.service);
    if (!service.ok()) {
      return absl::Status(service.status().code(),
                          absl::StrCat(service.status().message(),
                                       "; it is the TF_CONFIG address of ",
                                       coordinator.ToString()));
    }
    r->service_ = std::move(*service);
    // Our own DNS name may not resolve yet; the address we listen on always
    // does (loopback for a wildcard listener).
    if (*listen != coordinator_address) {
      const std::string host = listen->substr(0, listen->rfind(':'));
      connect_address = JoinHostPort(ConnectHostFor(host), r->service_->port());
    }
  }

  // Step 3.
  const Rendezvous* self = r.get();
  options.client.describe = [self](const TaskId& t) { return self->TaskName(t); };
  r->client_ = std::make_unique<CoordinationClient>(connect_address, coordinator, cluster.task(),
                                                    options.client);
  if (absl::Status s = r->client_->Connect(deadline); !s.ok()) return s;
  absl::StatusOr<Membership> membership = r->client_->Join(deadline);
  if (!membership.ok()) return membership.status();
  {
    absl::MutexLock lock(&r->mu_);
    r->membership_ = std::move(*membership);
  }

  // Step 4.
  Rendezvous* mutable_self = r.get();
  if (absl::Status s = r->client_->StartWatching(
          [mutable_self](const absl::Status& status) { mutable_self->OnStreamFailure(status); });
      !s.ok()) {
    return s;
  }
  return r;
}

Rendezvous::~Rendezvous() {
  client_.reset();   // cancels the stream without Leave (error path) and joins the watcher
  service_.reset();  // stops serving
}

void Rendezvous::OnStreamFailure(const absl::Status& status) {
  FailureCallback callback;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
    callback = on_failure_;
  }
  if (callback) callback(status);
}

void Rendezvous::StartWatching(FailureCallback on_failure) {
  absl::Status already;
  {
    absl::MutexLock lock(&mu_);
    on_failure_ = on_failure;
    already = failure_;
  }
  // OnStreamFailure runs at most once: either it saw no callback (and we
  // deliver here) or it saw ours (and `already` was OK).
  if (!already.ok() && on_failure) on_failure(already);
}

absl::Status Rendezvous::health() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::StatusOr<int64_t> Rendezvous::AwaitRegroup(int64_t failed_generation, absl::Time deadline,
                                                  const std::function<bool()>& cancelled) {
  int64_t after = failed_generation;
  while (true) {
    // R1.
    absl::StatusOr<Membership> whole = client_->WaitForWholeGroup(after, deadline, cancelled);
    if (!whole.ok()) return whole.status();
    if (whole->rank < 0 && num_unranked_ == 0) {
      return absl::AbortedError(absl::StrCat(task_.ToString(), " is not a member of the group ",
                                             "re-formed at generation ", whole->generation));
    }
    // R2. Cleared before re-arming, so a failure reported from here on is kept.
    {
      absl::MutexLock lock(&mu_);
      failure_ = absl::OkStatus();
      membership_ = *whole;
    }
    absl::Status pending = client_->RearmFailureReport(whole->generation);
    if (pending.ok()) return whole->generation;
    if (client_->membership_stream_ended()) return pending;
    // Another member was lost after that re-admission: wait for its
    // replacement too (the next whole group is newer than this one).
    after = whole->generation;
  }
}

std::string Rendezvous::TaskName(const TaskId& task) const {
  const std::optional<std::string> address = cluster_.address(task);
  return address.has_value() ? absl::StrCat(task.ToString(), " (", *address, ")") : task.ToString();
}

int Rendezvous::rank() const {
  absl::MutexLock lock(&mu_);
  return membership_.rank;
}

int Rendezvous::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(membership_.members.size()) - num_unranked_;
}

std::vector<TaskId> Rendezvous::members() const {
  absl::MutexLock lock(&mu_);
  return membership_.members;
}

std::string Rendezvous::peer_name(int rank) const {
  TaskId task;
  {
    absl::MutexLock lock(&mu_);
    const int ranked = static_cast<int>(membership_.members.size()) - num_unranked_;
    DISTRAIN_CHECK(rank >= 0 && rank < ranked) << "rank " << rank << " of " << ranked;
    task = membership_.members[rank];
  }
  return TaskName(task);
}

absl::Status Rendezvous::Shutdown(absl::Duration timeout, bool departing) {
  const absl::Time deadline = absl::Now() + timeout;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  // Step 5.
  absl::Status status = client_->Leave(departing);
  // Step 6.
  if (service_ != nullptr) {
    absl::Status waited = service_->WaitForAllToLeave(deadline - absl::Now());
    if (status.ok()) status = waited;
  }
  client_->StopWatching();
  if (service_ != nullptr) service_->Shutdown();
  return status;
}

}  // namespace distrain

#include "worker/coordination/coordination_service.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"
#include "distrain/v1/coordination.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/coordination/task_ref.h"
#include "worker/security/transport_security.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {
namespace {

constexpr int kMaxIncarnationBytes = 256;

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

std::string Pretty(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

// Keys and names go into error messages; keep those readable when they are huge.
std::string Quote(const std::string& s) {
  constexpr size_t kShown = 80;
  if (s.size() <= kShown) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kShown), "...' (", s.size(), " bytes)");
}

}  // namespace

// The gRPC service and all coordination state (protocol in the header).
class CoordinationService::Impl final : public v1::Coordination::Service {
 public:
  Impl(std::vector<TaskId> members, CoordinationServiceOptions options)
      : options_(std::move(options)),
        num_ranked_(static_cast<int>(options_.elastic ? options_.elastic->candidates.size()
                                                      : members.size())) {
    ids_ = options_.elastic ? options_.elastic->candidates : members;
    ids_.insert(ids_.end(), options_.unranked.begin(), options_.unranked.end());
    max_waiters_ = options_.max_waiters > 0 ? options_.max_waiters
                                            : 4 * static_cast<int64_t>(ids_.size()) + 16;
    tasks_.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) tasks_[i].id = ids_[i];
    active_.assign(num_ranked_, false);
    for (const TaskId& m : members) {
      const auto it = std::find(ids_.begin(), ids_.begin() + num_ranked_, m);
      if (it != ids_.begin() + num_ranked_) active_[it - ids_.begin()] = true;
    }
    const auto coordinator = std::find(ids_.begin(), ids_.begin() + num_ranked_, options_.coordinator);
    coordinator_rank_index_ =
        coordinator == ids_.begin() + num_ranked_ ? -1 : static_cast<int>(coordinator - ids_.begin());
    const int initial = static_cast<int>(members.size());
    allowed_size_ = options_.elastic && options_.elastic->allowed_size
                        ? options_.elastic->allowed_size
                        : std::function<bool(int)>([initial](int n) { return n == initial; });
  }

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse* resp) override {
    const absl::StatusOr<int> idx = FindTask(req->task(), "JoinRequest.task");
    if (!idx.ok()) return ToGrpcStatus(idx.status());
    if (grpc::Status s = CheckCallerIs(security(), *ctx, "Join", ids_[*idx]); !s.ok()) return s;
    const std::string& inc = req->incarnation();
    if (absl::Status s = CheckIncarnation(inc, "JoinRequest.incarnation"); !s.ok()) {
      return ToGrpcStatus(s);
    }
    const absl::StatusOr<absl::Time> deadline =
        Deadline(ctx, req->timeout_ms(), "JoinRequest.timeout_ms",
                 /*zero_means_call_deadline=*/true);
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    const std::string name = ids_[*idx].ToString();
    const absl::Time start = absl::Now();

    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    if (absl::Status s = CheckWaitersLocked("Join"); !s.ok()) return ToGrpcStatus(s);
    TaskState& t = tasks_[*idx];
    if (t.incarnation == inc) {
      switch (t.phase) {
        case Phase::kJoined:  // a retry of a Join that already succeeded
          FillJoinResponse(*idx, resp);
          return grpc::Status::OK;
        case Phase::kJoining:
          ++t.join_calls;
          break;
        case Phase::kLeft:
        case Phase::kFailed:
          return Error(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat(name, " incarnation '", inc, "' already ",
                                    t.phase == Phase::kLeft ? "left" : "was reported failed",
                                    "; a restarted process must join with a new incarnation"));
        case Phase::kAbsent:
          BeginJoinLocked(*idx, inc);
          break;
      }
    } else {
      switch (t.phase) {
        case Phase::kJoining:
          return Error(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat(name, " is already joining as incarnation '", t.incarnation,
                                    "' (this request: '", inc,
                                    "'); are two processes running as ", name, "?"));
        case Phase::kJoined:
          if (t.watch_id != 0) {
            return Error(grpc::StatusCode::FAILED_PRECONDITION,
                         absl::StrCat(name, " is a live member as incarnation '", t.incarnation,
                                      "' with an open membership stream (this request: '", inc,
                                      "'); are two processes running as ", name, "?"));
          }
          MarkFailedLocked(*idx, absl::StrCat(name, " lost: restarted as incarnation '", inc,
                                              "' before incarnation '", t.incarnation,
                                              "' opened its membership stream"));
          BeginJoinLocked(*idx, inc);
          break;
        case Phase::kAbsent:
        case Phase::kLeft:
        case Phase::kFailed:
          BeginJoinLocked(*idx, inc);
          break;
      }
    }
    ReconcileMembershipLocked();

    const WaitResult r = CountedWaitLocked(ctx, *deadline, [&] {
      return t.incarnation != inc || t.phase != Phase::kJoining;
    });
    if (t.incarnation == inc && t.phase == Phase::kJoined) {
      FillJoinResponse(*idx, resp);
      return grpc::Status::OK;
    }
    std::vector<TaskId> missing, joined;  // before withdrawing: we count as joined
    for (size_t i = 0; i < tasks_.size(); ++i) {
      const TaskState& other = tasks_[i];
      const bool there = other.phase == Phase::kJoining || other.phase == Phase::kJoined;
      if (there || IsMemberLocked(i)) (there ? joined : missing).push_back(other.id);
    }
    // With an elastic membership a joiner may have everyone it needs and
    // still wait: the group it would make is not a size the job allows.
    const std::string waiting_for =
        missing.empty() ? std::string("a group size the job allows (spec.elasticPolicy and "
                                      "spec.training.globalBatchSize)")
                        : TaskList(missing);
    if (t.incarnation == inc && t.phase == Phase::kJoining && --t.join_calls <= 0) {
      // Withdraw, so a retry or a restarted process can join (step 2).
      t.phase = t.phase_before_join;
      t.join_calls = 0;
    }
    switch (r) {
      case WaitResult::kTimeout:
        return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                     absl::StrCat("join of ", name, " timed out after ",
                                  Pretty(*deadline - start),
                                  ": still waiting for ", waiting_for,
                                  " (joined: ", TaskList(joined), ")"));
      case WaitResult::kShutdown:
        return ShuttingDown();
      case WaitResult::kCancelled:
        return Error(grpc::StatusCode::CANCELLED, absl::StrCat("join of ", name, " was cancelled"));
      case WaitResult::kDone:
        break;
    }
    return Error(grpc::StatusCode::ABORTED,
                 absl::StrCat("join of ", name, " as incarnation '", inc,
                              "' was abandoned: the task left or was replaced while joining"));
  }

  grpc::Status WatchMembership(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                               grpc::ServerWriter<v1::MembershipUpdate>* writer) override {
    const absl::StatusOr<int> idx = FindTask(req->task(), "WatchRequest.task");
    if (!idx.ok()) return ToGrpcStatus(idx.status());
    if (grpc::Status s = CheckCallerIs(security(), *ctx, "WatchMembership", ids_[*idx]);
        !s.ok()) {
      return s;
    }
    const std::string& inc = req->incarnation();
    if (absl::Status s = CheckIncarnation(inc, "WatchRequest.incarnation"); !s.ok()) {
      return ToGrpcStatus(s);
    }
    const std::string name = ids_[*idx].ToString();

    uint64_t my_id = 0;
    size_t next_event = 0;
    v1::MembershipUpdate update;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return ShuttingDown();
      TaskState& t = tasks_[*idx];
      if (t.incarnation != inc || t.phase != Phase::kJoined) {
        return Error(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat(name, " incarnation '", inc,
                                  "' is not an admitted member (state: ", PhaseName(t.phase),
                                  t.incarnation == inc ? "" : ", other incarnation",
                                  "); call Join first"));
      }
      if (t.watch_id != 0) {
        return Error(grpc::StatusCode::ALREADY_EXISTS,
                     absl::StrCat(name, " already has an open membership stream"));
      }
      my_id = ++next_watch_id_;
      t.watch_id = my_id;
      // Step 3: the snapshot.
      update.set_generation(generation_);
      for (size_t i = 0; i < tasks_.size(); ++i) {
        if (tasks_[i].phase == Phase::kFailed && IsMemberLocked(i)) {
          *update.add_failed() = ToTaskRef(ids_[i]);
        }
      }
      if (update.failed_size() > 0) {
        update.set_reason(failure_reasons_);
      } else {
        AddMembersLocked(MemberIndicesLocked(), &update);
      }
      next_event = events_.size();
    }

    bool closed = !writer->Write(update);
    grpc::Status result = grpc::Status::OK;
    while (!closed) {
      update.Clear();
      {
        absl::MutexLock lock(&mu_);
        TaskState& t = tasks_[*idx];
        const auto gone = [&] { return t.incarnation != inc || t.phase != Phase::kJoined; };
        const WaitResult r = WaitLocked(ctx, absl::InfiniteFuture(),
                                        [&] { return events_.size() > next_event || gone(); });
        if (r == WaitResult::kCancelled) {
          closed = true;
          break;
        }
        if (r == WaitResult::kShutdown) {
          result = ShuttingDown();
          break;
        }
        if (gone()) {
          if (t.incarnation == inc && t.phase == Phase::kLeft) break;  // step 6: OK
          result = Error(grpc::StatusCode::ABORTED,
                         absl::StrCat(name, " incarnation '", inc, "' is no longer a member (",
                                      PhaseName(t.phase), ")"));
          break;
        }
        std::vector<std::string> reasons;
        for (; next_event < events_.size(); ++next_event) {
          const Event& e = events_[next_event];
          // A re-admission (no failed task) is never merged with failures:
          // an update naming no failed task tells clients the group is whole
          // again at its generation (in-place recovery waits for that).
          if (e.failed.empty() && !reasons.empty()) break;
          update.set_generation(e.generation);
          for (int f : e.failed) {
            if (f != *idx) *update.add_failed() = ToTaskRef(ids_[f]);
          }
          reasons.push_back(e.reason);
          if (e.failed.empty()) {
            AddMembersLocked(e.members, &update);
            ++next_event;
            break;
          }
        }
        update.set_reason(absl::StrJoin(reasons, "; "));
      }
      closed = !writer->Write(update);
    }

    absl::MutexLock lock(&mu_);
    TaskState& t = tasks_[*idx];
    if (t.watch_id == my_id) t.watch_id = 0;
    if (closed && t.incarnation == inc && t.phase == Phase::kJoined && !shutting_down_) {
      // Step 4.
      MarkFailedLocked(*idx, absl::StrCat(name, " lost: its coordination stream closed (process "
                                                "died or was killed, or stopped answering "
                                                "keepalive pings)"));
    }
    return closed ? Error(grpc::StatusCode::CANCELLED, "membership stream closed") : result;
  }

  grpc::Status KeyValueSet(grpc::ServerContext* ctx, const v1::KeyValueSetRequest* req,
                           v1::KeyValueSetResponse*) override {
    if (absl::Status s = CheckName(req->key(), "KeyValueSetRequest.key"); !s.ok()) return ToGrpcStatus(s);
    if (grpc::Status s = CheckMember(*ctx, "KeyValueSet"); !s.ok()) return s;
    const std::optional<TaskId> writer = CallerTask(*ctx);
    if (static_cast<int64_t>(req->value().size()) > options_.max_value_bytes) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("KeyValueSetRequest.value of key ", Quote(req->key()), " is ",
                                req->value().size(), " bytes; the limit is ",
                                options_.max_value_bytes, " bytes"));
    }
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    const auto it = store_.find(req->key());
    // A key belongs to the task that set it first: another member cannot
    // redirect a ring address or rewrite the chief's manifest.
    if (const auto owner = owners_.find(req->key());
        writer.has_value() && owner != owners_.end() && !(owner->second == *writer)) {
      return Error(grpc::StatusCode::PERMISSION_DENIED,
                   absl::StrCat("KeyValueSet: key ", Quote(req->key()), " was set by ",
                                owner->second.ToString(), "; ", writer->ToString(),
                                " may not overwrite it"));
    }
    if (it == store_.end() && static_cast<int64_t>(store_.size()) >= options_.max_keys) {
      return Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrCat("KeyValueSetRequest.key ", Quote(req->key()),
                                " would be key number ", store_.size() + 1,
                                " in the key-value store; the limit is ", options_.max_keys,
                                " keys (CoordinationServiceOptions::max_keys)"));
    }
    const int64_t old_bytes =
        it == store_.end() ? 0 : static_cast<int64_t>(it->first.size() + it->second.size());
    const int64_t new_bytes = static_cast<int64_t>(req->key().size() + req->value().size());
    if (store_bytes_ - old_bytes + new_bytes > options_.max_store_bytes) {
      return Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrCat("the key-value store holds ", store_bytes_, " bytes; setting ",
                                Quote(req->key()), " would exceed its limit of ",
                                options_.max_store_bytes,
                                " bytes (CoordinationServiceOptions::max_store_bytes)"));
    }
    store_bytes_ += new_bytes - old_bytes;
    store_[req->key()] = req->value();
    if (writer.has_value()) owners_.emplace(req->key(), *writer);
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status KeyValueGet(grpc::ServerContext* ctx, const v1::KeyValueGetRequest* req,
                           v1::KeyValueGetResponse* resp) override {
    if (absl::Status s = CheckName(req->key(), "KeyValueGetRequest.key"); !s.ok()) return ToGrpcStatus(s);
    if (grpc::Status s = CheckMember(*ctx, "KeyValueGet"); !s.ok()) return s;
    const absl::StatusOr<absl::Time> deadline =
        Deadline(ctx, req->timeout_ms(), "KeyValueGetRequest.timeout_ms", false);
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    const absl::Time start = absl::Now();
    absl::MutexLock lock(&mu_);
    const auto present = [&] { return store_.find(req->key()) != store_.end(); };
    if (!present()) {
      if (absl::Status s = CheckWaitersLocked("KeyValueGet"); !s.ok()) return ToGrpcStatus(s);
    }
    const WaitResult r = CountedWaitLocked(ctx, *deadline, present);
    switch (r) {
      case WaitResult::kDone:
        resp->set_value(store_.at(req->key()));
        return grpc::Status::OK;
      case WaitResult::kTimeout:
        return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                     absl::StrCat("key ", Quote(req->key()), " was not set within ",
                                  Pretty(*deadline - start)));
      case WaitResult::kShutdown:
        return ShuttingDown();
      case WaitResult::kCancelled:
        break;
    }
    return Error(grpc::StatusCode::CANCELLED, "KeyValueGet cancelled");
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const v1::BarrierRequest* req,
                       v1::BarrierResponse*) override {
    if (absl::Status s = CheckName(req->name(), "BarrierRequest.name"); !s.ok()) return ToGrpcStatus(s);
    const absl::StatusOr<int> idx = FindTask(req->task(), "BarrierRequest.task");
    if (!idx.ok()) return ToGrpcStatus(idx.status());
    if (grpc::Status s = CheckCallerIs(security(), *ctx, "Barrier", ids_[*idx]); !s.ok()) return s;
    const absl::StatusOr<absl::Time> deadline =
        Deadline(ctx, req->timeout_ms(), "BarrierRequest.timeout_ms", false);
    if (!deadline.ok()) return ToGrpcStatus(deadline.status());
    const absl::Time start = absl::Now();
    const std::string name = ids_[*idx].ToString();
    const std::string barrier = Quote(req->name());

    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    if (tasks_[*idx].phase != Phase::kJoined) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   absl::StrCat(name, " cannot enter barrier ", barrier, ": it is ",
                                PhaseName(tasks_[*idx].phase), ", not an admitted member"));
    }
    auto it = barriers_.find(req->name());
    if (it == barriers_.end()) {
      if (static_cast<int64_t>(barriers_.size()) >= options_.max_barriers) {
        return Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("BarrierRequest.name ", barrier, " would be distinct barrier "
                                  "name number ", barriers_.size() + 1, "; the limit is ",
                                  options_.max_barriers,
                                  " (CoordinationServiceOptions::max_barriers); reuse names"));
      }
    }
    // Checked before arriving, so a refused call leaves the counts alone.
    if (absl::Status s = CheckWaitersLocked("Barrier"); !s.ok()) return ToGrpcStatus(s);
    if (it == barriers_.end()) {
      it = barriers_.emplace(req->name(), BarrierState{std::vector<int64_t>(tasks_.size(), 0), 0})
               .first;
    }
    BarrierState& b = it->second;
    const int64_t my_round = ++b.arrivals[*idx];
    TryCompleteBarrierLocked(b);

    const WaitResult r = CountedWaitLocked(
        ctx, *deadline, [&] { return b.completed >= my_round || AnyFailedLocked(); });
    if (b.completed >= my_round) return grpc::Status::OK;
    --b.arrivals[*idx];  // withdraw, so the counts stay consistent for a retry
    std::vector<TaskId> failed, missing;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      if (!IsMemberLocked(i)) continue;
      if (tasks_[i].phase == Phase::kFailed) failed.push_back(ids_[i]);
      if (tasks_[i].phase != Phase::kLeft && b.arrivals[i] < my_round && i != size_t(*idx)) {
        missing.push_back(ids_[i]);
      }
    }
    switch (r) {
      case WaitResult::kDone:
        return Error(grpc::StatusCode::ABORTED,
                     absl::StrCat("barrier ", barrier, " cannot complete: ", TaskList(failed),
                                  " failed (", failure_reasons_, ")"));
      case WaitResult::kTimeout:
        return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                     absl::StrCat("barrier ", barrier, " of ", name, " timed out after ",
                                  Pretty(*deadline - start), ": still waiting for ",
                                  TaskList(missing)));
      case WaitResult::kShutdown:
        return ShuttingDown();
      case WaitResult::kCancelled:
        break;
    }
    return Error(grpc::StatusCode::CANCELLED, absl::StrCat("barrier ", barrier, " cancelled"));
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const v1::LeaveRequest* req,
                     v1::LeaveResponse*) override {
    const absl::StatusOr<int> idx = FindTask(req->task(), "LeaveRequest.task");
    if (!idx.ok()) return ToGrpcStatus(idx.status());
    if (grpc::Status s = CheckCallerIs(security(), *ctx, "Leave", ids_[*idx]); !s.ok()) return s;
    const std::string& inc = req->incarnation();
    if (absl::Status s = CheckIncarnation(inc, "LeaveRequest.incarnation"); !s.ok()) {
      return ToGrpcStatus(s);
    }
    const std::string name = ids_[*idx].ToString();
    absl::MutexLock lock(&mu_);
    TaskState& t = tasks_[*idx];
    if (t.incarnation != inc) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   absl::StrCat(name, " incarnation '", inc, "' is not the current one ('",
                                t.incarnation, "'); nothing to leave"));
    }
    switch (t.phase) {
      case Phase::kLeft:
        return grpc::Status::OK;  // idempotent
      case Phase::kFailed:
        return Error(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat(name, " was already reported failed; leaving is too late"));
      case Phase::kAbsent:
        return Error(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat(name, " has not joined; nothing to leave"));
      case Phase::kJoining:
      case Phase::kJoined:
        break;
    }
    if (req->departing() && t.phase == Phase::kJoined && ever_admitted_) {
      // Step E: the others go on without it, told as for a failure.
      MarkFailedLocked(*idx, absl::StrCat(name, " departed: it was stopped (SIGTERM: scaled "
                                                "down or preempted) and left the group"));
      return grpc::Status::OK;
    }
    t.phase = Phase::kLeft;
    t.join_calls = 0;
    for (auto& [unused, b] : barriers_) TryCompleteBarrierLocked(b);
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  const TransportSecurity* security() const { return options_.security.get(); }

  // The key-value store is for the members (not the evaluator, which holds
  // a certificate of the job but never joins).
  grpc::Status CheckMember(const grpc::ServerContext& ctx, std::string_view method) const {
    return CheckCaller(
        security(), ctx, method,
        [&](const TaskId& caller) { return std::find(ids_.begin(), ids_.end(), caller) != ids_.end(); },
        "only the job's members");
  }

  grpc::Status Ping(grpc::ServerContext*, const v1::PingRequest*, v1::PingResponse* resp) override {
    *resp->mutable_coordinator() = ToTaskRef(options_.coordinator);
    absl::MutexLock lock(&mu_);
    resp->set_generation(generation_);
    return grpc::Status::OK;
  }

  int64_t generation() const {
    absl::MutexLock lock(&mu_);
    return generation_;
  }

  absl::Status WaitForAllToLeave(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    const auto still_there = [&] {
      std::vector<TaskId> out;
      for (size_t i = 0; i < tasks_.size(); ++i) {
        const Phase p = tasks_[i].phase;
        if ((p == Phase::kJoining || p == Phase::kJoined) && IsMemberLocked(i)) {
          out.push_back(tasks_[i].id);
        }
      }
      return out;
    };
    const WaitResult r = WaitLocked(nullptr, deadline, [&] { return still_there().empty(); });
    if (r == WaitResult::kDone) return absl::OkStatus();
    if (r == WaitResult::kShutdown) return absl::UnavailableError("coordination service shut down");
    return absl::DeadlineExceededError(absl::StrCat(
        "after ", Pretty(timeout), " these tasks had not left the coordination service: ",
        TaskList(still_there())));
  }

  void BeginShutdown() {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    cv_.SignalAll();
  }

 private:
  enum class Phase { kAbsent, kJoining, kJoined, kLeft, kFailed };
  static const char* PhaseName(Phase p) {
    switch (p) {
      case Phase::kAbsent: return "not joined";
      case Phase::kJoining: return "joining";
      case Phase::kJoined: return "joined";
      case Phase::kLeft: return "left";
      case Phase::kFailed: return "failed";
    }
    return "?";
  }

  struct TaskState {
    TaskId id;
    Phase phase = Phase::kAbsent;
    Phase phase_before_join = Phase::kAbsent;  // restored when a Join is withdrawn
    std::string incarnation;
    int join_calls = 0;      // Join RPCs of this incarnation waiting for admission
    uint64_t watch_id = 0;   // nonzero while a watch stream is open
  };
  // A membership change pushed to watchers (step 4, step 7, step E).
  struct Event {
    int64_t generation;
    std::vector<int> failed;  // indices into tasks_; empty for re-admissions
    std::string reason;
    std::vector<int> members;  // re-admissions: the ranked members, in rank order
  };
  struct BarrierState {
    std::vector<int64_t> arrivals;  // per task: how many times it entered
    int64_t completed = 0;          // rounds every non-left task has passed
  };
  enum class WaitResult { kDone, kTimeout, kCancelled, kShutdown };

  absl::StatusOr<int> FindTask(const v1::TaskRef& ref, const char* field) const {
    const TaskId id = FromTaskRef(ref);
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] == id) return static_cast<int>(i);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", Quote(id.ToString()), " is not a member of this cluster; members: ",
        TaskList(ids_)));
  }

  static absl::Status CheckIncarnation(const std::string& inc, const char* field) {
    if (inc.empty() || inc.size() > kMaxIncarnationBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be 1..", kMaxIncarnationBytes, " bytes (unique per process start); got ",
          inc.size(), " bytes"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckName(const std::string& name, const char* field) const {
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
    if (static_cast<int64_t>(name.size()) > options_.max_key_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, " is ", name.size(),
                                                     " bytes; the limit is ",
                                                     options_.max_key_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  // timeout_ms > 0: wait that long (capped by max_wait). 0: give up at once,
  // or, for Join, wait until the call's deadline.
  absl::StatusOr<absl::Time> Deadline(grpc::ServerContext* ctx, int64_t timeout_ms,
                                      const char* field, bool zero_means_call_deadline) const {
    const absl::Time now = absl::Now();
    if (timeout_ms < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", timeout_ms, "; it must be >= 0 milliseconds"));
    }
    absl::Duration wait = std::min(absl::Milliseconds(timeout_ms), options_.max_wait);
    if (timeout_ms == 0 && zero_means_call_deadline) {
      wait = std::min(absl::FromChrono(ctx->deadline()) - now, options_.max_wait);
    }
    return now + std::max(wait, absl::ZeroDuration());
  }

  static grpc::Status ShuttingDown() {
    return Error(grpc::StatusCode::UNAVAILABLE, "the coordination service is shutting down");
  }

  // RESOURCE_EXHAUSTED when max_waiters handlers are blocked already.
  absl::Status CheckWaitersLocked(const char* method) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiters_ < max_waiters_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": ", waiters_, " calls are already blocked in Join, KeyValueGet or Barrier; "
        "the limit is ", max_waiters_, " (CoordinationServiceOptions::max_waiters)"));
  }

  // WaitLocked, counted in waiters_ while it blocks.
  WaitResult CountedWaitLocked(grpc::ServerContext* ctx, absl::Time deadline,
                               const std::function<bool()>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++waiters_;
    const WaitResult r = WaitLocked(ctx, deadline, done);
    --waiters_;
    return r;
  }

  // Waits until done(), the deadline, the caller going away (ctx cancelled;
  // polled every cancel_poll) or shutdown.
  WaitResult WaitLocked(grpc::ServerContext* ctx, absl::Time deadline,
                        const std::function<bool()>& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      if (done()) return WaitResult::kDone;
      if (shutting_down_) return WaitResult::kShutdown;
      if (ctx != nullptr && ctx->IsCancelled()) return WaitResult::kCancelled;
      const absl::Time now = absl::Now();
      if (now >= deadline) return WaitResult::kTimeout;
      cv_.WaitWithDeadline(&mu_, std::min(deadline, now + options_.cancel_poll));
    }
  }

  void BeginJoinLocked(int i, const std::string& inc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TaskState& t = tasks_[i];
    t.phase_before_join = t.phase == Phase::kJoined ? Phase::kFailed : t.phase;
    t.phase = Phase::kJoining;
    t.incarnation = inc;
    t.join_calls = 1;
  }

  // Ranked tasks outside the member set (elastic candidates that never
  // joined, or were dropped) count for nothing: barriers, failures, leaving.
  bool IsMemberLocked(size_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return i >= static_cast<size_t>(num_ranked_) || active_[i];
  }

  std::vector<int> MemberIndicesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int> out;
    for (int i = 0; i < num_ranked_; ++i) {
      if (active_[i]) out.push_back(i);
    }
    return out;
  }

  void AddMembersLocked(const std::vector<int>& ranked, v1::MembershipUpdate* update) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int i : ranked) *update->add_members() = ToTaskRef(ids_[i]);
    for (size_t i = num_ranked_; i < ids_.size(); ++i) *update->add_members() = ToTaskRef(ids_[i]);
  }

  // Steps 2, 7 and E1-E2: admits the proposed member set when it is complete
  // and allowed.
  void ReconcileMembershipLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = num_ranked_; i < tasks_.size(); ++i) {
      if (tasks_[i].phase != Phase::kJoining && tasks_[i].phase != Phase::kJoined) return;
    }
    while (true) {
      // E1.
      std::vector<bool> proposed(num_ranked_, false);
      bool anyone_joining = false;
      int size = 0;
      for (int i = 0; i < num_ranked_; ++i) {
        const Phase p = tasks_[i].phase;
        const bool in = p == Phase::kJoining ? ever_admitted_ || active_[i]
                                             : (p == Phase::kJoined || p == Phase::kLeft) && active_[i];
        if (!in) continue;
        proposed[i] = true;
        ++size;
        anyone_joining |= p == Phase::kJoining;
      }
      for (size_t i = num_ranked_; i < tasks_.size(); ++i) {
        anyone_joining |= tasks_[i].phase == Phase::kJoining;
      }
      if (!ever_admitted_) {
        for (int i = 0; i < num_ranked_; ++i) {
          if (active_[i] && !proposed[i]) return;  // an initial member is missing
        }
      }
      // E2.
      if (proposed == active_ && !anyone_joining) return;
      if (coordinator_rank_index_ >= 0 && !proposed[coordinator_rank_index_]) return;
      if (size == 0 || !allowed_size_(size)) return;
      std::vector<std::string> admitted;
      std::vector<TaskId> dropped, members;
      for (size_t i = 0; i < tasks_.size(); ++i) {
        TaskState& t = tasks_[i];
        const bool ranked = i < static_cast<size_t>(num_ranked_);
        if (ranked && active_[i] && !proposed[i]) dropped.push_back(t.id);
        if (ranked && proposed[i]) members.push_back(t.id);
        if (t.phase != Phase::kJoining || (ranked && !proposed[i])) continue;
        t.phase = Phase::kJoined;
        t.join_calls = 0;
        admitted.push_back(t.id.ToString());
      }
      const bool resized = proposed != active_;
      active_ = std::move(proposed);
      // A barrier that waited for a dropped member may be complete now.
      if (resized) {
        for (auto& [unused, b] : barriers_) TryCompleteBarrierLocked(b);
      }
      if (ever_admitted_) {
        ++generation_;
        std::string reason =
            resized ? absl::StrCat("the group is now ", size, " (", TaskList(members), ")",
                                   admitted.empty() ? "" : "; joined: ",
                                   absl::StrJoin(admitted, ", "),
                                   dropped.empty() ? "" : "; without: ",
                                   dropped.empty() ? "" : TaskList(dropped))
                    : absl::StrCat(absl::StrJoin(admitted, ", "), " rejoined");
        events_.push_back(Event{generation_, {}, std::move(reason), MemberIndicesLocked()});
      }
      ever_admitted_ = true;
      failure_reasons_.clear();
      cv_.SignalAll();
      if (!options_.elastic) return;
    }
  }

  void MarkFailedLocked(int i, std::string reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    tasks_[i].phase = Phase::kFailed;
    ++generation_;
    if (!failure_reasons_.empty()) failure_reasons_ += "; ";
    failure_reasons_ += reason;
    events_.push_back(Event{generation_, {i}, std::move(reason), {}});
    cv_.SignalAll();
    // Step E: the group may go on without it.
    if (options_.elastic && ever_admitted_) ReconcileMembershipLocked();
  }

  bool AnyFailedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < tasks_.size(); ++i) {
      if (tasks_[i].phase == Phase::kFailed && IsMemberLocked(i)) return true;
    }
    return false;
  }

  void TryCompleteBarrierLocked(BarrierState& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A round completes when every task that has not left entered it; with
    // nobody left to wait for, there is nothing to complete.
    while (true) {
      bool anyone = false;
      for (size_t i = 0; i < tasks_.size(); ++i) {
        if (tasks_[i].phase == Phase::kLeft || !IsMemberLocked(i)) continue;
        anyone = true;
        if (b.arrivals[i] <= b.completed) return;
      }
      if (!anyone) return;
      ++b.completed;
      cv_.SignalAll();
    }
  }

  void FillJoinResponse(int i, v1::JoinResponse* resp) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    resp->set_generation(generation_);
    const std::vector<int> ranked = MemberIndicesLocked();
    for (int r : ranked) *resp->add_members() = ToTaskRef(ids_[r]);
    for (size_t u = num_ranked_; u < ids_.size(); ++u) *resp->add_members() = ToTaskRef(ids_[u]);
    const auto rank = std::find(ranked.begin(), ranked.end(), i);
    resp->set_rank(rank == ranked.end() ? -1 : static_cast<int>(rank - ranked.begin()));
  }

  const CoordinationServiceOptions options_;
  const int num_ranked_;     // ranked candidates (the members, unless elastic)
  std::vector<TaskId> ids_;  // ranked candidates, then unranked; immutable after construction
  int coordinator_rank_index_ = -1;  // index of options_.coordinator among the ranked, or -1
  std::function<bool(int)> allowed_size_;  // step E2; without elastic: the initial size only

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<TaskState> tasks_ ABSL_GUARDED_BY(mu_);  // parallel to ids_
  std::vector<bool> active_ ABSL_GUARDED_BY(mu_);     // per ranked candidate: a member now
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool ever_admitted_ ABSL_GUARDED_BY(mu_) = false;
  // Reasons of the failures since the last admission (snapshot messages).
  std::string failure_reasons_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TaskId> owners_ ABSL_GUARDED_BY(mu_);  // with TLS only
  int64_t store_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  int64_t max_waiters_ = 0;  // options_.max_waiters resolved; set in the constructor
  int64_t waiters_ ABSL_GUARDED_BY(mu_) = 0;  // handlers in CountedWaitLocked
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<CoordinationService>> CoordinationService::Start(
    const std::string& listen_address, std::vector<TaskId> members,
    CoordinationServiceOptions options) {
  if (members.empty()) {
    return absl::InvalidArgumentError("coordination service: the member set is empty");
  }
  std::vector<TaskId> all = options.elastic ? options.elastic->candidates : members;
  if (options.elastic) {
    for (const TaskId& m : members) {
      if (std::find(all.begin(), all.end(), m) == all.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "coordination service: member ", m.ToString(), " is not among the elastic candidates (",
            TaskList(all), ")"));
      }
    }
  }
  all.insert(all.end(), options.unranked.begin(), options.unranked.end());
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (all[i] == all[j]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "coordination service: task ", all[i].ToString(),
            " is listed twice in the member set (", TaskList(all), ")"));
      }
    }
  }
  if (options.cancel_poll <= absl::ZeroDuration()) options.cancel_poll = absl::Milliseconds(50);

  auto impl = std::make_unique<Impl>(std::move(members), options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_address, ServerCredentialsFor(options.security.get()), &port);
  builder.RegisterService(impl.get());
  ApplyKeepalive(options.keepalive, &builder);
  // gRPC sets SO_REUSEPORT by default, which would let a second process bind
  // the same port silently and split the tasks between two coordinators.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Let oversized values through to our check (a clear INVALID_ARGUMENT)
  // instead of gRPC's generic RESOURCE_EXHAUSTED.
  const int64_t max_message =
      std::min<int64_t>(2 * options.max_value_bytes + options.max_key_bytes + 4096, INT32_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "coordination service: cannot listen on ", listen_address,
        " (port in use by another process, or the host is not an address of this machine)"));
  }
  return std::unique_ptr<CoordinationService>(
      new CoordinationService(std::move(impl), std::move(server), port));
}

CoordinationService::CoordinationService(std::unique_ptr<Impl> impl,
                                         std::unique_ptr<grpc::Server> server, int port)
    : impl_(std::move(impl)), server_(std::move(server)), port_(port) {}

CoordinationService::~CoordinationService() { Shutdown(); }

int64_t CoordinationService::generation() const { return impl_->generation(); }

absl::Status CoordinationService::WaitForAllToLeave(absl::Duration timeout) {
  return impl_->WaitForAllToLeave(timeout);
}

std::shared_ptr<grpc::Channel> CoordinationService::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void CoordinationService::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  impl_->BeginShutdown();
  // Handlers return within cancel_poll of BeginShutdown; the deadline only
  // bounds a handler stuck in a write to a client that stopped reading.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
}

absl::StatusOr<std::string> CoordinatorListenAddress(const std::string& tf_address) {
  const size_t colon = tf_address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(tf_address.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator address '", tf_address, "' must be host:port with a port in 1..65535"));
  }
  const std::string host = absl::AsciiStrToLower(tf_address.substr(0, colon));
  if (absl::StartsWith(host, "127.") || host == "localhost" || host == "[::1]") return tf_address;
  // Our pod's own IP where the operator exported it (pods sharing one host
  // network each bind their own address), else every interface.
  return JoinHostPort(ListenHost(), port);
}

}  // namespace distrain

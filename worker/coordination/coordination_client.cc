#include "worker/coordination/coordination_client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "grpcpp/grpcpp.h"
#include "worker/coordination/task_ref.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {
namespace {

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%d-%d-%08x", getpid(), absl::ToUnixNanos(absl::Now()),
                         absl::Uniform<uint32_t>(gen));
}

// Waits are sent in milliseconds; clamp so absl::InfiniteDuration and
// friends stay representable (the server caps them anyway).
int64_t WaitMs(absl::Duration d) {
  constexpr int64_t kMaxMs = int64_t{100} * 24 * 3600 * 1000;  // 100 days
  return std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, kMaxMs);
}

void SetDeadline(grpc::ClientContext* ctx, absl::Time deadline) {
  ctx->set_deadline(absl::ToChronoTime(
      std::min(deadline, absl::Now() + absl::Hours(24 * 200))));
}

absl::Duration Jitter(absl::Duration d, absl::BitGen& gen) {
  return d * absl::Uniform<double>(gen, 0.8, 1.2);
}

}  // namespace

CoordinationClient::CoordinationClient(std::string coordinator_address, TaskId coordinator,
                                       TaskId self, CoordinationClientOptions options)
    : address_(std::move(coordinator_address)),
      coordinator_(std::move(coordinator)),
      self_(std::move(self)),
      options_(std::move(options)),
      incarnation_(options_.incarnation.empty() ? NewIncarnation() : options_.incarnation) {}

CoordinationClient::~CoordinationClient() { StopWatching(); }

std::string CoordinationClient::Describe(const TaskId& task) const {
  return options_.describe ? options_.describe(task) : task.ToString();
}

std::shared_ptr<v1::Coordination::Stub> CoordinationClient::stub() const {
  absl::MutexLock lock(&mu_);
  return stub_;
}

int64_t CoordinationClient::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

// Server answers carry their own descriptive message; transport failures get
// the coordinator's name and address so the operator knows where to look.
absl::Status CoordinationClient::FromGrpc(int code, const std::string& message,
                                          const std::string& what) const {
  const auto c = static_cast<grpc::StatusCode>(code);
  const bool transport = c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::UNKNOWN ||
                         c == grpc::StatusCode::INTERNAL || c == grpc::StatusCode::CANCELLED ||
                         (c == grpc::StatusCode::DEADLINE_EXCEEDED &&
                          message == "Deadline Exceeded");
  if (!transport) return absl::Status(static_cast<absl::StatusCode>(code), message);
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat(what, ": coordinator ", Describe(coordinator_), " at ", address_,
                                   ": ", message));
}

absl::Status CoordinationClient::Connect(absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::BitGen gen;
  absl::Duration backoff = options_.initial_backoff;
  std::string last_error = "no attempt made (the deadline had already passed)";
  while (true) {
    grpc::ChannelArguments args;
    // A fresh channel per attempt re-resolves DNS now instead of after gRPC's
    // own resolver backoff; a subchannel pool of its own keeps attempts
    // independent. Keepalive then widens the reconnect backoff to 2 s.
    ApplyJobChannelArgs(&args);
    ApplyKeepalive(options_.keepalive, &args);
    args.SetMaxReceiveMessageSize(-1);  // values up to the server's limit
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        ChannelCredentialsFor(options_.security.get(), coordinator_, &args);
    auto channel = grpc::CreateCustomChannel(address_, credentials, args);
    auto stub = std::shared_ptr<v1::Coordination::Stub>(v1::Coordination::NewStub(channel));

    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::min(deadline, now + options_.connect_attempt_timeout));
    v1::PingRequest req;
    v1::PingResponse resp;
    const grpc::Status s = stub->Ping(&ctx, req, &resp);
    if (s.ok()) {
      const TaskId served = FromTaskRef(resp.coordinator());
      if (!(served == coordinator_)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the coordination service at ", address_, " coordinates ", served.ToString(),
            ", but this task expects ", coordinator_.ToString(),
            "; every task must get the same TF_CONFIG cluster"));
      }
      absl::MutexLock lock(&mu_);
      stub_ = std::move(stub);
      generation_ = std::max(generation_, resp.generation());
      return absl::OkStatus();
    }
    last_error = s.error_message();
    const absl::Duration sleep = Jitter(backoff, gen);
    if (absl::Now() + sleep >= deadline) {
      absl::SleepFor(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      break;
    }
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  // Rounded to 0.1 s: "within 5m", not "within 4m59.999812s".
  const absl::Duration budget =
      absl::Trunc(deadline - start + absl::Milliseconds(50), absl::Milliseconds(100));
  return absl::DeadlineExceededError(absl::StrCat("could not reach the coordinator ",
                                                  Describe(coordinator_), " at ", address_,
                                                  " within ", absl::FormatDuration(budget), ": ",
                                                  last_error));
}

absl::StatusOr<Membership> CoordinationClient::Join(absl::Time deadline) {
  auto s = stub();
  if (s == nullptr) return absl::FailedPreconditionError("CoordinationClient::Join before Connect");
  absl::BitGen gen;
  absl::Duration backoff = options_.initial_backoff;
  const absl::Time predecessor_deadline =
      std::min(deadline, absl::Now() + options_.live_predecessor_grace);
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, deadline + options_.rpc_slack);
    v1::JoinRequest req;
    *req.mutable_task() = ToTaskRef(self_);
    req.set_incarnation(incarnation_);
    req.set_timeout_ms(std::max<int64_t>(1, WaitMs(deadline - absl::Now())));
    v1::JoinResponse resp;
    const grpc::Status st = s->Join(&ctx, req, &resp);
    if (st.ok()) {
      Membership m;
      m.generation = resp.generation();
      m.rank = resp.rank();
      for (const auto& ref : resp.members()) m.members.push_back(FromTaskRef(ref));
      absl::MutexLock lock(&mu_);
      generation_ = std::max(generation_, m.generation);
      whole_generation_ = std::max(whole_generation_, m.generation);
      whole_membership_ = m;
      return m;
    }
    // Join is idempotent for one incarnation, so a broken connection is retried;
    // so is the refusal while our predecessor still looks alive (see
    // live_predecessor_grace), which the service words as below.
    const absl::Duration sleep = Jitter(backoff, gen);
    const bool predecessor_live =
        st.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        absl::StrContains(st.error_message(), "are two processes running as");
    if (predecessor_live && absl::Now() + sleep < predecessor_deadline) {
      absl::SleepFor(sleep);
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + sleep >= deadline) {
      return FromGrpc(st.error_code(), st.error_message(),
                      absl::StrCat("join of ", self_.ToString()));
    }
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status CoordinationClient::Set(const std::string& key, const std::string& value) {
  auto s = stub();
  if (s == nullptr) return absl::FailedPreconditionError("CoordinationClient::Set before Connect");
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + options_.rpc_timeout);
  v1::KeyValueSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::KeyValueSetResponse resp;
  const grpc::Status st = s->KeyValueSet(&ctx, req, &resp);
  if (st.ok()) return absl::OkStatus();
  return FromGrpc(st.error_code(), st.error_message(), absl::StrCat("set of key '", key, "'"));
}

absl::StatusOr<std::string> CoordinationClient::Get(const std::string& key,
                                                    absl::Duration timeout) {
  auto s = stub();
  if (s == nullptr) return absl::FailedPreconditionError("CoordinationClient::Get before Connect");
  const int64_t wait_ms = WaitMs(timeout);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + absl::Milliseconds(wait_ms) + options_.rpc_slack);
  v1::KeyValueGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(wait_ms);
  v1::KeyValueGetResponse resp;
  const grpc::Status st = s->KeyValueGet(&ctx, req, &resp);
  if (st.ok()) return std::move(*resp.mutable_value());
  return FromGrpc(st.error_code(), st.error_message(), absl::StrCat("get of key '", key, "'"));
}

absl::Status CoordinationClient::Barrier(const std::string& name, absl::Duration timeout) {
  auto s = stub();
  if (s == nullptr) {
    return absl::FailedPreconditionError("CoordinationClient::Barrier before Connect");
  }
  const int64_t wait_ms = WaitMs(timeout);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + absl::Milliseconds(wait_ms) + options_.rpc_slack);
  v1::BarrierRequest req;
  req.set_name(name);
  *req.mutable_task() = ToTaskRef(self_);
  req.set_timeout_ms(wait_ms);
  v1::BarrierResponse resp;
  const grpc::Status st = s->Barrier(&ctx, req, &resp);
  if (st.ok()) return absl::OkStatus();
  return FromGrpc(st.error_code(), st.error_message(), absl::StrCat("barrier '", name, "'"));
}

absl::Status CoordinationClient::Leave(bool departing) {
  auto s = stub();
  if (s == nullptr) {
    return absl::FailedPreconditionError("CoordinationClient::Leave before Connect");
  }
  {
    // Set before the call: the server may end our stream before we see the reply.
    absl::MutexLock lock(&mu_);
    leaving_ = true;
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + options_.rpc_timeout);
  v1::LeaveRequest req;
  *req.mutable_task() = ToTaskRef(self_);
  req.set_incarnation(incarnation_);
  req.set_departing(departing);
  v1::LeaveResponse resp;
  const grpc::Status st = s->Leave(&ctx, req, &resp);
  if (st.ok()) return absl::OkStatus();
  return FromGrpc(st.error_code(), st.error_message(), absl::StrCat("leave of ", self_.ToString()));
}

absl::Status CoordinationClient::StartWatching(FailureCallback on_failure,
                                               absl::Duration open_timeout) {
  absl::MutexLock start_lock(&watch_start_mu_);
  if (watch_started_) {
    return absl::FailedPreconditionError("CoordinationClient::StartWatching called twice");
  }
  auto s = stub();
  if (s == nullptr) {
    return absl::FailedPreconditionError("CoordinationClient::StartWatching before Connect");
  }
  grpc::ClientContext* ctx = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("CoordinationClient is stopping");
    on_failure_ = std::move(on_failure);
    // No deadline: the stream lives as long as the process; keepalive finds a
    // dead coordinator host.
    watch_context_ = std::make_unique<grpc::ClientContext>();
    ctx = watch_context_.get();
  }
  watch_started_ = true;
  watch_thread_ = std::thread([this, s, ctx] { WatchLoop(s, ctx); });

  bool ended_by_itself = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + open_timeout;
    while (!watch_confirmed_ && !watch_ended_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (watch_confirmed_) return absl::OkStatus();
    // Not confirmed: stop the thread without ever calling the callback.
    ended_by_itself = watch_ended_;
    reported_ = true;
    watch_context_->TryCancel();
  }
  watch_thread_.join();
  absl::MutexLock lock(&mu_);
  if (ended_by_itself) {
    if (!watch_end_status_.ok()) return watch_end_status_;
    return absl::UnavailableError(absl::StrCat("the coordinator ", Describe(coordinator_), " at ",
                                               address_, " closed the membership stream of ",
                                               self_.ToString(), " before confirming it"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the coordinator ", Describe(coordinator_), " at ", address_,
      " did not confirm the membership stream of ", self_.ToString(), " within ",
      absl::FormatDuration(open_timeout)));
}

void CoordinationClient::WatchLoop(std::shared_ptr<v1::Coordination::Stub> stub,
                                   grpc::ClientContext* ctx) {
  v1::WatchRequest req;
  *req.mutable_task() = ToTaskRef(self_);
  req.set_incarnation(incarnation_);
  std::unique_ptr<grpc::ClientReader<v1::MembershipUpdate>> reader =
      stub->WatchMembership(ctx, req);
  v1::MembershipUpdate update;
  while (reader->Read(&update)) {
    FailureCallback callback;
    absl::Status report;
    {
      absl::MutexLock lock(&mu_);
      if (!watch_confirmed_) {
        watch_confirmed_ = true;
        cv_.SignalAll();
      }
      generation_ = std::max(generation_, update.generation());
      if (update.failed_size() == 0) {
        // A snapshot of a whole group, or a re-admission: whole again.
        whole_generation_ = std::max(whole_generation_, update.generation());
        if (update.members_size() > 0 && update.generation() >= whole_membership_.generation) {
          Membership m;
          m.generation = update.generation();
          for (const auto& ref : update.members()) m.members.push_back(FromTaskRef(ref));
          const auto me = std::find(m.members.begin(), m.members.end(), self_);
          // Unranked tasks (ps) stay unranked; ranked ones come first.
          m.rank = me == m.members.end() || whole_membership_.rank < 0
                       ? -1
                       : static_cast<int>(me - m.members.begin());
          // A changed member set (elastic: someone joined or was dropped)
          // means the collectives of the old set are stale: report it like
          // a failure, so the strategy regroups at this generation.
          const bool resized = !whole_membership_.members.empty() &&
                               m.members != whole_membership_.members;
          std::string before;
          for (const auto& t : whole_membership_.members) {
            absl::StrAppend(&before, before.empty() ? "" : ", ", t.ToString());
          }
          whole_membership_ = std::move(m);
          if (resized) {
            last_failure_ = absl::AbortedError(absl::StrCat(
                "membership changed at generation ", update.generation(), ": ", update.reason(),
                " (was: ", before, ")"));
            last_failure_generation_ = update.generation();
            if (!reported_ && !leaving_ && !stopping_) {
              report = last_failure_;
              reported_ = true;
              callback = on_failure_;
            }
          }
        }
        cv_.SignalAll();
      } else {
        std::vector<TaskId> failed;
        for (const auto& ref : update.failed()) failed.push_back(FromTaskRef(ref));
        std::string names;
        for (const auto& t : failed) {
          absl::StrAppend(&names, names.empty() ? "" : ", ", Describe(t));
        }
        last_failure_ = absl::UnavailableError(absl::StrCat(
            failed.size() == 1 ? "peer " : "peers ", names, " failed: ", update.reason(),
            " (membership generation ", update.generation(), ")"));
        last_failure_generation_ = update.generation();
        cv_.SignalAll();
        if (!reported_ && !leaving_ && !stopping_) {
          report = last_failure_;
          reported_ = true;
          callback = on_failure_;
        }
      }
    }
    if (callback) callback(report);
  }
  const grpc::Status st = reader->Finish();
  FailureCallback callback;
  absl::Status report;
  {
    absl::MutexLock lock(&mu_);
    const bool was_confirmed = watch_confirmed_;
    watch_ended_ = true;
    watch_end_status_ =
        FromGrpc(st.error_code(), st.error_message(),
                 absl::StrCat("membership stream of ", self_.ToString()));
    cv_.SignalAll();
    if (was_confirmed && !reported_ && !leaving_ && !stopping_) {
      report = absl::UnavailableError(absl::StrCat(
          "lost the coordinator ", Describe(coordinator_), " at ", address_,
          ": its membership stream ended (",
          st.ok() ? "closed by the coordinator" : st.error_message(),
          "); the coordinator process died, was killed, or its host is unreachable"));
      reported_ = true;
      callback = on_failure_;
    }
  }
  if (callback) callback(report);
}

int64_t CoordinationClient::whole_generation() const {
  absl::MutexLock lock(&mu_);
  return whole_generation_;
}

Membership CoordinationClient::whole_membership() const {
  absl::MutexLock lock(&mu_);
  return whole_membership_;
}

absl::StatusOr<Membership> CoordinationClient::WaitForWholeGroup(
    int64_t after, absl::Time deadline, const std::function<bool()>& cancelled) {
  constexpr absl::Duration kPoll = absl::Milliseconds(50);
  absl::MutexLock lock(&mu_);
  while (whole_generation_ <= after) {
    if (watch_ended_) {
      return absl::UnavailableError(absl::StrCat(
          "lost the coordinator ", Describe(coordinator_), " at ", address_,
          " while waiting for the group to re-form: nobody can re-admit a replacement"));
    }
    if (cancelled && cancelled()) {
      return absl::CancelledError("stopped while waiting for the group to re-form");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the group did not re-form: no replacement for the lost task(s) was admitted after "
          "membership generation ",
          after, " (", last_failure_.message(), ")"));
    }
    cv_.WaitWithDeadline(&mu_, std::min(deadline, now + kPoll));
  }
  Membership m = whole_membership_;
  m.generation = whole_generation_;  // a re-admission without members listed keeps the set
  return m;
}

bool CoordinationClient::membership_stream_ended() const {
  absl::MutexLock lock(&mu_);
  return watch_ended_;
}

absl::Status CoordinationClient::RearmFailureReport(int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (leaving_ || stopping_) return absl::OkStatus();
  if (last_failure_generation_ > generation) return last_failure_;  // still spent
  if (watch_ended_) {
    return absl::UnavailableError(absl::StrCat("lost the coordinator ", Describe(coordinator_),
                                               " at ", address_));
  }
  reported_ = false;
  return absl::OkStatus();
}

void CoordinationClient::StopWatching() {
  absl::MutexLock start_lock(&watch_start_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (watch_thread_.joinable()) {
    DISTRAIN_CHECK(watch_thread_.get_id() != std::this_thread::get_id())
        << "CoordinationClient::StopWatching (or the destructor) called from its failure callback";
    watch_thread_.join();
  }
}

}  // namespace distrain

#include "worker/strategy/ps_membership.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "distrain/v1/ps_membership.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"
#include "worker/coordination/grpc_support.h"

namespace distrain {
namespace {

constexpr size_t kMaxIncarnationBytes = 128;
constexpr size_t kMaxHostBytes = 253;  // a DNS name

std::string Cut(const std::string& s) {
  return s.size() <= 64 ? s : absl::StrCat(s.substr(0, 64), "...");
}

absl::Status CheckIncarnation(const std::string& inc, const char* field) {
  if (inc.empty() || inc.size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be 1..", kMaxIncarnationBytes,
                                                   " bytes (unique per process start); got ",
                                                   inc.size(), " bytes"));
  }
  for (char c : inc) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

grpc::Status Error(grpc::StatusCode code, const std::string& message) {
  return grpc::Status(code, message);
}

}  // namespace

absl::Status ValidatePsWorkerAddress(const std::string& address) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PsJoinRequest.address '", Cut(address), "': ", why,
        "; it must be host:port, the worker's own TF_CONFIG address (a DNS name, an IPv4 "
        "address or [IPv6]) with a port in 1..65535"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host:port");
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return bad("the port is not a number in 1..65535");
  }
  const std::string host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("an IPv6 host must be in brackets");
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return bad("the IPv6 host has a character that is not a hex digit, ':' or '.'");
      }
    }
    return absl::OkStatus();
  }
  if (host.size() > kMaxHostBytes) return bad("the host is longer than 253 bytes");
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      return bad("the host has a character other than letters, digits, '.', '-' and '_'");
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Server

class PsMembershipServer::Impl final : public v1::PsMembership::Service {
 public:
  explicit Impl(PsMembershipServerOptions options) : options_(std::move(options)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::PsJoinRequest* req,
                    grpc::ServerWriter<v1::PsMembershipEvent>* writer) override {
    const int w = req->worker_index();
    if (grpc::Status s = CheckIndex(w, "PsJoinRequest.worker_index"); !s.ok()) return s;
    const TaskId task{"worker", w};
    if (grpc::Status s = CheckCallerIs(options_.security.get(), *ctx, "PsMembership.Join", task);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckIncarnation(req->incarnation(), "PsJoinRequest.incarnation");
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (absl::Status s = ValidatePsWorkerAddress(req->address()); !s.ok()) return ToGrpcStatus(s);

    uint64_t my_stream = 0;
    v1::PsMembershipEvent event;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return ShuttingDown();
      auto it = members_.find(w);
      if (it != members_.end() && it->second.incarnation != req->incarnation()) {
        // Step 4: a new process for the same task; the old one is gone.
        ReportLocked(PsMembershipChange::Kind::kFailed, w, it->second,
                     absl::StrCat("replaced by a new process (incarnation ", req->incarnation(),
                                  ")"));
      }
      Member& m = members_[w];
      m.incarnation = req->incarnation();
      m.address = req->address();
      m.stream = my_stream = ++next_stream_;
      ReportLocked(PsMembershipChange::Kind::kJoined, w, m, "");
      event.set_generation(generation_);
      event.set_workers(static_cast<int>(members_.size()));
      cv_.SignalAll();  // a replaced stream ends
    }
    const std::string name = absl::StrCat("worker:", w, " (", req->address(), ")");
    bool closed = !writer->Write(event);

    absl::MutexLock lock(&mu_);
    while (!closed) {
      auto it = members_.find(w);
      if (it == members_.end()) return grpc::Status::OK;  // step 5: left
      if (it->second.stream != my_stream) {
        // Step 4: replaced by a newer Join of this worker.
        return Error(grpc::StatusCode::ABORTED,
                     absl::StrCat(name, ": replaced in the worker set by a newer Join of worker:",
                                  w, " (incarnation ", it->second.incarnation, ")"));
      }
      if (shutting_down_) return ShuttingDown();
      if (ctx->IsCancelled()) break;
      cv_.WaitWithTimeout(&mu_, options_.cancel_poll);
    }
    // Step 6: the stream ended without Leave.
    auto it = members_.find(w);
    if (it != members_.end() && it->second.stream == my_stream && !shutting_down_) {
      const Member gone = it->second;
      members_.erase(it);
      ReportLocked(PsMembershipChange::Kind::kFailed, w, gone,
                   absl::StrCat(name, " lost: its membership stream closed without Leave "
                                      "(process died, or its connection or host was lost)"));
    }
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const v1::PsLeaveRequest* req,
                     v1::PsLeaveResponse*) override {
    const int w = req->worker_index();
    if (grpc::Status s = CheckIndex(w, "PsLeaveRequest.worker_index"); !s.ok()) return s;
    if (grpc::Status s = CheckCallerIs(options_.security.get(), *ctx, "PsMembership.Leave",
                                       TaskId{"worker", w});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckIncarnation(req->incarnation(), "PsLeaveRequest.incarnation");
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return grpc::Status::OK;
    auto it = members_.find(w);
    if (it == members_.end() || it->second.incarnation != req->incarnation()) {
      return grpc::Status::OK;  // idempotent; a newer process holds the index
    }
    const Member gone = it->second;
    members_.erase(it);
    ReportLocked(PsMembershipChange::Kind::kLeft, w, gone, "it left cleanly");
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  void BeginShutdown() {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    cv_.SignalAll();
  }

  int64_t generation() const {
    absl::MutexLock lock(&mu_);
    return generation_;
  }

  std::map<int, std::string> members() const {
    absl::MutexLock lock(&mu_);
    std::map<int, std::string> out;
    for (const auto& [w, m] : members_) out[w] = m.address;
    return out;
  }

 private:
  struct Member {
    std::string incarnation;
    std::string address;
    uint64_t stream = 0;  // the Join call that holds the membership
  };

  grpc::Status CheckIndex(int w, const char* field) const {
    if (w < 0 || w >= options_.max_workers) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat(field, " is ", w, "; it must be in [0, ", options_.max_workers,
                                "): the index of this worker task in TF_CONFIG "
                                "(spec.replicaSpecs.Worker.replicas is at most ",
                                options_.max_workers, ")"));
    }
    return grpc::Status::OK;
  }

  static grpc::Status ShuttingDown() {
    return Error(grpc::StatusCode::UNAVAILABLE, "the chief is shutting down its worker set");
  }

  void ReportLocked(PsMembershipChange::Kind kind, int w, const Member& m,
                    const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++generation_;
    if (!options_.on_change) return;
    PsMembershipChange change;
    change.kind = kind;
    change.worker = w;
    change.address = m.address;
    change.incarnation = m.incarnation;
    change.reason = reason;
    change.generation = generation_;
    options_.on_change(change);
  }

  const PsMembershipServerOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, Member> members_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<PsMembershipServer>> PsMembershipServer::Start(
    const std::string& listen_address, PsMembershipServerOptions options) {
  if (options.cancel_poll <= absl::ZeroDuration()) options.cancel_poll = absl::Milliseconds(50);
  if (options.max_workers < 1) options.max_workers = 1;
  auto impl = std::make_unique<Impl>(options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_address, ServerCredentialsFor(options.security.get()), &port);
  builder.RegisterService(impl.get());
  ApplyKeepalive(options.keepalive, &builder);
  // No silent second chief on the same port (gRPC sets SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Every request is a few hundred bytes.
  builder.SetMaxReceiveMessageSize(16 << 10);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "ParameterServer: the chief cannot serve its worker set (PsMembership) on ",
        listen_address,
        ": the port of the chief's TF_CONFIG address is in use (an earlier chief still "
        "exiting?) or the host is not an address of this machine"));
  }
  return std::unique_ptr<PsMembershipServer>(
      new PsMembershipServer(std::move(impl), std::move(server), port));
}

PsMembershipServer::PsMembershipServer(std::unique_ptr<Impl> impl,
                                       std::unique_ptr<grpc::Server> server, int port)
    : impl_(std::move(impl)), server_(std::move(server)), port_(port) {}

PsMembershipServer::~PsMembershipServer() { Shutdown(); }

int64_t PsMembershipServer::generation() const { return impl_->generation(); }

std::map<int, std::string> PsMembershipServer::members() const { return impl_->members(); }

void PsMembershipServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  impl_->BeginShutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
}

// ---------------------------------------------------------------------------
// Client

PsMembershipClient::PsMembershipClient(PsMembershipClientOptions options)
    : options_(std::move(options)) {
  grpc::ChannelArguments args;
  ApplyJobChannelArgs(&args);
  ApplyKeepalive(options_.keepalive, &args);
  channel_ = grpc::CreateCustomChannel(
      options_.chief_address,
      ChannelCredentialsFor(options_.security.get(), TaskId{"chief", 0}, &args), args);
}

PsMembershipClient::~PsMembershipClient() { Stop(); }

void PsMembershipClient::Start() {
  DISTRAIN_CHECK(!thread_.joinable()) << "PsMembershipClient::Start called twice";
  thread_ = std::thread([this] { Loop(); });
}

absl::Status PsMembershipClient::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void PsMembershipClient::Loop() {
  auto stub = v1::PsMembership::NewStub(channel_);
  absl::Duration backoff = options_.initial_backoff;
  int64_t failed_attempts = 0;
  while (true) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stream_ = &ctx;
    }
    v1::PsJoinRequest req;
    req.set_worker_index(options_.worker_index);
    req.set_incarnation(options_.incarnation);
    req.set_address(options_.address);
    std::unique_ptr<grpc::ClientReader<v1::PsMembershipEvent>> reader = stub->Join(&ctx, req);
    v1::PsMembershipEvent event;
    bool confirmed = false;
    while (reader->Read(&event)) {
      if (!confirmed) {
        confirmed = true;
        joined_.store(true);
        const int64_t n = ++joins_;
        backoff = options_.initial_backoff;
        failed_attempts = 0;
        spdlog::info("worker:{} {} the chief's worker set at {} (generation {}, {} worker(s))",
                     options_.worker_index, n == 1 ? "joined" : "joined again",
                     options_.chief_address, event.generation(), event.workers());
      }
    }
    const grpc::Status s = reader->Finish();
    joined_.store(false);
    {
      absl::MutexLock lock(&mu_);
      stream_ = nullptr;
      if (stopping_) return;
      if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
          s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        refused_ = FromGrpcStatus(s);
        spdlog::error("worker:{}: the chief refuses this worker in its worker set: {}; it will "
                      "get closures only while it is in the chief's TF_CONFIG",
                      options_.worker_index, s.error_message());
        return;
      }
      if (s.error_code() == grpc::StatusCode::ABORTED) {
        // Step 4: another process holds this task now; joining again would
        // take it back from the process that replaced this one.
        refused_ = FromGrpcStatus(s);
        spdlog::warn("worker:{}: {}; not joining again", options_.worker_index, s.error_message());
        return;
      }
    }
    if (confirmed) {
      spdlog::warn("worker:{}: the membership stream to the chief ended ({}); joining again",
                   options_.worker_index, s.ok() ? "closed by the chief" : s.error_message());
    } else if (++failed_attempts % 30 == 0) {
      spdlog::info("worker:{}: the chief at {} does not answer yet ({}); still trying",
                   options_.worker_index, options_.chief_address, s.error_message());
    }
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status PsMembershipClient::Leave() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // no rejoin after the server ends the stream
  }
  auto stub = v1::PsMembership::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.rpc_timeout));
  v1::PsLeaveRequest req;
  req.set_worker_index(options_.worker_index);
  req.set_incarnation(options_.incarnation);
  v1::PsLeaveResponse resp;
  const grpc::Status s = stub->Leave(&ctx, req, &resp);
  Stop();
  return FromGrpcStatus(s);
}

void PsMembershipClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (stream_ != nullptr) stream_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace distrain

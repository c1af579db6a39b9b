#include "worker/security/transport_security.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace distrain {
namespace {

// Written once by main before threads start; shared_ptr copies are atomic
// through std::atomic_load/store so a test that swaps it stays defined.
std::shared_ptr<const TransportSecurity>& ProcessSlot() {
  static auto* slot = new std::shared_ptr<const TransportSecurity>();
  return *slot;
}

}  // namespace

TransportSecurity::TransportSecurity(LoadedCredentials credentials)
    : credentials_(std::move(credentials)) {}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials() const {
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = credentials_.ca_cert_pem;
  options.pem_key_cert_pairs.push_back({credentials_.key_pem, credentials_.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TransportSecurity::ChannelCredentials() const {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = credentials_.ca_cert_pem;
  options.pem_private_key = credentials_.key_pem;
  options.pem_cert_chain = credentials_.cert_pem;
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TransportSecurity* security) {
  return security != nullptr ? security->ServerCredentials() : grpc::InsecureServerCredentials();
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TransportSecurity* security,
                                                                const TaskId& server,
                                                                grpc::ChannelArguments* args) {
  if (security == nullptr) return grpc::InsecureChannelCredentials();
  args->SetSslTargetNameOverride(TaskServerName(server));
  return security->ChannelCredentials();
}

std::optional<TaskId> CallerTask(const grpc::ServerContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return std::nullopt;
  std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.size() != 1) return std::nullopt;
  absl::StatusOr<TaskId> task =
      ParseTaskCommonName(std::string(names[0].data(), names[0].size()));
  if (!task.ok()) return std::nullopt;
  return *task;
}

grpc::Status CheckCaller(const TransportSecurity* security, const grpc::ServerContext& ctx,
                         std::string_view method, const std::function<bool(const TaskId&)>& allowed,
                         std::string_view who_may) {
  if (security == nullptr) return grpc::Status::OK;
  std::optional<TaskId> caller = CallerTask(ctx);
  if (!caller.has_value()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(std::string(method), ": the call carries no task certificate of this job"));
  }
  if (!allowed(*caller)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(std::string(method), ": refused for ", caller->ToString(), "; ",
                                     std::string(who_may), " may call it"));
  }
  return grpc::Status::OK;
}

grpc::Status CheckCallerIs(const TransportSecurity* security, const grpc::ServerContext& ctx,
                           std::string_view method, const TaskId& task) {
  return CheckCaller(
      security, ctx, method, [&](const TaskId& caller) { return caller == task; },
      absl::StrCat("only ", task.ToString(), " itself"));
}

void SetProcessTransportSecurity(std::shared_ptr<const TransportSecurity> security) {
  std::atomic_store(&ProcessSlot(), std::move(security));
}

std::shared_ptr<const TransportSecurity> ProcessTransportSecurity() {
  return std::atomic_load(&ProcessSlot());
}

}  // namespace distrain

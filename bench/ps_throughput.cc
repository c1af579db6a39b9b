// ps_throughput: both sides of bench/ps_throughput.py — the parameter-server
// push+pull throughput over real processes on loopback, through the same
// PsService / PsClient the ParameterServer strategy uses.
//
//   ps_throughput --role ps --port P [--optimizer sgd|adam] [--chunk-bytes C]
//     Serves one ps task (task 0 of 1) on 127.0.0.1:P, prints "READY <port>"
//     and serves until SIGTERM/SIGINT.
//
//   ps_throughput --role worker --ps 127.0.0.1:P --worker I --tensor-bytes B
//                 --start-at UNIX_SECONDS [--warmup 0.5] [--seconds 2]
//                 [--variable shared|own] [--chunk-bytes C]
//     One worker. Protocol:
//       1. connect (WaitForReady), declare the variable (one float32 tensor of
//          B bytes, one shard, named "v" — shared by every worker, as the
//          workers of a job share the model — or "v<I>" with --variable own),
//          upload initial values (the first worker's win);
//       2. sleep until --start-at (the driver gives every worker the same wall
//          clock instant, so their measurement windows coincide);
//       3. repeat one operation — Pull the whole variable into a
//          preallocated tensor, then Push a gradient of the same size (applied
//          by the ps's optimizer) — for --warmup seconds untimed, then for
//          --seconds timed;
//       4. print RESULT {"side": "distrain_ps", "worker": I, "bytes": B,
//          "ops": K, "seconds": S, "ops_per_second": K/S,
//          "bytes_per_second": 2*B*K/S, "median_op_s": ..., "p90_op_s": ...,
//          "median_pull_s": ..., "median_push_s": ...}
//          where S runs from the start of the first timed operation to the
//          end of the last, so operations cut by the window edges bias nothing.
//     The driver sums ops_per_second and bytes_per_second over the workers.
//   Both roles take --credentials-dir DIR (a directory `distrain credentials`
//   wrote: ps-0 for the ps, worker-I for workers) to run mutual TLS, as a
//   job does by default; without it, plaintext.
// Exit codes: 0 done, 1 a ps call failed (the message names it), 2 bad flags.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/ps/partitioner.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_service.h"
#include "worker/security/transport_security.h"

namespace distrain {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

struct Flags {
  std::string role;
  int port = 0;
  std::string ps;
  int worker = 0;
  int64_t tensor_bytes = 16 << 20;
  double start_at = 0;
  double warmup = 0.5;
  double seconds = 2.0;
  std::string variable = "shared";
  std::string optimizer = "sgd";
  int64_t chunk_bytes = 1 << 20;
  std::string credentials_dir;  // mutual TLS with these (distrain credentials); empty: plaintext
};

// The process's job credentials, or null (plaintext) without --credentials-dir.
absl::StatusOr<std::shared_ptr<const TransportSecurity>> Security(const Flags& flags) {
  if (flags.credentials_dir.empty()) return std::shared_ptr<const TransportSecurity>();
  absl::StatusOr<LoadedCredentials> loaded = LoadCredentialsDir(flags.credentials_dir);
  if (!loaded.ok()) return loaded.status();
  return std::make_shared<const TransportSecurity>(*std::move(loaded));
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ps_throughput: %s\n", std::string(s.message()).c_str());
  return 1;
}

int RunPs(const Flags& flags) {
  PsServiceOptions options;
  options.task_index = 0;
  options.num_ps = 1;
  options.optimizer.type = flags.optimizer == "adam" ? OptimizerType::kAdam : OptimizerType::kSgd;
  options.optimizer.learning_rate = 1e-6f;  // values stay bounded however long it runs
  options.chunk_bytes = flags.chunk_bytes;
  auto security = Security(flags);
  if (!security.ok()) return Fail(security.status());
  options.security = *security;
  auto server = PsServer::Start(absl::StrCat("127.0.0.1:", flags.port), options);
  if (!server.ok()) return Fail(server.status());
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::printf("READY %d\n", (*server)->port());
  std::fflush(stdout);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (*server)->Shutdown();
  return 0;
}

int RunWorker(const Flags& flags) {
  if (flags.tensor_bytes < 4 || flags.tensor_bytes % 4 != 0) {
    std::fprintf(stderr, "ps_throughput: --tensor-bytes must be a positive multiple of 4\n");
    return 2;
  }
  const int64_t elements = flags.tensor_bytes / 4;
  const std::string name =
      flags.variable == "own" ? absl::StrCat("v", flags.worker) : std::string("v");
  auto plan = ShardingPlan::Create({{name, {elements}}}, Partitioner::None(), 1);
  if (!plan.ok()) return Fail(plan.status());
  PsClientOptions options;
  options.chunk_bytes = flags.chunk_bytes;
  options.rpc_timeout = absl::Seconds(120);
  auto security = Security(flags);
  if (!security.ok()) return Fail(security.status());
  options.security = *security;
  auto client = PsClient::Create({flags.ps}, *plan, options);
  if (!client.ok()) return Fail(client.status());
  PsClient& ps = **client;
  // 1.
  if (absl::Status s = ps.WaitForReady(); !s.ok()) return Fail(s);
  Tensor value({elements}, 0.5f);
  Tensor grad({elements}, 1e-3f);
  const TensorRef initial[] = {{name, &value}};
  // With credentials the ps lets only the chief declare and initialise (as
  // in a job): the driver gives worker 0 the chief's certificate, and the
  // others find the variable there by --start-at. Without, every worker
  // declares (idempotent; the first initialisation wins).
  const bool declares = *security == nullptr || (*security)->self().type == "chief";
  if (declares) {
    if (absl::Status s = ps.CreateVariables(); !s.ok()) return Fail(s);
    if (auto r = ps.Initialize(initial); !r.ok()) return Fail(r.status());
  }
  const MutableTensorRef pull_into[] = {{name, &value}};
  const TensorRef push[] = {{name, &grad}};
  double pull_seconds = 0;  // of the last op
  auto op = [&]() -> absl::Status {
    ShardVersions versions;
    const double t0 = Now();
    if (absl::Status s = ps.PullInto(pull_into, &versions); !s.ok()) return s;
    pull_seconds = Now() - t0;
    auto pushed = ps.Push(push, &versions);
    return pushed.ok() ? absl::OkStatus() : pushed.status();
  };
  // 2.
  const double wait = flags.start_at - absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  // 3.
  const double warm_end = Now() + flags.warmup;
  while (Now() < warm_end) {
    if (absl::Status s = op(); !s.ok()) return Fail(s);
  }
  std::vector<double> latencies, pulls, pushes;
  const double first = Now();
  const double end = first + flags.seconds;
  double last = first;
  while (last < end) {
    const double t0 = Now();
    if (absl::Status s = op(); !s.ok()) return Fail(s);
    last = Now();
    latencies.push_back(last - t0);
    pulls.push_back(pull_seconds);
    pushes.push_back(last - t0 - pull_seconds);
  }
  // 4.
  const double seconds = last - first;
  const int64_t ops = static_cast<int64_t>(latencies.size());
  for (auto* v : {&latencies, &pulls, &pushes}) std::sort(v->begin(), v->end());
  std::printf(
      "RESULT {\"side\": \"distrain_ps\", \"worker\": %d, \"bytes\": %lld, \"ops\": %lld, "
      "\"seconds\": %.6f, \"ops_per_second\": %.3f, \"bytes_per_second\": %.1f, "
      "\"median_op_s\": %.9f, \"p90_op_s\": %.9f, \"median_pull_s\": %.9f, "
      "\"median_push_s\": %.9f}\n",
      flags.worker, static_cast<long long>(flags.tensor_bytes), static_cast<long long>(ops),
      seconds, ops / seconds, 2.0 * flags.tensor_bytes * ops / seconds,
      latencies[latencies.size() / 2], latencies[latencies.size() * 9 / 10],
      pulls[pulls.size() / 2], pushes[pushes.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace distrain

int main(int argc, char** argv) {
  distrain::Flags flags;
  CLI::App app{"ps_throughput: parameter-server push+pull throughput over loopback (one side of "
               "bench/ps_throughput.py)"};
  app.add_option("--role", flags.role, "ps | worker")
      ->required()
      ->check(CLI::IsMember({"ps", "worker"}));
  app.add_option("--port", flags.port, "ps: port on 127.0.0.1 (0: any free one)");
  app.add_option("--ps", flags.ps, "worker: the ps address host:port");
  app.add_option("--worker", flags.worker, "worker: this worker's index");
  app.add_option("--tensor-bytes", flags.tensor_bytes, "worker: variable size in bytes")
      ->capture_default_str();
  app.add_option("--start-at", flags.start_at, "worker: wall-clock time (Unix seconds) to start");
  app.add_option("--warmup", flags.warmup, "worker: untimed seconds first")->capture_default_str();
  app.add_option("--seconds", flags.seconds, "worker: timed seconds")->capture_default_str();
  app.add_option("--variable", flags.variable, "worker: shared (one variable for all) | own")
      ->check(CLI::IsMember({"shared", "own"}))
      ->capture_default_str();
  app.add_option("--optimizer", flags.optimizer, "ps: the optimizer applying pushes")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_option("--credentials-dir", flags.credentials_dir,
                 "mutual TLS with this task's credentials (`distrain credentials`: ps:0 for the "
                 "ps, worker:I for workers); default plaintext");
  app.add_option("--chunk-bytes", flags.chunk_bytes, "streamed chunk payload (both sides)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  distrain::KeepPsBuffersMapped();  // as the strategy's ps and worker tasks do
  if (flags.role == "ps") return distrain::RunPs(flags);
  if (flags.ps.empty()) {
    std::fprintf(stderr, "ps_throughput: --role worker needs --ps host:port\n");
    return 2;
  }
  return distrain::RunWorker(flags);
}

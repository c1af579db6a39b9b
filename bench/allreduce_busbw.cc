// allreduce_busbw: distrain's side of bench/allreduce_busbw.py.
//
// One process per rank. Each finds its peers the way MultiWorkerMirrored
// does: TF_CONFIG names the cluster, the coordinator task (chief:0, or
// worker:0) serves the coordination service, every task joins it
// (Rendezvous), and the RingCollective publishes its TCP addresses through
// that service's key-value store. Then, for each size (float32, SUM):
//   1. value(i, r) = (7 i + 3 r) mod 11 on rank r; one AllReduce; every rank
//      checks every element against the exact sum (small integers, exact in
//      float32). A wrong element fails the run (exit 1) naming the index.
//   2. `warmup` more AllReduces; rank 0 times them and picks the iteration
//      count (enough for `target-seconds`, at least `min-iters`, at most
//      `max-iters`) and Broadcasts it.
//   3. Each AllReduce is timed on its own on rank 0 with no barrier in
//      between (steady state, as in a training loop); the median is reported.
// In place, like MPI_IN_PLACE on the MPI side; the values are not reset
// between iterations (positive values only grow, at worst to +inf, which
// costs the same as any value on x86: no denormals).
//
// Rank 0 prints one line per size:
//   RESULT {"side": "distrain", "ranks": N, "bytes": B, "iters": K,
//           "median_s": T, "mean_s": T, "sent_per_byte": S, "cpu_s_per_op": C}
// cpu_s_per_op is rank 0's process CPU time (user + system, all threads)
// over the timed iterations, per operation: on a machine shared with other
// load it says what an operation costs independently of what else runs.
// sent_per_byte is what rank 0 sent per payload byte per operation
// (2(N-1)/N for the ring, N-1 for the small-payload all-gather path).
// Exit codes: 0 done, 1 a collective or the check failed, 2 bad flags or TF_CONFIG.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cluster_spec.h"
#include "worker/collective/ring.h"
#include "worker/coordination/rendezvous.h"
#include "worker/security/transport_security.h"

namespace distrain {
namespace {

struct Flags {
  std::string sizes = "4096,65536,1048576,16777216,67108864";
  int warmup = 3;
  int min_iters = 5;
  int max_iters = 20000;
  double target_seconds = 0.5;
  double timeout_seconds = 120;
  int64_t chunk_bytes = 0;          // 0: RingOptions' default
  int stage_slices = 0;             // 0: RingOptions' default
  int socket_buffer_bytes = -1;     // -1: RingOptions' default
  int64_t small_allreduce_bytes = -1;
  int64_t halving_doubling_bytes = -1;
  int64_t busy_poll_us = -1;        // -1: RingOptions' default
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// User + system CPU seconds of this process (all threads) so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

float Pattern(int64_t i, int rank) { return static_cast<float>((7 * i + 3 * int64_t{rank}) % 11); }

// Step 1: one checked AllReduce.
absl::Status CheckedAllReduce(Collective& ring, std::vector<float>& buf, const CollectiveOptions& opts) {
  const int64_t count = static_cast<int64_t>(buf.size());
  for (int64_t i = 0; i < count; ++i) buf[i] = Pattern(i, ring.rank());
  if (absl::Status s = ring.AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, opts); !s.ok()) return s;
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < count; ++i) {
    int64_t want = 0;
    for (int r = 0; r < ring.size(); ++r) want += (7 * i + 3 * int64_t{r}) % 11;
    if (buf[i] != static_cast<float>(want)) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  }
  if (bad > 0) {
    return absl::InternalError(absl::StrCat("rank ", ring.rank(), ": ", bad, " of ", count,
                                            " elements wrong after AllReduce (first at index ",
                                            first_bad, ": ", buf[first_bad], ")"));
  }
  return absl::OkStatus();
}

absl::Status MeasureSize(Collective& ring, int64_t bytes, const Flags& flags) {
  const CollectiveOptions opts{absl::Seconds(flags.timeout_seconds), absl::StrCat("bench/", bytes)};
  std::vector<float> buf(static_cast<size_t>(bytes / 4));
  if (absl::Status s = CheckedAllReduce(ring, buf, opts); !s.ok()) return s;

  // Step 2.
  const double t0 = Now();
  for (int i = 0; i < flags.warmup; ++i) {
    if (absl::Status s = ring.AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, opts); !s.ok()) return s;
  }
  const double per_op = flags.warmup > 0 ? (Now() - t0) / flags.warmup : 0;
  float iters_f = static_cast<float>(flags.min_iters);
  if (ring.rank() == 0 && per_op > 0) {
    iters_f = static_cast<float>(
        std::clamp(static_cast<int64_t>(flags.target_seconds / per_op) + 1, int64_t{flags.min_iters},
                   int64_t{std::max(flags.min_iters, flags.max_iters)}));
  }
  if (absl::Status s = ring.Broadcast(absl::MakeSpan(&iters_f, 1), 0, opts); !s.ok()) return s;
  const int iters = static_cast<int>(iters_f);

  // Step 3.
  std::vector<double> times;
  times.reserve(iters);
  const int64_t sent_before = ring.stats().bytes_sent;
  const double cpu_before = CpuSeconds();
  for (int i = 0; i < iters; ++i) {
    const double a = Now();
    if (absl::Status s = ring.AllReduce(absl::MakeSpan(buf), ReduceOp::kSum, opts); !s.ok()) return s;
    times.push_back(Now() - a);
  }
  const int64_t sent = ring.stats().bytes_sent - sent_before;
  const double cpu = CpuSeconds() - cpu_before;
  if (ring.rank() == 0) {
    double total = 0;
    for (double t : times) total += t;
    std::sort(times.begin(), times.end());
    const double median =
        iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    std::printf(
        "RESULT {\"side\": \"distrain\", \"ranks\": %d, \"bytes\": %lld, \"iters\": %d, "
        "\"median_s\": %.9g, \"mean_s\": %.9g, \"sent_per_byte\": %.4f, "
        "\"cpu_s_per_op\": %.9g}\n",
        ring.size(), static_cast<long long>(bytes), iters, median, total / iters,
        bytes > 0 ? static_cast<double>(sent) / iters / bytes : 0.0, cpu / iters);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

int Run(const Flags& flags) {
  std::vector<int64_t> sizes;
  for (absl::string_view piece : absl::StrSplit(flags.sizes, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(piece, &v) || v < 0 || v % 4 != 0) {
      std::fprintf(stderr, "allreduce_busbw: --sizes: '%s' is not a byte count that is a multiple of 4\n",
                   std::string(piece).c_str());
      return 2;
    }
    sizes.push_back(v);
  }
  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr) {
    std::fprintf(stderr, "allreduce_busbw: TF_CONFIG is not set (bench/allreduce_busbw.py sets it)\n");
    return 2;
  }
  absl::StatusOr<ClusterSpec> cluster = ClusterSpec::Parse(tf_config);
  if (!cluster.ok()) {
    std::fprintf(stderr, "allreduce_busbw: TF_CONFIG: %s\n", cluster.status().ToString().c_str());
    return 2;
  }
  std::vector<TaskId> members;
  for (int r = 0; r < cluster->num_training_tasks(); ++r) members.push_back(cluster->TaskForTrainingRank(r));

  // As the worker does: mutual TLS for the coordination service and the
  // ring's HMAC handshake when DISTRAIN_CREDENTIALS_DIR names this task's
  // credentials; plaintext otherwise. Set before any options are made (they
  // read the process's credentials when constructed).
  if (const char* dir = std::getenv("DISTRAIN_CREDENTIALS_DIR"); dir != nullptr && *dir) {
    absl::StatusOr<LoadedCredentials> loaded = LoadCredentialsDir(dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "allreduce_busbw: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    SetProcessTransportSecurity(std::make_shared<const TransportSecurity>(*std::move(loaded)));
  }
  RendezvousOptions rv_options;
  rv_options.join_timeout = absl::Seconds(flags.timeout_seconds);
  absl::StatusOr<std::unique_ptr<Rendezvous>> rendezvous =
      Rendezvous::Start(*cluster, members, rv_options);
  if (!rendezvous.ok()) {
    std::fprintf(stderr, "allreduce_busbw: rendezvous: %s\n", rendezvous.status().ToString().c_str());
    return 1;
  }
  Rendezvous& rv = **rendezvous;

  RingOptions ring_options;
  ring_options.key_prefix = absl::StrCat("bench/allreduce_busbw/", rv.generation());
  const std::string address = cluster->my_address().value_or("127.0.0.1:0");
  ring_options.bind_host = address.substr(0, address.rfind(':'));
  ring_options.setup_timeout = absl::Seconds(flags.timeout_seconds);
  for (int r = 0; r < rv.size(); ++r) ring_options.peer_names.push_back(rv.peer_name(r));
  if (flags.chunk_bytes > 0) ring_options.chunk_bytes = flags.chunk_bytes;
  if (flags.stage_slices > 0) ring_options.stage_slices = flags.stage_slices;
  if (flags.socket_buffer_bytes >= 0) ring_options.socket_buffer_bytes = flags.socket_buffer_bytes;
  if (flags.small_allreduce_bytes >= 0) ring_options.small_allreduce_bytes = flags.small_allreduce_bytes;
  if (flags.halving_doubling_bytes >= 0) ring_options.halving_doubling_bytes = flags.halving_doubling_bytes;
  if (flags.busy_poll_us >= 0) ring_options.busy_poll = absl::Microseconds(flags.busy_poll_us);
  absl::StatusOr<std::unique_ptr<RingCollective>> created =
      RingCollective::Create(rv.store(), rv.rank(), rv.size(), ring_options);
  if (!created.ok()) {
    std::fprintf(stderr, "allreduce_busbw: ring setup: %s\n", created.status().ToString().c_str());
    return 1;
  }
  // Shared with the failure callback, which may run until the Rendezvous is gone.
  std::shared_ptr<RingCollective> ring = std::move(*created);
  // A peer that dies makes the coordinator report it; fail the ring at once
  // instead of waiting for the operation timeout.
  rv.StartWatching([ring](const absl::Status& s) { ring->Abort(s); });

  for (int64_t bytes : sizes) {
    if (absl::Status s = MeasureSize(*ring, bytes, flags); !s.ok()) {
      std::fprintf(stderr, "allreduce_busbw: rank %d, %lld bytes: %s\n", rv.rank(),
                   static_cast<long long>(bytes), s.ToString().c_str());
      return 1;
    }
  }
  const CollectiveOptions done{absl::Seconds(flags.timeout_seconds), "bench/done"};
  if (absl::Status s = ring->Barrier(done); !s.ok()) {
    std::fprintf(stderr, "allreduce_busbw: final barrier: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = rv.Shutdown(absl::Seconds(30)); !s.ok()) {
    std::fprintf(stderr, "allreduce_busbw: shutdown: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace distrain

int main(int argc, char** argv) {
  distrain::Flags flags;
  CLI::App app{"allreduce_busbw: distrain's ring all-reduce timed over buffer sizes; one process "
               "per rank, peers from TF_CONFIG (run by bench/allreduce_busbw.py)"};
  app.add_option("--sizes", flags.sizes, "comma-separated byte counts (multiples of 4)")->capture_default_str();
  app.add_option("--warmup", flags.warmup, "warm-up iterations per size")->capture_default_str();
  app.add_option("--min-iters", flags.min_iters, "timed iterations at least")->capture_default_str();
  app.add_option("--max-iters", flags.max_iters, "timed iterations at most")->capture_default_str();
  app.add_option("--target-seconds", flags.target_seconds, "timed iterations fill about this")
      ->capture_default_str();
  app.add_option("--timeout-seconds", flags.timeout_seconds, "per operation, join and ring setup")
      ->capture_default_str();
  app.add_option("--chunk-bytes", flags.chunk_bytes, "RingOptions::chunk_bytes (0: default)");
  app.add_option("--stage-slices", flags.stage_slices, "RingOptions::stage_slices (0: default)");
  app.add_option("--socket-buffer-bytes", flags.socket_buffer_bytes,
                 "RingOptions::socket_buffer_bytes (-1: default, 0: kernel autotuning)");
  app.add_option("--small-allreduce-bytes", flags.small_allreduce_bytes,
                 "RingOptions::small_allreduce_bytes (-1: default)");
  app.add_option("--halving-doubling-bytes", flags.halving_doubling_bytes,
                 "RingOptions::halving_doubling_bytes (-1: default)");
  app.add_option("--busy-poll-us", flags.busy_poll_us,
                 "RingOptions::busy_poll in microseconds (-1: default)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (flags.min_iters < 1 || flags.warmup < 0 || flags.target_seconds < 0 || flags.timeout_seconds <= 0) {
    std::fprintf(stderr, "allreduce_busbw: --min-iters >= 1, --warmup >= 0, --timeout-seconds > 0\n");
    return 2;
  }
  return distrain::Run(flags);
}

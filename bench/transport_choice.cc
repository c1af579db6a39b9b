// transport_choice: the measurement behind RingCollective's transport (see
// the header comment of worker/collective/ring.h).
//
// Both candidates move the same bytes over 127.0.0.1 in one process (a
// server thread and a client thread), in the same run:
//   raw_tcp      a TCP socket set up like RingCollective's links (TCP_NODELAY,
//                4 MiB socket buffers, non-blocking with poll), sending with
//                send(MSG_NOSIGNAL) and receiving with recv() into a buffer.
//   grpc_stream  a gRPC 1.x bidirectional stream (proto/distrain/v1/
//                collective.proto) carrying one CollectiveChunk per chunk,
//                synchronous API, insecure channel, message size limits raised.
// Figures:
//   throughput   `total` bytes (default 64 MiB) sent as `chunk` bytes (default
//                1 MiB) one way, timed from the first byte sent to a 1-byte
//                (TCP) / empty-chunk (gRPC) acknowledgement after the last;
//                best and median of `repeats` runs, in GB/s (1e9 bytes/s).
//   cpu          CPU seconds (user + system, all threads of the process: both
//                ends and gRPC's own threads) per GB moved in the throughput
//                runs. In a ring all-reduce every core is busy, so CPU per
//                byte, not one idle-machine stream, is what limits bandwidth.
//   ping-pong    median round trip of a 4 KiB message echoed back, microseconds
//                (the latency a small all-reduce step pays per hop).
//
//   transport_choice [--total-bytes 67108864] [--chunk-bytes 1048576]
//                    [--repeats 5] [--pings 2000]
// Prints a table and one line per transport:
//   RESULT {"side": "raw_tcp"|"grpc_stream", "gbps_best": .., "gbps_median": ..,
//           "cpu_s_per_gb": .., "pingpong_us_median": ..}
// Exit 0 on success, 1 when a transfer fails (the message says which), 2 on bad flags.

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "distrain/v1/collective.grpc.pb.h"
#include "worker/collective/tcp_socket.h"

namespace distrain {
namespace {

struct Flags {
  int64_t total_bytes = 64 << 20;
  int64_t chunk_bytes = 1 << 20;
  int repeats = 5;
  int pings = 2000;
};

struct Figures {
  double gbps_best = 0;
  double gbps_median = 0;
  double cpu_s_per_gb = 0;
  double pingpong_us_median = 0;
};

constexpr int kSocketBuffer = 4 << 20;  // RingOptions' default
constexpr int64_t kPingBytes = 4096;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// User + system CPU seconds of the whole process so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ---- raw TCP -------------------------------------------------------------

// Per connection the client first sends {mode, bytes}: mode 0 = receive
// `bytes` then answer one byte; mode 1 = echo `bytes`-sized messages until
// the client closes.
absl::Status ServeTcp(int fd, const Flags& flags) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  std::vector<char> buffer(std::max(flags.chunk_bytes, kPingBytes));
  while (true) {
    int64_t request[2];
    absl::Status s = tcp::RecvAll(fd, request, sizeof(request), deadline, -1, "client");
    if (!s.ok()) return absl::OkStatus();  // client closed: done
    if (request[0] == 0) {
      int64_t left = request[1];
      while (left > 0) {
        const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buffer.size()));
        if (s = tcp::RecvAll(fd, buffer.data(), n, deadline, -1, "client"); !s.ok()) return s;
        left -= n;
      }
      char ack = 1;
      if (s = tcp::SendAll(fd, &ack, 1, deadline, -1, "client"); !s.ok()) return s;
    } else {
      for (int i = 0; i < flags.pings; ++i) {
        if (s = tcp::RecvAll(fd, buffer.data(), request[1], deadline, -1, "client"); !s.ok()) {
          return s;
        }
        if (s = tcp::SendAll(fd, buffer.data(), request[1], deadline, -1, "client"); !s.ok()) {
          return s;
        }
      }
    }
  }
}

absl::Status MeasureTcp(const Flags& flags, Figures* out) {
  int port = 0;
  absl::StatusOr<tcp::Fd> listener = tcp::Listen("127.0.0.1", 0, kSocketBuffer, &port);
  if (!listener.ok()) return listener.status();
  absl::Status server_status;
  std::thread server([&] {
    pollfd p{listener->get(), POLLIN, 0};
    poll(&p, 1, 10000);
    tcp::Fd conn(accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn.valid()) {
      server_status = absl::InternalError("accept failed");
      return;
    }
    server_status = tcp::ConfigureStream(conn.get(), kSocketBuffer);
    if (server_status.ok()) server_status = ServeTcp(conn.get(), flags);
  });
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  absl::StatusOr<tcp::Fd> conn =
      tcp::Connect(tcp::HostPort{"127.0.0.1", port}, kSocketBuffer, deadline, -1, "server");
  if (!conn.ok()) {
    server.join();
    return conn.status();
  }
  std::vector<char> chunk(flags.chunk_bytes, 'x');
  std::vector<double> rates;
  absl::Status s;
  const double cpu_start = CpuSeconds();
  for (int r = 0; r < flags.repeats && s.ok(); ++r) {
    const double start = Seconds();
    int64_t request[2] = {0, flags.total_bytes};
    s = tcp::SendAll(conn->get(), request, sizeof(request), deadline, -1, "server");
    for (int64_t left = flags.total_bytes; left > 0 && s.ok(); left -= flags.chunk_bytes) {
      s = tcp::SendAll(conn->get(), chunk.data(), std::min(left, flags.chunk_bytes), deadline, -1,
                       "server");
    }
    char ack;
    if (s.ok()) s = tcp::RecvAll(conn->get(), &ack, 1, deadline, -1, "server");
    rates.push_back(flags.total_bytes / (Seconds() - start) / 1e9);
  }
  out->cpu_s_per_gb = (CpuSeconds() - cpu_start) / (flags.total_bytes * flags.repeats / 1e9);
  std::vector<double> rtts;
  if (s.ok()) {
    int64_t request[2] = {1, kPingBytes};
    s = tcp::SendAll(conn->get(), request, sizeof(request), deadline, -1, "server");
    for (int i = 0; i < flags.pings && s.ok(); ++i) {
      const double start = Seconds();
      s = tcp::SendAll(conn->get(), chunk.data(), kPingBytes, deadline, -1, "server");
      if (s.ok()) s = tcp::RecvAll(conn->get(), chunk.data(), kPingBytes, deadline, -1, "server");
      rtts.push_back((Seconds() - start) * 1e6);
    }
  }
  conn->Close();
  server.join();
  if (!s.ok()) return s;
  if (!server_status.ok()) return server_status;
  out->gbps_best = *std::max_element(rates.begin(), rates.end());
  out->gbps_median = Median(rates);
  out->pingpong_us_median = Median(rtts);
  return absl::OkStatus();
}

// ---- gRPC stream -----------------------------------------------------------

class TransportService final : public v1::CollectiveTransport::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::CollectiveChunk, v1::CollectiveChunk>* stream)
      override {
    v1::CollectiveChunk chunk;
    v1::CollectiveChunk empty;
    while (stream->Read(&chunk)) {
      if (!chunk.reply()) continue;
      if (!stream->Write(chunk.echo() ? chunk : empty)) break;
    }
    return grpc::Status::OK;
  }
};

absl::Status MeasureGrpc(const Flags& flags, Figures* out) {
  TransportService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(flags.chunk_bytes) + (1 << 20));
  builder.SetMaxSendMessageSize(static_cast<int>(flags.chunk_bytes) + (1 << 20));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::InternalError("gRPC server did not start");

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(flags.chunk_bytes) + (1 << 20));
  args.SetMaxSendMessageSize(static_cast<int>(flags.chunk_bytes) + (1 << 20));
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::CollectiveTransport::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Stream(&context);

  v1::CollectiveChunk chunk;
  chunk.set_data(std::string(flags.chunk_bytes, 'x'));
  v1::CollectiveChunk last = chunk;
  last.set_reply(true);
  v1::CollectiveChunk answer;
  std::vector<double> rates;
  const double cpu_start = CpuSeconds();
  for (int r = 0; r < flags.repeats; ++r) {
    const double start = Seconds();
    for (int64_t left = flags.total_bytes; left > 0; left -= flags.chunk_bytes) {
      if (!stream->Write(left <= flags.chunk_bytes ? last : chunk)) {
        return absl::UnavailableError("gRPC stream write failed (throughput)");
      }
    }
    if (!stream->Read(&answer)) return absl::UnavailableError("gRPC stream read failed");
    rates.push_back(flags.total_bytes / (Seconds() - start) / 1e9);
  }
  out->cpu_s_per_gb = (CpuSeconds() - cpu_start) / (flags.total_bytes * flags.repeats / 1e9);
  v1::CollectiveChunk ping;
  ping.set_data(std::string(kPingBytes, 'p'));
  ping.set_reply(true);
  ping.set_echo(true);
  std::vector<double> rtts;
  for (int i = 0; i < flags.pings; ++i) {
    const double start = Seconds();
    if (!stream->Write(ping) || !stream->Read(&answer)) {
      return absl::UnavailableError("gRPC stream failed (ping-pong)");
    }
    rtts.push_back((Seconds() - start) * 1e6);
  }
  stream->WritesDone();
  grpc::Status done = stream->Finish();
  server->Shutdown();
  if (!done.ok()) return absl::UnavailableError(absl::StrCat("gRPC stream: ", done.error_message()));
  out->gbps_best = *std::max_element(rates.begin(), rates.end());
  out->gbps_median = Median(rates);
  out->pingpong_us_median = Median(rtts);
  return absl::OkStatus();
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "transport_choice: %s needs a value\n", arg.c_str());
      return false;
    }
    const char* value = argv[++i];
    bool ok = false;
    if (arg == "--total-bytes") ok = absl::SimpleAtoi(value, &flags->total_bytes);
    if (arg == "--chunk-bytes") ok = absl::SimpleAtoi(value, &flags->chunk_bytes);
    if (arg == "--repeats") ok = absl::SimpleAtoi(value, &flags->repeats);
    if (arg == "--pings") ok = absl::SimpleAtoi(value, &flags->pings);
    if (!ok) {
      std::fprintf(stderr,
                   "transport_choice: bad flag %s %s (flags: --total-bytes, --chunk-bytes, "
                   "--repeats, --pings; positive integers)\n",
                   arg.c_str(), value);
      return false;
    }
  }
  if (flags->total_bytes <= 0 || flags->chunk_bytes <= 0 || flags->repeats <= 0 ||
      flags->pings <= 0) {
    std::fprintf(stderr, "transport_choice: every flag must be positive\n");
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  Figures tcp_figures, grpc_figures;
  if (absl::Status s = MeasureTcp(flags, &tcp_figures); !s.ok()) {
    std::fprintf(stderr, "transport_choice: raw TCP: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = MeasureGrpc(flags, &grpc_figures); !s.ok()) {
    std::fprintf(stderr, "transport_choice: gRPC: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%lld bytes as %lld-byte chunks over 127.0.0.1, %d repeats; 4 KiB ping-pong x %d\n",
              static_cast<long long>(flags.total_bytes), static_cast<long long>(flags.chunk_bytes),
              flags.repeats, flags.pings);
  std::printf("%-12s %10s %12s %12s %14s\n", "transport", "GB/s best", "GB/s median",
              "CPU s per GB", "ping-pong us");
  for (auto [name, f] : {std::pair{"raw_tcp", tcp_figures}, std::pair{"grpc_stream", grpc_figures}}) {
    std::printf("%-12s %10.3f %12.3f %12.3f %14.1f\n", name, f.gbps_best, f.gbps_median,
                f.cpu_s_per_gb, f.pingpong_us_median);
  }
  std::printf(
      "raw_tcp vs grpc_stream: throughput %.2fx (median), CPU per byte %.2fx less, ping-pong "
      "%.2fx faster\n",
      tcp_figures.gbps_median / grpc_figures.gbps_median,
      grpc_figures.cpu_s_per_gb / tcp_figures.cpu_s_per_gb,
      grpc_figures.pingpong_us_median / tcp_figures.pingpong_us_median);
  for (auto [name, f] : {std::pair{"raw_tcp", tcp_figures}, std::pair{"grpc_stream", grpc_figures}}) {
    std::printf(
        "RESULT {\"side\": \"%s\", \"gbps_best\": %.4f, \"gbps_median\": %.4f, "
        "\"cpu_s_per_gb\": %.4f, \"pingpong_us_median\": %.2f}\n",
        name, f.gbps_best, f.gbps_median, f.cpu_s_per_gb, f.pingpong_us_median);
  }
  return 0;
}

}  // namespace
}  // namespace distrain

int main(int argc, char** argv) { return distrain::Main(argc, argv); }

// transport_choice: the measurement behind RingCollective's transport (see
// the header comment of worker/collective/ring.h).
//
// Both candidates move the same bytes over 127.0.0.1 in one process (a
// server thread and a client thread), in the same run, alternating repeat by
// repeat so that load from elsewhere on the machine hits both alike:
//   raw_tcp      a TCP socket set up like RingCollective's links (TCP_NODELAY,
//                RingOptions' socket buffers, non-blocking with poll), sending with
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
//                ends and gRPC's own threads) per GB moved, median over the
//                throughput runs. In a ring all-reduce every core is busy, so CPU per
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
#include "worker/collective/ring.h"
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

const int kSocketBuffer = RingOptions().socket_buffer_bytes;
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

// A client socket and a server thread. Each request starts with
// {mode, bytes, count}: mode 0 = receive `bytes`, then answer one byte;
// mode 1 = echo `count` messages of `bytes`.
class TcpSide {
 public:
  explicit TcpSide(const Flags& flags) : flags_(flags), chunk_(flags.chunk_bytes, 'x') {}
  ~TcpSide() {
    client_.Close();
    if (server_.joinable()) server_.join();
  }

  absl::Status Start() {
    int port = 0;
    absl::StatusOr<tcp::Fd> listener = tcp::Listen("127.0.0.1", 0, kSocketBuffer, &port);
    if (!listener.ok()) return listener.status();
    listener_ = std::move(*listener);
    server_ = std::thread([this] { server_status_ = Serve(); });
    absl::StatusOr<tcp::Fd> conn =
        tcp::Connect(tcp::HostPort{"127.0.0.1", port}, kSocketBuffer, Deadline(), -1, "server");
    if (!conn.ok()) return conn.status();
    client_ = std::move(*conn);
    return absl::OkStatus();
  }

  absl::Status Transfer() {
    int64_t request[3] = {0, flags_.total_bytes, 0};
    absl::Status s =
        tcp::SendAll(client_.get(), request, sizeof(request), Deadline(), -1, "server");
    for (int64_t left = flags_.total_bytes; left > 0 && s.ok(); left -= flags_.chunk_bytes) {
      s = tcp::SendAll(client_.get(), chunk_.data(), std::min(left, flags_.chunk_bytes), Deadline(),
                       -1, "server");
    }
    char ack;
    if (s.ok()) s = tcp::RecvAll(client_.get(), &ack, 1, Deadline(), -1, "server");
    return s;
  }

  absl::Status Pings(int count, std::vector<double>* rtts) {
    int64_t request[3] = {1, kPingBytes, count};
    absl::Status s =
        tcp::SendAll(client_.get(), request, sizeof(request), Deadline(), -1, "server");
    for (int i = 0; i < count && s.ok(); ++i) {
      const double start = Seconds();
      s = tcp::SendAll(client_.get(), chunk_.data(), kPingBytes, Deadline(), -1, "server");
      if (s.ok()) {
        s = tcp::RecvAll(client_.get(), chunk_.data(), kPingBytes, Deadline(), -1, "server");
      }
      rtts->push_back((Seconds() - start) * 1e6);
    }
    return s;
  }

  const absl::Status& server_status() const { return server_status_; }

 private:
  static absl::Time Deadline() { return absl::Now() + absl::Minutes(2); }

  absl::Status Serve() {
    pollfd p{listener_.get(), POLLIN, 0};
    poll(&p, 1, 10000);
    tcp::Fd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn.valid()) return absl::InternalError("accept failed");
    if (absl::Status s = tcp::ConfigureStream(conn.get(), kSocketBuffer); !s.ok()) return s;
    std::vector<char> buffer(std::max(flags_.chunk_bytes, kPingBytes));
    while (true) {
      int64_t request[3];
      if (!tcp::RecvAll(conn.get(), request, sizeof(request), Deadline(), -1, "client").ok()) {
        return absl::OkStatus();  // the client closed: done
      }
      absl::Status s;
      if (request[0] == 0) {
        for (int64_t left = request[1]; left > 0 && s.ok();) {
          const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buffer.size()));
          s = tcp::RecvAll(conn.get(), buffer.data(), n, Deadline(), -1, "client");
          left -= n;
        }
        char ack = 1;
        if (s.ok()) s = tcp::SendAll(conn.get(), &ack, 1, Deadline(), -1, "client");
      } else {
        for (int64_t i = 0; i < request[2] && s.ok(); ++i) {
          s = tcp::RecvAll(conn.get(), buffer.data(), request[1], Deadline(), -1, "client");
          if (s.ok()) {
            s = tcp::SendAll(conn.get(), buffer.data(), request[1], Deadline(), -1, "client");
          }
        }
      }
      if (!s.ok()) return s;
    }
  }

  const Flags& flags_;
  std::vector<char> chunk_;
  tcp::Fd listener_;
  tcp::Fd client_;
  std::thread server_;
  absl::Status server_status_;
};

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

// An in-process gRPC server and one open bidirectional stream to it.
class GrpcSide {
 public:
  explicit GrpcSide(const Flags& flags) : flags_(flags) {}
  ~GrpcSide() {
    if (stream_ != nullptr) {
      stream_->WritesDone();
      (void)stream_->Finish();
    }
    if (server_ != nullptr) server_->Shutdown();
  }

  absl::Status Start() {
    const int limit = static_cast<int>(flags_.chunk_bytes) + (1 << 20);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(limit);
    builder.SetMaxSendMessageSize(limit);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) return absl::InternalError("gRPC server did not start");
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(limit);
    args.SetMaxSendMessageSize(limit);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::CollectiveTransport::NewStub(channel_);
    stream_ = stub_->Stream(&context_);
    chunk_.set_data(std::string(flags_.chunk_bytes, 'x'));
    last_ = chunk_;
    last_.set_reply(true);
    ping_.set_data(std::string(kPingBytes, 'p'));
    ping_.set_reply(true);
    ping_.set_echo(true);
    return absl::OkStatus();
  }

  absl::Status Transfer() {
    for (int64_t left = flags_.total_bytes; left > 0; left -= flags_.chunk_bytes) {
      if (!stream_->Write(left <= flags_.chunk_bytes ? last_ : chunk_)) {
        return absl::UnavailableError("gRPC stream write failed (throughput)");
      }
    }
    if (!stream_->Read(&answer_)) return absl::UnavailableError("gRPC stream read failed");
    return absl::OkStatus();
  }

  absl::Status Pings(int count, std::vector<double>* rtts) {
    for (int i = 0; i < count; ++i) {
      const double start = Seconds();
      if (!stream_->Write(ping_) || !stream_->Read(&answer_)) {
        return absl::UnavailableError("gRPC stream failed (ping-pong)");
      }
      rtts->push_back((Seconds() - start) * 1e6);
    }
    return absl::OkStatus();
  }

 private:
  const Flags& flags_;
  TransportService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CollectiveTransport::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::CollectiveChunk, v1::CollectiveChunk>> stream_;
  v1::CollectiveChunk chunk_, last_, ping_, answer_;
};

// Alternates the two transports repeat by repeat (and ping block by ping
// block), so load from elsewhere on the machine hits both alike.
absl::Status Measure(const Flags& flags, Figures* tcp_out, Figures* grpc_out) {
  TcpSide tcp_side(flags);
  GrpcSide grpc_side(flags);
  if (absl::Status s = tcp_side.Start(); !s.ok()) return s;
  if (absl::Status s = grpc_side.Start(); !s.ok()) return s;
  std::vector<double> rates[2], cpu[2], rtts[2];
  for (int r = 0; r < flags.repeats; ++r) {
    for (int side = 0; side < 2; ++side) {
      const double cpu_start = CpuSeconds();
      const double start = Seconds();
      absl::Status s = side == 0 ? tcp_side.Transfer() : grpc_side.Transfer();
      if (!s.ok()) return s;
      rates[side].push_back(flags.total_bytes / (Seconds() - start) / 1e9);
      cpu[side].push_back((CpuSeconds() - cpu_start) / (flags.total_bytes / 1e9));
    }
  }
  constexpr int kBlock = 100;
  for (int done = 0; done < flags.pings; done += kBlock) {
    const int count = std::min(kBlock, flags.pings - done);
    if (absl::Status s = tcp_side.Pings(count, &rtts[0]); !s.ok()) return s;
    if (absl::Status s = grpc_side.Pings(count, &rtts[1]); !s.ok()) return s;
  }
  if (!tcp_side.server_status().ok()) return tcp_side.server_status();
  Figures* outs[2] = {tcp_out, grpc_out};
  for (int side = 0; side < 2; ++side) {
    outs[side]->gbps_best = *std::max_element(rates[side].begin(), rates[side].end());
    outs[side]->gbps_median = Median(rates[side]);
    outs[side]->cpu_s_per_gb = Median(cpu[side]);
    outs[side]->pingpong_us_median = Median(rtts[side]);
  }
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
  if (absl::Status s = Measure(flags, &tcp_figures, &grpc_figures); !s.ok()) {
    std::fprintf(stderr, "transport_choice: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%lld bytes as %lld-byte chunks over 127.0.0.1, %d repeats; 4 KiB ping-pong x %d\n",
              static_cast<long long>(flags.total_bytes), static_cast<long long>(flags.chunk_bytes),
              flags.repeats, flags.pings);
  std::printf("%-12s %10s %12s %12s %14s\n", "transport", "GB/s best", "GB/s median",
              "CPU s per GB", "ping-pong us");
  const std::pair<const char*, Figures> sides[] = {{"raw_tcp", tcp_figures},
                                                   {"grpc_stream", grpc_figures}};
  for (const auto& [name, f] : sides) {
    std::printf("%-12s %10.3f %12.3f %12.3f %14.1f\n", name, f.gbps_best, f.gbps_median,
                f.cpu_s_per_gb, f.pingpong_us_median);
  }
  std::printf(
      "raw_tcp vs grpc_stream: throughput %.2fx (median), CPU per byte %.2fx less, ping-pong "
      "%.2fx faster\n",
      tcp_figures.gbps_median / grpc_figures.gbps_median,
      grpc_figures.cpu_s_per_gb / tcp_figures.cpu_s_per_gb,
      grpc_figures.pingpong_us_median / tcp_figures.pingpong_us_median);
  for (const auto& [name, f] : sides) {
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

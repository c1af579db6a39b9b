// loopback_limit: the loopback ceiling for bench/allreduce_busbw.py.
//
// Measures L_agg, the aggregate TCP throughput of N concurrent streams on
// 127.0.0.1 (one sender thread and one receiver thread per stream, large
// writes, TCP_NODELAY, kernel-default buffers). A ring all-reduce over N
// processes keeps N such streams busy at once (rank r -> r+1), all sharing
// the same cores and the same loopback, so one ring link can move at most
// L_agg / N: that is the ceiling for the all-reduce's bus bandwidth.
//
// Protocol of one repeat: connect N streams, start all senders, let them run
// `warmup` seconds (slow start, scheduler settling), then count the bytes
// received during `seconds`; close. The best repeat is reported (a limit:
// on a shared machine other load only ever lowers it), with the median.
//
//   loopback_limit [--streams N] [--seconds 1.0] [--warmup 0.2]
//                  [--chunk-bytes 1048576] [--repeats 3]
// Prints: RESULT {"side": "loopback", "streams": N, "bytes_per_second": L_agg (best),
//                 "median_bytes_per_second": ..., "repeats": [...]}
// Exit 0 on success, 1 when a socket call fails (the message names it), 2 on bad flags.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "loopback_limit: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Flags {
  int streams = 4;
  double seconds = 1.0;
  double warmup = 0.2;
  size_t chunk_bytes = 1 << 20;
  int repeats = 3;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loopback_limit: %s needs a value\n", name.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (name == "--streams") {
      f.streams = std::atoi(v);
    } else if (name == "--seconds") {
      f.seconds = std::atof(v);
    } else if (name == "--warmup") {
      f.warmup = std::atof(v);
    } else if (name == "--chunk-bytes") {
      f.chunk_bytes = static_cast<size_t>(std::atoll(v));
    } else if (name == "--repeats") {
      f.repeats = std::atoi(v);
    } else {
      std::fprintf(stderr, "loopback_limit: unknown flag %s\n", name.c_str());
      std::exit(2);
    }
  }
  if (f.streams < 1 || f.seconds <= 0 || f.chunk_bytes == 0 || f.repeats < 1) {
    std::fprintf(stderr, "loopback_limit: --streams, --seconds, --chunk-bytes, --repeats must be positive\n");
    std::exit(2);
  }
  return f;
}

// One repeat; returns aggregate bytes per second received over all streams.
double MeasureOnce(const Flags& f) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("bind 127.0.0.1:0");
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) Die("getsockname");
  if (::listen(listener, f.streams) != 0) Die("listen");

  std::vector<int> senders, receivers;
  for (int i = 0; i < f.streams; ++i) {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) Die("socket");
    if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
    int s = ::accept(listener, nullptr, nullptr);
    if (s < 0) Die("accept");
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    senders.push_back(c);
    receivers.push_back(s);
  }
  ::close(listener);

  std::atomic<bool> stop{false};
  std::vector<std::atomic<int64_t>> received(f.streams);
  for (auto& r : received) r.store(0);
  std::vector<std::thread> threads;
  for (int i = 0; i < f.streams; ++i) {
    threads.emplace_back([&, i] {
      std::vector<char> buf(f.chunk_bytes, 'x');
      while (!stop.load(std::memory_order_relaxed)) {
        ssize_t n = ::send(senders[i], buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n < 0 && errno != EINTR) break;  // shut down at the end
      }
    });
    threads.emplace_back([&, i] {
      std::vector<char> buf(f.chunk_bytes);
      while (true) {
        ssize_t n = ::recv(receivers[i], buf.data(), buf.size(), 0);
        if (n == 0 || (n < 0 && errno != EINTR)) break;
        if (n > 0) received[i].fetch_add(n, std::memory_order_relaxed);
      }
    });
  }
  auto total = [&] {
    int64_t sum = 0;
    for (auto& r : received) sum += r.load(std::memory_order_relaxed);
    return sum;
  };
  std::this_thread::sleep_for(std::chrono::duration<double>(f.warmup));
  const int64_t b0 = total();
  const double t0 = Now();
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  const int64_t b1 = total();
  const double t1 = Now();

  stop.store(true);
  for (int fd : senders) ::shutdown(fd, SHUT_RDWR);
  for (int fd : receivers) ::shutdown(fd, SHUT_RDWR);
  for (auto& t : threads) t.join();
  for (int fd : senders) ::close(fd);
  for (int fd : receivers) ::close(fd);
  return static_cast<double>(b1 - b0) / (t1 - t0);
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  std::vector<double> rates;
  for (int r = 0; r < f.repeats; ++r) rates.push_back(MeasureOnce(f));
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double best = sorted.back();
  std::string all;
  for (double x : rates) all += (all.empty() ? "" : ", ") + std::to_string(x);
  std::printf(
      "RESULT {\"side\": \"loopback\", \"streams\": %d, \"bytes_per_second\": %.6g, "
      "\"median_bytes_per_second\": %.6g, \"repeats\": [%s]}\n",
      f.streams, best, median, all.c_str());
  return 0;
}

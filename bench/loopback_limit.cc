// loopback_limit: the loopback ceiling for bench/allreduce_busbw.py.
//
// Two shapes of N concurrent TCP streams on 127.0.0.1 (large writes,
// TCP_NODELAY, kernel-default buffers), each reporting aggregate bytes/s:
//
//   --topology streams (L_agg, the default): one process, one sender thread
//     and one receiver thread per stream. A ring all-reduce over N processes
//     keeps N such streams busy at once (rank r -> r+1), all sharing the same
//     cores and the same loopback, so one ring link can move at most
//     L_agg / N.
//   --topology ring (L_ring): N processes, process i sends on stream i and
//     receives stream i-1 with one thread that multiplexes both with poll(),
//     as a ring rank does (distrain's RingCollective drives both directions
//     from one thread per rank). The same bytes cross the same loopback, but
//     each process sends AND receives, and a process that is not scheduled
//     stalls both of its streams. L_ring / N is the ceiling for a ring that
//     moves bytes and does nothing else (no reduction, no per-operation
//     protocol): the fair ceiling for one thread per rank.
//
// Protocol of one repeat: connect N streams, start all senders, let them run
// `warmup` seconds (slow start, scheduler settling), then count the bytes
// received during `seconds`; close. The best repeat is reported (a limit:
// on a shared machine other load only ever lowers it), with the median.
//
//   loopback_limit [--streams N] [--topology streams|ring] [--seconds 1.0]
//                  [--warmup 0.2] [--chunk-bytes 1048576] [--buffer-bytes B]
//                  [--repeats 3]
// --buffer-bytes (default: chunk-bytes): every sender and receiver walks its
// own buffer of this size chunk by chunk. The default 1 MiB buffer stays in
// cache, the best case; 64 MiB makes each byte come from and go to memory,
// as the ring's own buffers do at 64 MiB.
// Prints: RESULT {"side": "loopback", "topology": "streams", "streams": N,
//                 "bytes_per_second": best, "median_bytes_per_second": ...,
//                 "cpu_s_per_byte": ..., "repeats": [...]}
// cpu_s_per_byte: user + system CPU seconds of all senders and receivers per
// byte moved (lowest repeat) — what a byte costs, whatever else shares the
// cores.
// Exit 0 on success, 1 when a socket call fails (the message names it), 2 on bad flags.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "loopback_limit: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// User + system CPU seconds of `who` (RUSAGE_SELF: every thread of this process).
double CpuSeconds(int who) {
  rusage u{};
  ::getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// User + system CPU seconds of processes `pids` so far, from /proc (clock
// ticks: 10 ms resolution, fine over a one-second window).
double ChildrenCpuSeconds(const std::vector<pid_t>& pids) {
  double ticks = 0;
  for (pid_t pid : pids) {
    FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (stat == nullptr) continue;
    char buf[1024] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, stat);
    std::fclose(stat);
    // Fields after the ")" that ends the command name: state is field 3,
    // utime 14, stime 15.
    const char* p = std::strrchr(buf, ')');
    if (p == nullptr || n == 0) continue;
    unsigned long utime = 0, stime = 0;
    if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                    &stime) == 2) {
      ticks += static_cast<double>(utime + stime);
    }
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Flags {
  int streams = 4;
  bool ring = false;  // --topology ring
  double seconds = 1.0;
  double warmup = 0.2;
  size_t chunk_bytes = 1 << 20;
  size_t buffer_bytes = 0;  // 0: chunk_bytes
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
    } else if (name == "--topology") {
      const std::string t = v;
      if (t != "streams" && t != "ring") {
        std::fprintf(stderr, "loopback_limit: --topology is 'streams' or 'ring', not '%s'\n", v);
        std::exit(2);
      }
      f.ring = t == "ring";
    } else if (name == "--seconds") {
      f.seconds = std::atof(v);
    } else if (name == "--warmup") {
      f.warmup = std::atof(v);
    } else if (name == "--chunk-bytes") {
      f.chunk_bytes = static_cast<size_t>(std::atoll(v));
    } else if (name == "--buffer-bytes") {
      f.buffer_bytes = static_cast<size_t>(std::atoll(v));
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
  if (f.buffer_bytes < f.chunk_bytes) f.buffer_bytes = f.chunk_bytes;
  return f;
}

// Walks a buffer of buffer_bytes in chunk_bytes pieces, wrapping around: with
// a buffer far larger than the caches every byte comes from (or goes to)
// memory, as in an all-reduce of a large vector.
class Cursor {
 public:
  explicit Cursor(const Flags& f) : chunk_(f.chunk_bytes), buffer_(f.buffer_bytes, 'x') {}
  char* data() { return buffer_.data() + at_; }
  size_t size() const { return std::min(chunk_, buffer_.size() - at_); }
  void Advance(size_t n) {
    at_ += n;
    if (at_ >= buffer_.size()) at_ = 0;
  }

 private:
  const size_t chunk_;
  std::vector<char> buffer_;
  size_t at_ = 0;
};

// Connects `n` loopback streams: (*senders)[i] -> (*receivers)[i].
void ConnectStreams(int n, std::vector<int>* senders, std::vector<int>* receivers) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("bind 127.0.0.1:0");
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) Die("getsockname");
  if (::listen(listener, n) != 0) Die("listen");
  for (int i = 0; i < n; ++i) {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) Die("socket");
    if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
    int s = ::accept(listener, nullptr, nullptr);
    if (s < 0) Die("accept");
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    senders->push_back(c);
    receivers->push_back(s);
  }
  ::close(listener);
}

struct Measurement {
  double bytes_per_second = 0;  // during the timed window
  double cpu_s_per_byte = 0;    // CPU of the timed window over the bytes it moved
};

// --topology streams: one repeat.
Measurement MeasureStreams(const Flags& f) {
  std::vector<int> senders, receivers;
  ConnectStreams(f.streams, &senders, &receivers);

  std::atomic<bool> stop{false};
  std::vector<std::atomic<int64_t>> received(f.streams);
  for (auto& r : received) r.store(0);
  // Buffers are allocated (and their pages touched) before the clock starts.
  std::vector<std::unique_ptr<Cursor>> send_cursors, recv_cursors;
  for (int i = 0; i < f.streams; ++i) {
    send_cursors.push_back(std::make_unique<Cursor>(f));
    recv_cursors.push_back(std::make_unique<Cursor>(f));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < f.streams; ++i) {
    threads.emplace_back([&, i] {
      Cursor& buf = *send_cursors[i];
      while (!stop.load(std::memory_order_relaxed)) {
        ssize_t n = ::send(senders[i], buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n < 0 && errno != EINTR) break;  // shut down at the end
        if (n > 0) buf.Advance(static_cast<size_t>(n));
      }
    });
    threads.emplace_back([&, i] {
      Cursor& buf = *recv_cursors[i];
      while (true) {
        ssize_t n = ::recv(receivers[i], buf.data(), buf.size(), 0);
        if (n == 0 || (n < 0 && errno != EINTR)) break;
        if (n > 0) {
          received[i].fetch_add(n, std::memory_order_relaxed);
          buf.Advance(static_cast<size_t>(n));
        }
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
  const double cpu0 = CpuSeconds(RUSAGE_SELF);
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  const int64_t b1 = total();
  const double t1 = Now();
  const double cpu1 = CpuSeconds(RUSAGE_SELF);

  stop.store(true);
  for (int fd : senders) ::shutdown(fd, SHUT_RDWR);
  for (int fd : receivers) ::shutdown(fd, SHUT_RDWR);
  for (auto& t : threads) t.join();
  for (int fd : senders) ::close(fd);
  for (int fd : receivers) ::close(fd);
  return {static_cast<double>(b1 - b0) / (t1 - t0),
          (cpu1 - cpu0) / static_cast<double>(std::max<int64_t>(1, b1 - b0))};
}

// --topology ring: process i sends stream i and receives stream i-1, both
// from one thread with non-blocking calls and poll(), like a ring rank.
// Counters live in shared memory so the parent can read them.
Measurement MeasureRing(const Flags& f) {
  const int n = f.streams;
  std::vector<int> senders, receivers;
  ConnectStreams(n, &senders, &receivers);
  // counters[i]: bytes process i received; counters[n]: non-zero = stop;
  // counters[n + 1]: processes ready (buffers allocated).
  const size_t shared_bytes = sizeof(std::atomic<int64_t>) * (n + 2);
  void* mem = ::mmap(nullptr, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) Die("mmap");
  auto* counters = static_cast<std::atomic<int64_t>*>(mem);
  for (int i = 0; i <= n + 1; ++i) new (&counters[i]) std::atomic<int64_t>(0);
  std::atomic<int64_t>& stop = counters[n];
  std::atomic<int64_t>& ready = counters[n + 1];

  std::vector<pid_t> children;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) Die("fork");
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    const int out = senders[i];
    const int in = receivers[(i + n - 1) % n];
    for (int fd : {out, in}) {
      const int flags = ::fcntl(fd, F_GETFL, 0);
      ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
    Cursor send_buf(f);
    Cursor recv_buf(f);
    ready.fetch_add(1);
    while (ready.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    while (stop.load(std::memory_order_relaxed) == 0) {
      pollfd fds[2] = {{out, POLLOUT, 0}, {in, POLLIN, 0}};
      if (::poll(fds, 2, 100) < 0 && errno != EINTR) _exit(1);
      if (fds[0].revents & (POLLERR | POLLHUP)) break;
      if (fds[0].revents & POLLOUT) {
        ssize_t k = ::send(out, send_buf.data(), send_buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno != EAGAIN && errno != EINTR) break;
        if (k > 0) send_buf.Advance(static_cast<size_t>(k));
      }
      if (fds[1].revents & POLLIN) {
        ssize_t k = ::recv(in, recv_buf.data(), recv_buf.size(), MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
        if (k > 0) {
          counters[i].fetch_add(k, std::memory_order_relaxed);
          recv_buf.Advance(static_cast<size_t>(k));
        }
      }
    }
    _exit(0);
  }
  auto total = [&] {
    int64_t sum = 0;
    for (int i = 0; i < n; ++i) sum += counters[i].load(std::memory_order_relaxed);
    return sum;
  };
  while (ready.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::duration<double>(f.warmup));
  const int64_t b0 = total();
  const double t0 = Now();
  const double cpu0 = ChildrenCpuSeconds(children);
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  const int64_t b1 = total();
  const double t1 = Now();
  const double cpu1 = ChildrenCpuSeconds(children);
  stop.store(1);
  for (int fd : senders) ::shutdown(fd, SHUT_RDWR);
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
  const Measurement m{static_cast<double>(b1 - b0) / (t1 - t0),
                      (cpu1 - cpu0) / static_cast<double>(std::max<int64_t>(1, b1 - b0))};
  for (int fd : senders) ::close(fd);
  for (int fd : receivers) ::close(fd);
  ::munmap(mem, shared_bytes);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  std::vector<double> rates;
  double cpu_s_per_byte = 0;  // the lowest of the repeats: a limit, like the rate
  for (int r = 0; r < f.repeats; ++r) {
    const Measurement m = f.ring ? MeasureRing(f) : MeasureStreams(f);
    rates.push_back(m.bytes_per_second);
    if (r == 0 || m.cpu_s_per_byte < cpu_s_per_byte) cpu_s_per_byte = m.cpu_s_per_byte;
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double best = sorted.back();
  std::string all;
  for (double x : rates) all += (all.empty() ? "" : ", ") + std::to_string(x);
  std::printf(
      "RESULT {\"side\": \"loopback\", \"topology\": \"%s\", \"streams\": %d, "
      "\"bytes_per_second\": %.6g, \"median_bytes_per_second\": %.6g, \"cpu_s_per_byte\": %.6g, "
      "\"repeats\": [%s]}\n",
      f.ring ? "ring" : "streams", f.streams, best, median, cpu_s_per_byte, all.c_str());
  return 0;
}

#ifndef DISTRAIN_TESTS_INTEGRATION_SUBPROCESS_H_
#define DISTRAIN_TESTS_INTEGRATION_SUBPROCESS_H_

// Test helper: runs a real binary with extra environment, collects its merged
// stdout+stderr on a reader thread, lets the test wait for a line, signal it,
// and reap it with a deadline. Owns the child; the destructor kills it.
// Thread-safe for one test thread plus the internal reader.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace distrain::testing {

inline std::string BinaryDir() { return DISTRAIN_BINARY_DIR; }
inline std::string SourceDir() { return DISTRAIN_SOURCE_DIR; }
inline std::string DistrainBinary() { return BinaryDir() + "/cli/distrain"; }
inline std::string WorkerBinary() { return BinaryDir() + "/worker/distrain-worker"; }

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
    reader_ = std::thread([this] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd_, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        output_.append(buf, n);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      eof_ = true;
      cv_.notify_all();
    });
  }
  ~Subprocess() {
    if (!exit_code_) {
      ::kill(pid_, SIGKILL);
      Wait(10);
    }
    if (reader_.joinable()) reader_.join();
    ::close(fd_);
  }

  // True once the output contains `needle` (false after `seconds` or at EOF).
  bool WaitForOutput(const std::string& needle, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                        [&] { return output_.find(needle) != std::string::npos || eof_; }) &&
           output_.find(needle) != std::string::npos;
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  // Exit code (128+N for signal N), or nullopt if still running after `seconds`.
  std::optional<int> Wait(double seconds) {
    if (exit_code_) return exit_code_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (reader_.joinable()) reader_.join();
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }
  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
  std::optional<int> exit_code_;
};

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_SUBPROCESS_H_

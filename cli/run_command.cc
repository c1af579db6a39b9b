#include "cli/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "cli/local_cluster.h"
#include "cli/progress.h"
#include "common/auto_strategy.h"
#include "common/exit_codes.h"
#include "common/job_config.h"
#include "worker/strategy/strategy.h"

extern char** environ;

namespace distrain {
namespace {

std::atomic<int> g_signals{0};
std::atomic<int> g_last_signal{0};
void OnSignal(int sig) {
  g_last_signal.store(sig);
  g_signals.fetch_add(1);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Child {
  LocalReplica replica;
  pid_t pid = -1;
  int out_fd = -1;       // read end of the child's stdout+stderr
  std::string pending;   // partial line
  std::optional<int> exit_code;  // set once reaped; signals as 128+N
  int restarts = 0;              // ShouldRestartLocally
};

std::string FindWorkerBinary(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir : {self.parent_path(), self.parent_path().parent_path() / "worker"}) {
      auto cand = dir / "distrain-worker";
      if (std::filesystem::exists(cand)) return cand.string();
    }
  }
  return "distrain-worker";  // $PATH
}

absl::StatusOr<Child> Spawn(const std::string& binary, const LocalReplica& replica) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    // The user's own BLAS setting wins over our spread; the contract env wins otherwise.
    if (replica.env.count(key) && key != "OPENBLAS_NUM_THREADS") continue;
    env_strings.push_back(kv);
  }
  for (const auto& [k, v] : replica.env) {
    if (k == "OPENBLAS_NUM_THREADS" && std::getenv("OPENBLAS_NUM_THREADS") != nullptr) continue;
    env_strings.push_back(k + "=" + v);
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = binary;
  char* argv[] = {arg0.data(), nullptr};
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Own process group: a terminal Ctrl-C reaches only `distrain run`, which
    // forwards it as SIGTERM so replicas can checkpoint. Die with the parent.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kExitInterrupted);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::execvpe(binary.c_str(), argv, envp.data());
    std::fprintf(stderr, "cannot start %s: %s (build it, or pass --worker-binary)\n", binary.c_str(),
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  Child c;
  c.replica = replica;
  c.pid = pid;
  c.out_fd = fds[0];
  return c;
}

class Console {
 public:
  explicit Console(bool progress_bar) : tty_(progress_bar && ::isatty(STDOUT_FILENO)) {}
  bool tty() const { return tty_; }

  void Line(const std::string& prefix, const std::string& text) {
    ClearBar();
    std::cout << prefix << text << "\n";
    DrawBar();
  }
  void SetProgress(const Progress& p) {
    progress_ = p;
    if (tty_) {
      DrawBar();
    } else if (Now() - last_plain_ >= 10) {
      last_plain_ = Now();
      std::cout << RenderProgressLine(p) << std::endl;
    }
  }
  void Finish() {
    ClearBar();
    std::cout.flush();
  }

 private:
  int Width() const {
    winsize ws{};
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
  }
  void ClearBar() {
    if (tty_ && drawn_) std::cout << "\r\033[K";
    drawn_ = false;
  }
  void DrawBar() {
    if (!tty_ || !progress_) return;
    std::cout << "\r\033[K" << RenderProgressBar(*progress_, Width() - 1) << std::flush;
    drawn_ = true;
  }

  bool tty_;
  bool drawn_ = false;
  std::optional<Progress> progress_;
  double last_plain_ = 0;
};

void PumpOutput(Child& c, Console& console, bool eof) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
    if (n <= 0) break;
    c.pending.append(buf, n);
    if (n < static_cast<ssize_t>(sizeof(buf))) break;
  }
  size_t start = 0;
  for (size_t nl; (nl = c.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    console.Line("[" + c.replica.label + "] ", c.pending.substr(start, nl - start));
  }
  c.pending.erase(0, start);
  if (eof && !c.pending.empty()) {
    console.Line("[" + c.replica.label + "] ", c.pending);
    c.pending.clear();
  }
}

}  // namespace

int RunJob(const RunOptions& options) {
  // 1. Everything that can be checked is checked before any process starts.
  auto config = LoadJobYamlFile(options.job_file);
  if (config.ok()) {
    if (absl::Status s = ValidateJobConfig(*config); !s.ok()) config = s;
  }
  if (config.ok()) {
    // The model against its data: the layers' shapes from the dataset's
    // example shape (the IDX header, the first CSV line), every layer problem
    // at once, before any replica starts and fails on its own copy of them.
    std::vector<std::string> notes;
    if (absl::Status s = ValidateModelWithData(*config, &notes); !s.ok()) config = s;
    for (const std::string& note : notes) {
      std::cerr << "distrain run: " << options.job_file << ": warning: " << note << "\n";
    }
  }
  if (!config.ok()) {
    std::cerr << "distrain run: " << options.job_file << ": " << config.status().message() << "\n";
    return kExitInvalidConfig;
  }
  // spec.strategy: Auto, on this host (common/auto_strategy.h): the GPUs it
  // sees, for the plan of processes; each worker process decides again from
  // the same file and the same GPUs, plus the bandwidths it measures, which
  // only choose between the single-process strategies (one process either way).
  DeviceFacts host_facts;
  host_facts.gpus = ThisProcessDeviceFacts().visible_gpus;
  if (auto resolved = ResolveAutoStrategy(*config, host_facts); !resolved.ok()) {
    std::cerr << "distrain run: " << options.job_file << ": " << resolved.status().message() << "\n";
    return kExitInvalidConfig;
  } else if (!resolved->second.empty()) {
    config = std::move(resolved->first);
    std::cerr << "distrain run: " << options.job_file << ": " << resolved->second << "\n";
  }
  if (absl::Status s = CheckStrategySupported(*config); !s.ok()) {
    std::cerr << "distrain run: " << options.job_file << ": " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitInvalidConfig : kExitUnsupported;
  }

  std::string work_dir = options.work_dir;
  if (work_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(tmp ? tmp : "/tmp", "/distrain-", config->name, "-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::cerr << "distrain run: cannot create a work directory " << tmpl << ": "
                << std::strerror(errno) << "\n";
      return kExitInternal;
    }
    work_dir = tmpl;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(work_dir, ec);
    if (ec) {
      std::cerr << "distrain run: --work-dir " << work_dir << ": " << ec.message() << "\n";
      return kExitUsage;
    }
  }
  LocalClusterOptions cluster_options;
  cluster_options.work_dir = work_dir;
  cluster_options.checkpoint_dir =
      options.checkpoint_dir.empty() ? work_dir + "/checkpoints" : options.checkpoint_dir;
  // The GPUs a child may be given, in CUDA_VISIBLE_DEVICES' own terms.
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    for (absl::string_view id : absl::StrSplit(visible, ',', absl::SkipWhitespace())) {
      if (static_cast<int>(cluster_options.gpu_ids.size()) < host_facts.gpus) {
        cluster_options.gpu_ids.emplace_back(absl::StripAsciiWhitespace(id));
      }
    }
  } else {
    for (int g = 0; g < host_facts.gpus; ++g) cluster_options.gpu_ids.push_back(absl::StrCat(g));
  }
  auto replicas = PlanLocalCluster(*config, cluster_options);
  if (!replicas.ok()) {
    std::cerr << "distrain run: " << options.job_file << ": " << replicas.status().message()
              << "\n";
    return replicas.status().code() == absl::StatusCode::kFailedPrecondition ? kExitUnsupported
                                                                            : kExitInternal;
  }
  if (absl::Status s = WriteLocalCredentials(*config, work_dir, &*replicas); !s.ok()) {
    std::cerr << "distrain run: job credentials: " << s.message() << "\n";
    return kExitInternal;
  }

  const std::string binary = FindWorkerBinary(options.worker_binary);
  Console console(options.progress);
  std::cout << absl::StrFormat("distrain run: job %s, strategy %s, %d process(es); work dir %s\n",
                               config->name, StrategyName(config->strategy), replicas->size(),
                               work_dir);

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  // 2. Start every replica.
  std::vector<Child> children;
  const double start = Now();
  for (const LocalReplica& r : *replicas) {
    auto child = Spawn(binary, r);
    if (!child.ok()) {
      std::cerr << "distrain run: " << child.status().message() << "\n";
      for (Child& c : children) ::kill(c.pid, SIGKILL);
      return kExitInternal;
    }
    children.push_back(std::move(*child));
  }
  const Child* coordinator = nullptr;
  for (const Child& c : children) {
    if (IsCoordinator(*config, c.replica)) coordinator = &c;
  }
  const std::string status_file = coordinator->replica.env.at("DISTRAIN_STATUS_FILE");

  // 3. Supervise: pump output, reap, decide the job's fate.
  std::optional<int> job_exit;       // decided result
  std::string failure;               // which replica failed and how
  double stop_sent_at = -1;          // when SIGTERM went to the remaining replicas
  double decided_at = -1;            // when the job's result became known
  bool killed = false;
  int handled_signals = 0;
  double last_progress_read = 0;
  auto stop_all = [&](int sig) {
    for (Child& c : children) {
      if (!c.exit_code) ::kill(c.pid, sig);
    }
  };

  while (true) {
    std::vector<pollfd> pfds;
    for (Child& c : children) {
      if (c.out_fd >= 0) pfds.push_back({c.out_fd, POLLIN, 0});
    }
    ::poll(pfds.data(), pfds.size(), 200);
    for (Child& c : children) {
      if (c.out_fd < 0) continue;
      for (const pollfd& p : pfds) {
        if (p.fd != c.out_fd || p.revents == 0) continue;
        const bool eof = (p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLIN);
        PumpOutput(c, console, eof);
        if (eof) {
          ::close(c.out_fd);
          c.out_fd = -1;
        }
      }
    }
    // Reap.
    for (Child& c : children) {
      if (c.exit_code) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (c.out_fd >= 0) {
        PumpOutput(c, console, /*eof=*/false);
      }
      if (stop_sent_at < 0 && !job_exit &&
          ShouldRestartLocally(*config, c.replica, *c.exit_code, c.restarts)) {
        // A ParameterServer worker: the chief re-runs its closure elsewhere
        // and re-admits it once it is back. A MultiWorkerMirrored worker:
        // the survivors wait for it and take it back into their group.
        console.Line("", absl::StrFormat("distrain run: %s exited with code %d; restarting it "
                                         "(restart %d; %s)",
                                         c.replica.label, *c.exit_code, c.restarts + 1,
                                         config->strategy == StrategyKind::kParameterServer
                                             ? "the chief re-admits it"
                                             : "it rejoins the others in place"));
        if (c.out_fd >= 0) {
          PumpOutput(c, console, /*eof=*/true);
          ::close(c.out_fd);
        }
        auto again = Spawn(binary, c.replica);
        if (again.ok()) {
          const int restarts = c.restarts + 1;
          c = std::move(*again);
          c.restarts = restarts;
          continue;
        }
        console.Line("", "distrain run: " + std::string(again.status().message()));
      }
      const bool training_task = c.replica.type == ReplicaType::kChief ||
                                 c.replica.type == ReplicaType::kWorker ||
                                 c.replica.type == ReplicaType::kPS;
      if (!job_exit && *c.exit_code != 0 && training_task && stop_sent_at < 0) {
        job_exit = *c.exit_code;
        failure = absl::StrFormat("%s exited with code %d (%s)", c.replica.label, *c.exit_code,
                                  IsRetryableExitCode(*c.exit_code) ? "retryable" : "permanent");
        console.Line("", "distrain run: " + failure + "; stopping the other replicas");
        stop_all(SIGTERM);
        stop_sent_at = Now();
      }
    }
    // Success policy.
    if (!job_exit) {
      bool succeeded = false;
      if (config->success_policy == SuccessPolicy::kAllWorkers) {
        succeeded = true;
        for (const Child& c : children) {
          if ((c.replica.type == ReplicaType::kChief || c.replica.type == ReplicaType::kWorker) &&
              c.exit_code != 0) {
            succeeded = false;
          }
        }
      } else {
        succeeded = coordinator->exit_code == 0;
      }
      if (succeeded) job_exit = kExitOk;
    }
    // Once decided, give the chief/workers time to finish, then stop ps/evaluators.
    if (job_exit && stop_sent_at < 0) {
      bool training_left = false;
      for (const Child& c : children) {
        if (!c.exit_code && (c.replica.type == ReplicaType::kChief || c.replica.type == ReplicaType::kWorker)) {
          training_left = true;
        }
      }
      if (decided_at < 0) decided_at = Now();
      // Under the Default policy workers normally finish right after the
      // chief; a straggler gets the grace period, then is stopped.
      if (!training_left || Now() - decided_at > options.grace_seconds) {
        stop_all(SIGTERM);
        stop_sent_at = Now();
      }
    }
    // Signals from the user.
    if (int n = g_signals.load(); n > handled_signals) {
      handled_signals = n;
      if (n == 1) {
        console.Line("", "distrain run: stopping replicas (they checkpoint first); Ctrl-C again to kill");
        stop_all(SIGTERM);
        if (!job_exit) job_exit = 128 + g_last_signal.load();
        if (failure.empty()) failure = "stopped by signal";
        stop_sent_at = Now();
      } else {
        stop_all(SIGKILL);
        killed = true;
      }
    }
    if (stop_sent_at >= 0 && !killed && Now() - stop_sent_at > options.grace_seconds) {
      console.Line("", "distrain run: replicas did not stop within the grace period; killing them");
      stop_all(SIGKILL);
      killed = true;
    }
    if (Now() - last_progress_read > 0.5) {
      last_progress_read = Now();
      if (auto p = ReadProgressFile(status_file)) console.SetProgress(*p);
    }
    bool all_done = true;
    for (const Child& c : children) {
      if (!c.exit_code || c.out_fd >= 0) all_done = false;
    }
    if (all_done) break;
  }
  console.Finish();

  // 4. Summary.
  const int code = job_exit.value_or(kExitInternal);
  const double wall = Now() - start;
  std::optional<Progress> p = ReadProgressFile(status_file);
  const bool interrupted = handled_signals > 0;
  std::cout << absl::StrFormat("\ndistrain run: job %s %s in %s\n", config->name,
                               code == 0      ? "Succeeded"
                               : interrupted ? "Interrupted"
                                             : "Failed",
                               FormatDuration(wall));
  if (!failure.empty() && code != 0) std::cout << "  reason          " << failure << "\n";
  if (p) {
    std::cout << absl::StrFormat("  steps           %d/%d\n", p->step, p->total_steps);
    std::cout << absl::StrFormat("  final loss      %.4f\n", p->loss);
    if (p->eval_accuracy) {
      std::cout << absl::StrFormat("  eval accuracy   %.4f (eval loss %.4f)\n", *p->eval_accuracy,
                                   p->eval_loss.value_or(0));
    }
    if (p->examples_per_second > 0) {
      std::cout << absl::StrFormat("  examples/s      %.0f (whole job, last interval)\n", p->examples_per_second);
    }
  }
  std::cout << absl::StrFormat("  wall time       %.1fs\n", wall);
  std::cout << "  checkpoints     " << cluster_options.checkpoint_dir << "\n";
  // The chief's event files (docs/tensorboard.md) live next to the checkpoints.
  std::error_code ignored;
  if (std::filesystem::is_directory(cluster_options.checkpoint_dir + "/train", ignored)) {
    std::cout << "  tensorboard     tensorboard --logdir " << cluster_options.checkpoint_dir << "\n";
  }
  if (code == 0 && !config->training.export_model.path.empty()) {
    std::cout << "  keras model     " << config->training.export_model.path << "\n";
  }
  if (code != 0 && IsRetryableExitCode(code)) {
    std::cout << "  resume with     distrain run " << options.job_file << " --checkpoint-dir "
              << cluster_options.checkpoint_dir << "\n";
  }
  std::cout << "  exit code       " << code << "\n";
  return code;
}

}  // namespace distrain

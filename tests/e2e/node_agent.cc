// distrain-test-node: a test node agent for the e2e tier (DESIGN.md §8). Not
// shipped; test infrastructure only.
//
// It plays scheduler and kubelet for the developer control plane of
// scripts/control-plane.sh, which has neither:
//   1. registers a Node (Ready, heartbeat every 10 s, so the node lifecycle
//      controller never evicts its pods);
//   2. binds every unscheduled pod to that Node (a one-node scheduler);
//   3. runs each bound pod's main container (named "distrain", else the
//      first) as a local process: the image is mapped to a locally built
//      binary (--image-map REPO=PATH, matched on the repository without tag),
//      with the pod's command/args and env (fieldRef downward-API fields,
//      configMapKeyRef and secretKeyRef resolved through the API);
//   4. gives every pod an address of its own, 127.0.<a>.<b> (all of 127/8 is
//      loopback), as status.podIP — the distrain worker binds its servers to
//      $POD_IP, so every pod can listen on port 2222;
//   5. makes names resolve: a managed block in the hosts file maps each pod's
//      <hostname>.<subdomain>.<ns>.svc[.cluster.local] and each headless
//      Service's <service>.<ns>.svc[.cluster.local] to the pod's address;
//   6. reports status like a kubelet: Running with a running container state,
//      then Succeeded (exit 0) or Failed with the terminated state's exit code
//      and reason; restartPolicy OnFailure/Always restart the process in
//      place, counting restartCount;
//   7. a pod being deleted gets SIGTERM, then SIGKILL after its grace period,
//      and is then removed with grace period 0 (what a kubelet does).
//   8. serves the kubelet's log endpoint, GET /containerLogs/{ns}/{pod}/{container}
//      (tailLines, limitBytes, follow), over HTTPS on 127.0.0.1:<kubelet-port>
//      with a self-signed certificate made at start with the openssl CLI, and
//      advertises it as status.daemonEndpoints.kubeletEndpoint, so
//      `kubectl logs` works through the API server. The dev API server sets no
//      --kubelet-certificate-authority (it does not verify kubelet serving
//      certificates) and no --kubelet-client-certificate (it presents none),
//      so the endpoint neither needs a CA-signed certificate nor authenticates.
// Container logs go to <state-dir>/logs/<namespace>_<pod>.log and the running
// process id to <state-dir>/pids/<namespace>_<pod>.pid, so tests can read a
// chief's log or kill -9 one replica.
//
// Threads: informer threads only enqueue pod keys; one sync thread owns the
// process table, forks the pods and does the pod API writes; one reaper thread
// waits for children; one heartbeat thread; cpprestsdk's listener threads serve
// logs (reading files and the process table). Shared state is guarded by mu_;
// hosts_mu_ serialises rewrites of the hosts file.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "operator/api/distributed_training_job.h"
#include "operator/kube/informer.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/paths.h"
#include "operator/kube/rest_client.h"
#include "spdlog/spdlog.h"
// Last, and U undefined after: cpprestsdk defines a macro U that breaks fmt.
#include "cpprest/http_listener.h"
#include "cpprest/producerconsumerstream.h"
#undef U

namespace distrain::testnode {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::stop_source g_stop;
void OnSignal(int) { g_stop.request_stop(); }

std::string Now() { return api::FormatKubeTime(absl::Now()); }

std::string Str(const Json& j, const char* pointer, std::string fallback = "") {
  Json::json_pointer p(pointer);
  if (!j.contains(p) || !j.at(p).is_string()) return fallback;
  return j.at(p).get<std::string>();
}

// The main container: "distrain", else the first.
const Json* MainContainer(const Json& pod) {
  const Json& containers = pod["spec"]["containers"];
  for (const Json& c : containers) {
    if (c.value("name", "") == "distrain") return &c;
  }
  return containers.empty() ? nullptr : &containers[0];
}

// "localhost/distrain/worker:0.1.0" -> "localhost/distrain/worker".
std::string Repository(const std::string& image) {
  size_t slash = image.rfind('/');
  size_t colon = image.rfind(':');
  std::string repo = colon != std::string::npos && (slash == std::string::npos || colon > slash)
                         ? image.substr(0, colon)
                         : image;
  size_t at = repo.find('@');
  return at == std::string::npos ? repo : repo.substr(0, at);
}

struct Options {
  std::string kubeconfig;
  std::string node_name = "distrain-test-node";
  std::map<std::string, std::string> image_map;  // repository -> binary
  std::string state_dir = "/tmp/distrain-test-node";
  std::string hosts_file = "/etc/hosts";
  std::string namespace_name;  // "": pods of every namespace
  int kubelet_port = 0;        // 0: a free port
  int first_address = 256;     // 127.0.1.0
};

// A loopback TCP port that was free a moment ago.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// The last `n` lines of `text` (all of it when it has fewer).
std::string TailLines(const std::string& text, int64_t n) {
  if (n < 0) return text;
  if (n == 0) return "";
  size_t end = text.size();
  if (end > 0 && text[end - 1] == '\n') --end;  // a final newline ends the last line
  size_t pos = end;
  for (int64_t i = 0; i < n; ++i) {
    if (pos == 0) return text;
    size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text;
    pos = nl;
  }
  return text.substr(pos + 1);
}

class NodeAgent {
 public:
  NodeAgent(Options options, std::unique_ptr<kube::RestClient> client)
      : options_(std::move(options)), client_(std::move(client)) {}

  absl::Status Run(std::stop_token stop);

 private:
  struct Proc {
    pid_t pid = -1;
    std::string ns, name, uid, container, ip;
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
    std::string restart_policy;
    int restarts = 0;
    std::string started_at;
    bool terminating = false;
    absl::Time kill_at = absl::InfiniteFuture();
    std::optional<int> exit_code;  // set by the reaper
    bool finished_reported = false;
  };

  absl::Status RegisterNode();
  absl::Status StartKubeletServer();
  void ServeLogs(web::http::http_request request);
  bool PodProcessRunning(const std::string& key);
  void Heartbeat(std::stop_token stop);
  void Reaper(std::stop_token stop);
  void SyncLoop(std::stop_token stop);
  void Sync(const std::string& key);
  void Enqueue(const std::string& key);
  absl::Status Start(const Json& pod);
  absl::StatusOr<std::map<std::string, std::string>> ResolveEnv(const Json& pod, const Json& container,
                                                                const std::string& ip);
  absl::StatusOr<std::string> MapImage(const std::string& image, const std::string& command0);
  pid_t Spawn(Proc& p);
  void ReportRunning(const Proc& p);
  void ReportTerminated(const Proc& p, int exit_code);
  void PatchStatus(const std::string& ns, const std::string& name, const Json& status);
  void FinalizeDeletion(const std::string& ns, const std::string& name, const std::string& uid);
  void WriteHosts();
  std::string AllocateAddress();

  Options options_;
  std::unique_ptr<kube::RestClient> client_;
  std::unique_ptr<kube::Informer> pods_, services_;

  int kubelet_port_ = 0;
  std::unique_ptr<web::http::experimental::listener::http_listener> kubelet_;
  std::stop_source follow_stop_;  // ends `kubectl logs -f` streams at shutdown

  std::mutex hosts_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> dirty_;            // pod keys to sync
  std::map<std::string, Proc> procs_;      // pod key -> process
  std::map<pid_t, std::string> by_pid_;
  int next_address_ = 0;
  std::string last_hosts_;
};

std::string NodeAgent::AllocateAddress() {
  int n = options_.first_address + next_address_++;
  while ((n & 255) == 0 || (n & 255) == 255) n = options_.first_address + next_address_++;
  return absl::StrCat("127.0.", (n >> 8) & 255, ".", n & 255);
}

absl::Status NodeAgent::RegisterNode() {
  Json node = {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata",
       {{"name", options_.node_name},
        {"labels", {{"kubernetes.io/hostname", options_.node_name}, {"kubernetes.io/os", "linux"},
                    {"kubernetes.io/arch", "amd64"}, {"distrain.io/test-node", "true"}}}}},
      {"spec", Json::object()}};
  auto r = client_->Request("POST", kube::ResourcePath({"", "v1", "nodes", false}), &node);
  if (!r.ok()) return r.status();
  if (!r->ok() && !r->conflict()) {
    return absl::UnavailableError(absl::StrCat("registering node ", options_.node_name, ": ", r->message()));
  }
  return absl::OkStatus();
}

absl::Status NodeAgent::StartKubeletServer() {
  kubelet_port_ = options_.kubelet_port != 0 ? options_.kubelet_port : FreePort();
  if (kubelet_port_ == 0) return absl::UnavailableError("no free port for the kubelet endpoint");
  const fs::path pki = fs::path(options_.state_dir) / "pki";
  fs::create_directories(pki);
  const std::string cert = (pki / "kubelet.crt").string(), key = (pki / "kubelet.key").string();
  // Self-signed: the dev API server does not verify kubelet certificates (no
  // --kubelet-certificate-authority), but it does speak TLS to them.
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=", options_.node_name,
      " -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout '", key, "' -out '", cert,
      "' >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("making the kubelet certificate failed: ", cmd,
                                               " (is the openssl CLI installed?)"));
  }
  web::http::experimental::listener::http_listener_config config;
  config.set_ssl_context_callback([cert, key](boost::asio::ssl::context& ctx) {
    ctx.set_options(boost::asio::ssl::context::default_workarounds | boost::asio::ssl::context::no_sslv2 |
                    boost::asio::ssl::context::no_sslv3);
    ctx.use_certificate_chain_file(cert);
    ctx.use_private_key_file(key, boost::asio::ssl::context::pem);
  });
  try {
    kubelet_ = std::make_unique<web::http::experimental::listener::http_listener>(
        web::uri(absl::StrCat("https://127.0.0.1:", kubelet_port_)), config);
    kubelet_->support(web::http::methods::GET, [this](web::http::http_request r) { ServeLogs(std::move(r)); });
    kubelet_->open().wait();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("kubelet endpoint on 127.0.0.1:", kubelet_port_, ": ", e.what(), " (pass a free --kubelet-port)"));
  }
  return absl::OkStatus();
}

bool NodeAgent::PodProcessRunning(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = procs_.find(key);
  return it != procs_.end() && !it->second.exit_code;
}

// GET /containerLogs/{namespace}/{pod}/{container}?tailLines=&limitBytes=&follow=
// (what the API server asks a kubelet for `kubectl logs`). Timestamps are not
// recorded, so timestamps=true is answered without them.
void NodeAgent::ServeLogs(web::http::http_request request) {
  using web::http::status_codes;
  const std::vector<std::string> parts = web::uri::split_path(request.relative_uri().path());
  if (parts.size() != 4 || parts[0] != "containerLogs") {
    request.reply(status_codes::NotFound, "this test node serves only /containerLogs/{namespace}/{pod}/{container}\n");
    return;
  }
  const std::string ns = web::uri::decode(parts[1]), pod = web::uri::decode(parts[2]);
  const std::map<std::string, std::string> query = web::uri::split_query(request.relative_uri().query());
  auto int_param = [&](const char* name, int64_t fallback) {
    auto it = query.find(name);
    int64_t v = fallback;
    if (it != query.end() && !absl::SimpleAtoi(it->second, &v)) v = fallback;
    return v;
  };
  const int64_t tail = int_param("tailLines", -1);
  const int64_t limit = int_param("limitBytes", -1);
  auto follow_it = query.find("follow");
  const bool follow = follow_it != query.end() && (follow_it->second == "true" || follow_it->second == "1");
  const fs::path log = fs::path(options_.state_dir) / "logs" / (ns + "_" + pod + ".log");
  std::ifstream in(log, std::ios::binary);
  if (!in) {
    request.reply(status_codes::NotFound, absl::StrCat("no log for pod ", ns, "/", pod, " on this node\n"));
    return;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::streamoff offset = static_cast<std::streamoff>(text.size());
  text = TailLines(text, tail);
  if (limit >= 0 && static_cast<int64_t>(text.size()) > limit) text.resize(limit);
  if (!follow || (limit >= 0 && static_cast<int64_t>(text.size()) >= limit)) {
    request.reply(status_codes::OK, text, "text/plain");
    return;
  }
  // follow: what is there, then what is appended until the process ends.
  concurrency::streams::producer_consumer_buffer<uint8_t> buffer;
  buffer.putn_nocopy(reinterpret_cast<const uint8_t*>(text.data()), text.size()).wait();
  std::thread([this, buffer, log, offset, key = kube::ObjectKey(ns, pod), stop = follow_stop_.get_token()]() mutable {
    std::ifstream f(log, std::ios::binary);
    f.seekg(offset);
    char chunk[8192];
    bool last_round = false;
    while (!stop.stop_requested()) {
      const bool running = PodProcessRunning(key);
      f.clear();
      while (f.read(chunk, sizeof(chunk)) || f.gcount() > 0) {
        buffer.putn_nocopy(reinterpret_cast<const uint8_t*>(chunk), f.gcount()).wait();
        if (f.eof()) break;
      }
      if (last_round) break;
      if (!running) last_round = true;  // one more read after the exit, then close
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    buffer.close(std::ios_base::out).wait();
  }).detach();
  request.reply(status_codes::OK, buffer.create_istream(), "text/plain");
}

void NodeAgent::Heartbeat(std::stop_token stop) {
  while (!stop.stop_requested()) {
    const std::string now = Now();
    auto condition = [&](const char* type, const char* status, const char* reason) {
      return Json{{"type", type}, {"status", status}, {"reason", reason}, {"message", "distrain test node"},
                  {"lastHeartbeatTime", now}, {"lastTransitionTime", now}};
    };
    Json patch = {
        {"status",
         {{"capacity", {{"cpu", "64"}, {"memory", "256Gi"}, {"pods", "1000"}}},
          {"allocatable", {{"cpu", "64"}, {"memory", "256Gi"}, {"pods", "1000"}}},
          // InternalIP only: the API server reaches the kubelet endpoint at the
          // first address of its preferred types, and Hostname comes first there
          // but the node's name does not resolve.
          {"addresses", Json::array({{{"type", "InternalIP"}, {"address", "127.0.0.1"}}})},
          {"daemonEndpoints", {{"kubeletEndpoint", {{"Port", kubelet_port_}}}}},
          {"conditions",
           {condition("Ready", "True", "KubeletReady"), condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"), condition("PIDPressure", "False", "KubeletHasSufficientPID")}},
          {"nodeInfo",
           {{"kubeletVersion", "distrain-test-node"}, {"containerRuntimeVersion", "process://local"},
            {"operatingSystem", "linux"}, {"architecture", "amd64"}, {"osImage", "local processes"},
            {"kernelVersion", ""}, {"kubeProxyVersion", ""}, {"machineID", ""}, {"systemUUID", ""}, {"bootID", ""}}}}}};
    auto r = client_->Request("PATCH", kube::ResourcePath({"", "v1", "nodes", false}, "", options_.node_name, "status"),
                              &patch, "application/strategic-merge-patch+json");
    if (!r.ok() || !r->ok()) {
      spdlog::warn("node heartbeat failed: {}", r.ok() ? r->message() : std::string(r.status().message()));
    }
    for (int i = 0; i < 100 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void NodeAgent::Enqueue(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  dirty_.insert(key);
  cv_.notify_all();
}

absl::StatusOr<std::string> NodeAgent::MapImage(const std::string& image, const std::string& command0) {
  if (!command0.empty() && command0.front() == '/' && fs::exists(command0)) return command0;
  auto it = options_.image_map.find(Repository(image));
  if (it == options_.image_map.end()) {
    return absl::NotFoundError(absl::StrCat("image ", image, " is not in --image-map (repository ",
                                            Repository(image), ")"));
  }
  if (command0.empty()) return it->second;
  // A bare command ("distrain-worker") runs from the mapped binary's directory.
  fs::path candidate = fs::path(it->second).parent_path() / command0;
  if (fs::exists(candidate)) return candidate.string();
  if (fs::path(it->second).filename() == command0) return it->second;
  return absl::NotFoundError(absl::StrCat("command ", command0, " of image ", image, " not found next to ",
                                          it->second));
}

absl::StatusOr<std::map<std::string, std::string>> NodeAgent::ResolveEnv(const Json& pod, const Json& container,
                                                                         const std::string& ip) {
  std::map<std::string, std::string> env;
  env["HOSTNAME"] = Str(pod, "/spec/hostname", Str(pod, "/metadata/name"));
  if (!container.contains("env")) return env;
  for (const Json& e : container["env"]) {
    const std::string name = e.value("name", "");
    if (e.contains("value")) {
      env[name] = e["value"].get<std::string>();
      continue;
    }
    if (!e.contains("valueFrom")) {
      env[name] = "";
      continue;
    }
    const Json& from = e["valueFrom"];
    if (from.contains("fieldRef")) {
      const std::string path = from["fieldRef"].value("fieldPath", "");
      if (path == "status.podIP" || path == "status.podIPs") env[name] = ip;
      else if (path == "status.hostIP" || path == "status.hostIPs") env[name] = "127.0.0.1";
      else if (path == "spec.nodeName") env[name] = options_.node_name;
      else if (path == "spec.serviceAccountName") env[name] = Str(pod, "/spec/serviceAccountName", "default");
      else if (path == "metadata.name") env[name] = Str(pod, "/metadata/name");
      else if (path == "metadata.namespace") env[name] = Str(pod, "/metadata/namespace");
      else if (path == "metadata.uid") env[name] = Str(pod, "/metadata/uid");
      else if (absl::StartsWith(path, "metadata.labels['") || absl::StartsWith(path, "metadata.annotations['")) {
        const bool labels = absl::StartsWith(path, "metadata.labels");
        const size_t open = path.find("['") + 2, close = path.rfind("']");
        const std::string k = path.substr(open, close - open);
        const Json& m = pod["metadata"].value(labels ? "labels" : "annotations", Json::object());
        env[name] = m.contains(k) ? m[k].get<std::string>() : "";
      } else {
        return absl::InvalidArgumentError(absl::StrCat("env ", name, ": fieldPath ", path, " is not supported"));
      }
    } else if (from.contains("configMapKeyRef") || from.contains("secretKeyRef")) {
      const bool secret = from.contains("secretKeyRef");
      const Json& ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
      auto r = client_->Request("GET", kube::ResourcePath({"", "v1", secret ? "secrets" : "configmaps", true},
                                                          Str(pod, "/metadata/namespace"), ref.value("name", "")));
      if (!r.ok() || !r->ok()) {
        if (ref.value("optional", false)) continue;
        return absl::NotFoundError(absl::StrCat("env ", name, ": ", secret ? "secret " : "configmap ",
                                                ref.value("name", ""), " not found"));
      }
      const std::string key = ref.value("key", "");
      const Json& data = r->body.value("data", Json::object());
      if (!data.contains(key)) return absl::NotFoundError(absl::StrCat("env ", name, ": key ", key, " missing"));
      env[name] = data[key].get<std::string>();  // secrets: base64, as a kubelet would NOT leave it; tests use configmaps
    } else {
      return absl::InvalidArgumentError(absl::StrCat("env ", name, ": this valueFrom is not supported"));
    }
  }
  return env;
}

pid_t NodeAgent::Spawn(Proc& p) {
  fs::create_directories(fs::path(options_.state_dir) / "logs");
  fs::create_directories(fs::path(options_.state_dir) / "pids");
  const fs::path workdir = fs::path(options_.state_dir) / "pods" / (p.ns + "_" + p.name);
  fs::create_directories(workdir);
  const std::string log = (fs::path(options_.state_dir) / "logs" / (p.ns + "_" + p.name + ".log")).string();
  // Everything the child needs is built before fork: between fork and exec a
  // child of a multi-threaded process may only make async-signal-safe calls
  // (another thread may hold the allocator's lock).
  std::vector<std::string> env_strings;
  if (!p.env.count("PATH")) env_strings.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  for (const auto& [k, v] : p.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = p.argv;
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string dir = workdir.string();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // an agent that dies takes its pods with it
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      dup2(devnull, 0);
      close(devnull);
    }
    if (chdir(dir.c_str()) != 0) _exit(127);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  std::ofstream(fs::path(options_.state_dir) / "pids" / (p.ns + "_" + p.name + ".pid")) << pid << "\n";
  return pid;
}

absl::Status NodeAgent::Start(const Json& pod) {
  const Json* container = MainContainer(pod);
  if (container == nullptr) return absl::InvalidArgumentError("pod has no containers");
  Proc p;
  p.ns = Str(pod, "/metadata/namespace");
  p.name = Str(pod, "/metadata/name");
  p.uid = Str(pod, "/metadata/uid");
  p.container = container->value("name", "main");
  p.restart_policy = Str(pod, "/spec/restartPolicy", "Always");
  std::vector<std::string> command = container->value("command", std::vector<std::string>{});
  auto binary = MapImage(container->value("image", ""), command.empty() ? "" : command[0]);
  if (!binary.ok()) return binary.status();
  p.argv.push_back(*binary);
  for (size_t i = 1; i < command.size(); ++i) p.argv.push_back(command[i]);
  for (const std::string& a : container->value("args", std::vector<std::string>{})) p.argv.push_back(a);
  {
    std::lock_guard<std::mutex> lock(mu_);
    p.ip = AllocateAddress();
  }
  auto env = ResolveEnv(pod, *container, p.ip);
  if (!env.ok()) return env.status();
  p.env = std::move(*env);
  p.env["POD_IP"] = p.env.count("POD_IP") ? p.env["POD_IP"] : p.ip;
  p.started_at = Now();
  const std::string key = kube::ObjectKey(p.ns, p.name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    p.pid = Spawn(p);
    by_pid_[p.pid] = key;
    procs_[key] = p;
  }
  spdlog::info("started {} as pid {} on {}: {}", key, p.pid, p.ip, absl::StrJoin(p.argv, " "));
  WriteHosts();
  ReportRunning(p);
  return absl::OkStatus();
}

void NodeAgent::PatchStatus(const std::string& ns, const std::string& name, const Json& status) {
  Json patch = {{"status", status}};
  auto r = client_->Request("PATCH", kube::ResourcePath(kube::PodsResource(), ns, name, "status"), &patch,
                            "application/merge-patch+json");
  if (!r.ok() || (!r->ok() && !r->not_found())) {
    spdlog::warn("status of {}/{}: {}", ns, name, r.ok() ? r->message() : std::string(r.status().message()));
  }
}

void NodeAgent::ReportRunning(const Proc& p) {
  const std::string now = Now();
  Json status = {
      {"phase", "Running"},
      {"hostIP", "127.0.0.1"},
      {"hostIPs", {{{"ip", "127.0.0.1"}}}},
      {"podIP", p.ip},
      {"podIPs", {{{"ip", p.ip}}}},
      {"startTime", p.started_at},
      {"conditions",
       {{{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", now}},
        {{"type", "Initialized"}, {"status", "True"}, {"lastTransitionTime", now}},
        {{"type", "ContainersReady"}, {"status", "True"}, {"lastTransitionTime", now}},
        {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", now}}}},
      {"containerStatuses",
       {{{"name", p.container}, {"ready", true}, {"started", true}, {"restartCount", p.restarts},
         {"image", "local"}, {"imageID", "local://" + p.argv[0]}, {"containerID", absl::StrCat("process://", p.pid)},
         {"state", {{"running", {{"startedAt", now}}}}}}}}};
  PatchStatus(p.ns, p.name, status);
}

void NodeAgent::ReportTerminated(const Proc& p, int exit_code) {
  const std::string now = Now();
  const bool ok = exit_code == 0;
  Json status = {
      {"phase", ok ? "Succeeded" : "Failed"},
      {"podIP", p.ip},
      {"podIPs", {{{"ip", p.ip}}}},
      {"conditions",
       {{{"type", "Ready"}, {"status", "False"}, {"reason", "PodCompleted"}, {"lastTransitionTime", now}},
        {{"type", "ContainersReady"}, {"status", "False"}, {"reason", "PodCompleted"}, {"lastTransitionTime", now}}}},
      {"containerStatuses",
       {{{"name", p.container}, {"ready", false}, {"started", false}, {"restartCount", p.restarts},
         {"image", "local"}, {"imageID", "local://" + p.argv[0]}, {"containerID", absl::StrCat("process://", p.pid)},
         {"state",
          {{"terminated",
            {{"exitCode", exit_code}, {"reason", ok ? "Completed" : (exit_code == 137 ? "Killed" : "Error")},
             {"startedAt", p.started_at}, {"finishedAt", now}, {"containerID", absl::StrCat("process://", p.pid)}}}}}}}}};
  PatchStatus(p.ns, p.name, status);
}

void NodeAgent::FinalizeDeletion(const std::string& ns, const std::string& name, const std::string& uid) {
  Json options = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}, {"gracePeriodSeconds", 0}};
  if (!uid.empty()) options["preconditions"] = {{"uid", uid}};
  (void)client_->Request("DELETE", kube::ResourcePath(kube::PodsResource(), ns, name), &options);
}

void NodeAgent::WriteHosts() {
  std::lock_guard<std::mutex> hosts_lock(hosts_mu_);  // one rewrite at a time, newest wins
  // <ip> names, for every running pod and every headless Service selecting it.
  std::map<std::string, std::set<std::string>> names;  // ip -> names
  std::map<std::string, std::string> pod_ip;           // ns/name -> ip
  std::vector<Json> pods;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, p] : procs_) {
      if (p.exit_code && p.finished_reported) continue;
      pod_ip[key] = p.ip;
    }
  }
  for (const auto& [key, ip] : pod_ip) {
    std::optional<Json> pod = pods_ ? pods_->Get(key) : std::nullopt;
    if (!pod) continue;
    const std::string ns = Str(*pod, "/metadata/namespace");
    const std::string hostname = Str(*pod, "/spec/hostname", Str(*pod, "/metadata/name"));
    const std::string subdomain = Str(*pod, "/spec/subdomain");
    if (!subdomain.empty()) {
      names[ip].insert(absl::StrCat(hostname, ".", subdomain, ".", ns, ".svc"));
      names[ip].insert(absl::StrCat(hostname, ".", subdomain, ".", ns, ".svc.cluster.local"));
    }
    pods.push_back(std::move(*pod));
  }
  for (const Json& svc : services_ ? services_->List() : std::vector<Json>{}) {
    if (Str(svc, "/spec/clusterIP") != "None" || !svc["spec"].contains("selector")) continue;
    const Json& selector = svc["spec"]["selector"];
    const std::string ns = Str(svc, "/metadata/namespace");
    for (const Json& pod : pods) {
      if (Str(pod, "/metadata/namespace") != ns) continue;
      const Json& labels = pod["metadata"].value("labels", Json::object());
      bool match = !selector.empty();
      for (auto it = selector.begin(); it != selector.end() && match; ++it) {
        match = labels.contains(it.key()) && labels[it.key()] == it.value();
      }
      if (!match) continue;
      const std::string& ip = pod_ip[kube::ObjectKey(pod)];
      names[ip].insert(absl::StrCat(Str(svc, "/metadata/name"), ".", ns, ".svc"));
      names[ip].insert(absl::StrCat(Str(svc, "/metadata/name"), ".", ns, ".svc.cluster.local"));
    }
  }
  std::string block = "# BEGIN distrain-test-node (managed; removed when the agent stops)\n";
  for (const auto& [ip, n] : names) block += ip + " " + absl::StrJoin(n, " ") + "\n";
  block += "# END distrain-test-node\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (block == last_hosts_) return;
  last_hosts_ = block;
  std::ifstream in(options_.hosts_file);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t begin = content.find("# BEGIN distrain-test-node");
  size_t end = content.find("# END distrain-test-node\n");
  if (begin != std::string::npos && end != std::string::npos) content.erase(begin, end + 25 - begin);
  if (!content.empty() && content.back() != '\n') content += '\n';
  // In place (not rename): /etc/hosts is often a bind mount.
  std::ofstream out(options_.hosts_file, std::ios::trunc);
  out << content << (names.empty() ? "" : block);
}

void NodeAgent::Sync(const std::string& key) {
  std::optional<Json> pod = pods_->Get(key);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = procs_.find(key);
  Proc* proc = it == procs_.end() ? nullptr : &it->second;
  if (!pod || (proc != nullptr && Str(*pod, "/metadata/uid") != proc->uid)) {
    // Deleted (or replaced under the same name): kill what runs.
    if (proc != nullptr) {
      if (!proc->exit_code) kill(-proc->pid, SIGKILL);
      by_pid_.erase(proc->pid);
      procs_.erase(it);
      lock.unlock();
      WriteHosts();
      if (pod) Enqueue(key);
    }
    return;
  }
  const bool deleting = pod->at("metadata").contains("deletionTimestamp");
  const std::string node = Str(*pod, "/spec/nodeName");
  if (node.empty()) {
    if (deleting) return;
    lock.unlock();
    Json binding = {{"apiVersion", "v1"}, {"kind", "Binding"},
                    {"metadata", {{"name", Str(*pod, "/metadata/name")}}},
                    {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", options_.node_name}}}};
    auto r = client_->Request("POST", kube::ResourcePath(kube::PodsResource(), Str(*pod, "/metadata/namespace"),
                                                         Str(*pod, "/metadata/name"), "binding"), &binding);
    if (!r.ok() || (!r->ok() && !r->conflict())) {
      spdlog::warn("binding {}: {}", key, r.ok() ? r->message() : std::string(r.status().message()));
    }
    return;
  }
  if (node != options_.node_name) return;
  if (deleting) {
    if (proc == nullptr || proc->exit_code) {
      const std::string uid = Str(*pod, "/metadata/uid");
      if (proc != nullptr) {
        by_pid_.erase(proc->pid);
        procs_.erase(it);
      }
      lock.unlock();
      FinalizeDeletion(Str(*pod, "/metadata/namespace"), Str(*pod, "/metadata/name"), uid);
      WriteHosts();
      return;
    }
    if (!proc->terminating) {
      proc->terminating = true;
      const int64_t grace = pod->at("metadata").value("deletionGracePeriodSeconds", int64_t{30});
      proc->kill_at = absl::Now() + absl::Seconds(grace);
      kill(-proc->pid, SIGTERM);
    }
    return;
  }
  const std::string phase = Str(*pod, "/status/phase");
  if (proc == nullptr && (phase == "Succeeded" || phase == "Failed")) return;
  if (proc == nullptr) {
    lock.unlock();
    if (absl::Status s = Start(*pod); !s.ok()) {
      spdlog::error("cannot run {}: {}", key, s.message());
      Proc failed;
      failed.ns = Str(*pod, "/metadata/namespace");
      failed.name = Str(*pod, "/metadata/name");
      failed.uid = Str(*pod, "/metadata/uid");
      failed.container = "distrain";
      failed.argv = {"?"};
      failed.exit_code = 128;
      failed.finished_reported = true;
      {
        std::lock_guard<std::mutex> l(mu_);
        procs_[key] = failed;
      }
      PatchStatus(failed.ns, failed.name,
                  {{"phase", "Failed"}, {"reason", "CreateContainerError"}, {"message", std::string(s.message())}});
    }
    return;
  }
  if (proc->exit_code && !proc->finished_reported) {
    const int code = *proc->exit_code;
    const bool restart = proc->restart_policy == "Always" || (proc->restart_policy == "OnFailure" && code != 0);
    if (restart) {
      by_pid_.erase(proc->pid);
      proc->restarts++;
      proc->exit_code.reset();
      proc->started_at = Now();
      proc->pid = Spawn(*proc);
      by_pid_[proc->pid] = key;
      Proc copy = *proc;
      lock.unlock();
      spdlog::info("{} exited {}; restarted in place as pid {} (restartPolicy {})", key, code, copy.pid,
                   copy.restart_policy);
      ReportRunning(copy);
      return;
    }
    proc->finished_reported = true;
    Proc copy = *proc;
    lock.unlock();
    spdlog::info("{} exited with code {}", key, code);
    ReportTerminated(copy, code);
    WriteHosts();
  }
}

void NodeAgent::Reaper(std::stop_token stop) {
  while (!stop.stop_requested()) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      // Escalate terminations whose grace period is over.
      std::vector<pid_t> to_kill;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [key, p] : procs_) {
          if (p.terminating && !p.exit_code && absl::Now() >= p.kill_at) to_kill.push_back(p.pid);
        }
      }
      for (pid_t k : to_kill) kill(-k, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::string key;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_pid_.find(pid);
      if (it == by_pid_.end()) continue;
      key = it->second;
      procs_[key].exit_code = code;
      fs::remove(fs::path(options_.state_dir) / "pids" / (procs_[key].ns + "_" + procs_[key].name + ".pid"));
    }
    Enqueue(key);
  }
}

void NodeAgent::SyncLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::set<std::string> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return !dirty_.empty(); });
      batch.swap(dirty_);
    }
    for (const std::string& key : batch) Sync(key);
  }
}

absl::Status NodeAgent::Run(std::stop_token stop) {
  if (absl::Status s = StartKubeletServer(); !s.ok()) return s;
  if (absl::Status s = RegisterNode(); !s.ok()) return s;
  {
    std::ofstream probe(options_.hosts_file, std::ios::app);
    if (!probe) {
      return absl::PermissionDeniedError(absl::StrCat(options_.hosts_file, " is not writable: run as root, or pass "
                                                      "--hosts-file for a resolver you control"));
    }
  }
  WriteHosts();  // drops the block a killed agent may have left
  pods_ = std::make_unique<kube::Informer>(
      client_.get(), kube::InformerOptions{.resource = kube::PodsResource(), .namespace_name = options_.namespace_name});
  services_ = std::make_unique<kube::Informer>(client_.get(), kube::InformerOptions{.resource = kube::ServicesResource()});
  pods_->AddHandlers({.on_add = [this](const Json& p) { Enqueue(kube::ObjectKey(p)); },
                      .on_update = [this](const Json&, const Json& p) { Enqueue(kube::ObjectKey(p)); },
                      .on_delete = [this](const Json& p) { Enqueue(kube::ObjectKey(p)); }});
  services_->AddHandlers({.on_add = [this](const Json&) { WriteHosts(); },
                          .on_update = [this](const Json&, const Json&) { WriteHosts(); },
                          .on_delete = [this](const Json&) { WriteHosts(); }});
  pods_->Start();
  services_->Start();
  std::jthread heartbeat([this](std::stop_token s) { Heartbeat(s); });
  std::jthread reaper([this](std::stop_token s) { Reaper(s); });
  std::jthread sync([this](std::stop_token s) { SyncLoop(s); });
  spdlog::info("node {} ready; kubelet endpoint https://127.0.0.1:{}; state in {}", options_.node_name, kubelet_port_,
               options_.state_dir);
  while (!stop.stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  sync.request_stop();
  sync.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, p] : procs_) {
      if (!p.exit_code) kill(-p.pid, SIGKILL);
    }
  }
  reaper.request_stop();
  heartbeat.request_stop();
  follow_stop_.request_stop();
  try {
    kubelet_->close().wait();
  } catch (const std::exception&) {
  }
  pods_->Stop();
  services_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    procs_.clear();
  }
  last_hosts_.clear();
  WriteHosts();  // removes the block
  (void)client_->Request("DELETE", kube::ResourcePath({"", "v1", "nodes", false}, "", options_.node_name));
  return absl::OkStatus();
}

}  // namespace
}  // namespace distrain::testnode

int main(int argc, char** argv) {
  using namespace distrain;
  CLI::App app{"distrain-test-node: a test node agent for the e2e tier — binds pods to one Node and runs their "
               "main containers as local processes (see the header of tests/e2e/node_agent.cc)"};
  testnode::Options options;
  std::vector<std::string> image_map;
  app.add_option("--kubeconfig", options.kubeconfig, "kubeconfig (default: $KUBECONFIG)");
  app.add_option("--node-name", options.node_name, "name of the Node to register");
  app.add_option("--image-map", image_map, "REPOSITORY=BINARY: run BINARY for images of REPOSITORY (repeatable)");
  app.add_option("--state-dir", options.state_dir, "logs, pid files and pod working directories");
  app.add_option("--hosts-file", options.hosts_file, "hosts file whose managed block resolves pod and Service names");
  app.add_option("--namespace", options.namespace_name, "run only pods of this namespace (default: every namespace)");
  app.add_option("--kubelet-port", options.kubelet_port,
                 "port of the HTTPS log endpoint on 127.0.0.1 (default: a free port)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const std::string& m : image_map) {
    size_t eq = m.find('=');
    if (eq == std::string::npos) {
      std::cerr << "--image-map: want REPOSITORY=BINARY, got " << m << "\n";
      return 2;
    }
    options.image_map[m.substr(0, eq)] = m.substr(eq + 1);
  }
  InitLogging("info");
  auto config = kube::LoadRestConfig({.kubeconfig_path = options.kubeconfig});
  if (!config.ok()) {
    spdlog::error("{}", config.status().message());
    return 3;
  }
  auto client = kube::RestClient::Create(*config, {.qps = 200, .burst = 400});
  if (!client.ok()) {
    spdlog::error("{}", client.status().message());
    return 3;
  }
  struct sigaction sa = {};
  sa.sa_handler = testnode::OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  testnode::NodeAgent agent(options, std::move(*client));
  absl::Status s = agent.Run(testnode::g_stop.get_token());
  if (!s.ok()) {
    spdlog::error("{}", s.message());
    return 1;
  }
  return 0;
}

// distrain-test-node: a test node agent for the e2e tier (docs/architecture.md §8). Not
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
//      with the pod's command/args and env as a kubelet builds them
//      (kubelet_env.h): envFrom then env in order, fieldRef downward-API
//      fields, configMapKeyRef and secretKeyRef (Secret data base64-decoded)
//      read through the API, `$(VAR)` in values expanded against the entries
//      before it and the service env, `$$` an escaped `$`, unknown references
//      left as written, and command/args expanded against the final env. A
//      ConfigMap or Secret that is not there yet (and not optional) leaves the
//      pod Pending (CreateContainerConfigError) and is retried every second;
//   3a. in-cluster API access: the service env is KUBERNETES_SERVICE_HOST /
//      _PORT = the API server of the agent's kubeconfig (127.0.0.1:<port>),
//      not a ClusterIP: the dev control plane runs no kube-proxy, so the
//      `kubernetes` Service's ClusterIP leads nowhere;
//   3b. volumes the main container mounts are written under
//      <state-dir>/pods/<ns>_<pod>/volumes/<volume>: emptyDir, hostPath,
//      configMap, secret, and projected (serviceAccountToken from the
//      TokenRequest API for the pod's ServiceAccount, bound to the pod, with
//      the requested audience and expiry; configMap items such as
//      kube-root-ca.crt, which kube-controller-manager's root-ca-cert-publisher
//      publishes (scripts/control-plane.sh passes --root-ca-file); secret;
//      downwardAPI fieldRefs). Tokens are re-requested after 80% of their
//      lifetime (kubelet's rule; --token-refresh-seconds for tests) and
//      replaced atomically. The process runs in a mount namespace of its own
//      (unshare(CLONE_NEWNS), / made MS_PRIVATE|MS_REC) where each volume is
//      bind-mounted at its mountPath (read-only for configMap, secret and
//      projected volumes, and where readOnly is set), so only it sees them;
//      the mount point directories are created on the host (empty). It also
//      gets a UTS namespace whose hostname is the pod's (spec.hostname, else
//      its name). Setting these up needs root (CAP_SYS_ADMIN); a failure
//      fails the pod with CreateContainerError and a message naming the step;
//   3b'. persistentVolumeClaim volumes through a local provisioner: every
//      claim that is Pending with no volume (of the agent's namespace, or
//      all) gets a PersistentVolume "pvc-<claim uid>" of its own, a hostPath
//      directory <state-dir>/volumes/pvc-<claim uid> with the claim's access
//      modes, size and storage class, pre-bound to it (claimRef), which
//      kube-controller-manager's persistentvolume-binder then binds; a pod
//      mounting the claim waits (CreateContainerConfigError, retried every
//      second) until it is Bound, then gets that directory bind-mounted, so
//      pods that mount one claim, one after another or at once, see the same
//      files. The PVs have reclaim policy Retain (the dev control plane has no
//      deleter for hostPath); once a claim is deleted and its PV Released, the
//      agent deletes the PV and the directory (what a provisioner's Delete
//      does). Checked every second;
//   3b''. the termination message: <state-dir>/pods/<ns>_<pod>/termination-log,
//      emptied at each start, is bind-mounted at the main container's
//      terminationMessagePath (default /dev/termination-log; the mount point
//      is created on the host, like every other one), and what the process
//      wrote there (at most 4096 bytes, the kubelet's limit) becomes
//      state.terminated.message (policy File; FallbackToLogsOnError is not
//      applied);
//   3c. readiness, startup and liveness probes (httpGet over HTTP and
//      tcpSocket) run against the pod's address every periodSeconds with the
//      thresholds of the spec, as a kubelet runs them: the pod's Ready
//      condition follows readiness (no probe: Ready once running); liveness
//      waits until a startupProbe has succeeded; a startup or liveness probe
//      that fails failureThreshold times in a row kills the container
//      (SIGTERM to its process group, SIGKILL after the pod's
//      terminationGracePeriodSeconds), which then ends as its restartPolicy
//      says (the operator's pods: Never, so the pod fails). runAsUser is not
//      applied (pods run as the agent's user, root);
//   4. gives every pod an address of its own, 127.0.<a>.<b> (all of 127/8 is
//      loopback), as status.podIP — the distrain worker binds its servers to
//      $POD_IP, so every pod can listen on port 2222;
//   5. makes names resolve: a managed block in the hosts file maps each pod's
//      <hostname>.<subdomain>.<ns>.svc[.cluster.local] and each headless
//      Service's <service>.<ns>.svc[.cluster.local] to the pod's address,
//      and each ClusterIP Service with a selector to the address of the
//      first (by name) ready pod it selects — there is no proxy, so a client
//      reaches it only where the Service's port equals the container's;
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
// A new pod's log starts empty; a restart in place appends to it.
//
// Threads: informer threads only enqueue pod keys; one sync thread owns the
// process table, forks the pods and does the pod API writes; one reaper thread
// waits for children; one heartbeat thread; one housekeeping thread refreshes
// tokens and runs readiness probes (a readiness change is written by the sync
// thread); cpprestsdk's listener threads serve logs (reading files and the
// process table). Shared state is guarded by mu_; hosts_mu_ serialises
// rewrites of the hosts file.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
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
#include "absl/strings/escaping.h"
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
#include "tests/e2e/kubelet_env.h"
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
  int token_refresh_seconds = 0;  // 0: refresh a token after 80% of its lifetime (kubelet's rule)
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
  NodeAgent(Options options, std::unique_ptr<kube::RestClient> client, const std::string& server)
      : options_(std::move(options)), client_(std::move(client)) {
    std::tie(api_host_, api_port_) = ServerHostPort(server);
  }

  absl::Status Run(std::stop_token stop);

 private:
  // A volume directory (or file, for a subPath) bound at a path the process sees.
  struct Mount {
    std::string source, target;
    bool read_only = false;
  };
  // A projected serviceAccountToken file, re-requested before it expires.
  struct Token {
    std::string file, service_account, audience;
    int64_t expiration_seconds = 3600;
    int mode = 0644;
    absl::Time refresh_at = absl::InfiniteFuture();
  };
  // A probe (httpGet or tcpSocket) and its running tally.
  struct Probe {
    bool http = true;
    std::string path = "/";
    int port = 0;
    absl::Duration period = absl::Seconds(10), timeout = absl::Seconds(1);
    int success_threshold = 1, failure_threshold = 3;
    absl::Time next = absl::InfinitePast();
    int successes = 0, failures = 0;
  };
  struct Proc {
    pid_t pid = -1;
    std::string ns, name, uid, container, ip, service_account, hostname;
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
    std::vector<Mount> mounts;
    std::vector<Token> tokens;
    std::optional<Probe> readiness;
    std::optional<Probe> startup, liveness;  // a failure past the threshold kills it
    bool started = true;  // false until a startupProbe succeeds; liveness waits for it
    bool killed_by_probe = false;  // SIGTERMed for a failed probe; SIGKILL at kill_at
    int64_t grace_seconds = 30;    // the pod's terminationGracePeriodSeconds
    bool ready = true;  // false until a readinessProbe succeeds
    bool report_readiness = false;  // `ready` changed; the sync thread reports it
    std::string restart_policy;
    int restarts = 0;
    std::string started_at;
    bool terminating = false;
    absl::Time kill_at = absl::InfiniteFuture();
    std::optional<int> exit_code;  // set by the reaper
    bool finished_reported = false;
    std::string termination_log;  // host file bound at the terminationMessagePath
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
  absl::StatusOr<std::optional<std::map<std::string, std::string>>> GetData(const std::string& ns, bool secret,
                                                                            const std::string& name);
  absl::StatusOr<std::string> MapImage(const std::string& image, const std::string& command0);
  absl::StatusOr<pid_t> Spawn(Proc& p);
  absl::StatusOr<std::string> FieldRef(const Json& pod, const std::string& path, const std::string& ip);
  absl::Status MaterializeVolumes(const Json& pod, const Json& container, Proc& p);
  absl::Status RequestToken(const std::string& ns, const std::string& pod, const std::string& uid, Token& token);
  void Housekeeping(std::stop_token stop);
  // The local provisioner (3b'): PVs for Pending claims, Released ones reclaimed.
  void ProvisionVolumes();
  // The host directory of a Bound claim; kFailedPrecondition until it is bound.
  absl::StatusOr<std::string> ClaimDirectory(const std::string& ns, const std::string& claim);
  bool RunProbe(const std::string& ip, const Probe& probe);
  void FailPod(const std::string& key, Proc failed, const std::string& reason, const std::string& message);
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
  std::string api_host_, api_port_;  // the API server, for pods' in-cluster config
  std::unique_ptr<web::http::experimental::listener::http_listener> kubelet_;
  std::stop_source follow_stop_;  // ends `kubectl logs -f` streams at shutdown

  std::mutex hosts_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> dirty_;            // pod keys to sync
  std::map<std::string, Proc> procs_;      // pod key -> process
  std::map<pid_t, std::string> by_pid_;
  int next_address_ = 0;
  std::map<std::string, std::string> reserved_ip_;  // pod key -> address, while the pod waits to start
  std::map<std::string, absl::Time> retry_at_;      // pod key -> when to try starting it again
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

// One key of a ConfigMap or Secret, decoded (Secret data is base64 on the API;
// a kubelet hands the container the bytes). nullopt when the object or the key
// is missing.
absl::StatusOr<std::optional<std::map<std::string, std::string>>> NodeAgent::GetData(const std::string& ns,
                                                                                     bool secret,
                                                                                     const std::string& name) {
  auto r = client_->Request("GET", kube::ResourcePath({"", "v1", secret ? "secrets" : "configmaps", true}, ns, name));
  if (!r.ok()) return r.status();
  if (r->not_found()) return std::optional<std::map<std::string, std::string>>();
  if (!r->ok()) {
    return absl::UnavailableError(
        absl::StrCat("reading ", secret ? "secret " : "configmap ", ns, "/", name, ": ", r->message()));
  }
  std::map<std::string, std::string> data;
  const Json fields = r->body.value("data", Json::object());
  for (const auto& [k, v] : fields.items()) {
    if (!v.is_string()) continue;
    if (!secret) {
      data[k] = v.get<std::string>();
      continue;
    }
    std::string decoded;
    if (!absl::Base64Unescape(v.get<std::string>(), &decoded)) {
      return absl::InvalidArgumentError(
          absl::StrCat("secret ", ns, "/", name, ": data.", k, " is not valid base64"));
    }
    data[k] = std::move(decoded);
  }
  if (!secret) {  // binaryData is base64 on a ConfigMap too
    const Json binary = r->body.value("binaryData", Json::object());
    for (const auto& [k, v] : binary.items()) {
      std::string decoded;
      if (v.is_string() && absl::Base64Unescape(v.get<std::string>(), &decoded)) data[k] = std::move(decoded);
    }
  }
  return std::optional<std::map<std::string, std::string>>(std::move(data));
}

// A downward-API field of `pod` (env fieldRef and downwardAPI volume items).
absl::StatusOr<std::string> NodeAgent::FieldRef(const Json& pod, const std::string& path, const std::string& ip) {
  if (path == "status.podIP" || path == "status.podIPs") return ip;
  if (path == "status.hostIP" || path == "status.hostIPs") return std::string("127.0.0.1");
  if (path == "spec.nodeName") return options_.node_name;
  if (path == "spec.serviceAccountName") return Str(pod, "/spec/serviceAccountName", "default");
  if (path == "metadata.name") return Str(pod, "/metadata/name");
  if (path == "metadata.namespace") return Str(pod, "/metadata/namespace");
  if (path == "metadata.uid") return Str(pod, "/metadata/uid");
  if (path == "metadata.labels" || path == "metadata.annotations") {  // volumes only: k="v" lines, sorted
    std::string out;
    const Json fields = pod["metadata"].value(path.substr(9), Json::object());
    for (const auto& [k, v] : fields.items()) {
      out += absl::StrCat(k, "=", Json(v.is_string() ? v.get<std::string>() : v.dump()).dump(), "\n");
    }
    return out;
  }
  if (absl::StartsWith(path, "metadata.labels['") || absl::StartsWith(path, "metadata.annotations['")) {
    const bool labels = absl::StartsWith(path, "metadata.labels");
    const size_t open = path.find("['") + 2, close = path.rfind("']");
    if (close == std::string::npos || close < open) return absl::InvalidArgumentError(absl::StrCat("fieldPath ", path, " is malformed"));
    const std::string k = path.substr(open, close - open);
    const Json& m = pod["metadata"].value(labels ? "labels" : "annotations", Json::object());
    return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : std::string();
  }
  return absl::InvalidArgumentError(absl::StrCat("fieldPath ", path, " is not supported by the test node"));
}

absl::StatusOr<std::map<std::string, std::string>> NodeAgent::ResolveEnv(const Json& pod, const Json& container,
                                                                         const std::string& ip) {
  const std::string ns = Str(pod, "/metadata/namespace");
  std::vector<EnvEntry> entries;
  // envFrom first (kubelet's order), then env; later names replace earlier ones.
  for (const Json& from : container.value("envFrom", Json::array())) {
    const bool secret = from.contains("secretRef");
    const Json& ref = secret ? from["secretRef"] : from.value("configMapRef", Json::object());
    const std::string ref_name = ref.value("name", "");
    auto data = GetData(ns, secret, ref_name);
    if (!data.ok()) return data.status();
    if (!data->has_value()) {
      if (ref.value("optional", false)) continue;
      return absl::FailedPreconditionError(absl::StrCat("envFrom: ", secret ? "secret " : "configmap ", ns, "/", ref_name,
                                              " not found"));
    }
    const std::string prefix = from.value("prefix", "");
    for (const auto& [k, v] : **data) entries.push_back({prefix + k, v, false});
  }
  for (const Json& e : container.value("env", Json::array())) {
    const std::string name = e.value("name", "");
    if (e.contains("value") && e["value"].is_string()) {
      entries.push_back({name, e["value"].get<std::string>(), true});
      continue;
    }
    if (!e.contains("valueFrom")) {
      entries.push_back({name, "", true});
      continue;
    }
    const Json& from = e["valueFrom"];
    if (from.contains("fieldRef")) {
      auto value = FieldRef(pod, from["fieldRef"].value("fieldPath", ""), ip);
      if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat("env ", name, ": ", value.status().message()));
      entries.push_back({name, *value, false});
    } else if (from.contains("configMapKeyRef") || from.contains("secretKeyRef")) {
      const bool secret = from.contains("secretKeyRef");
      const Json& ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
      const std::string ref_name = ref.value("name", ""), key = ref.value("key", "");
      auto data = GetData(ns, secret, ref_name);
      if (!data.ok()) return data.status();
      const bool found = data->has_value() && (*data)->count(key) > 0;
      if (!found) {
        if (ref.value("optional", false)) continue;  // kubelet leaves the variable unset
        // Retried, as a kubelet does (CreateContainerConfigError): the
        // object may be created right after the pod.
        return absl::FailedPreconditionError(absl::StrCat("env ", name, ": ", secret ? "secret " : "configmap ", ns, "/",
                                                ref_name, data->has_value() ? absl::StrCat(" has no key ", key)
                                                                            : std::string(" not found")));
      }
      entries.push_back({name, (*data)->at(key), false});
    } else {
      return absl::InvalidArgumentError(absl::StrCat("env ", name, ": this valueFrom is not supported"));
    }
  }
  // The service env a kubelet adds (only the API server's: there are no
  // Service links here). Host and port are the API server's real ones, not a
  // ClusterIP: the dev control plane runs no kube-proxy, so a ClusterIP would
  // lead nowhere; 127.0.0.1 is reachable from every pod process on this node.
  std::map<std::string, std::string> service_env = {{"HOSTNAME", Str(pod, "/spec/hostname", Str(pod, "/metadata/name"))}};
  if (!api_host_.empty()) {
    service_env["KUBERNETES_SERVICE_HOST"] = api_host_;
    service_env["KUBERNETES_SERVICE_PORT"] = api_port_;
    service_env["KUBERNETES_SERVICE_PORT_HTTPS"] = api_port_;
    service_env["KUBERNETES_PORT"] = absl::StrCat("tcp://", api_host_, ":", api_port_);
  }
  return BuildContainerEnv(entries, service_env);
}

namespace {

// Writes `content` to dir/rel with `mode`, atomically (temp file + rename), so
// a process reading a refreshed token never sees half of it. `rel` comes from
// the pod spec: it must stay inside `dir`.
absl::Status WriteVolumeFile(const fs::path& dir, const std::string& rel, const std::string& content, int mode) {
  const fs::path relative = fs::path(rel).lexically_normal();
  if (rel.empty() || relative.is_absolute() || *relative.begin() == "..") {
    return absl::InvalidArgumentError(absl::StrCat("volume item path \"", rel, "\" must be relative and stay inside the volume"));
  }
  const fs::path target = dir / relative;
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out.flush()) return absl::InternalError(absl::StrCat("writing ", tmp.string(), " failed"));
  }
  fs::permissions(tmp, static_cast<fs::perms>(mode & 0777), ec);
  fs::rename(tmp, target, ec);
  if (ec) return absl::InternalError(absl::StrCat("renaming ", tmp.string(), " to ", target.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// The keys of a ConfigMap or Secret as files: every key, or only `items`
// ([{key, path, mode}]) when given.
absl::Status ProjectKeys(const fs::path& dir, const std::map<std::string, std::string>& data, const Json& items,
                         int default_mode, const std::string& what) {
  if (!items.is_array() || items.empty()) {
    for (const auto& [k, v] : data) {
      if (absl::Status st = WriteVolumeFile(dir, k, v, default_mode); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  for (const Json& item : items) {
    const std::string key = item.value("key", "");
    auto it = data.find(key);
    if (it == data.end()) return absl::FailedPreconditionError(absl::StrCat(what, " has no key ", key));
    if (absl::Status st = WriteVolumeFile(dir, item.value("path", key), it->second, item.value("mode", default_mode));
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

// POST .../serviceaccounts/<sa>/token (the TokenRequest API), bound to the pod
// as a kubelet binds it, then writes the token file and when to refresh it:
// after 80% of its lifetime (kubelet's rule), or --token-refresh-seconds.
absl::Status NodeAgent::RequestToken(const std::string& ns, const std::string& pod, const std::string& uid,
                                     Token& token) {
  Json request = {{"apiVersion", "authentication.k8s.io/v1"},
                  {"kind", "TokenRequest"},
                  {"spec",
                   {{"expirationSeconds", token.expiration_seconds},
                    {"boundObjectRef", {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", pod}, {"uid", uid}}}}}};
  if (!token.audience.empty()) request["spec"]["audiences"] = Json::array({token.audience});
  auto r = client_->Request(
      "POST", kube::ResourcePath({"", "v1", "serviceaccounts", true}, ns, token.service_account, "token"), &request);
  if (!r.ok()) return r.status();
  if (!r->ok()) {
    return absl::FailedPreconditionError(absl::StrCat("TokenRequest for serviceaccount ", ns, "/",
                                                      token.service_account, ": ", r->message()));
  }
  const std::string jwt = Str(r->body, "/status/token");
  if (jwt.empty()) return absl::InternalError("TokenRequest answered without status.token");
  if (absl::Status st = WriteVolumeFile(fs::path(token.file).parent_path(), fs::path(token.file).filename().string(),
                                        jwt, token.mode);
      !st.ok()) {
    return st;
  }
  const absl::Duration lifetime = options_.token_refresh_seconds > 0
                                      ? absl::Seconds(options_.token_refresh_seconds)
                                      : absl::Seconds(token.expiration_seconds * 8 / 10);
  token.refresh_at = absl::Now() + lifetime;
  return absl::OkStatus();
}

// Writes every volume the main container mounts under the pod's state
// directory and records where each is mounted. Missing ConfigMaps, Secrets or
// keys (not optional) are kFailedPrecondition: the pod waits, as on a kubelet.
absl::Status NodeAgent::MaterializeVolumes(const Json& pod, const Json& container, Proc& p) {
  const fs::path root = fs::path(options_.state_dir) / "pods" / (p.ns + "_" + p.name) / "volumes";
  std::error_code ec;
  fs::remove_all(root, ec);  // a replaced pod of the same name starts clean
  std::map<std::string, const Json*> volumes;
  const Json pod_volumes = pod["spec"].value("volumes", Json::array());
  for (const Json& v : pod_volumes) volumes[v.value("name", "")] = &v;
  std::map<std::string, std::pair<fs::path, bool>> made;  // volume -> (dir, always read-only)
  for (const Json& vm : container.value("volumeMounts", Json::array())) {
    const std::string name = vm.value("name", ""), mount_path = vm.value("mountPath", "");
    auto vit = volumes.find(name);
    if (vit == volumes.end()) return absl::InvalidArgumentError(absl::StrCat("volumeMount ", name, ": no such volume"));
    if (!made.count(name)) {
      const Json& v = *vit->second;
      const fs::path dir = root / name;
      fs::create_directories(dir, ec);
      bool read_only = true;  // configMap, secret and projected volumes are read-only on a kubelet
      fs::path elsewhere;     // hostPath and persistentVolumeClaim: a directory of their own
      const std::string what = absl::StrCat("volume ", name);
      if (v.contains("emptyDir")) {
        read_only = false;
      } else if (v.contains("hostPath")) {
        read_only = false;
        const std::string path = v["hostPath"].value("path", "");
        const std::string type = v["hostPath"].value("type", "");
        if (type == "DirectoryOrCreate") fs::create_directories(path, ec);
        if (!fs::exists(path)) return absl::FailedPreconditionError(absl::StrCat(what, ": hostPath ", path, " does not exist"));
        elsewhere = path;
      } else if (v.contains("persistentVolumeClaim")) {
        const Json& claim = v["persistentVolumeClaim"];
        auto path = ClaimDirectory(p.ns, claim.value("claimName", ""));
        if (!path.ok()) return absl::Status(path.status().code(), absl::StrCat(what, ": ", path.status().message()));
        elsewhere = *path;
        read_only = claim.value("readOnly", false);
      } else if (v.contains("configMap") || v.contains("secret")) {
        const bool secret = v.contains("secret");
        const Json& src = secret ? v["secret"] : v["configMap"];
        const std::string obj = src.value(secret ? "secretName" : "name", "");
        auto data = GetData(p.ns, secret, obj);
        if (!data.ok()) return data.status();
        if (!data->has_value()) {
          if (!src.value("optional", false)) {
            return absl::FailedPreconditionError(absl::StrCat(what, ": ", secret ? "secret " : "configmap ", p.ns, "/", obj, " not found"));
          }
        } else if (absl::Status st = ProjectKeys(dir, **data, src.value("items", Json::array()), src.value("defaultMode", 0644),
                                                 absl::StrCat(what, ": ", obj));
                   !st.ok()) {
          return st;
        }
      } else if (v.contains("projected")) {
        const int default_mode = v["projected"].value("defaultMode", 0644);
        for (const Json& source : v["projected"].value("sources", Json::array())) {
          if (source.contains("serviceAccountToken")) {
            const Json& t = source["serviceAccountToken"];
            Token token;
            token.file = (dir / fs::path(t.value("path", "token")).lexically_normal()).string();
            token.service_account = p.service_account;
            token.audience = t.value("audience", "");
            token.expiration_seconds = t.value("expirationSeconds", int64_t{3600});
            token.mode = default_mode;
            if (absl::Status st = RequestToken(p.ns, p.name, p.uid, token); !st.ok()) {
              return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
            }
            p.tokens.push_back(token);
          } else if (source.contains("configMap") || source.contains("secret")) {
            const bool secret = source.contains("secret");
            const Json& src = secret ? source["secret"] : source["configMap"];
            const std::string obj = src.value("name", "");
            auto data = GetData(p.ns, secret, obj);
            if (!data.ok()) return data.status();
            if (!data->has_value()) {
              if (src.value("optional", false)) continue;
              return absl::FailedPreconditionError(absl::StrCat(what, ": ", secret ? "secret " : "configmap ", p.ns, "/",
                                                                obj, " not found"));
            }
            if (absl::Status st = ProjectKeys(dir, **data, src.value("items", Json::array()), default_mode,
                                              absl::StrCat(what, ": ", obj));
                !st.ok()) {
              return st;
            }
          } else if (source.contains("downwardAPI")) {
            for (const Json& item : source["downwardAPI"].value("items", Json::array())) {
              if (!item.contains("fieldRef")) {
                return absl::InvalidArgumentError(absl::StrCat(what, ": only fieldRef downwardAPI items are supported"));
              }
              auto value = FieldRef(pod, item["fieldRef"].value("fieldPath", ""), p.ip);
              if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", value.status().message()));
              if (absl::Status st = WriteVolumeFile(dir, item.value("path", ""), *value, item.value("mode", default_mode));
                  !st.ok()) {
                return st;
              }
            }
          } else {
            return absl::InvalidArgumentError(absl::StrCat(what, ": a projected source other than serviceAccountToken, "
                                                           "configMap, secret or downwardAPI is not supported by the test node"));
          }
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat(what, ": only emptyDir, hostPath, persistentVolumeClaim, configMap, "
                                                       "secret and projected volumes are supported by the test node"));
      }
      // (hostPath and claims were `continue`d past the mount below before
      // 3b', so a process never saw them.)
      made[name] = {elsewhere.empty() ? dir : elsewhere, read_only};
    }
    const auto& [dir, always_ro] = made[name];
    fs::path source = dir;
    if (const std::string sub = vm.value("subPath", ""); !sub.empty()) {
      const fs::path rel = fs::path(sub).lexically_normal();
      if (rel.is_absolute() || *rel.begin() == "..") {
        return absl::InvalidArgumentError(absl::StrCat("volumeMount ", name, ": subPath ", sub, " must stay inside the volume"));
      }
      source = dir / rel;
      if (!fs::exists(source)) fs::create_directories(source, ec);
    }
    if (mount_path.empty() || mount_path.front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat("volumeMount ", name, ": mountPath must be absolute"));
    }
    // The mount point must exist for a bind mount. It is made on the host's
    // filesystem (mount namespaces separate mounts, not directories); an empty
    // directory such as /var/run/secrets/kubernetes.io/serviceaccount is left.
    if (fs::is_directory(source)) {
      fs::create_directories(mount_path, ec);
    } else {
      fs::create_directories(fs::path(mount_path).parent_path(), ec);
      if (!fs::exists(mount_path)) std::ofstream(mount_path).flush();
    }
    if (!fs::exists(mount_path)) {
      return absl::InternalError(absl::StrCat("volumeMount ", name, ": cannot create the mount point ", mount_path));
    }
    p.mounts.push_back({source.string(), mount_path, always_ro || vm.value("readOnly", false)});
  }
  // 3b'': the termination message file, empty for this start.
  const std::string message_path = container.value("terminationMessagePath", "/dev/termination-log");
  if (!message_path.empty() && message_path.front() == '/') {
    p.termination_log = (root.parent_path() / "termination-log").string();
    std::ofstream(p.termination_log, std::ios::trunc).flush();
    fs::create_directories(fs::path(message_path).parent_path(), ec);
    if (!fs::exists(message_path)) std::ofstream(message_path).flush();
    if (!fs::exists(message_path)) {
      return absl::InternalError(absl::StrCat("terminationMessagePath: cannot create the mount point ", message_path));
    }
    p.mounts.push_back({p.termination_log, message_path, false});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NodeAgent::ClaimDirectory(const std::string& ns, const std::string& claim) {
  auto r = client_->Request("GET", kube::ResourcePath(kube::PersistentVolumeClaimsResource(), ns, claim));
  if (!r.ok()) return r.status();
  if (r->not_found()) return absl::FailedPreconditionError(absl::StrCat("persistentvolumeclaim ", ns, "/", claim, " not found"));
  if (!r->ok()) return absl::UnavailableError(absl::StrCat("reading persistentvolumeclaim ", ns, "/", claim, ": ", r->message()));
  const std::string volume = Str(r->body, "/spec/volumeName");
  if (Str(r->body, "/status/phase") != "Bound" || volume.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("persistentvolumeclaim ", ns, "/", claim, " is not bound yet"));
  }
  auto pv = client_->Request("GET", kube::ResourcePath({"", "v1", "persistentvolumes", false}, "", volume));
  if (!pv.ok()) return pv.status();
  if (!pv->ok()) return absl::UnavailableError(absl::StrCat("reading persistentvolume ", volume, ": ", pv->message()));
  const std::string path = Str(pv->body, "/spec/hostPath/path");
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("persistentvolume ", volume, " of claim ", ns, "/", claim,
                                                   " is not a hostPath volume; the test node mounts only those"));
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!fs::is_directory(path)) return absl::InternalError(absl::StrCat("persistentvolume ", volume, ": cannot create ", path));
  return path;
}

void NodeAgent::ProvisionVolumes() {
  constexpr char kProvisionedBy[] = "distrain.io/test-node-provisioner";
  const kube::Resource pvs{"", "v1", "persistentvolumes", false};
  auto claims = client_->Request("GET", kube::ResourcePath(kube::PersistentVolumeClaimsResource(), options_.namespace_name));
  if (claims.ok() && claims->ok()) {
    for (const Json& c : claims->body.value("items", Json::array())) {
      if (Str(c, "/status/phase") != "Pending" || !Str(c, "/spec/volumeName").empty() ||
          c["metadata"].contains("deletionTimestamp")) {
        continue;
      }
      const std::string uid = Str(c, "/metadata/uid"), name = Str(c, "/metadata/name"), ns = Str(c, "/metadata/namespace");
      const std::string pv_name = "pvc-" + uid;
      const std::string dir = (fs::path(options_.state_dir) / "volumes" / pv_name).string();
      std::error_code ec;
      fs::create_directories(dir, ec);
      // Writable by the pods' users whatever their uid (the agent runs them as
      // root today; a kubelet honouring runAsUser would need this).
      fs::permissions(dir, fs::perms::all, ec);
      Json pv = {{"apiVersion", "v1"},
                 {"kind", "PersistentVolume"},
                 {"metadata", {{"name", pv_name}, {"labels", {{kProvisionedBy, options_.node_name}}}}},
                 {"spec",
                  {{"capacity", {{"storage", Str(c, "/spec/resources/requests/storage", "1Gi")}}},
                   {"accessModes", c["spec"].value("accessModes", Json::array({"ReadWriteOnce"}))},
                   {"persistentVolumeReclaimPolicy", "Retain"},
                   {"storageClassName", Str(c, "/spec/storageClassName")},
                   {"hostPath", {{"path", dir}, {"type", "DirectoryOrCreate"}}},
                   {"claimRef",
                    {{"apiVersion", "v1"}, {"kind", "PersistentVolumeClaim"}, {"namespace", ns}, {"name", name}, {"uid", uid}}}}}};
      auto r = client_->Request("POST", kube::ResourcePath(pvs, ""), &pv);
      if (r.ok() && r->ok()) {
        spdlog::info("provisioned {} for claim {}/{} at {}", pv_name, ns, name, dir);
      } else if (!(r.ok() && r->conflict())) {
        spdlog::warn("provisioning {} for claim {}/{}: {}", pv_name, ns, name,
                     r.ok() ? r->message() : std::string(r.status().message()));
      }
    }
  }
  // Reclaim: a Released volume of ours (its claim is gone) goes, with its files.
  auto volumes = client_->Request(
      "GET", kube::ResourcePath(pvs, "") + "?labelSelector=" + kProvisionedBy + "%3D" + options_.node_name);
  if (!volumes.ok() || !volumes->ok()) return;
  for (const Json& v : volumes->body.value("items", Json::array())) {
    if (Str(v, "/status/phase") != "Released") continue;
    const std::string name = Str(v, "/metadata/name"), path = Str(v, "/spec/hostPath/path");
    Json options = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}, {"preconditions", {{"uid", Str(v, "/metadata/uid")}}}};
    auto r = client_->Request("DELETE", kube::ResourcePath(pvs, "", name), &options);
    if (r.ok() && (r->ok() || r->not_found())) {
      std::error_code ec;
      // Only what the provisioner made: the path is under its own directory.
      if (absl::StartsWith(path, (fs::path(options_.state_dir) / "volumes").string() + "/")) fs::remove_all(path, ec);
      spdlog::info("reclaimed {} (its claim is gone)", name);
    }
  }
}

// Forks and execs p.argv. With mounts, the child first enters a mount
// namespace of its own (unshare(CLONE_NEWNS), / made private so nothing leaks
// back to the host) and bind-mounts each volume at its mountPath, so only this
// process sees them. A failure there comes back through a close-on-exec pipe
// as an error naming the step; an exec that fails exits 127.
absl::StatusOr<pid_t> NodeAgent::Spawn(Proc& p) {
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
  const std::vector<Mount> mounts = p.mounts;
  const std::string hostname = p.hostname.substr(0, 63);
  struct ChildError {
    int step = 0;  // 1 unshare, 2 make / private, 3 bind mount, 4 remount read-only, 5 sethostname
    int err = 0;
    int index = 0;  // which mount
  };
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    close(pipe_fds[0]);
    auto fail = [&](int step, int index) {
      ChildError e{step, errno, index};
      (void)!write(pipe_fds[1], &e, sizeof(e));
      _exit(126);
    };
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // an agent that dies takes its pods with it
    // A UTS namespace too: the process's hostname is the pod's, as in a
    // container (leader election names its identity after it).
    if (unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) fail(1, 0);
    if (sethostname(hostname.data(), hostname.size()) != 0) fail(5, 0);
    if (!mounts.empty()) {
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(2, 0);
      for (size_t i = 0; i < mounts.size(); ++i) {
        if (mount(mounts[i].source.c_str(), mounts[i].target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
          fail(3, static_cast<int>(i));
        }
        if (mounts[i].read_only &&
            mount(nullptr, mounts[i].target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
          fail(4, static_cast<int>(i));
        }
      }
    }
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
  close(pipe_fds[1]);
  ChildError e;
  ssize_t n;
  do {
    n = read(pipe_fds[0], &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (n == static_cast<ssize_t>(sizeof(e))) {
    // The reaper collects the child; it is not in by_pid_, so nothing reports it.
    const Mount* m = e.index < static_cast<int>(mounts.size()) ? &mounts[e.index] : nullptr;
    switch (e.step) {
      case 1:
        return absl::PermissionDeniedError(absl::StrCat(
            "unshare(CLONE_NEWNS | CLONE_NEWUTS) failed: ", strerror(e.err),
            " — the test node needs root (CAP_SYS_ADMIN) to give a pod its own mount and UTS namespaces"));
      case 5:
        return absl::PermissionDeniedError(absl::StrCat("sethostname(", hostname, "): ", strerror(e.err)));
      case 2:
        return absl::PermissionDeniedError(absl::StrCat("making / private in the pod's mount namespace: ", strerror(e.err)));
      default:
        return absl::InternalError(absl::StrCat(e.step == 3 ? "bind-mounting " : "remounting read-only ",
                                                m ? m->source : "?", " at ", m ? m->target : "?", ": ", strerror(e.err)));
    }
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
  p.service_account = Str(pod, "/spec/serviceAccountName", "default");
  p.hostname = Str(pod, "/spec/hostname", p.name);
  p.container = container->value("name", "main");
  p.restart_policy = Str(pod, "/spec/restartPolicy", "Always");
  std::vector<std::string> command = container->value("command", std::vector<std::string>{});
  auto binary = MapImage(container->value("image", ""), command.empty() ? "" : command[0]);
  if (!binary.ok()) return binary.status();
  p.argv.push_back(*binary);
  const std::string key = kube::ObjectKey(p.ns, p.name);
  {
    // A pod that waits (a ConfigMap not there yet) keeps its address.
    std::lock_guard<std::mutex> lock(mu_);
    auto& ip = reserved_ip_[key];
    if (ip.empty()) ip = AllocateAddress();
    p.ip = ip;
  }
  auto env = ResolveEnv(pod, *container, p.ip);
  if (!env.ok()) return env.status();
  p.env = std::move(*env);
  // command and args are expanded against the container's final env (kubelet's
  // ExpandContainerCommandAndArgs).
  for (size_t i = 1; i < command.size(); ++i) p.argv.push_back(ExpandKubeVars(command[i], {&p.env}));
  for (const std::string& a : container->value("args", std::vector<std::string>{})) {
    p.argv.push_back(ExpandKubeVars(a, {&p.env}));
  }
  p.env["POD_IP"] = p.env.count("POD_IP") ? p.env["POD_IP"] : p.ip;
  if (absl::Status st = MaterializeVolumes(pod, *container, p); !st.ok()) return st;
  // The container's probe of `kind`, when the agent can run it.
  auto parse_probe = [&](const char* kind) -> std::optional<Probe> {
    if (!container->contains(kind)) return std::nullopt;
    const Json& rp = (*container)[kind];
    Probe probe;
    const Json* action = rp.contains("httpGet") ? &rp["httpGet"] : rp.contains("tcpSocket") ? &rp["tcpSocket"] : nullptr;
    if (action != nullptr && action->value("scheme", "HTTP") == "HTTP") {
      probe.http = rp.contains("httpGet");
      probe.path = action->value("path", "/");
      const Json& port = action->value("port", Json());
      if (port.is_number_integer()) probe.port = port.get<int>();
      for (const Json& cp : container->value("ports", Json::array())) {  // a named port
        if (port.is_string() && cp.value("name", "") == port.get<std::string>()) probe.port = cp.value("containerPort", 0);
      }
      probe.period = absl::Seconds(rp.value("periodSeconds", 10));
      probe.timeout = absl::Seconds(rp.value("timeoutSeconds", 1));
      probe.success_threshold = rp.value("successThreshold", 1);
      probe.failure_threshold = rp.value("failureThreshold", 3);
      probe.next = absl::Now() + absl::Seconds(rp.value("initialDelaySeconds", 0));
      if (probe.port > 0) return probe;
    }
    spdlog::warn("{}: {} not supported by the test node (exec/https); not run", key, kind);
    return std::nullopt;
  };
  p.readiness = parse_probe("readinessProbe");
  p.ready = !p.readiness;
  p.startup = parse_probe("startupProbe");
  p.started = !p.startup;
  p.liveness = parse_probe("livenessProbe");
  p.grace_seconds = pod.value(Json::json_pointer("/spec/terminationGracePeriodSeconds"), int64_t{30});
  p.started_at = Now();
  // A new pod (not a restart in place) starts a new log, as on a kubelet: a
  // pod recreated under the same name does not show its predecessor's lines.
  fs::create_directories(fs::path(options_.state_dir) / "logs");
  std::ofstream(fs::path(options_.state_dir) / "logs" / (p.ns + "_" + p.name + ".log"), std::ios::trunc).flush();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto pid = Spawn(p);
    if (!pid.ok()) return pid.status();
    p.pid = *pid;
    by_pid_[p.pid] = key;
    procs_[key] = p;
    reserved_ip_.erase(key);
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
        {{"type", "ContainersReady"}, {"status", p.ready ? "True" : "False"}, {"lastTransitionTime", now}},
        {{"type", "Ready"}, {"status", p.ready ? "True" : "False"}, {"lastTransitionTime", now}}}},
      {"containerStatuses",
       {{{"name", p.container}, {"ready", p.ready}, {"started", true}, {"restartCount", p.restarts},
         {"image", "local"}, {"imageID", "local://" + p.argv[0]}, {"containerID", absl::StrCat("process://", p.pid)},
         {"state", {{"running", {{"startedAt", p.started_at}}}}}}}}};
  PatchStatus(p.ns, p.name, status);
}

void NodeAgent::ReportTerminated(const Proc& p, int exit_code) {
  const std::string now = Now();
  const bool ok = exit_code == 0;
  std::string message;
  if (!p.termination_log.empty()) {
    std::ifstream in(p.termination_log, std::ios::binary);
    message.resize(4096);  // the kubelet's limit per container
    in.read(message.data(), static_cast<std::streamsize>(message.size()));
    message.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  }
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
  if (!message.empty()) status["containerStatuses"][0]["state"]["terminated"]["message"] = message;
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
  std::set<std::string> ready;                         // ns/name of running, ready pods
  std::vector<Json> pods;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, p] : procs_) {
      if (p.exit_code && p.finished_reported) continue;
      pod_ip[key] = p.ip;
      if (!p.exit_code && p.ready) ready.insert(key);
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
  // Headless Services name every selected pod (the operator's publish
  // not-ready addresses). A ClusterIP Service has no proxy here (no
  // kube-proxy): its name resolves to one ready pod it selects, the first by
  // name, so a client reaches it on the Service's port when that equals the
  // container port.
  for (const Json& svc : services_ ? services_->List() : std::vector<Json>{}) {
    if (!svc["spec"].contains("selector") || Str(svc, "/spec/type", "ClusterIP") == "ExternalName") continue;
    const bool headless = Str(svc, "/spec/clusterIP") == "None";
    const Json& selector = svc["spec"]["selector"];
    const std::string ns = Str(svc, "/metadata/namespace");
    for (const Json& pod : pods) {
      if (!headless && !ready.count(kube::ObjectKey(pod))) continue;
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
      if (!headless) break;
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
  if (!pod || pod->at("metadata").contains("deletionTimestamp")) {
    retry_at_.erase(key);
    reserved_ip_.erase(key);
  }
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
      std::optional<Proc> ended;
      if (proc != nullptr) {
        if (!proc->finished_reported) ended = *proc;
        by_pid_.erase(proc->pid);
        procs_.erase(it);
      }
      lock.unlock();
      // As a kubelet does, the terminal phase first: a finalizer may keep the pod
      // (Kueue's does, and reads the phase to tell a finished pod group).
      if (ended) ReportTerminated(*ended, *ended->exit_code);
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
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        // What the pod needs is not there yet: it waits and is retried, as on
        // a kubelet (CreateContainerConfigError / ContainerCreating).
        spdlog::warn("{} waits: {}", key, s.message());
        PatchStatus(Str(*pod, "/metadata/namespace"), Str(*pod, "/metadata/name"),
                    {{"phase", "Pending"},
                     {"containerStatuses",
                      {{{"name", MainContainer(*pod) ? MainContainer(*pod)->value("name", "main") : "main"},
                        {"ready", false}, {"restartCount", 0}, {"image", "local"}, {"imageID", ""},
                        {"state", {{"waiting", {{"reason", "CreateContainerConfigError"},
                                                {"message", std::string(s.message())}}}}}}}}});
        std::lock_guard<std::mutex> l(mu_);
        retry_at_[key] = absl::Now() + absl::Seconds(1);
        return;
      }
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
  if (!proc->exit_code && proc->report_readiness) {
    proc->report_readiness = false;
    Proc copy = *proc;
    lock.unlock();
    spdlog::info("{} is {}", key, copy.ready ? "ready" : "not ready (its readinessProbe fails)");
    ReportRunning(copy);
    WriteHosts();
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
      proc->ready = !proc->readiness;
      proc->started = !proc->startup;
      proc->killed_by_probe = false;
      for (std::optional<Probe>* pr : {&proc->readiness, &proc->startup, &proc->liveness}) {
        if (!*pr) continue;
        (*pr)->successes = (*pr)->failures = 0;
        (*pr)->next = absl::Now();
      }
      auto pid = Spawn(*proc);
      if (!pid.ok()) {
        proc->exit_code = 128;
        proc->finished_reported = true;
        Proc copy = *proc;
        lock.unlock();
        spdlog::error("restarting {}: {}", key, pid.status().message());
        PatchStatus(copy.ns, copy.name,
                    {{"phase", "Failed"}, {"reason", "CreateContainerError"}, {"message", std::string(pid.status().message())}});
        WriteHosts();
        return;
      }
      proc->pid = *pid;
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

// A probe against the pod's own address: an HTTP GET answered 200-399
// (httpGet) or an accepted connection (tcpSocket), within the probe's timeout.
bool NodeAgent::RunProbe(const std::string& ip, const Probe& probe) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval tv{};
  tv.tv_sec = absl::ToInt64Seconds(probe.timeout);
  tv.tv_usec = absl::ToInt64Microseconds(probe.timeout) % 1000000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(probe.port));
  bool ok = inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) == 1 &&
            connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (ok && probe.http) {
    const std::string request =
        absl::StrCat("GET ", probe.path, " HTTP/1.0\r\nHost: ", ip, ":", probe.port, "\r\nUser-Agent: kube-probe/distrain-test-node\r\n\r\n");
    ok = send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
    char buf[64] = {};
    ssize_t n = ok ? recv(fd, buf, sizeof(buf) - 1, 0) : -1;
    int code = 0;
    ok = n > 12 && std::sscanf(buf, "HTTP/%*d.%*d %d", &code) == 1 && code >= 200 && code < 400;
  }
  close(fd);
  return ok;
}

// Once a second: refreshes projected tokens that are due and runs the
// probes (step 3c); a pod whose readiness flips gets its status patched and
// the hosts block rewritten (Services resolve to ready pods only); a
// container whose startup or liveness probe fails too often is killed.
void NodeAgent::Housekeeping(std::stop_token stop) {
  while (!stop.stop_requested()) {
    ProvisionVolumes();
    const absl::Time now = absl::Now();
    struct Due {
      std::string key, ns, name, uid;
      Token token;
      size_t index;
    };
    std::vector<Due> tokens;
    enum class Kind { kReadiness, kStartup, kLiveness };
    struct DueProbe {
      std::string key;
      Kind kind;
      std::string ip;
      Probe probe;
    };
    std::vector<DueProbe> probes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [key, p] : procs_) {
        if (p.exit_code) continue;
        for (size_t i = 0; i < p.tokens.size(); ++i) {
          if (p.tokens[i].refresh_at <= now) tokens.push_back({key, p.ns, p.name, p.uid, p.tokens[i], i});
        }
        if (p.killed_by_probe) continue;
        if (p.readiness && p.readiness->next <= now) {
          p.readiness->next = now + p.readiness->period;
          probes.push_back({key, Kind::kReadiness, p.ip, *p.readiness});
        }
        // Liveness only once started, as a kubelet does.
        std::optional<Probe>& life = p.started ? p.liveness : p.startup;
        if (life && life->next <= now) {
          life->next = now + life->period;
          probes.push_back({key, p.started ? Kind::kLiveness : Kind::kStartup, p.ip, *life});
        }
      }
    }
    for (Due& d : tokens) {
      absl::Status st = RequestToken(d.ns, d.name, d.uid, d.token);
      if (!st.ok()) {
        spdlog::warn("refreshing the token of {} ({}): {}", d.key, d.token.file, st.message());
        d.token.refresh_at = absl::Now() + absl::Seconds(5);
      } else {
        spdlog::debug("refreshed the token of {}", d.key);
      }
      std::lock_guard<std::mutex> lock(mu_);
      auto it = procs_.find(d.key);
      if (it != procs_.end() && it->second.uid == d.uid && d.index < it->second.tokens.size()) {
        it->second.tokens[d.index].refresh_at = d.token.refresh_at;
      }
    }
    for (const DueProbe& due : probes) {
      const std::string& key = due.key;
      const bool ok = RunProbe(due.ip, due.probe);
      if (due.kind != Kind::kReadiness) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = procs_.find(key);
        if (it == procs_.end() || it->second.exit_code || it->second.killed_by_probe) continue;
        Proc& p = it->second;
        std::optional<Probe>& pr = due.kind == Kind::kStartup ? p.startup : p.liveness;
        if (!pr) continue;
        if (ok) {
          pr->failures = 0;
          if (due.kind == Kind::kStartup && ++pr->successes >= pr->success_threshold) {
            p.started = true;
            if (p.liveness) p.liveness->next = absl::Now();
          }
        } else if (++pr->failures >= pr->failure_threshold) {
          // What a kubelet does: kill the container; its restartPolicy decides the rest.
          spdlog::warn("{}: {} probe failed {} times in a row: killing it (SIGTERM, SIGKILL after {} s)",
                       key, due.kind == Kind::kStartup ? "startup" : "liveness", pr->failures,
                       p.grace_seconds);
          p.killed_by_probe = true;
          p.kill_at = absl::Now() + absl::Seconds(p.grace_seconds);
          kill(-p.pid, SIGTERM);
        }
        continue;
      }
      bool changed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = procs_.find(key);
        if (it == procs_.end() || !it->second.readiness || it->second.exit_code) continue;
        Proc& p = it->second;
        Probe& pr = *p.readiness;
        if (ok) {
          pr.failures = 0;
          ++pr.successes;
          if (!p.ready && pr.successes >= pr.success_threshold) {
            p.ready = true;
            changed = true;
          }
        } else {
          pr.successes = 0;
          ++pr.failures;
          if (p.ready && pr.failures >= pr.failure_threshold) {
            p.ready = false;
            changed = true;
          }
        }
        if (changed) p.report_readiness = true;
      }
      if (changed) Enqueue(key);  // the sync thread writes the pod's status
    }
    for (int i = 0; i < 10 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
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
          if ((p.terminating || p.killed_by_probe) && !p.exit_code && absl::Now() >= p.kill_at) {
            to_kill.push_back(p.pid);
          }
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
      const absl::Time now = absl::Now();
      for (auto it = retry_at_.begin(); it != retry_at_.end();) {
        if (it->second > now) {
          ++it;
          continue;
        }
        batch.insert(it->first);
        it = retry_at_.erase(it);
      }
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
  std::jthread housekeeping([this](std::stop_token s) { Housekeeping(s); });
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
  housekeeping.request_stop();
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
  app.add_option("--token-refresh-seconds", options.token_refresh_seconds,
                 "re-request projected ServiceAccount tokens this often (default: after 80% of their lifetime, as a "
                 "kubelet does); tests use a few seconds to see a refresh");
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
  testnode::NodeAgent agent(options, std::move(*client), config->server);
  absl::Status s = agent.Run(testnode::g_stop.get_token());
  if (!s.ok()) {
    spdlog::error("{}", s.message());
    return 1;
  }
  return 0;
}

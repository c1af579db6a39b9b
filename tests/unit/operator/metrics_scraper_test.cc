// ScrapeAll and the ProgressReporter against in-process HTTP servers that
// behave as a tenant's pod may: answer normally, stream without end, accept
// and never answer, claim a huge Content-Length, speak something else.

#include "operator/metrics_scraper.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "operator/progress_reporter.h"
#include "tests/unit/operator/kube/scripted_client.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

// A TCP server on 127.0.0.1 whose `serve(fd, stop)` handles each connection
// on a thread of its own. Owns its threads; joins them (after closing every
// socket) on destruction.
class TestServer {
 public:
  using Handler = std::function<void(int fd, const std::atomic<bool>& stop)>;
  explicit TestServer(Handler serve) : serve_(std::move(serve)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listen_fd_, 64), 0);
    socklen_t len = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &len);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listen_fd_, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) continue;
        std::lock_guard<std::mutex> lock(mu_);
        connections_.emplace_back([this, fd] {
          serve_(fd, stop_);
          close(fd);
        });
      }
    });
  }
  ~TestServer() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : connections_) t.join();
    close(listen_fd_);
  }
  int port() const { return port_; }

  // Reads the request up to its blank line (or until the client goes away).
  static bool ReadRequest(int fd) {
    std::string request;
    char buf[1024];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      request.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  static void SendAll(int fd, const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

 private:
  Handler serve_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> connections_;
};

// A chief whose distrain_steps_total goes up by 10 per request.
std::unique_ptr<TestServer> NormalChief(std::atomic<int>* requests) {
  return std::make_unique<TestServer>([requests](int fd, const std::atomic<bool>&) {
    if (!TestServer::ReadRequest(fd)) return;
    const int step = 10 * ++*requests;
    const std::string body = absl::StrCat(
        "# TYPE distrain_steps_total counter\ndistrain_steps_total ", step,
        "\ndistrain_total_steps 1000\ndistrain_loss 0.5\n");
    TestServer::SendAll(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                         "Content-Length: ", body.size(), "\r\n\r\n", body));
  });
}

// Headers without a length, then metrics lines for as long as anyone reads.
std::unique_ptr<TestServer> EndlessStream(std::atomic<size_t>* sent) {
  return std::make_unique<TestServer>([sent](int fd, const std::atomic<bool>& stop) {
    if (!TestServer::ReadRequest(fd)) return;
    TestServer::SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n");
    const std::string line(4096, 'x');
    while (!stop) {
      const ssize_t n = send(fd, line.data(), line.size(), MSG_NOSIGNAL);
      if (n <= 0) return;  // the reader went away
      *sent += static_cast<size_t>(n);
    }
  });
}

// Accepts, reads the request, never answers (until the client gives up).
std::unique_ptr<TestServer> Silent() {
  return std::make_unique<TestServer>([](int fd, const std::atomic<bool>& stop) {
    TestServer::ReadRequest(fd);
    char c;
    while (!stop) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0 && recv(fd, &c, 1, 0) <= 0) return;
    }
  });
}

// Answers `response` verbatim, then closes.
std::unique_ptr<TestServer> Verbatim(std::string response) {
  return std::make_unique<TestServer>([response](int fd, const std::atomic<bool>&) {
    if (TestServer::ReadRequest(fd)) TestServer::SendAll(fd, response);
  });
}

TEST(MetricsScraperTest, ReadsContentLengthAndChunkedBodies) {
  auto plain = Verbatim("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  auto chunked = Verbatim(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n");
  auto until_close = Verbatim("HTTP/1.0 200 OK\r\n\r\nhello");
  std::vector<ScrapeResult> r =
      ScrapeAll({{"127.0.0.1", plain->port()}, {"127.0.0.1", chunked->port()},
                 {"127.0.0.1", until_close->port()}},
                {});
  ASSERT_EQ(r.size(), 3u);
  for (const ScrapeResult& x : r) {
    ASSERT_TRUE(x.status.ok()) << x.status;
    EXPECT_EQ(x.body, "hello");
  }
}

TEST(MetricsScraperTest, RefusesOversizedNonHttpAndErrorAnswersNamingWhy) {
  auto huge_length = Verbatim("HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n" +
                              std::string(8192, 'x'));
  auto not_http = Verbatim("SSH-2.0-OpenSSH_9.2\r\n\r\n");
  auto not_found = Verbatim("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
  auto truncated = Verbatim("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
  // A port nobody listens on: bind one, close it.
  int refused_port;
  {
    TestServer gone([](int, const std::atomic<bool>&) {});
    refused_port = gone.port();
  }
  ScrapeOptions options;
  options.max_response_bytes = 4096;
  std::vector<ScrapeResult> r = ScrapeAll(
      {{"127.0.0.1", huge_length->port()}, {"127.0.0.1", not_http->port()},
       {"127.0.0.1", not_found->port()}, {"127.0.0.1", truncated->port()},
       {"127.0.0.1", refused_port}, {"pod.example", 80}},
      options);
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kResourceExhausted) << r[0].status;
  EXPECT_LE(r[0].bytes_read, 4096u);
  EXPECT_EQ(r[1].status.code(), absl::StatusCode::kInvalidArgument) << r[1].status;
  EXPECT_EQ(r[2].status.code(), absl::StatusCode::kFailedPrecondition) << r[2].status;
  EXPECT_NE(r[2].status.message().find("404"), std::string::npos);
  EXPECT_EQ(r[3].status.code(), absl::StatusCode::kUnavailable) << r[3].status;
  EXPECT_EQ(r[4].status.code(), absl::StatusCode::kUnavailable) << r[4].status;
  EXPECT_EQ(r[5].status.code(), absl::StatusCode::kInvalidArgument) << r[5].status;
}

TEST(MetricsScraperTest, AResponseOfExactlyTheLimitFitsAndOneByteMoreDoesNot) {
  const std::string head = "HTTP/1.0 200 OK\r\n\r\n";
  const size_t limit = 1024;
  auto exact = Verbatim(head + std::string(limit - head.size(), 'a'));
  auto over = Verbatim(head + std::string(limit - head.size() + 1, 'a'));
  ScrapeOptions options;
  options.max_response_bytes = limit;
  std::vector<ScrapeResult> r =
      ScrapeAll({{"127.0.0.1", exact->port()}, {"127.0.0.1", over->port()}}, options);
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(r[0].body.size(), limit - head.size());
  EXPECT_EQ(r[1].status.code(), absl::StatusCode::kResourceExhausted) << r[1].status;
  EXPECT_EQ(r[1].bytes_read, limit);
}

// The reporter's view: jobs "normal-0", "normal-1", "stream", "silent-<i>",
// each Running with a master pod at 127.0.0.1:<its server's port>.
Json RunningJob(const std::string& name) {
  return {{"metadata", {{"namespace", "ns"}, {"name", name}, {"resourceVersion", "rv-" + name}}},
          {"status", {{"conditions", {{{"type", "Running"}, {"status", "True"}}}}}}};
}
Json MasterPod(int port) {
  return {{"metadata", {{"labels", {{"distrain.io/job-role", "master"}}}}},
          {"spec",
           {{"containers",
             {{{"name", "distrain"},
               {"env", {{{"name", "DISTRAIN_METRICS_PORT"}, {"value", std::to_string(port)}}}}}}}}},
          {"status", {{"phase", "Running"}, {"podIP", "127.0.0.1"}}}};
}

TEST(ProgressReporterTest, AChiefThatStreamsForeverOrNeverAnswersCostsOnlyItsOwnJob) {
  std::atomic<int> requests0{0}, requests1{0};
  std::atomic<size_t> streamed{0};
  std::map<std::string, std::unique_ptr<TestServer>> servers;
  servers["normal-0"] = NormalChief(&requests0);
  servers["normal-1"] = NormalChief(&requests1);
  servers["stream"] = EndlessStream(&streamed);
  constexpr int kSilent = 12;
  for (int i = 0; i < kSilent; ++i) servers[absl::StrCat("silent-", i)] = Silent();

  kube::testing::ScriptedClient client;
  std::mutex mu;
  std::map<std::string, std::vector<int64_t>> patched_steps;  // job -> steps written
  client.SetFallback([&](const kube::testing::ScriptedClient::Call& call) {
    EXPECT_EQ(call.method, "PATCH");
    const std::string job = call.path.substr(call.path.rfind("/distributedtrainingjobs/") + 25);
    // The job as seen before the scrape is the patch's precondition: a job
    // that finished meanwhile keeps its final figures (final_progress.h).
    EXPECT_EQ(call.body["metadata"]["resourceVersion"], "rv-" + job.substr(0, job.find('/')));
    std::lock_guard<std::mutex> lock(mu);
    patched_steps[job.substr(0, job.find('/'))].push_back(
        call.body["status"]["progress"].value("step", int64_t{-1}));
    return kube::testing::ScriptedClient::Reply(200, Json::object());
  });
  ProgressReporter::Options options;
  options.scrape.timeout = absl::Milliseconds(400);
  options.scrape.max_response_bytes = 64 * 1024;
  ProgressReporter reporter(
      &client,
      {.jobs =
           [&] {
             std::vector<Json> jobs;
             for (const auto& [name, server] : servers) jobs.push_back(RunningJob(name));
             return jobs;
           },
       .pods = [&](const std::string&, const std::string& job) {
         return std::vector<Json>{MasterPod(servers.at(job)->port())};
       }},
      options);

  for (int round = 1; round <= 3; ++round) {
    const absl::Time start = absl::Now();
    ProgressReporter::RoundStats stats = reporter.ReportOnce();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(stats.scraped, 3 + kSilent);
    EXPECT_EQ(stats.failed, 1 + kSilent) << "round " << round;
    // Bounded memory: never more than the limit from any one pod, although
    // the stream offered far more.
    EXPECT_LE(stats.max_bytes_read, options.scrape.max_response_bytes);
    // Concurrent, each within its own deadline: the round lasts about one
    // timeout, not one per silent job (13 x 400 ms one at a time).
    EXPECT_LT(took, options.scrape.timeout + absl::Milliseconds(600)) << "round " << round;
    // The normal jobs' progress moved on this round, to what their chief said.
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(patched_steps["normal-0"].size(), static_cast<size_t>(round));
    ASSERT_EQ(patched_steps["normal-1"].size(), static_cast<size_t>(round));
    EXPECT_EQ(patched_steps["normal-0"].back(), 10 * round);
    EXPECT_EQ(patched_steps["normal-1"].back(), 10 * round);
    EXPECT_FALSE(patched_steps.count("stream"));
    EXPECT_FALSE(patched_steps.count("silent-0"));
  }
  // The stream really was hostile: it got more into the socket than the
  // reporter was willing to read.
  EXPECT_GT(streamed.load(), options.scrape.max_response_bytes);
}

// spec.strategy Auto: a master that reports the choice it made on its GPUs
// (worker/training_metrics.h ExportAutoStrategy) gets it into status.strategy
// with the same patch as its progress; once the status says so, rounds that
// see the same choice write only progress.
TEST(ProgressReporterTest, TheMastersAutoChoiceIsPatchedIntoStatusStrategyOnce) {
  std::atomic<int> requests{0};
  TestServer chief([&](int fd, const std::atomic<bool>&) {
    if (!TestServer::ReadRequest(fd)) return;
    const std::string body = absl::StrCat(
        "distrain_auto_strategy_info{reason=\"2 GPUs; CPU<->GPU 51.2 GB/s is faster than "
        "GPU<->GPU 24.0 GB/s: variables on the CPU\",strategy=\"CentralStorage\"} 1\n"
        "distrain_step ", 10 * ++requests, "\n");
    TestServer::SendAll(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                         "Content-Length: ", body.size(), "\r\n\r\n", body));
  });
  Json job = RunningJob("auto");
  job["status"]["strategy"] = {{"name", "Mirrored"},
                               {"reason", "2 GPUs (bandwidths not measured): a replica per GPU"},
                               {"decidedBy", "operator"}};
  std::vector<Json> patches;
  kube::testing::ScriptedClient client;
  client.SetFallback([&](const kube::testing::ScriptedClient::Call& call) {
    patches.push_back(call.body);
    job["status"]["progress"] = call.body["status"]["progress"];  // as the API server merges it
    if (call.body["status"].contains("strategy")) {
      job["status"]["strategy"] = call.body["status"]["strategy"];
    }
    return kube::testing::ScriptedClient::Reply(200, Json::object());
  });
  ProgressReporter reporter(&client, {.jobs = [&] { return std::vector<Json>{job}; },
                                      .pods = [&](const std::string&, const std::string&) {
                                        return std::vector<Json>{MasterPod(chief.port())};
                                      }});
  reporter.ReportOnce();
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0]["status"]["strategy"]["name"], "CentralStorage");
  EXPECT_EQ(patches[0]["status"]["strategy"]["decidedBy"], "worker");
  EXPECT_NE(patches[0]["status"]["strategy"]["reason"].get<std::string>().find("51.2 GB/s"),
            std::string::npos);
  EXPECT_EQ(patches[0]["status"]["progress"]["step"], 10);
  reporter.ReportOnce();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_FALSE(patches[1]["status"].contains("strategy")) << patches[1].dump();
  EXPECT_EQ(patches[1]["status"]["progress"]["step"], 20);
}

TEST(ProgressReporterTest, MoreJobsThanConnectionsStillEndWithinTheirOwnDeadlines) {
  // 3 silent jobs and 2 normal ones through 2 connections at a time: the
  // normal ones wait for a free connection, but each scrape's own deadline
  // stays one timeout.
  std::atomic<int> requests{0};
  std::vector<std::unique_ptr<TestServer>> servers;
  for (int i = 0; i < 3; ++i) servers.push_back(Silent());
  servers.push_back(NormalChief(&requests));
  servers.push_back(NormalChief(&requests));
  std::vector<ScrapeTarget> targets;
  for (const auto& s : servers) targets.push_back({"127.0.0.1", s->port()});
  ScrapeOptions options;
  options.timeout = absl::Milliseconds(300);
  options.max_in_flight = 2;
  std::vector<ScrapeResult> r = ScrapeAll(targets, options);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(r[i].elapsed, options.timeout + absl::Milliseconds(200));
  }
  EXPECT_TRUE(r[3].status.ok()) << r[3].status;
  EXPECT_TRUE(r[4].status.ok()) << r[4].status;
}

}  // namespace
}  // namespace distrain

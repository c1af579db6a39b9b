// ClusterCoordinator scheduling with injected worker and ps failures (threads
// and an in-memory transport, no processes), the ParameterServer sharding
// helpers, and the whole strategy over in-process ps and worker services on
// loopback gRPC.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "prometheus/registry.h"
#include "worker/ps/ps_service.h"
#include "worker/strategy/cluster_coordinator.h"
#include "worker/strategy/parameter_server.h"
#include "worker/strategy/ps_membership.h"
#include "worker/strategy/ps_worker.h"

namespace distrain {
namespace {

using Kind = ClosureOutcome::Kind;

// Scripted workers. Each worker's behaviour is a function of (worker, the
// number of RunStep calls it has had, closure id); everything observed is
// recorded for the assertions.
class FakeTransport : public WorkerTransport {
 public:
  struct Call {
    int worker;
    int64_t closure;
    int attempt;
  };
  using StepScript = std::function<ClosureOutcome(int worker, int nth_call, int64_t closure)>;
  using PrepareScript = std::function<absl::StatusOr<std::string>(int worker, int nth_call)>;

  // `workers` are TF_CONFIG's; indexes up to `capacity` may join later.
  explicit FakeTransport(int workers, int capacity = 0) : workers_(workers) {
    const int n = std::max(workers, capacity);
    runs_per_worker_.assign(n, 0);
    prepares_per_worker_.assign(n, 0);
    in_flight_.assign(n, 0);
    max_in_flight_.assign(n, 0);
  }
  void SetStep(StepScript s) { step_ = std::move(s); }
  void SetPrepare(PrepareScript p) { prepare_ = std::move(p); }

  int num_workers() const override { return workers_; }
  std::string WorkerName(int w) const override { return absl::StrCat("worker:", w, " (fake)"); }
  absl::StatusOr<std::string> Prepare(int w) override {
    int nth;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("cancelled");
      nth = prepares_per_worker_[w]++;
    }
    if (prepare_) return prepare_(w, nth);
    return std::string("incarnation-1");
  }
  ClosureOutcome RunStep(int w, int64_t closure, int attempt) override {
    int nth;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return {Kind::kWorkerLost, absl::CancelledError("cancelled"), {}};
      nth = runs_per_worker_[w]++;
      ++in_flight_[w];
      max_in_flight_[w] = std::max(max_in_flight_[w], in_flight_[w]);
      calls_.push_back({w, closure, attempt});
    }
    ClosureOutcome out;
    if (step_) {
      out = step_(w, nth, closure);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      out.result = ClosureResult{1.0, 3, 4, 0, 0};
    }
    absl::MutexLock lock(&mu_);
    --in_flight_[w];
    if (out.kind == Kind::kDone) done_.push_back({w, closure, attempt});
    return out;
  }
  void Finish(int w) override {
    absl::MutexLock lock(&mu_);
    finished_.insert(w);
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<Call> done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  int max_in_flight(int w) {
    absl::MutexLock lock(&mu_);
    return max_in_flight_[w];
  }
  std::set<int> finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  int prepares(int w) {
    absl::MutexLock lock(&mu_);
    return prepares_per_worker_[w];
  }
  int runs(int w) {
    absl::MutexLock lock(&mu_);
    return runs_per_worker_[w];
  }

 private:
  const int workers_;
  StepScript step_;
  PrepareScript prepare_;
  absl::Mutex mu_;
  bool cancelled_ = false;
  std::vector<int> runs_per_worker_, prepares_per_worker_, in_flight_, max_in_flight_;
  std::vector<Call> calls_, done_;
  std::set<int> finished_;
};

ClosureOutcome Done(double loss = 1.0, int64_t examples = 4) {
  std::this_thread::sleep_for(std::chrono::microseconds(300));
  ClosureOutcome out;
  out.result = ClosureResult{loss, 1, examples, 0, 0};
  return out;
}

ClusterCoordinatorOptions FastProbes() {
  ClusterCoordinatorOptions o;
  o.probe_initial_backoff = absl::Milliseconds(1);
  o.probe_max_backoff = absl::Milliseconds(5);
  return o;
}

// Every closure id in [first, first + n) completed exactly once.
void ExpectEachClosureDoneOnce(const std::vector<FakeTransport::Call>& done, int64_t first,
                               int64_t n) {
  std::map<int64_t, int> count;
  for (const auto& c : done) ++count[c.closure];
  ASSERT_EQ(count.size(), static_cast<size_t>(n));
  for (int64_t id = first; id < first + n; ++id) EXPECT_EQ(count[id], 1) << "closure " << id;
}

TEST(ClusterCoordinatorTest, JoinWaitsForEveryScheduledClosureAndCountsEachOnce) {
  FakeTransport transport(3);
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start(/*first_closure_id=*/100);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.scheduled(), 60);
  EXPECT_EQ(coordinator.completed(), 60);
  EXPECT_EQ(coordinator.retried(), 0);
  EXPECT_EQ(coordinator.admissions(), 3);
  ExpectEachClosureDoneOnce(transport.done(), 100, 60);
  CompletedClosures totals = coordinator.TakeCompleted();
  EXPECT_EQ(totals.closures, 60);
  EXPECT_EQ(totals.examples, 60 * 4);
  EXPECT_DOUBLE_EQ(totals.loss_sum, 60 * 4 * 1.0);
  EXPECT_EQ(coordinator.TakeCompleted().closures, 0) << "taken once";
  coordinator.FinishWorkers();
  EXPECT_EQ(transport.finished(), (std::set<int>{0, 1, 2}));
}

TEST(ClusterCoordinatorTest, RunsAtMostOneClosurePerWorkerAtATime) {
  FakeTransport transport(2);
  ClusterCoordinatorOptions options = FastProbes();
  options.max_outstanding = 16;  // plenty queued, so a second closure could start if allowed
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start();
  for (int i = 0; i < 80; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(transport.max_in_flight(0), 1);
  EXPECT_EQ(transport.max_in_flight(1), 1);
  std::set<int> used;
  for (const auto& c : transport.done()) used.insert(c.worker);
  EXPECT_EQ(used, (std::set<int>{0, 1})) << "both workers get closures";
}

TEST(ClusterCoordinatorTest, ScheduleBlocksOnceMaxOutstandingClosuresArePending) {
  FakeTransport transport(1);
  absl::Mutex gate_mu;
  bool open = false;
  transport.SetStep([&](int, int, int64_t) {
    absl::MutexLock lock(&gate_mu);
    gate_mu.Await(absl::Condition(&open));
    return Done();
  });
  ClusterCoordinatorOptions options = FastProbes();
  options.max_outstanding = 2;
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start();
  ASSERT_TRUE(coordinator.Schedule().ok());  // 1 outstanding
  std::atomic<bool> second_returned{false};
  std::thread second([&] {
    EXPECT_TRUE(coordinator.Schedule().ok());  // 2 outstanding: waits for a completion
    second_returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second_returned.load());
  {
    absl::MutexLock lock(&gate_mu);
    open = true;
  }
  second.join();
  EXPECT_TRUE(second_returned.load());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.completed(), 2);
}

TEST(ClusterCoordinatorTest, DrainFinishesClosuresInFlightAndDropsQueuedOnes) {
  FakeTransport transport(1);
  absl::Mutex gate_mu;
  bool open = false;
  transport.SetStep([&](int, int, int64_t) {
    absl::MutexLock lock(&gate_mu);
    gate_mu.Await(absl::Condition(&open));
    return Done();
  });
  ClusterCoordinatorOptions options = FastProbes();
  options.max_outstanding = 8;
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start(/*first_closure_id=*/50);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  // Wait until the worker holds closure 50.
  for (int i = 0; i < 400 && transport.calls().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(transport.calls().size(), 1u);
  std::atomic<bool> drained{false};
  absl::StatusOr<int64_t> dropped;
  std::thread drainer([&] {
    dropped = coordinator.Drain();
    drained = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(drained.load()) << "waits for the closure in flight";
  {
    absl::MutexLock lock(&gate_mu);
    open = true;
  }
  drainer.join();
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 3);
  EXPECT_EQ(coordinator.completed(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(transport.calls().size(), 1u) << "no queued closure starts after Drain";
}

TEST(ClusterCoordinatorTest, LostWorkersClosureIsRequeuedOntoAnotherWorker) {
  FakeTransport transport(3);
  std::atomic<int> calls{0};
  std::atomic<int> lost_worker{-1};
  std::atomic<int64_t> lost_closure{-1};
  // The worker running the 5th closure attempt dies and never comes back.
  transport.SetStep([&](int w, int, int64_t closure) {
    if (calls++ == 4) {
      lost_worker = w;
      lost_closure = closure;
      return ClosureOutcome{Kind::kWorkerLost, absl::UnavailableError("connection reset"), {}};
    }
    return Done();
  });
  transport.SetPrepare([&](int w, int) -> absl::StatusOr<std::string> {
    if (w == lost_worker.load()) return absl::UnavailableError("connection refused");
    return std::string("incarnation-1");
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.completed(), 40);
  EXPECT_EQ(coordinator.retried(), 1);
  EXPECT_EQ(coordinator.active_workers(), 2);
  ExpectEachClosureDoneOnce(transport.done(), 0, 40);
  ASSERT_GE(lost_closure.load(), 0);
  bool rerun = false;
  for (const auto& c : transport.done()) {
    if (c.closure == lost_closure.load()) {
      rerun = true;
      EXPECT_NE(c.worker, lost_worker.load()) << "re-run on another worker";
      EXPECT_EQ(c.attempt, 1);
    }
  }
  EXPECT_TRUE(rerun) << "closure " << lost_closure.load() << " ran again";
  bool after_loss = false;
  for (const auto& c : transport.calls()) {
    if (after_loss) {
      EXPECT_NE(c.worker, lost_worker.load()) << "a dead worker gets no closures";
    }
    after_loss = after_loss || c.closure == lost_closure.load();
  }
}

TEST(ClusterCoordinatorTest, RestartedWorkerIsReadmittedAndScheduledAgain) {
  FakeTransport transport(2);
  std::atomic<int> calls{0};
  std::atomic<int> lost_worker{-1};
  std::atomic<bool> others_slow{false};
  transport.SetStep([&](int w, int, int64_t) {
    if (calls++ == 2) {
      lost_worker = w;
      return ClosureOutcome{Kind::kWorkerLost, absl::UnavailableError("worker killed"), {}};
    }
    if (others_slow && w != lost_worker.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Done();
  });
  // After the loss, three probes find nothing listening; then the restarted
  // process answers with a new incarnation.
  std::atomic<int> probes_after_loss{0};
  transport.SetPrepare([&](int w, int) -> absl::StatusOr<std::string> {
    if (w != lost_worker.load()) return std::string("incarnation-1");
    if (probes_after_loss++ < 3) return absl::UnavailableError("connection refused");
    return std::string("incarnation-2");
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.retried(), 1);
  ASSERT_GE(lost_worker.load(), 0);
  for (int i = 0; i < 1000 && coordinator.admissions() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(coordinator.admissions(), 3) << "the restarted worker was re-admitted";
  EXPECT_EQ(probes_after_loss.load(), 4) << "probed until it answered";
  EXPECT_EQ(coordinator.active_workers(), 2);
  // With the other worker slow, the rejoined one must take most of the next closures.
  others_slow = true;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  int done_after_rejoin = 0;
  for (const auto& c : transport.done()) {
    done_after_rejoin += c.worker == lost_worker.load() && c.closure >= 10;
  }
  EXPECT_GE(done_after_rejoin, 10) << "the rejoined worker runs closures again";
  ExpectEachClosureDoneOnce(transport.done(), 0, 30);
}

TEST(ClusterCoordinatorTest, PsFailureStopsSchedulingAndNamesThePs) {
  FakeTransport transport(2);
  transport.SetStep([&](int w, int nth, int64_t) {
    if (w == 0 && nth == 4) {
      return ClosureOutcome{
          Kind::kFatal,
          absl::UnavailableError("ps:1 (127.0.0.1:5555): Push: UNAVAILABLE: connection refused"),
          {}};
    }
    return Done();
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  absl::Status status;
  for (int i = 0; i < 1000 && status.ok(); ++i) status = coordinator.Schedule();
  if (status.ok()) status = coordinator.Join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("ps:1 (127.0.0.1:5555)"), std::string::npos) << status;
  EXPECT_EQ(coordinator.Join().code(), absl::StatusCode::kUnavailable) << "Join reports it too";
  EXPECT_EQ(coordinator.Schedule().code(), absl::StatusCode::kUnavailable);
  const size_t calls = transport.calls().size();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(transport.calls().size(), calls) << "no closure runs after the ps failed";
  EXPECT_LT(coordinator.completed(), coordinator.scheduled());
  coordinator.Stop();
}

TEST(ClusterCoordinatorTest, WorkerWithADifferentJobConfigIsFatal) {
  FakeTransport transport(2);
  transport.SetPrepare([](int w, int) -> absl::StatusOr<std::string> {
    if (w == 1) return absl::FailedPreconditionError("plan abc differs from plan def");
    return std::string("incarnation-1");
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  for (int i = 0; i < 200 && coordinator.fatal_error().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  absl::Status status = coordinator.Schedule();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("worker:1 (fake)"), std::string::npos) << status;
}

TEST(ClusterCoordinatorTest, StopReturnsPromptlyWithClosuresQueuedAndNoWorker) {
  FakeTransport transport(2);
  transport.SetPrepare(
      [](int, int) -> absl::StatusOr<std::string> { return absl::UnavailableError("down"); });
  ClusterCoordinatorOptions options = FastProbes();
  options.max_outstanding = 8;
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  std::thread joiner([&] { EXPECT_EQ(coordinator.Join().code(), absl::StatusCode::kCancelled); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  coordinator.Stop();
  joiner.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(coordinator.completed(), 0);
}

TEST(ClusterCoordinatorTest, ExportsClosureAndAdmissionMetrics) {
  prometheus::Registry registry;
  FakeTransport transport(2);
  std::atomic<int> calls{0};
  transport.SetStep([&](int, int, int64_t) {
    if (calls++ == 0) {  // the first closure's worker is lost, then comes back
      return ClosureOutcome{Kind::kWorkerLost, absl::UnavailableError("reset"), {}};
    }
    return Done();
  });
  ClusterCoordinatorOptions options = FastProbes();
  options.registry = &registry;
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  // The other worker may have run every closure before the lost one was re-admitted.
  for (int i = 0; i < 200 && coordinator.active_workers() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::map<std::string, double> values;
  for (const auto& family : registry.Collect()) {
    if (family.metric.empty()) continue;
    const auto& m = family.metric[0];
    values[family.name] = family.type == prometheus::MetricType::Counter ? m.counter.value
                          : family.type == prometheus::MetricType::Gauge
                              ? m.gauge.value
                              : static_cast<double>(m.histogram.sample_count);
  }
  EXPECT_EQ(values["distrain_ps_closures_scheduled_total"], 10);
  EXPECT_EQ(values["distrain_ps_closures_completed_total"], 10);
  EXPECT_EQ(values["distrain_ps_closures_retried_total"], 1);
  EXPECT_EQ(values["distrain_ps_workers_admitted_total"], 3);  // the lost worker twice
  EXPECT_EQ(values["distrain_ps_workers_active"], 2);
  EXPECT_EQ(values["distrain_ps_closure_seconds"], 10);
  EXPECT_EQ(values["distrain_ps_closure_staleness"], 10);
}

// --- dynamic membership (ps_membership.h; cluster_coordinator.h steps 8-10) --

TEST(ClusterCoordinatorMembershipTest, WorkersThatJoinMidRunGetClosures) {
  prometheus::Registry registry;
  FakeTransport transport(2, /*capacity=*/4);
  ClusterCoordinatorOptions options = FastProbes();
  options.registry = &registry;
  ClusterCoordinator coordinator(&transport, options);
  coordinator.Start();
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  EXPECT_EQ(coordinator.members(), 2);
  // A scale 2 -> 4: workers 2 and 3 join the chief's worker set.
  coordinator.AddWorker(2);
  coordinator.AddWorker(3);
  EXPECT_EQ(coordinator.members(), 4);
  for (int i = 0; i < 400; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  const std::vector<int64_t> by_worker = coordinator.completed_by_worker();
  ASSERT_EQ(by_worker.size(), 4u);
  EXPECT_GT(by_worker[2], 0) << "the joined worker ran closures";
  EXPECT_GT(by_worker[3], 0) << "the joined worker ran closures";
  EXPECT_EQ(by_worker[0] + by_worker[1] + by_worker[2] + by_worker[3], 440);
  EXPECT_EQ(coordinator.active_workers(), 4);
  ExpectEachClosureDoneOnce(transport.done(), 0, 440);
  // The per-worker metric is labelled by worker.
  std::map<std::string, double> per_worker;
  double members = -1;
  for (const auto& family : registry.Collect()) {
    if (family.name == "distrain_ps_workers_members") members = family.metric[0].gauge.value;
    if (family.name != "distrain_ps_worker_closures_completed_total") continue;
    for (const auto& m : family.metric) {
      ASSERT_EQ(m.label.size(), 1u);
      EXPECT_EQ(m.label[0].name, "worker");
      per_worker[m.label[0].value] = m.counter.value;
    }
  }
  EXPECT_EQ(per_worker["worker:3"], static_cast<double>(by_worker[3]));
  EXPECT_EQ(per_worker["worker:2"], static_cast<double>(by_worker[2]));
  EXPECT_EQ(members, 4);
  coordinator.FinishWorkers();
  EXPECT_EQ(transport.finished(), (std::set<int>{0, 1, 2, 3}));
}

TEST(ClusterCoordinatorMembershipTest, AWorkerThatJoinsBeforeStartIsScheduledFromTheStart) {
  FakeTransport transport(1, /*capacity=*/3);
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.AddWorker(2);  // joined while the chief waited for its ps tasks
  coordinator.Start();
  EXPECT_EQ(coordinator.members(), 2);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_GT(coordinator.completed_by_worker()[2], 0);
  EXPECT_EQ(transport.runs(1), 0) << "worker 1 never joined and is not in TF_CONFIG";
}

TEST(ClusterCoordinatorMembershipTest, AWorkerThatLeavesGetsNoneAndItsClosureIsRerun) {
  FakeTransport transport(3);
  // Worker 2's first closure blocks until released, then fails as a process
  // that exited after leaving would.
  absl::Mutex gate_mu;
  bool in_step = false, release = false;
  transport.SetStep([&](int w, int nth, int64_t) {
    if (w == 2 && nth == 0) {
      absl::MutexLock lock(&gate_mu);
      in_step = true;
      gate_mu.Await(absl::Condition(&release));
      return ClosureOutcome{Kind::kWorkerLost, absl::UnavailableError("worker:2 is stopping"), {}};
    }
    return Done();
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  // Until worker 2 has a closure in flight.
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(coordinator.Schedule().ok());
    absl::MutexLock lock(&gate_mu);
    if (in_step) break;
  }
  {
    absl::MutexLock lock(&gate_mu);
    ASSERT_TRUE(gate_mu.AwaitWithTimeout(absl::Condition(&in_step), absl::Seconds(10)));
  }
  coordinator.RemoveWorker(2, "it left (stopped cleanly)");  // SIGTERM: Leave first
  EXPECT_EQ(coordinator.members(), 2);
  const int prepares_at_leave = transport.prepares(2);
  {
    absl::MutexLock lock(&gate_mu);
    release = true;
  }
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  const int64_t scheduled = coordinator.scheduled();
  EXPECT_EQ(coordinator.completed(), scheduled) << "no closure lost";
  EXPECT_EQ(coordinator.retried(), 1) << "the leaving worker's closure ran again";
  EXPECT_EQ(transport.runs(2), 1) << "no closure went to the worker after it left";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(transport.prepares(2), prepares_at_leave) << "a worker that left is not probed";
  EXPECT_EQ(coordinator.completed_by_worker()[2], 0);
  ExpectEachClosureDoneOnce(transport.done(), 0, scheduled);
  coordinator.FinishWorkers();
  EXPECT_EQ(transport.finished(), (std::set<int>{0, 1})) << "only the members are told";
}

TEST(ClusterCoordinatorMembershipTest, AFailedWorkerIsNotProbedForeverAndComesBackByJoining) {
  FakeTransport transport(2);
  std::atomic<bool> back{false};
  transport.SetPrepare([&](int w, int) -> absl::StatusOr<std::string> {
    if (w == 1 && !back.load()) return absl::UnavailableError("connection refused");
    return std::string(w == 1 ? "incarnation-2" : "incarnation-1");
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  for (int i = 0; i < 200 && transport.prepares(1) < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(transport.prepares(1), 3) << "a TF_CONFIG worker that never answered is probed";
  // The worker set says it failed (its stream broke and it never came back).
  coordinator.RemoveWorker(1, "worker:1 lost: its membership stream closed");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int probes = transport.prepares(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(transport.prepares(1), probes + 1) << "no probing once it is out of the set";
  // A replacement process joins: probed at once, admitted, scheduled.
  back = true;
  coordinator.AddWorker(1);
  for (int i = 0; i < 400 && coordinator.active_workers() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(coordinator.active_workers(), 2);
  EXPECT_EQ(coordinator.admissions(), 2);
}

TEST(ClusterCoordinatorMembershipTest, JoinDoesNotWaitForAWorkerThatLeftWithNothingQueued) {
  FakeTransport transport(2);
  transport.SetPrepare([&](int w, int) -> absl::StatusOr<std::string> {
    if (w == 1) return absl::UnavailableError("connection refused");
    return std::string("incarnation-1");
  });
  ClusterCoordinator coordinator(&transport, FastProbes());
  coordinator.Start();
  coordinator.RemoveWorker(1, "it left");
  coordinator.RemoveWorker(1, "twice is harmless");
  coordinator.RemoveWorker(7, "never a member");
  EXPECT_EQ(coordinator.members(), 1);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(coordinator.Schedule().ok());
  ASSERT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.completed(), 30);
}

// --- sharding helpers -------------------------------------------------------

TEST(PsShardingPlanTest, LargeKernelsSpreadOverEveryPsAndSmallVariablesStayWhole) {
  ModelConfig config;
  config.hidden_units = {1024};
  auto model = Model::Create(config, 784, 10, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto plan = PsShardingPlan(**model, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const VariablePlan* kernel = plan->Find((*model)->parameters()[0]->name);
  ASSERT_NE(kernel, nullptr);
  ASSERT_EQ(kernel->shards.size(), 2u) << "784x1024 floats = 3 MiB over 2 ps";
  EXPECT_NE(plan->shards()[kernel->shards[0]].ps_task, plan->shards()[kernel->shards[1]].ps_task);
  const VariablePlan* bias = plan->Find((*model)->parameters()[1]->name);
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->shards.size(), 1u) << "4 KiB is below the 256 KiB minimum shard";
  // Every process derives the same plan.
  auto again = Model::Create(config, 784, 10, 99);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(PsShardingPlan(**again, 2)->Fingerprint(), plan->Fingerprint());
  EXPECT_NE(PsShardingPlan(**again, 3)->Fingerprint(), plan->Fingerprint());
}

TEST(PsShardingPlanTest, ModelDimsReadsInputWidthAndClassCount) {
  ModelConfig config;
  config.hidden_units = {32, 16};
  auto model = Model::Create(config, 48, 7, 1);
  ASSERT_TRUE(model.ok());
  auto dims = ModelDimsOf(**model);
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(dims->num_features, 48);
  EXPECT_EQ(dims->num_classes, 7);
}

// --- the strategy over in-process ps and workers ----------------------------

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

JobConfig SmallJob(int64_t steps) {
  JobConfig config;
  config.strategy = StrategyKind::kParameterServer;
  config.training.model.hidden_units = {32};
  config.training.dataset.num_examples = 2048;
  config.training.dataset.num_eval_examples = 256;
  config.training.dataset.num_features = 16;
  config.training.dataset.num_classes = 4;
  config.training.optimizer.type = OptimizerType::kAdam;
  config.training.optimizer.learning_rate = 0.01f;
  config.training.global_batch_size = 32;
  config.training.steps = steps;
  config.training.communication.timeout_seconds = 10;
  return config;
}

// 2 ps + 2 workers as services in this process; the chief's cluster spec
// points at them.
struct InProcessPsJob {
  explicit InProcessPsJob(const JobConfig& config) {
    for (int t = 0; t < 2; ++t) {
      PsServiceOptions o;
      o.task_index = t;
      o.num_ps = 2;
      o.optimizer = config.training.optimizer;
      o.max_staleness = config.training.max_staleness.value_or(-1);
      // As RunParameterServerTask gives a ps task its own directory.
      o.checkpoint_dir = PsCheckpointRoot(config.training.checkpoint.dir);
      auto s = PsServer::Start("127.0.0.1:0", o);
      EXPECT_TRUE(s.ok()) << s.status();
      ps_addresses.push_back((*s)->address());
      ps.push_back(std::move(*s));
    }
    for (int w = 0; w < 2; ++w) {
      // The service only reads its own index, the worker count and the ps
      // addresses from the spec; the worker addresses are placeholders.
      auto spec = ClusterSpec::Create({{"chief", {"127.0.0.1:1"}},
                                       {"worker", {"127.0.0.1:2", "127.0.0.1:3"}},
                                       {"ps", ps_addresses}},
                                      TaskId{"worker", w});
      EXPECT_TRUE(spec.ok()) << spec.status();
      PsWorkerOptions o;
      o.config = config;
      o.cluster = *spec;
      services.push_back(std::make_unique<PsWorkerService>(o));
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(services.back().get());
      servers.push_back(builder.BuildAndStart());
      worker_addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }
  ~InProcessPsJob() {
    for (auto& s : servers) s->Shutdown(std::chrono::system_clock::now());
  }
  ClusterSpec Chief() const {
    // The chief serves its worker set on its own port (ps_membership.h).
    auto spec = ClusterSpec::Create(
        {{"chief", {chief_address}}, {"worker", worker_addresses}, {"ps", ps_addresses}},
        TaskId{"chief", 0});
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  const std::string chief_address = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  std::vector<std::unique_ptr<PsServer>> ps;
  std::vector<std::string> ps_addresses;
  std::vector<std::unique_ptr<PsWorkerService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> worker_addresses;
};

TEST(ParameterServerStrategyTest, RunsEveryStepOnTheWorkersAndLearns) {
  const JobConfig config = SmallJob(120);
  InProcessPsJob job(config);
  ParameterServerStrategy strategy;
  ASSERT_TRUE(strategy.Init(job.Chief(), config).ok());
  EXPECT_EQ(strategy.num_local_replicas(), 0) << "the coordinator feeds no data";
  EXPECT_EQ(strategy.num_replicas_in_sync(), 2);
  auto factory = [&] {
    return Model::Create(config.training.model, 16, 4, config.training.seed);
  };
  ASSERT_TRUE(strategy.CreateVariables(factory, config.training.optimizer).ok());
  auto start = strategy.SynchronizeInitialState(0);
  ASSERT_TRUE(start.ok()) << start.status();
  std::vector<float> initial(strategy.primary_model()->parameters()[0]->value.data(),
                             strategy.primary_model()->parameters()[0]->value.data() + 16);
  int64_t examples = 0;
  double first_loss = -1, last_loss = 0;
  for (int step = 0; step < 120; ++step) {
    auto out = strategy.Run([](ReplicaContext&) -> LossResult {
      ADD_FAILURE() << "the chief computes nothing";
      return {};
    }, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    examples += out->examples;
    if (out->examples > 0 && first_loss < 0) first_loss = out->loss;
    last_loss = out->loss;
  }
  // The final step joined: every closure completed, each counted once.
  EXPECT_EQ(examples, 120 * 32);
  EXPECT_EQ(strategy.coordinator()->completed(), 120);
  EXPECT_LT(last_loss, first_loss);
  // ... and pulled the trained variables into the chief's model.
  const float* now = strategy.primary_model()->parameters()[0]->value.data();
  EXPECT_NE(std::vector<float>(now, now + 16), initial);
  // Every closure's gradient was applied to every shard exactly once.
  auto plan = PsShardingPlan(*strategy.primary_model(), 2);
  ASSERT_TRUE(plan.ok());
  auto client = PsClient::Create(job.ps_addresses, *plan);
  ASSERT_TRUE(client.ok());
  auto pulled = (*client)->Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->versions.size(), 4u);
  for (const auto& [name, versions] : pulled->versions) {
    for (int64_t v : versions) EXPECT_EQ(v, 120) << name;
  }
  strategy.Shutdown();
  for (auto& s : job.services) EXPECT_TRUE(s->finished()) << "Shutdown tells the workers";
}

// A worker that is not in the chief's TF_CONFIG (a scale-up's) joins the
// chief's worker set mid-run and runs closures; when it leaves, the run
// finishes on the others with every step done.
TEST(ParameterServerStrategyTest, AWorkerThatJoinsTheWorkerSetMidRunRunsClosures) {
  const JobConfig config = SmallJob(400);
  InProcessPsJob job(config);
  ParameterServerStrategy strategy;
  ASSERT_TRUE(strategy.Init(job.Chief(), config).ok());
  auto factory = [&] { return Model::Create(config.training.model, 16, 4, config.training.seed); };
  ASSERT_TRUE(strategy.CreateVariables(factory, config.training.optimizer).ok());
  ASSERT_GT(strategy.membership_port(), 0);
  ASSERT_TRUE(strategy.SynchronizeInitialState(0).ok());
  auto step_fn = [](ReplicaContext&) -> LossResult { return {}; };
  for (int step = 0; step < 50; ++step) ASSERT_TRUE(strategy.Run(step_fn, 0).ok());

  // worker:2, with the 3-worker TF_CONFIG a scale gives a new pod.
  auto spec = ClusterSpec::Create({{"chief", {job.chief_address}},
                                   {"worker", {"127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}},
                                   {"ps", job.ps_addresses}},
                                  TaskId{"worker", 2});
  ASSERT_TRUE(spec.ok()) << spec.status();
  PsWorkerOptions o;
  o.config = config;
  o.cluster = *spec;
  PsWorkerService joined(o);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartPsWorkerServer("127.0.0.1:0", joined, &port);
  ASSERT_NE(server, nullptr);
  PsMembershipClientOptions mo;
  mo.chief_address = job.chief_address;
  mo.worker_index = 2;
  mo.incarnation = joined.incarnation();
  mo.address = absl::StrCat("127.0.0.1:", port);
  PsMembershipClient membership(mo);
  membership.Start();
  int step = 50;
  for (; step < 300; ++step) ASSERT_TRUE(strategy.Run(step_fn, 0).ok());
  EXPECT_EQ(strategy.coordinator()->members(), 3);
  EXPECT_EQ(strategy.num_replicas_in_sync(), 3);
  std::vector<int64_t> by_worker = strategy.coordinator()->completed_by_worker();
  ASSERT_EQ(by_worker.size(), 3u);
  EXPECT_GT(by_worker[2], 0) << "the worker that joined ran closures";

  // It stops (SIGTERM): leaving first, then the rest of the run goes on.
  joined.BeginLeaving();
  ASSERT_TRUE(membership.Leave().ok());
  joined.WaitIdle();
  // Out of the set, and its last closure (in flight when it left) answered
  // and counted: its scheduler thread has let it go.
  for (int i = 0; i < 400 && (strategy.coordinator()->members() != 2 ||
                              strategy.coordinator()->active_workers() != 2);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(strategy.coordinator()->members(), 2);
  EXPECT_EQ(strategy.coordinator()->active_workers(), 2);
  const int64_t ran_there = strategy.coordinator()->completed_by_worker()[2];
  for (; step < 400; ++step) ASSERT_TRUE(strategy.Run(step_fn, 0).ok());
  EXPECT_EQ(strategy.coordinator()->completed(), 400) << "every step done";
  EXPECT_EQ(strategy.coordinator()->completed_by_worker()[2], ran_there)
      << "nothing ran on the worker after it left";
  strategy.Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(ParameterServerStrategyTest, CheckpointHoldsPsValuesAndSlotsAndResumes) {
  JobConfig config = SmallJob(40);
  const std::string dir = ::testing::TempDir() + "/ps_strategy_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  config.training.checkpoint.dir = dir;
  InProcessPsJob job(config);
  auto factory = [&] {
    return Model::Create(config.training.model, 16, 4, config.training.seed);
  };
  CheckpointState saved;
  {
    ParameterServerStrategy strategy;
    ASSERT_TRUE(strategy.Init(job.Chief(), config).ok());
    ASSERT_TRUE(strategy.CreateVariables(factory, config.training.optimizer).ok());
    ASSERT_TRUE(strategy.SynchronizeInitialState(0).ok());
    for (int i = 0; i < 25; ++i) ASSERT_TRUE(strategy.Run({}, 0).ok());
    auto state = strategy.SaveState(25);
    ASSERT_TRUE(state.ok()) << state.status();
    saved = std::move(*state);
    EXPECT_EQ(strategy.coordinator()->completed(), 25) << "SaveState drains in-flight closures";
  }
  EXPECT_EQ(saved.step, 25);
  int variables = 0, slots = 0;
  for (const auto& [name, t] : saved.tensors) {
    variables += name.rfind("variables/", 0) == 0;
    slots += name.rfind("optimizer/", 0) == 0;
  }
  EXPECT_EQ(variables, 4);
  EXPECT_EQ(slots, 8) << "Adam m and v of every variable, as the ps held them";
  EXPECT_EQ(saved.metadata["optimizer_iterations"], "25");

  // A new chief (after a lost ps, say) resumes at step 25 from that state.
  ParameterServerStrategy resumed;
  ASSERT_TRUE(resumed.Init(job.Chief(), config).ok());
  ASSERT_TRUE(resumed.CreateVariables(factory, config.training.optimizer).ok());
  ASSERT_TRUE(resumed.RestoreState(saved).ok());
  auto start = resumed.SynchronizeInitialState(25);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(*start, 25);
  for (int step = 25; step < 40; ++step) ASSERT_TRUE(resumed.Run({}, 0).ok());
  EXPECT_EQ(resumed.coordinator()->completed(), 15) << "only the remaining steps run";
  resumed.Shutdown();
  std::filesystem::remove_all(dir);
}

// Staleness is a property of the whole run, so both cases train the same
// small job with 2 workers; asynchronous training sees stale pushes, a bound
// of 0 admits none (rejected pushes are redone on fresh parameters).
int64_t MaxStaleness(std::optional<int64_t> bound, int64_t* stale_retries) {
  JobConfig config = SmallJob(150);
  config.training.max_staleness = bound;
  InProcessPsJob job(config);
  ParameterServerStrategy strategy;
  EXPECT_TRUE(strategy.Init(job.Chief(), config).ok());
  auto factory = [&] {
    return Model::Create(config.training.model, 16, 4, config.training.seed);
  };
  EXPECT_TRUE(strategy.CreateVariables(factory, config.training.optimizer).ok());
  EXPECT_TRUE(strategy.SynchronizeInitialState(0).ok());
  for (int i = 0; i < 150; ++i) {
    auto out = strategy.Run({}, 0);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) break;
  }
  EXPECT_EQ(strategy.coordinator()->completed(), 150);
  strategy.Shutdown();
  *stale_retries = strategy.stale_retries();
  return strategy.max_staleness_seen();
}

TEST(ParameterServerStrategyTest, StalenessBoundOfZeroAdmitsNoStalePush) {
  int64_t retries = 0;
  EXPECT_EQ(MaxStaleness(0, &retries), 0);
  std::cout << "pushes redone under the bound: " << retries << "\n";
}

TEST(ParameterServerStrategyTest, UnboundedTrainingIsAsynchronous) {
  int64_t retries = 0;
  EXPECT_GT(MaxStaleness(std::nullopt, &retries), 0)
      << "two workers pushing independently see each other's updates";
  EXPECT_EQ(retries, 0);
}

// --- BatchNormalization: moving statistics on the ps -----------------------

constexpr char kMovingMean[] = "batch_normalization/moving_mean";
constexpr char kMovingVariance[] = "batch_normalization/moving_variance";

// SmallJob's data through Dense(32, relu), BatchNormalization, Dense(4,
// softmax): the moving statistics are [32] each, one non-trainable shard.
JobConfig BatchNormJob(int64_t steps) {
  JobConfig config = SmallJob(steps);
  LayerConfig hidden, bn, out;
  hidden.kind = LayerKind::kDense;
  hidden.units = 32;
  hidden.activation = ActivationKind::kRelu;
  bn.kind = LayerKind::kBatchNormalization;
  bn.momentum = 0.9;  // moves visibly within a few dozen closures
  out.kind = LayerKind::kDense;
  out.units = 4;
  out.activation = ActivationKind::kSoftmax;
  config.training.model.type = "sequential";
  config.training.model.layers = {hidden, bn, out};
  return config;
}

std::function<absl::StatusOr<std::unique_ptr<Model>>()> FactoryOf(const JobConfig& config) {
  return [config] { return Model::Create(config.training.model, 16, 4, config.training.seed); };
}

// Every variable as the ps tasks hold it, with its shard versions.
PullResult PullEverything(const InProcessPsJob& job, Model& model) {
  auto plan = PsShardingPlan(model, 2);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto client = PsClient::Create(job.ps_addresses, *plan);
  EXPECT_TRUE(client.ok()) << client.status();
  auto pulled = (*client)->Pull();
  EXPECT_TRUE(pulled.ok()) << pulled.status();
  return pulled.ok() ? *pulled : PullResult{};
}

std::vector<float> Values(const Tensor& t) { return {t.data(), t.data() + t.size()}; }

TEST(PsShardingPlanTest, StateVariablesFollowTheParametersAsNonTrainableShards) {
  const JobConfig config = BatchNormJob(1);
  auto model = FactoryOf(config)();
  ASSERT_TRUE(model.ok()) << model.status();
  auto plan = PsShardingPlan(**model, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> names;
  for (const VariablePlan& v : plan->variables()) {
    names.push_back(v.name);
    EXPECT_EQ(v.trainable, v.name != kMovingMean && v.name != kMovingVariance) << v.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"dense/kernel", "dense/bias",
                                             "batch_normalization/gamma",
                                             "batch_normalization/beta", "dense_1/kernel",
                                             "dense_1/bias", kMovingMean, kMovingVariance}));
  EXPECT_EQ(plan->Find(kMovingMean)->shards.size(), 1u) << "128 bytes: one shard";
}

// Workers pull the moving statistics with the parameters, move them in their
// forward passes and push the deltas, which the ps adds: after N closures
// each moving-statistic shard has taken N deltas, the chief's checkpoint holds
// statistics that moved away from their initial zeros and ones (and no
// optimizer slots for them), and the chief evaluates with what it pulled.
TEST(ParameterServerStrategyTest, BatchNormalizationMovingStatisticsLiveOnThePs) {
  constexpr int kSteps = 60;
  JobConfig config = BatchNormJob(kSteps);
  const std::string dir = ::testing::TempDir() + "/ps_strategy_bn_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  config.training.checkpoint.dir = dir;
  InProcessPsJob job(config);
  ParameterServerStrategy strategy;
  ASSERT_TRUE(strategy.Init(job.Chief(), config).ok());
  absl::Status created = strategy.CreateVariables(FactoryOf(config), config.training.optimizer);
  ASSERT_TRUE(created.ok()) << created;
  ASSERT_TRUE(strategy.SynchronizeInitialState(0).ok());
  ASSERT_EQ(strategy.primary_model()->state_variables().size(), 2u);
  double first_loss = -1, last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto out = strategy.Run({}, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    if (out->examples > 0 && first_loss < 0) first_loss = out->loss;
    last_loss = out->loss;
  }
  EXPECT_LT(last_loss, first_loss);
  auto state = strategy.SaveState(kSteps);
  ASSERT_TRUE(state.ok()) << state.status();

  ASSERT_TRUE(state->tensors.contains(absl::StrCat("variables/", kMovingMean)));
  ASSERT_TRUE(state->tensors.contains(absl::StrCat("variables/", kMovingVariance)));
  const Tensor& mean = state->tensors.at(absl::StrCat("variables/", kMovingMean));
  const Tensor& variance = state->tensors.at(absl::StrCat("variables/", kMovingVariance));
  ASSERT_EQ(mean.size(), 32);
  int mean_moved = 0, variance_moved = 0;
  for (int64_t i = 0; i < 32; ++i) {
    ASSERT_TRUE(std::isfinite(mean[i]) && std::isfinite(variance[i])) << i;
    EXPECT_GE(variance[i], 0.0f) << i;
    mean_moved += mean[i] != 0.0f;
    variance_moved += variance[i] != 1.0f;
  }
  // ReLU outputs: a unit that is never active keeps mean 0, variance moves
  // towards 0; most units are active for some examples.
  EXPECT_GT(mean_moved, 16);
  EXPECT_GT(variance_moved, 16);
  for (const auto& [name, tensor] : state->tensors) {
    EXPECT_EQ(name.find("optimizer/batch_normalization/moving"), std::string::npos) << name;
  }
  EXPECT_EQ(state->metadata.at("optimizer_iterations"), absl::StrCat(kSteps));

  // Each closure's delta landed exactly once, next to its gradients.
  const PullResult ps = PullEverything(job, *strategy.primary_model());
  for (const auto& [name, versions] : ps.versions) {
    for (int64_t v : versions) EXPECT_EQ(v, kSteps) << name;
  }
  // The chief pulled them for evaluation.
  const std::vector<Parameter*> chief = strategy.primary_model()->state_variables();
  EXPECT_EQ(Values(chief[0]->value), Values(mean));
  EXPECT_EQ(Values(chief[1]->value), Values(variance));
  EXPECT_EQ(Values(ps.values.at(kMovingMean)), Values(mean));
  strategy.Shutdown();

  // A new chief resumes with the moving statistics: from the ps tasks'
  // files, and, when those are gone, from its own checkpoint's values.
  for (const bool ps_files : {true, false}) {
    if (!ps_files) std::filesystem::remove_all(PsCheckpointRoot(dir));
    InProcessPsJob fresh(config);  // new ps tasks: nothing survives in memory
    ParameterServerStrategy resumed;
    ASSERT_TRUE(resumed.Init(fresh.Chief(), config).ok());
    ASSERT_TRUE(resumed.CreateVariables(FactoryOf(config), config.training.optimizer).ok());
    ASSERT_TRUE(resumed.RestoreState(*state).ok());
    ASSERT_TRUE(resumed.SynchronizeInitialState(kSteps).ok());
    const PullResult now = PullEverything(fresh, *resumed.primary_model());
    EXPECT_EQ(Values(now.values.at(kMovingMean)), Values(mean)) << ps_files;
    EXPECT_EQ(Values(now.values.at(kMovingVariance)), Values(variance)) << ps_files;
    EXPECT_EQ(now.versions.at(kMovingMean)[0], ps_files ? kSteps : 0);
    resumed.Shutdown();
  }
  std::filesystem::remove_all(dir);
}

// With a staleness bound, pushes rejected for stale gradients are redone;
// the deltas follow only once a closure's gradients were taken, and a redone
// closure pushes only to the ps tasks that refused it, so each closure moves
// every shard, trainable or not, exactly once (a shard's version counts the
// pushes it applied).
TEST(ParameterServerStrategyTest, RedoneStalePushesApplyEachClosureOncePerShard) {
  constexpr int kSteps = 80;
  JobConfig config = BatchNormJob(kSteps);
  config.training.max_staleness = 0;
  InProcessPsJob job(config);
  ParameterServerStrategy strategy;
  ASSERT_TRUE(strategy.Init(job.Chief(), config).ok());
  ASSERT_TRUE(strategy.CreateVariables(FactoryOf(config), config.training.optimizer).ok());
  ASSERT_TRUE(strategy.SynchronizeInitialState(0).ok());
  for (int step = 0; step < kSteps; ++step) {
    auto out = strategy.Run({}, 0);
    ASSERT_TRUE(out.ok()) << out.status();
  }
  EXPECT_EQ(strategy.max_staleness_seen(), 0);
  std::cout << "pushes redone under the bound: " << strategy.stale_retries() << "\n";
  const PullResult ps = PullEverything(job, *strategy.primary_model());
  for (const auto& [name, versions] : ps.versions) {
    for (size_t shard = 0; shard < versions.size(); ++shard) {
      EXPECT_EQ(versions[shard], kSteps) << name << " shard " << shard;
    }
  }
  EXPECT_EQ(ps.versions.at(kMovingMean)[0], kSteps);
  EXPECT_EQ(ps.versions.at(kMovingVariance)[0], kSteps);
  EXPECT_NE(Values(ps.values.at(kMovingMean)), std::vector<float>(32, 0.0f));
  strategy.Shutdown();
}

TEST(ParameterServerStrategyTest, RefusesToRunTheTrainerOnAWorkerTask) {
  auto spec = ClusterSpec::Create(
      {{"chief", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:2"}}, {"ps", {"127.0.0.1:3"}}},
      TaskId{"worker", 0});
  ASSERT_TRUE(spec.ok());
  ParameterServerStrategy strategy;
  absl::Status s = strategy.Init(*spec, SmallJob(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("worker:0"), std::string::npos) << s;
}

TEST(ParameterServerStrategyTest, FactoryCreatesIt) {
  JobConfig config = SmallJob(1);
  EXPECT_TRUE(CheckStrategySupported(config).ok());
  auto created = CreateStrategy(config);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_STREQ((*created)->name(), "ParameterServer");
}

}  // namespace
}  // namespace distrain

#ifndef DISTRAIN_WORKER_STRATEGY_REPLICA_RUNNER_H_
#define DISTRAIN_WORKER_STRATEGY_REPLICA_RUNNER_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace distrain {

// A persistent pool that runs one function for every local replica, each
// replica on its own thread, once per step (CPU replicas are threads;
// starting threads every step would cost more than a small model's step).
// Replica 0 runs on the calling thread, replicas 1..N-1 on N-1 pool threads
// that live as long as the runner.
//
// Thread-safety: Run is called from one thread at a time; the function runs
// concurrently on every replica's thread and must synchronise itself.
class ReplicaRunner {
 public:
  // Each replica's thread runs its ops on `threads_per_replica` cores
  // (ops::SetCpuThreadsForThisThread); 0 leaves the threads' default.
  explicit ReplicaRunner(int num_replicas, int threads_per_replica = 0);
  ~ReplicaRunner();
  ReplicaRunner(const ReplicaRunner&) = delete;
  ReplicaRunner& operator=(const ReplicaRunner&) = delete;

  int num_replicas() const { return num_replicas_; }
  // Calls fn(r) for r in [0, num_replicas) concurrently; returns when all returned.
  void Run(const std::function<void(int replica)>& fn);

 private:
  void Loop(int replica);

  const int num_replicas_;
  const int threads_per_replica_;
  absl::Mutex mu_;
  const std::function<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumps once per Run
  int pending_ ABSL_GUARDED_BY(mu_) = 0;         // pool threads still running this generation
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_REPLICA_RUNNER_H_

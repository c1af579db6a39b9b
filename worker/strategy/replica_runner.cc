#include "worker/strategy/replica_runner.h"

#include "common/check.h"
#include "worker/tensor/ops.h"

namespace distrain {

ReplicaRunner::ReplicaRunner(int num_replicas, int threads_per_replica)
    : num_replicas_(num_replicas), threads_per_replica_(threads_per_replica) {
  DISTRAIN_CHECK_GE(num_replicas, 1);
  threads_.reserve(num_replicas - 1);
  for (int r = 1; r < num_replicas; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

ReplicaRunner::~ReplicaRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ReplicaRunner::Run(const std::function<void(int replica)>& fn) {
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    pending_ = num_replicas_ - 1;
    ++generation_;
  }
  if (threads_per_replica_ > 0) ops::SetCpuThreadsForThisThread(threads_per_replica_);
  fn(0);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ReplicaRunner* self)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->pending_ == 0; },
      this));
  fn_ = nullptr;
}

void ReplicaRunner::Loop(int replica) {
  if (threads_per_replica_ > 0) ops::SetCpuThreadsForThisThread(threads_per_replica_);
  int64_t seen = 0;
  while (true) {
    const std::function<void(int)>* fn;
    {
      absl::MutexLock lock(&mu_);
      struct Args {
        ReplicaRunner* self;
        int64_t seen;
      } args{this, seen};
      mu_.Await(absl::Condition(
          +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return a->self->stop_ || a->self->generation_ != a->seen;
          },
          &args));
      if (stop_) return;
      seen = generation_;
      fn = fn_;
    }
    (*fn)(replica);
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

}  // namespace distrain

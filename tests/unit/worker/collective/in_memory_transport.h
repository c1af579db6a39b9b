#ifndef DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_IN_MEMORY_TRANSPORT_H_
#define DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_IN_MEMORY_TRANSPORT_H_

// A Transport (worker/collective/transport.h) of ranks-as-threads over
// bounded in-memory pipes: what the algorithms need from a transport and
// nothing of TCP. Small pipes and a cap on the bytes one call moves make
// every short transfer, full link and wake-up path of an algorithm happen
// many times per operation.
//
// Ownership: an InMemoryNetwork holds the pipes of all ranks and must
// outlive the transports it hands out. Thread-safety: thread-safe (one
// mutex for the whole network); each transport is driven by one thread as
// Transport requires.

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/collective/transport.h"

namespace distrain::collective_testing {

class InMemoryNetwork {
 public:
  // `capacity`: bytes a pipe holds; `max_per_call`: bytes one call moves at
  // most. Without `fully_connected` only ring neighbours have links.
  InMemoryNetwork(int size, size_t capacity, size_t max_per_call, bool fully_connected)
      : size_(size),
        capacity_(capacity),
        max_per_call_(max_per_call),
        fully_connected_(fully_connected),
        pipes_(size * size),
        down_(size, false) {}

  // Rank `rank`'s end; names "worker:<r>".
  std::unique_ptr<Transport> Join(int rank) {
    return std::make_unique<InMemoryTransport>(*this, rank);
  }
  // Rank `rank`'s process is gone: its peers read what it sent, then kClosed.
  void Close(int rank) {
    absl::MutexLock lock(&mu_);
    down_[rank] = true;
    changed_.SignalAll();
  }

 private:
  class InMemoryTransport;

  class InMemoryLink final : public Link {
   public:
    InMemoryLink(InMemoryNetwork& net, int self, int peer) : net_(net), self_(self), peer_(peer) {}

    IoResult TrySend(absl::Span<const IoSlice> slices) override {
      absl::MutexLock lock(&net_.mu_);
      if (net_.down_[self_] || net_.down_[peer_]) {
        return IoResult{IoResult::kBroken, 0, "Broken pipe"};
      }
      std::deque<char>& pipe = net_.pipe(self_, peer_);
      size_t budget = std::min(net_.capacity_ - pipe.size(), net_.max_per_call_);
      int64_t moved = 0;
      for (const IoSlice& s : slices) {
        const size_t n = std::min(budget, s.size);
        const char* p = static_cast<const char*>(s.data);
        pipe.insert(pipe.end(), p, p + n);
        moved += static_cast<int64_t>(n);
        budget -= n;
        if (n < s.size) break;
      }
      if (moved == 0) return IoResult{};
      net_.changed_.SignalAll();
      return IoResult{IoResult::kMoved, moved};
    }

    IoResult TryReceive(absl::Span<const IoSlice> slices) override {
      absl::MutexLock lock(&net_.mu_);
      return ReceiveLocked(slices);
    }

    IoResult Receive(absl::Span<const IoSlice> slices, absl::Time deadline) override {
      absl::MutexLock lock(&net_.mu_);
      while (!ReadableLocked()) {
        if (net_.changed_.WaitWithDeadline(&net_.mu_, deadline) && absl::Now() >= deadline) {
          return IoResult{IoResult::kTimedOut};
        }
      }
      return ReceiveLocked(slices);
    }

    bool AwaitReadable(absl::Duration budget) override {
      const absl::Time until = absl::Now() + budget;
      absl::MutexLock lock(&net_.mu_);
      while (!ReadableLocked()) {
        if (net_.changed_.WaitWithDeadline(&net_.mu_, until)) return ReadableLocked();
      }
      return true;
    }

    // For Wait.
    bool ReadyLocked(LinkWait::Direction direction) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(net_.mu_) {
      if (direction == LinkWait::kReceive) return ReadableLocked();
      return net_.down_[self_] || net_.down_[peer_] ||
             net_.pipe(self_, peer_).size() < net_.capacity_;
    }

   private:
    bool ReadableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(net_.mu_) {
      return !net_.pipe(peer_, self_).empty() || net_.down_[peer_] || net_.down_[self_];
    }

    IoResult ReceiveLocked(absl::Span<const IoSlice> slices)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(net_.mu_) {
      // Like shutdown(): this rank's own end reads nothing once it is down.
      if (net_.down_[self_]) return IoResult{IoResult::kClosed};
      std::deque<char>& pipe = net_.pipe(peer_, self_);
      if (pipe.empty()) {
        return IoResult{net_.down_[peer_] ? IoResult::kClosed : IoResult::kWouldBlock};
      }
      size_t budget = std::min(pipe.size(), net_.max_per_call_);
      int64_t moved = 0;
      for (const IoSlice& s : slices) {
        const size_t n = std::min(budget, s.size);
        std::copy_n(pipe.begin(), n, static_cast<char*>(s.data));
        pipe.erase(pipe.begin(), pipe.begin() + static_cast<std::ptrdiff_t>(n));
        moved += static_cast<int64_t>(n);
        budget -= n;
        if (n < s.size) break;
      }
      net_.changed_.SignalAll();
      return IoResult{IoResult::kMoved, moved};
    }

    InMemoryNetwork& net_;
    const int self_;
    const int peer_;
  };

  class InMemoryTransport final : public Transport {
   public:
    InMemoryTransport(InMemoryNetwork& net, int rank) : net_(net), rank_(rank) {
      const int n = net.size_;
      for (int p = 0; p < n; ++p) {
        names_.push_back(absl::StrCat("worker:", p));
        const bool neighbour = p == (rank + 1) % n || p == (rank + n - 1) % n;
        links_.push_back(p != rank && (neighbour || net.fully_connected_)
                             ? std::make_unique<InMemoryLink>(net, rank, p)
                             : nullptr);
      }
    }
    ~InMemoryTransport() override { net_.Close(rank_); }

    int rank() const override { return rank_; }
    int size() const override { return net_.size_; }
    const std::string& name(int rank) const override { return names_[rank]; }
    bool fully_connected() const override { return net_.fully_connected_; }
    Link* SendLink(int peer) override { return links_[peer].get(); }
    Link* ReceiveLink(int peer) override { return links_[peer].get(); }

    absl::Status Wait(absl::Span<LinkWait> waits, absl::Time deadline) override {
      absl::MutexLock lock(&net_.mu_);
      while (true) {
        bool any = net_.down_[rank_];  // aborted: look again
        for (LinkWait& w : waits) {
          w.ready = static_cast<InMemoryLink*>(w.link)->ReadyLocked(w.direction);
          any = any || w.ready;
        }
        if (any) return absl::OkStatus();
        if (absl::Now() >= deadline) return absl::DeadlineExceededError("");
        net_.changed_.WaitWithDeadline(&net_.mu_, deadline);
      }
    }
    void Abort() override { net_.Close(rank_); }
    bool aborted() const override {
      absl::MutexLock lock(&net_.mu_);
      return net_.down_[rank_];
    }
    TransportStats stats() const override { return {}; }

   private:
    InMemoryNetwork& net_;
    const int rank_;
    std::vector<std::string> names_;
    std::vector<std::unique_ptr<InMemoryLink>> links_;
  };

  std::deque<char>& pipe(int from, int to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pipes_[from * size_ + to];
  }
  const std::deque<char>& pipe(int from, int to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pipes_[from * size_ + to];
  }

  const int size_;
  const size_t capacity_;
  const size_t max_per_call_;
  const bool fully_connected_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<std::deque<char>> pipes_ ABSL_GUARDED_BY(mu_);  // [from * size + to]
  std::vector<bool> down_ ABSL_GUARDED_BY(mu_);               // closed or aborted
};

}  // namespace distrain::collective_testing

#endif  // DISTRAIN_TESTS_UNIT_WORKER_COLLECTIVE_IN_MEMORY_TRANSPORT_H_

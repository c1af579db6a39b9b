#ifndef DISTRAIN_OPERATOR_KUBE_EXPECTATIONS_H_
#define DISTRAIN_OPERATOR_KUBE_EXPECTATIONS_H_

// Expectations: what a reconciler has asked the API server to create or
// delete for a job and not yet seen come back through its informer — the
// Kubernetes job controller's ControllerExpectations (+ UID tracking for
// deletions). It is what keeps a reconcile that runs before the informer has
// caught up from creating the same pod twice:
//
//   1. Before creating n pods: ExpectCreations(key, n). Before deleting pods:
//      ExpectDeletions(key, uids).
//   2. The informer's handlers call CreationObserved(key) for every pod ADDED,
//      and DeletionObserved(key, uid) when a pod is deleted (or marked for
//      deletion); each uid is counted once, however many events carry it.
//      A create that the API server refused will never be observed, so the
//      reconciler lowers the expectation itself (CreationObserved) on failure.
//   3. Reconcile only acts on the children when SatisfiedExpectations(key):
//      no record, everything expected observed, or the record is older than
//      the TTL (5 min) — so a lost watch event delays a job, never wedges it.
//   4. DeleteExpectations(key) when the job is gone.
//
// Ownership: keys are "namespace/name" job keys; the clock must outlive this.
// Thread-safety: every method may be called from any thread (the informer's
// and the workers').

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "operator/kube/clock.h"

namespace distrain::kube {

class Expectations {
 public:
  static constexpr absl::Duration kDefaultTtl = absl::Minutes(5);

  explicit Expectations(const Clock* clock = Clock::Real(), absl::Duration ttl = kDefaultTtl);

  // Sets (replaces) the expected creations of `key` and restarts its TTL.
  void ExpectCreations(const std::string& key, int n);
  // Sets the expected deletions of `key` to these pod UIDs (replacing any
  // earlier set) and restarts its TTL.
  void ExpectDeletions(const std::string& key, const std::vector<std::string>& uids);
  // Count-only deletions, for children without a known UID.
  void ExpectDeletions(const std::string& key, int n);

  void CreationObserved(const std::string& key);
  // Lowers the deletions of `key` once per expected uid; other uids, and a
  // uid seen before, change nothing. An empty uid lowers a count-only
  // expectation.
  void DeletionObserved(const std::string& key, const std::string& uid = "");

  bool SatisfiedExpectations(const std::string& key) const;
  void DeleteExpectations(const std::string& key);

  struct Pending {
    int creations = 0;
    int deletions = 0;
  };
  // What `key` still waits for (zeros when there is no record).
  Pending Get(const std::string& key) const;

 private:
  struct Record {
    int adds = 0;
    int dels = 0;  // count-only deletions
    absl::flat_hash_set<std::string> del_uids;
    absl::Time timestamp;
  };

  const Clock* const clock_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Record> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain::kube

#endif  // DISTRAIN_OPERATOR_KUBE_EXPECTATIONS_H_

#include "operator/kube/expectations.h"

#include "common/check.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"

namespace distrain::kube {

Expectations::Expectations(const Clock* clock, absl::Duration ttl) : clock_(clock), ttl_(ttl) {
  DISTRAIN_CHECK(clock_ != nullptr);
}

void Expectations::ExpectCreations(const std::string& key, int n) {
  DISTRAIN_CHECK_GE(n, 0);
  absl::MutexLock lock(&mu_);
  Record& r = records_[key];
  r.adds = n;
  r.timestamp = clock_->Now();
}

void Expectations::ExpectDeletions(const std::string& key, const std::vector<std::string>& uids) {
  absl::MutexLock lock(&mu_);
  Record& r = records_[key];
  r.del_uids = absl::flat_hash_set<std::string>(uids.begin(), uids.end());
  r.dels = 0;
  r.timestamp = clock_->Now();
}

void Expectations::ExpectDeletions(const std::string& key, int n) {
  DISTRAIN_CHECK_GE(n, 0);
  absl::MutexLock lock(&mu_);
  Record& r = records_[key];
  r.del_uids.clear();
  r.dels = n;
  r.timestamp = clock_->Now();
}

void Expectations::CreationObserved(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(key);
  // No record: an informer event the reconciler did not cause (a resync, a
  // create by an earlier operator instance): nothing to lower.
  if (it == records_.end()) return;
  if (it->second.adds > 0) --it->second.adds;
}

void Expectations::DeletionObserved(const std::string& key, const std::string& uid) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return;
  Record& r = it->second;
  if (!uid.empty() && r.del_uids.erase(uid) > 0) return;
  if (uid.empty() && r.dels > 0) --r.dels;
}

bool Expectations::SatisfiedExpectations(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return true;
  const Record& r = it->second;
  if (r.adds <= 0 && r.dels <= 0 && r.del_uids.empty()) return true;
  if (clock_->Now() - r.timestamp > ttl_) {
    spdlog::warn(
        "expectations of {} expired after {}s with {} creations and {} deletions unobserved; "
        "reconciling anyway (a watch event was probably lost)",
        key, absl::ToInt64Seconds(ttl_), r.adds, r.dels + static_cast<int>(r.del_uids.size()));
    return true;
  }
  return false;
}

void Expectations::DeleteExpectations(const std::string& key) {
  absl::MutexLock lock(&mu_);
  records_.erase(key);
}

Expectations::Pending Expectations::Get(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return {};
  return {it->second.adds, it->second.dels + static_cast<int>(it->second.del_uids.size())};
}

}  // namespace distrain::kube

#include "worker/collective/store.h"

#include "absl/strings/str_cat.h"

namespace distrain {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return values_.count(key) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "key '", key, "' did not appear in the store within ", absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

}  // namespace distrain

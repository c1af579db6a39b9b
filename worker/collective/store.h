#ifndef DISTRAIN_WORKER_COLLECTIVE_STORE_H_
#define DISTRAIN_WORKER_COLLECTIVE_STORE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace distrain {

// Key-value store that bootstraps collectives (gloo's Store): ranks publish
// their listening addresses and read their peers'. Across processes it is
// the coordination service (worker/coordination/coordination_client.h);
// for ranks-as-threads tests it is InMemoryStore. Implementations are
// thread-safe.
class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists; DeadlineExceeded naming the key after `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

class InMemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_STORE_H_

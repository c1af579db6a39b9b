#ifndef DISTRAIN_WORKER_COORDINATION_TASK_REF_H_
#define DISTRAIN_WORKER_COORDINATION_TASK_REF_H_

// Conversions between TaskId (common/cluster_spec.h) and the wire TaskRef,
// and the "chief:0, worker:1" lists that coordination errors print.
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/cluster_spec.h"
#include "distrain/v1/coordination.pb.h"

namespace distrain {

inline v1::TaskRef ToTaskRef(const TaskId& task) {
  v1::TaskRef ref;
  ref.set_type(task.type);
  ref.set_index(task.index);
  return ref;
}

inline TaskId FromTaskRef(const v1::TaskRef& ref) { return TaskId{ref.type(), ref.index()}; }

inline std::string TaskList(const std::vector<TaskId>& tasks) {
  if (tasks.empty()) return "none";
  return absl::StrJoin(tasks, ", ",
                       [](std::string* out, const TaskId& t) { out->append(t.ToString()); });
}

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COORDINATION_TASK_REF_H_

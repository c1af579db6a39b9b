#ifndef DISTRAIN_OPERATOR_CONTROLLER_FINAL_PROGRESS_H_
#define DISTRAIN_OPERATOR_CONTROLLER_FINAL_PROGRESS_H_

// A finished job's status.progress: the chief's own last figures, not
// whatever the last 5 s scrape of its /metrics happened to see
// (docs/architecture.md §7, "Progress").
//
// Why the termination message: by the time the operator sees the master pod
// Succeeded its process is gone, so one more scrape has nothing to ask, and
// keeping the process alive for a scrape would hold the pod's resources for
// a race the operator could still lose. Instead the worker hands its final
// figures to the kubelet, which keeps them with the pod:
//   1. The operator sets DISTRAIN_TERMINATION_MESSAGE_PATH in every pod to
//      its main container's terminationMessagePath (the API server's default
//      /dev/termination-log when the template sets none).
//   2. The master's Trainer, after its final evaluation and checkpoint,
//      writes there one JSON object (worker/trainer.h, "termination message"):
//        {"step": 1500, "totalSteps": 1500, "loss": 0.21,
//         "examplesPerSecond": 5120.3, "accuracy": 0.97}
//      (accuracy: the final evaluation's, when the job has eval data).
//   3. The kubelet copies the file into the terminated container state
//      (status.containerStatuses[].state.terminated.message) in the same
//      status update that makes the pod Succeeded.
//   4. The reconcile that marks the job Succeeded writes these figures into
//      status.progress together with the Succeeded condition, in one status
//      write. Without a message (a TensorFlow image, an older worker) step is
//      set to totalSteps, which success implies, and the other fields stay as
//      last scraped.
// The progress reporter only patches jobs it saw running, with the job's
// resourceVersion as a precondition, so a scrape that was in flight when the
// job finished cannot overwrite these figures.
//
// Pure functions; thread-safe.

#include <optional>
#include <string>

#include "common/job_config.h"
#include "nlohmann/json.hpp"
#include "operator/controller/plan.h"

namespace distrain::controller {

inline constexpr char kTerminationMessageEnv[] = "DISTRAIN_TERMINATION_MESSAGE_PATH";
inline constexpr char kDefaultTerminationMessagePath[] = "/dev/termination-log";

// Step 1: the main container's terminationMessagePath, or the default.
std::string TerminationMessagePath(const nlohmann::json& main_container);

// The figures in a pod's main-container termination message: an object with
// the fields of status.progress it has (step, totalSteps, loss, accuracy,
// examplesPerSecond; numbers, others dropped); nullopt when the pod has no
// message or it is not such an object.
std::optional<nlohmann::json> FinalFiguresOf(const nlohmann::json& pod);

// Step 4: status.progress for a job that has just succeeded, from `current`
// and the termination message of its master pod among `pods` (the pod
// labelled distrain.io/job-role=master). `total_steps` is spec.training.steps.
nlohmann::json FinalProgress(const nlohmann::json& current, const std::vector<ObjectRef>& pods,
                             int64_t total_steps);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_FINAL_PROGRESS_H_

#ifndef DISTRAIN_OPERATOR_CONTROLLER_CONDITIONS_H_
#define DISTRAIN_OPERATOR_CONTROLLER_CONDITIONS_H_

// status.conditions with metav1.Condition semantics (apimachinery's
// meta.SetStatusCondition): a condition whose status changes gets
// lastTransitionTime = now; one whose status stays keeps its
// lastTransitionTime and takes the new reason, message and
// observedGeneration. A condition that is absent and would be False is not
// added: "not yet" needs no entry (Running appears once the job first runs),
// unless `record_false` asks for it (a False that explains why the job waits,
// like Created False PodGroupCRDMissing).
//
// Pure functions; thread-safe.

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "operator/api/distributed_training_job.h"

namespace distrain::controller {

// Returns whether the condition's status changed (a transition, which gets an
// event); reason/message-only updates return false.
bool SetCondition(api::JobStatus* status, const std::string& type, bool value,
                  const std::string& reason, const std::string& message, int64_t generation,
                  absl::Time now, bool record_false = false);

// status.state, the printer column: the type of the most decisive condition
// that is True (Failed, Succeeded, Suspended, Restarting, Queued, Running,
// Created), or "" when none is.
std::string StateOf(const api::JobStatus& status);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_CONDITIONS_H_

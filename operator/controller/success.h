#ifndef DISTRAIN_OPERATOR_CONTROLLER_SUCCESS_H_
#define DISTRAIN_OPERATOR_CONTROLLER_SUCCESS_H_

// Success policy (spec.successPolicy): when the job has succeeded.
//   Default     the Chief's pod succeeded, or Worker 0's when there is no Chief
//               (the replica that coordinates and writes the final checkpoint);
//   AllWorkers  every Worker's pod succeeded (the Chief's is not required).
// The Evaluator never decides: it evaluates beside training and may end
// before or after it. PS pods serve until they are cleaned up.
//
// Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "operator/controller/observed.h"

namespace distrain::controller {

// The message of the Succeeded condition when the job has succeeded
// ("pod mnist-chief-0 succeeded"), else nullopt. Terminating pods do not count.
std::optional<std::string> SucceededBecause(const JobConfig& config,
                                            const std::vector<ObservedPod>& pods);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_SUCCESS_H_

#ifndef DISTRAIN_OPERATOR_CONTROLLER_RESTART_H_
#define DISTRAIN_OPERATOR_CONTROLLER_RESTART_H_

// Restart policy: which ended pods are restarted, and which pods restart
// with them.
//
// Restarts are the operator's: every pod runs with restartPolicy Never and a
// pod to restart is deleted and created again under the same name (pods.h).
// That way each restart is counted in status.restartCount and
// replicaStatuses.<type>.restarts, runPolicy.backoffLimit bounds them, and a
// group of pods can restart as one generation.
//
// Per replica type (spec.replicaSpecs.<type>.restartPolicy), for a pod that
// failed:
//   Never      never restarted;
//   OnFailure  always restarted;
//   Always     always restarted; and a PS or Evaluator pod that exits 0 while
//              the job runs is restarted too (they serve the others and have
//              no reason to end on their own). A Chief or Worker exiting 0 is
//              training that finished, which is how a job ends: success.h
//              decides, nothing is restarted;
//   ExitCode   restarted when the main container's exit code is 128-255 (a
//              signal: 137 is SIGKILL, e.g. OOM or a lost node; common/
//              exit_codes.h's 170/171 say a peer was lost) or when the pod
//              failed without the container exiting (evicted, node lost);
//              1-127 are permanent: the job or its data is wrong and a
//              restart would fail the same way.
//
// Who restarts with whom (strategy-aware), once a pod must restart:
//   * MultiWorkerMirrored with runPolicy.recoveryPolicy InPlace (the
//     default): a Worker that is not the master (the coordinator) is
//     replaced alone. Its survivors keep running and wait for it; the
//     replacement rejoins their group at the next membership generation and
//     receives the newest state from them (worker/strategy/
//     multi_worker_mirrored.h, Recover). The master hosts the rendezvous, so
//     losing it restarts the group as below; so does a worker that exited
//     143: SIGTERM makes every process of the group stop after the same step
//     (preemption), so the others are stopping with it;
//   * other synchronous strategies (and MultiWorkerMirrored with
//     RestartGroup, or its master lost): every Chief and Worker pod restarts,
//     as one new generation counted as one restart. A collective ring cannot
//     lose a member: the survivors' next all-reduce would hang or fail. All
//     of them resume from the chief's last checkpoint;
//   * ParameterServer: a Worker is replaced alone (workers are independent;
//     the coordinator re-dispatches its steps). A PS holds a shard of the
//     variables in memory, so losing one loses state: the chief (the
//     coordinator) sees the PS RPCs fail and exits with a retryable code
//     (kExitPeerLost), and every Chief, Worker and PS pod restarts as one
//     generation, restoring from the checkpoint. A Chief failure restarts the
//     same group, for the same reason seen from the other side: the PS would
//     keep variables the restarted coordinator then overwrites from its
//     checkpoint, so they restart with it. Handling a PS failure by restarting
//     the group directly (rather than waiting for the chief's exit) is what
//     keeps a PS failure and the chief's resulting exit from counting twice;
//   * an Evaluator restarts alone under every strategy: it is not part of
//     the training cluster (common/cluster_spec.h).
// A permanent Evaluator failure does not fail the job (the evaluator never
// decides the outcome, success.h); a permanent failure of any other replica
// fails it.
//
// Pure functions; thread-safe.

#include <vector>

#include "common/job_config.h"
#include "operator/controller/observed.h"

namespace distrain::controller {

// Whether a Failed pod of a replica with `policy` is restarted.
bool RestartsAfterFailure(RestartPolicy policy, const ObservedPod& pod);

// Whether a pod of `type` that exited 0 is restarted (Always on PS / Evaluator).
bool RestartsAfterSuccess(RestartPolicy policy, ReplicaType type);

// The replica types restarted together when `pod` of the job must restart;
// empty: the pod is replaced alone.
std::vector<ReplicaType> RestartGroup(const JobConfig& config, const ObservedPod& pod);

struct RestartDecision {
  // Failed pods that are not restarted and end the job (not Evaluators).
  std::vector<const ObservedPod*> fatal;
  // Failed Evaluator pods that are not restarted; the job goes on.
  std::vector<const ObservedPod*> evaluator_lost;
  // A generation restart: every pod of these types is deleted and created
  // again. `group_causes` are the pods that set it off.
  std::vector<ReplicaType> group_types;
  std::vector<const ObservedPod*> group_causes;
  // Pods replaced alone, each counted as one restart.
  std::vector<const ObservedPod*> individual;

  // What the decision adds to status.restartCount.
  int restarts() const {
    return (group_types.empty() ? 0 : 1) + static_cast<int>(individual.size());
  }
};

// Decides from the pods observed (terminating pods are being handled already
// and are ignored). `config` carries the resolved strategy. Only pods of
// replicas the spec still asks for are considered.
RestartDecision DecideRestarts(const JobConfig& config, const std::vector<ObservedPod>& pods);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_RESTART_H_

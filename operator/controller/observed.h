#ifndef DISTRAIN_OPERATOR_CONTROLLER_OBSERVED_H_
#define DISTRAIN_OPERATOR_CONTROLLER_OBSERVED_H_

// What the controller reads from an observed pod (as the API returns it):
// which replica it is, its phase, and how its main container ended.
//
// Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "operator/controller/plan.h"
#include "operator/controller/pods.h"

namespace distrain::controller {

struct ObservedPod {
  std::string name;
  std::string uid;
  ReplicaId id;
  std::string phase;         // Pending, Running, Succeeded, Failed, Unknown ("" before the kubelet)
  bool terminating = false;  // metadata.deletionTimestamp is set
  // The main container's exit code once it has terminated; nullopt when the
  // pod failed without it exiting (evicted, node lost, never started).
  std::optional<int> exit_code;
  // Why: the container's terminated reason ("OOMKilled", "Error") or the
  // pod's status.reason ("Evicted"); may be empty.
  std::string reason;
  // What the process said when it gave up: the "error" of a distrain-worker's
  // termination message ({"error": ..., "exitCode": ...}, worker/main.cc);
  // empty for other images and for success.
  std::string error;
  std::string cluster_hash;  // annotation kClusterHashAnnotation; "" when absent
  bool reports_progress = false;  // annotation kReportsProgressAnnotation is "true"
  // When its process started: the main container's state.running.startedAt,
  // else the pod's status.startTime; nullopt before either is known. The
  // stall clock of a new pod starts here (stall.h).
  std::optional<absl::Time> started;

  bool active() const { return !terminating && phase != "Succeeded" && phase != "Failed"; }
  bool succeeded() const { return !terminating && phase == "Succeeded"; }
  bool failed() const { return !terminating && phase == "Failed"; }
  bool running() const { return !terminating && phase == "Running"; }
  // "exited with code 137 (OOMKilled)", "failed: Evicted",
  // "exited with code 5 (Error): spec.training...: ...", ...
  std::string Describe() const;
};

// The main container's status (the one named like the spec's main
// container), or null before the kubelet reports it.
const nlohmann::json* MainContainerStatus(const nlohmann::json& pod);

// The pod's phase as the operator counts it: status.phase, except that a
// restartPolicy Never pod (every pod the operator makes) whose containers
// have all exited is over already: Succeeded when its main container exited
// 0, else Failed. The kubelet reports that phase only after tearing down the
// pod's sandbox, about 1.5 s later on a real node; acting on the containers
// is that much of a recovery saved, and the master's final figures
// (final_progress.h) count from the same moment. "" before the kubelet.
std::string EffectivePhase(const nlohmann::json& pod);

// nullopt when the object is not a replica pod of job `job_name` (labels
// missing or malformed, or another controller owns it).
std::optional<ObservedPod> ParseObservedPod(const nlohmann::json& pod, const std::string& job_name,
                                            const std::string& job_uid);

std::vector<ObservedPod> ParseObservedPods(const std::vector<ObjectRef>& pods,
                                           const std::string& job_name, const std::string& job_uid);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_OBSERVED_H_

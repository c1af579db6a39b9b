#ifndef DISTRAIN_OPERATOR_CONTROLLER_PROBES_H_
#define DISTRAIN_OPERATOR_CONTROLLER_PROBES_H_

// The kubelet's probes of a training pod: startup, liveness and readiness,
// all an httpGet of /healthz on the metrics port (docs/architecture.md §6b,
// "Stalls"). distrain-worker's /healthz fails once training stalls
// (worker/progress_watchdog.h); a liveness failure makes the kubelet kill the
// container, the pod (restartPolicy Never) ends Failed, and the operator
// restarts it as its restartPolicy says (restart.h), as for any failure.
//
// Timings, chosen so that no healthy job is killed while it starts up:
//   startupProbe    period 10 s, timeout 5 s, failureThreshold 30: up to
//                   5 min for the process to open its metrics port (a slow
//                   node, a cold page cache). Liveness waits for it. Once the
//                   port is open /healthz itself answers OK through start-up
//                   for max(progress deadline, 10 min) (rendezvous, data
//                   loading, restore: common/progress_deadline.h), so the
//                   probes need no guess of how long start-up takes: the
//                   worker knows when it has finished.
//   livenessProbe   period 10 s, timeout 5 s, failureThreshold 3: killed
//                   about 30 s after /healthz first says stalled.
//   readinessProbe  period 10 s, timeout 5 s, failureThreshold 3: a stalled
//                   pod shows not Ready. (The headless Services publish
//                   not-ready addresses, so readiness never hides a peer.)
// The timeout is generous because the metrics server's threads share the
// cores with training; a missed answer under load must not count as a stall.
//
// Which pods: those whose main container runs distrain-worker, i.e. its
// command's first word is distrain-worker (any directory), or it sets no
// command and its image is the operator's worker image (the same repository,
// any tag). A TensorFlow image (and so every TPU pod) serves no /healthz and
// gets none. A probe of a kind the template's container already has is kept
// as the template wrote it: a template's own probes win.
//
// Pure functions; thread-safe.

#include "nlohmann/json.hpp"
#include "operator/controller/plan.h"

namespace distrain::controller {

inline constexpr char kHealthPath[] = "/healthz";

// Whether `container` runs distrain-worker (see above).
bool RunsDistrainWorker(const nlohmann::json& container, const ControllerOptions& options);

// Adds the probes of the file comment that `main` lacks, when it runs
// distrain-worker; `metrics_port` is its DISTRAIN_METRICS_PORT.
void AddHealthProbes(nlohmann::json* main, int metrics_port, const ControllerOptions& options);

}  // namespace distrain::controller

#endif  // DISTRAIN_OPERATOR_CONTROLLER_PROBES_H_

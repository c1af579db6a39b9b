#!/usr/bin/env python3
"""Recovery time from a lost worker (docs/architecture.md §6b): MultiWorkerMirrored
in-place recovery vs restarting every process from the last checkpoint (what
TensorFlow documents), the same job in the same run.

The job is examples/multi-worker-mirrored.yaml's (chief + 3 workers, MLP
784-256-128-10, Adam, checkpoint every 100 steps) with a global batch of 120
(the example's 128 does not divide among 3: elastic needs it to), run as
distrain-worker processes on 127.0.0.1 with the job's credentials, the way
`distrain run` and the operator start them. Once training is under way
(--kill-after steps done) worker:2 gets SIGKILL and is started again at once,
as the operator recreates a pod (on Kubernetes the pod's own start adds the
same time to both modes):

  in place     runPolicy.recoveryPolicy InPlace (the default): the survivors
               wait, the replacement rejoins, the newest state is broadcast.
  elastic      InPlace with spec.elasticPolicy {minReplicas: 2, maxReplicas:
               3}: the survivors go on at once as a group of 3 (the global
               batch re-split), and the replacement grows it back to 4 when
               it has started.
  restart-all  recoveryPolicy RestartGroup: the survivors exit 170; every
               process is started again once all have exited, restoring the
               chief's last checkpoint.

Figure: kill -> the first step completed after it (the chief's parameter
checksum file, which gains a line after every step; in place, a line for a
step past the one the group resumed at), and kill -> back at the step the job
had reached (restart-all redoes the steps since the last checkpoint). Also:
the steps redone. Modes alternate round by round; medians.
Both modes restart processes at once here; on Kubernetes restart-all also
waits for every old pod to terminate and every new one to start.

With --kube the same rounds also run on Kubernetes: the real node
(scripts/node.sh, which must be up; root), the worker image imported, the
operator as a local process, the example applied with each policy, worker:2's
container SIGKILLed through containerd. There the operator replaces the pod
(in place) or the whole group (restart-all), and the kubelet starts them; the
figures come from the chief's log (logEverySteps 1, millisecond timestamps)
against the kill's wall-clock time.

  bench/recovery_time.py [--rounds 3] [--kill-after 150] [--kube] [--no-record]

Targets (issue 15): in place <= 1/5 of restart-all, and <= 5 s.
Global batch 120 since the elastic mode was added (records before: 128).
Appends one JSON line to bench/records/recovery_time.jsonl unless --no-record.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BUILD, ROOT, append_record, cpu_info, fail, free_ports, job_credentials, uptime  # noqa: E402

WORKER = os.path.join(BUILD, "worker", "distrain-worker")


MODES = ["InPlace", "Elastic", "RestartGroup"]


def job_yaml(mode, steps):
    """The example's spec with more steps, a global batch of 120 and the mode's policy."""
    with open(os.path.join(ROOT, "examples", "multi-worker-mirrored.yaml")) as f:
        text = f.read()
    text = re.sub(r"\n    steps: \d+", f"\n    steps: {steps}", text)
    text = re.sub(r"\n    globalBatchSize: \d+", "\n    globalBatchSize: 120", text)
    if mode == "Elastic":
        return text + "  runPolicy: {recoveryPolicy: InPlace}\n  elasticPolicy: {minReplicas: 2, maxReplicas: 3}\n"
    return text + f"  runPolicy: {{recoveryPolicy: {mode}}}\n"


class Job:
    """Chief + 3 workers started here with their own TF_CONFIG."""

    def __init__(self, workdir, policy, steps):
        self.dir = workdir
        self.config = os.path.join(workdir, "job.yaml")
        with open(self.config, "w") as f:
            f.write(job_yaml(policy, steps))
        ports = free_ports(8)
        addrs = [f"127.0.0.1:{p}" for p in ports[:4]]
        self.metrics_ports = ports[4:]
        cluster = {"chief": addrs[:1], "worker": addrs[1:]}
        self.tasks = [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
        self.creds = job_credentials(self.tasks, os.path.join(workdir, "creds"))
        self.tf_configs = [json.dumps({"cluster": cluster, "task": {"type": t, "index": i}})
                           for t, i in self.tasks]
        self.procs = [None] * 4
        self.logs = [None] * 4

    def checksums(self):
        return os.path.join(self.dir, "checksums.chief-0.txt")

    def start(self, i):
        t, idx = self.tasks[i]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
                   DISTRAIN_CREDENTIALS_DIR=os.path.join(self.creds, f"{t}-{idx}"),
                   DISTRAIN_PARAM_CHECKSUM_FILE=os.path.join(self.dir, "checksums.{task}.txt"))
        ckpt = os.path.join(self.dir, "ckpt" if i == 0 else f"ckpt-{t}-{idx}")
        log = open(os.path.join(self.dir, f"{t}-{idx}.log"), "a")
        self.logs[i] = log
        self.procs[i] = subprocess.Popen(
            [WORKER, "--config", self.config, "--tf-config", self.tf_configs[i],
             "--checkpoint-dir", ckpt, "--metrics-port", str(self.metrics_ports[i])],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_text(self, i):
        t, idx = self.tasks[i]
        with open(os.path.join(self.dir, f"{t}-{idx}.log")) as f:
            return f.read()

    def kill_all(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            if p is not None:
                p.wait()


def checksum_steps(path):
    try:
        with open(path) as f:
            return [int(line.split()[0]) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    fail(f"recovery_time: {what} did not happen within {timeout:.0f} s")


def one_round(policy, kill_after, steps):
    workdir = tempfile.mkdtemp(prefix=f"recovery_{policy}_")
    if True:
        job = Job(workdir, policy, steps)
        try:
            for i in range(4):
                job.start(i)
            path = job.checksums()
            wait_for(lambda: len(checksum_steps(path)) >= kill_after, 300, f"{kill_after} steps")
            before = checksum_steps(path)
            done_before = before[-1]
            lines_before = len(before)
            killed_at = time.monotonic()
            os.killpg(job.procs[3].pid, signal.SIGKILL)
            job.procs[3].wait()
            if policy in ("InPlace", "Elastic"):
                job.start(3)  # the replacement pod

                def resumed():
                    m = re.findall(r"recovered in place in [^:]+: membership generation \d+, "
                                   r"resuming at step (\d+)", job.log_text(0))
                    if not m:
                        return None
                    at = int(m[-1])
                    later = [s for s in checksum_steps(path)[lines_before:] if s > at]
                    return (at, later[0]) if later else None

                at, first = wait_for(resumed, 120, "in-place recovery")
            else:
                # Every process exits (170); then all are started again, as the
                # operator recreates the whole generation.
                for i in range(3):
                    wait_for(lambda i=i: job.procs[i].poll() is not None, 120, f"process {i} exiting")
                    if job.procs[i].returncode != 170:
                        fail(f"recovery_time: {job.tasks[i]} exited {job.procs[i].returncode}, "
                             f"want 170:\n{job.log_text(i)[-3000:]}")
                for i in range(4):
                    job.start(i)
                m = wait_for(lambda: re.search(r"resumed from checkpoint step (\d+)", job.log_text(0)),
                             120, "restore")
                at = int(m.group(1))
                wait_for(lambda: any(s > at for s in checksum_steps(path)[lines_before:]), 120,
                         "a step after the restart")
            seconds = time.monotonic() - killed_at
            redone = max(0, done_before - at)
            # Back where it was: the first step past the last one done before the kill.
            wait_for(lambda: any(s > done_before for s in checksum_steps(path)[lines_before:]), 300,
                     "a step past the one reached before the kill")
            regained = time.monotonic() - killed_at
            # The job finishes: recovery left a working group.
            for i in range(4):
                wait_for(lambda i=i: job.procs[i].poll() is not None, 600, f"process {i} finishing")
                if job.procs[i].returncode != 0:
                    fail(f"recovery_time: {policy}: {job.tasks[i]} exited {job.procs[i].returncode}:\n"
                         f"{job.log_text(i)[-3000:]}")
            shutil.rmtree(workdir, ignore_errors=True)  # kept when the round fails
            return seconds, regained, redone
        finally:
            job.kill_all()


# --- Kubernetes rounds -------------------------------------------------------

NODE_SH = os.path.join(ROOT, "scripts", "node.sh")
KUBE_TAG = "bench"
STEP_LINE = re.compile(r"^(\S+Z) \w+ +step (\d+)/")


def log_time(stamp):
    """2026-11-28T12:12:03.319Z -> seconds since the epoch."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


class Kube:
    """The real node's cluster, a namespace of this run's and an operator process."""

    def __init__(self):
        env = subprocess.run([NODE_SH, "env"], capture_output=True, text=True)
        m = re.search(r"KUBECONFIG=(\S+) DISTRAIN_KUBE_BINDIR=(\S+)", env.stdout)
        if env.returncode != 0 or not m or subprocess.run([NODE_SH, "status"], capture_output=True).returncode:
            fail("recovery_time --kube: the node is not up (sudo scripts/node.sh up)")
        self.env = dict(os.environ, KUBECONFIG=m.group(1))
        self.kubectl = os.path.join(m.group(2), "kubectl")
        subprocess.run([NODE_SH, "load-images", "--build-dir", BUILD, "--tag", KUBE_TAG], check=True,
                       stdout=subprocess.DEVNULL)
        # The CRD as the chart ships it (a fresh node's API server has none).
        self.k("apply", "--server-side", "-f", os.path.join(ROOT, "charts", "distrain", "crds"), ns=False)
        self.ns = f"bench-recovery-{os.getpid()}"
        self.k("create", "namespace", self.ns, ns=False)
        self.dir = tempfile.mkdtemp(prefix="recovery_kube_")
        self.operator = subprocess.Popen(
            [os.path.join(BUILD, "operator", "distrain-operator"), "--kubeconfig", self.env["KUBECONFIG"],
             "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--namespaces", self.ns,
             "--worker-image", f"localhost/distrain/worker:{KUBE_TAG}"],
            env=self.env, stdout=open(os.path.join(self.dir, "operator.log"), "w"), stderr=subprocess.STDOUT)

    def k(self, *args, ns=True, check=True, stdin=None):
        cmd = [self.kubectl] + (["-n", self.ns] if ns else []) + list(args)
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, input=stdin)
        if check and r.returncode != 0:
            fail(f"recovery_time --kube: {' '.join(cmd[1:])}: {r.stderr.strip()}")
        return r.stdout

    def close(self):
        self.operator.terminate()
        self.operator.wait()
        self.k("delete", "namespace", self.ns, "--wait=false", ns=False, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pod(self, name, field):
        return self.k("get", "pod", name, "-o", f"jsonpath={field}", check=False).strip()

    def log(self, pod):
        return self.k("logs", pod, check=False)


def kube_round(kube, policy, kill_after, steps):
    name = f"mwms-{policy.lower()}"
    spec = job_yaml(policy, steps).replace("name: multi-worker-mirrored", f"name: {name}", 1)
    spec = re.sub(r"\n    logEverySteps: \d+", "\n    logEverySteps: 1", spec)
    kube.k("apply", "-f", "-", stdin=spec)
    chief = f"{name}-chief-0"

    def steps_in(text):
        return [(int(m.group(2)), log_time(m.group(1)))
                for m in (STEP_LINE.match(line) for line in text.splitlines()) if m]

    wait_for(lambda: any(n >= kill_after for n, _ in steps_in(kube.log(chief))), 300, f"{kill_after} steps")
    old_uid = kube.pod(chief, "{.metadata.uid}")
    cid = kube.pod(f"{name}-worker-2", "{.status.containerStatuses[0].containerID}").replace("containerd://", "")
    killed_at = time.time()
    subprocess.run([NODE_SH, "ctr", "tasks", "kill", "-s", "SIGKILL", cid], check=True)

    # The last step the group completed: what the chief logged before it saw
    # worker:2 fail (its log, read before a restart-all deletes its pod).
    def failure_seen():
        text = kube.log(chief)
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if re.search(r"peer worker:2 .*failed", line):
                return [n for n, _ in steps_in("\n".join(lines[:i]))] or [0]
        return None
    done_before = max(wait_for(failure_seen, 60, "the chief seeing worker:2 fail"))
    if policy in ("InPlace", "Elastic"):
        def resumed():
            text = kube.log(chief)
            m = re.findall(r"recovered in place in [^:]+: membership generation \d+, resuming at step (\d+)", text)
            if not m:
                return None
            at = int(m[-1])
            later = [(n, t) for n, t in steps_in(text) if t > killed_at and n > at]
            return (at, later) if later else None
    else:
        def resumed():
            if kube.pod(chief, "{.metadata.uid}") in ("", old_uid):
                return None
            text = kube.log(chief)
            m = re.search(r"resumed from checkpoint step (\d+)", text)
            later = [(n, t) for n, t in steps_in(text) if m and n > int(m.group(1))]
            return (int(m.group(1)), later) if later else None
    at, later = wait_for(resumed, 180, f"{policy}: a step after the kill")
    seconds = later[0][1] - killed_at
    back = wait_for(lambda: [t for n, t in steps_in(kube.log(chief)) if t > killed_at and n > done_before],
                    180, f"{policy}: a step past {done_before}")
    regained = back[0] - killed_at
    kube.k("delete", "dtj", name, "--wait=true", "--timeout=120s")
    wait_for(lambda: not kube.k("get", "pods", "-l", f"distrain.io/job-name={name}", "-o", "name", check=False).strip(),
             120, "the job's pods to go")
    return seconds, regained, max(0, done_before - at)


def run_rounds(label, rounds, round_fn):
    results = {mode: [] for mode in MODES}
    for r in range(rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]  # each mode first once in 3
        for policy in order:
            seconds, regained, redone = round_fn(policy)
            results[policy].append((seconds, regained, redone))
            print(f"{label} round {r + 1} {policy:12s} kill -> next step {seconds:6.2f} s, -> back at "
                  f"the step reached {regained:6.2f} s, steps redone {redone}")
    return results


def summarise(label, results, prefix=""):
    def median(policy, i):
        return statistics.median(x[i] for x in results[policy])

    in_place, restart = median("InPlace", 0), median("RestartGroup", 0)
    in_place_back, restart_back = median("InPlace", 1), median("RestartGroup", 1)
    elastic, elastic_back = median("Elastic", 0), median("Elastic", 1)
    print(f"{label}: kill -> next step: in place {in_place:.2f} s, elastic {elastic:.2f} s, restart-all "
          f"{restart:.2f} s, ratios {in_place / restart:.3f} and {elastic / restart:.3f} "
          f"(target <= 0.2 and <= 5 s)")
    print(f"{label}: kill -> back at the step reached: in place {in_place_back:.2f} s, elastic "
          f"{elastic_back:.2f} s, restart-all {restart_back:.2f} s, ratios "
          f"{in_place_back / restart_back:.3f} and {elastic_back / restart_back:.3f}")
    return {f"{prefix}elastic_s": round(elastic, 3), f"{prefix}elastic_back_s": round(elastic_back, 3),
            f"{prefix}ratio_elastic_over_restart_all": round(elastic / restart, 3),
            f"{prefix}ratio_elastic_back": round(elastic_back / restart_back, 3),
            f"{prefix}elastic_steps_redone": [x[2] for x in results["Elastic"]],
            f"{prefix}in_place_s": round(in_place, 3), f"{prefix}restart_all_s": round(restart, 3),
            f"{prefix}ratio_in_place_over_restart_all": round(in_place / restart, 3),
            f"{prefix}in_place_back_s": round(in_place_back, 3),
            f"{prefix}restart_all_back_s": round(restart_back, 3),
            f"{prefix}ratio_back": round(in_place_back / restart_back, 3),
            f"{prefix}in_place_steps_redone": [x[2] for x in results["InPlace"]],
            f"{prefix}restart_all_steps_redone": [x[2] for x in results["RestartGroup"]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=150,
                    help="steps done before the kill (the example checkpoints every 100)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kube", action="store_true",
                    help="also on Kubernetes: the real node (scripts/node.sh up, root)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(WORKER):
        fail(f"{WORKER} is missing: build it (scripts/build.sh)")
    up = uptime()
    print(f"# {up}\n# {cpu_info()}")
    results = run_rounds("local", args.rounds, lambda p: one_round(p, args.kill_after, args.steps))
    figures = summarise("local", results)
    figures.update({"rounds": args.rounds, "kill_after_steps": args.kill_after})
    if args.kube:
        kube = Kube()
        try:
            results = run_rounds("kube", args.rounds, lambda p: kube_round(kube, p, args.kill_after, args.steps))
        finally:
            kube.close()
        figures.update(summarise("kube", results, "kube_"))
    if not args.no_record:
        append_record("recovery_time", figures, up)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Recovery time from a lost worker (docs/architecture.md §6b): MultiWorkerMirrored
in-place recovery vs restarting every process from the last checkpoint (what
TensorFlow documents), the same job in the same run.

The job is examples/multi-worker-mirrored.yaml's (chief + 3 workers, MLP
784-256-128-10, Adam, global batch 128, checkpoint every 100 steps), run as
distrain-worker processes on 127.0.0.1 with the job's credentials, the way
`distrain run` and the operator start them. Once training is under way
(--kill-after steps done) worker:2 gets SIGKILL and is started again at once,
as the operator recreates a pod (on Kubernetes the pod's own start adds the
same time to both modes):

  in place     runPolicy.recoveryPolicy InPlace (the default): the survivors
               wait, the replacement rejoins, the newest state is broadcast.
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

  bench/recovery_time.py [--rounds 3] [--kill-after 150] [--no-record]

Targets (issue 15): in place <= 1/5 of restart-all, and <= 5 s.
Appends one JSON line to bench/records/recovery_time.jsonl unless --no-record.
"""
import argparse
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


def job_yaml(policy, steps):
    """The example's spec with more steps and a per-step log off; the policy set."""
    with open(os.path.join(ROOT, "examples", "multi-worker-mirrored.yaml")) as f:
        text = f.read()
    text = re.sub(r"\n    steps: \d+", f"\n    steps: {steps}", text)
    return text + f"  runPolicy: {{recoveryPolicy: {policy}}}\n"


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
            if policy == "InPlace":
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=150,
                    help="steps done before the kill (the example checkpoints every 100)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(WORKER):
        fail(f"{WORKER} is missing: build it (scripts/build.sh)")
    up = uptime()
    print(f"# {up}\n# {cpu_info()}")
    results = {"InPlace": [], "RestartGroup": []}
    for r in range(args.rounds):
        order = ["InPlace", "RestartGroup"] if r % 2 == 0 else ["RestartGroup", "InPlace"]
        for policy in order:
            seconds, regained, redone = one_round(policy, args.kill_after, args.steps)
            results[policy].append((seconds, regained, redone))
            print(f"round {r + 1} {policy:12s} kill -> next step {seconds:6.2f} s, -> back at the "
                  f"step reached {regained:6.2f} s, steps redone {redone}")

    def median(policy, i):
        return statistics.median(x[i] for x in results[policy])

    in_place, restart = median("InPlace", 0), median("RestartGroup", 0)
    in_place_back, restart_back = median("InPlace", 1), median("RestartGroup", 1)
    figures = {"in_place_s": round(in_place, 3), "restart_all_s": round(restart, 3),
               "ratio_in_place_over_restart_all": round(in_place / restart, 3),
               "in_place_back_s": round(in_place_back, 3),
               "restart_all_back_s": round(restart_back, 3),
               "ratio_back": round(in_place_back / restart_back, 3),
               "in_place_steps_redone": [x[2] for x in results["InPlace"]],
               "restart_all_steps_redone": [x[2] for x in results["RestartGroup"]],
               "rounds": args.rounds, "kill_after_steps": args.kill_after}
    print(f"kill -> next step: in place {in_place:.2f} s, restart-all {restart:.2f} s, ratio "
          f"{in_place / restart:.3f} (target <= 0.2 and <= 5 s)")
    print(f"kill -> back at the step reached: in place {in_place_back:.2f} s, restart-all "
          f"{restart_back:.2f} s, ratio {in_place_back / restart_back:.3f}")
    if not args.no_record:
        append_record("recovery_time", figures, up)


if __name__ == "__main__":
    main()

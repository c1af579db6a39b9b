#!/usr/bin/env python3
"""Operator scale benchmark against the real API server (scripts/control-plane.sh).

1. Creation throughput: `kubectl apply` of one MultiWorkerMirrored job with
   --workers workers (default 500); the clock runs from just before the apply
   until a watch has seen every one of the job's pods and Services ADDED.
   Prints pods/s (workers / seconds) and objects/s (pods + Services).
   JobSet publishes 290 pods/s for its controller; the target is >= 300.
   The pods are O(1) in size: the cluster (every host) is in one ConfigMap per
   job, which TF_CONFIG refers to (docs/architecture.md §5); the ceiling POSTs the same.
2. Footprint: --jobs small jobs (default 200, one worker each) are applied and
   reconciled; then the operator watches them idle for --idle seconds. Prints
   the operator's peak RSS (VmHWM) over the whole run and its CPU use while
   watching. Target: RSS <= 40 MB.

The API server, etcd and the controller manager share this machine's cores
with the operator, so creation throughput here is bounded by the control
plane as much as by the operator; the script also prints the operator's own
CPU seconds during the burst to show which side was busy.

  python3 bench/operator_scale.py [--workers 500] [--jobs 200] [--qps 1000] [--burst 2000]
                                  [--no-record]

Appends every figure it prints to bench/records/operator_scale.jsonl.
"""
import argparse
import base64
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import append_record, uptime  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CP = os.path.join(ROOT, "scripts", "control-plane.sh")


def sh(*args, check=True, capture=True, input_text=None):
    r = subprocess.run(list(args), capture_output=capture, text=True, input=input_text)
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr or r.stdout}")
    return r.stdout.strip() if capture else ""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Api:
    """Just enough of the API for a watch: client-cert TLS from the admin kubeconfig."""

    def __init__(self, kubeconfig):
        text = open(kubeconfig).read()

        def field(name):
            m = re.search(rf"{name}:\s*(\S+)", text)
            if not m:
                sys.exit(f"{kubeconfig}: no {name}")
            return m.group(1)

        server = field("server")
        m = re.match(r"https://([^:/]+):(\d+)", server)
        self.host, self.port = m.group(1), int(m.group(2))
        self.tmp = tempfile.mkdtemp(prefix="distrain-bench-")
        paths = {}
        for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
            path = os.path.join(self.tmp, key)
            with open(path, "wb") as f:
                f.write(base64.b64decode(field(key)))
            paths[key] = path
        self.ctx = ssl.create_default_context(cafile=paths["certificate-authority-data"])
        self.ctx.load_cert_chain(paths["client-certificate-data"], paths["client-key-data"])

    def watch_count(self, path, want, on_done, stop, on_first=None):
        """Counts distinct names until `want` exist; calls on_done(time) then,
        and on_first(time) when the first one is seen.
        LIST then WATCH from its resourceVersion, again whenever the stream
        ends, so a closed watch loses nothing."""
        seen = set()
        while not stop.is_set():
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=600)
            conn.request("GET", path)
            listed = json.loads(conn.getresponse().read())
            seen.update(item["metadata"]["name"] for item in listed.get("items", []))
            if len(seen) >= want:
                on_done(time.monotonic())
                return
            rv = listed["metadata"]["resourceVersion"]
            conn.request("GET", f"{path}&watch=1&resourceVersion={rv}&allowWatchBookmarks=true")
            resp = conn.getresponse()
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "ADDED":
                    if not seen and on_first is not None:
                        on_first(time.monotonic())
                    seen.add(ev["object"]["metadata"]["name"])
                    if len(seen) >= want:
                        on_done(time.monotonic())
                        conn.close()
                        return
            conn.close()

    def create_raw(self, ns, objects, connections=32):
        """POSTs (path, object) pairs over `connections` keep-alive connections;
        returns seconds. The API server's own ceiling for the same writes."""
        lock = threading.Lock()
        todo = list(objects)
        errors = []

        def worker():
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
            while True:
                with lock:
                    if not todo:
                        break
                    path, obj = todo.pop()
                conn.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                body = r.read()
                if r.status >= 300:
                    errors.append(f"{r.status} {body[:200]}")
            conn.close()

        t = time.monotonic()
        threads = [threading.Thread(target=worker) for _ in range(connections)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            sys.exit(f"raw create failed: {errors[0]}")
        return time.monotonic() - t


def proc_stats(pid):
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return hwm, rss, cpu


def control_plane_cpu(bindir):
    """CPU seconds used so far by each control-plane component (etcd,
    kube-apiserver, kube-controller-manager), found by executable path."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if exe.startswith(bindir + "/"):
            out[os.path.basename(exe)] = out.get(os.path.basename(exe), 0) + proc_stats(pid)[2]
    return out


def cpu_split(before, after, wall):
    return ", ".join(f"{k} {after[k] - before.get(k, 0):.2f} s" for k in sorted(after)) + f" of {wall:.2f} s wall"


def stored_pod_bytes(kubectl, ns, name):
    """Size of a pod's spec, labels and annotations as the API server stores
    them (its defaults included), to check the ceiling POSTs the operator's shape."""
    pod = json.loads(sh(*kubectl, "-n", ns, "get", "pod", name, "-o", "json"))
    kept = {"labels": pod["metadata"].get("labels", {}), "annotations": pod["metadata"].get("annotations", {}),
            "spec": pod["spec"]}
    return len(json.dumps(kept, separators=(",", ":")))


def job_yaml(name, workers):
    return f"""apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: {name}}}
spec:
  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker: {{replicas: {workers}, restartPolicy: ExitCode}}
  training:
    model: {{type: mlp, hiddenUnits: [16]}}
    dataset: {{type: synthetic, numFeatures: 8, numClasses: 2, numExamples: 100000}}
    optimizer: {{type: sgd, learningRate: 0.1}}
    globalBatchSize: {16 * workers}
    steps: 10
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--qps", type=float, default=1000)
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--concurrent-reconciles", type=int, default=8)
    ap.add_argument("--idle", type=float, default=30, help="seconds of idle watching measured for CPU")
    ap.add_argument("--build-dir", default=os.environ.get("DISTRAIN_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    load_before = uptime()
    figures = {"workers": args.workers, "jobs": args.jobs, "qps": args.qps, "burst": args.burst,
               "concurrent_reconciles": args.concurrent_reconciles}

    operator_bin = os.path.join(args.build_dir, "operator", "distrain-operator")
    if not os.access(operator_bin, os.X_OK):
        sys.exit(f"{operator_bin} not found; build first (scripts/build.sh)")
    started = False
    if subprocess.run([CP, "status"], capture_output=True).returncode != 0:
        print("[bench] starting the control plane", flush=True)
        sh(CP, "up")
        started = True
    kubeconfig = sh(CP, "kubeconfig")
    bindir = sh(CP, "bindir")
    kubectl = [os.path.join(bindir, "kubectl"), f"--kubeconfig={kubeconfig}"]
    sh(*kubectl, "apply", "--server-side", "--force-conflicts", "-f", os.path.join(ROOT, "crds"))
    ns = f"bench-operator-{os.getpid()}"
    sh(*kubectl, "create", "namespace", ns)
    api = Api(kubeconfig)

    def start_operator(namespace):
        metrics_port, health_port = free_port(), free_port()
        proc = subprocess.Popen(
            [operator_bin, f"--kubeconfig={kubeconfig}", f"--namespaces={namespace}",
             f"--kube-api-qps={args.qps}", f"--kube-api-burst={args.burst}",
             f"--concurrent-reconciles={args.concurrent_reconciles}",
             f"--metrics-bind-address=127.0.0.1:{metrics_port}",
             f"--health-probe-bind-address=127.0.0.1:{health_port}", "--log-level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", health_port, timeout=1)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    return proc
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("operator not ready within 60 s: " + (proc.stderr.read() if proc.poll() is not None else ""))

    def stop_operator(proc):
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

    ns2 = ns + "-footprint"
    ns_raw = ns + "-raw"
    op = None
    try:
        # 0. The ceiling: what the operator writes for this job, POSTed by a
        # bare client with 32 connections, no operator involved: the job's
        # cluster-spec ConfigMap (every host, once) first, then the pods in
        # the operator's shape (TF_CONFIG refers to the ConfigMap; same env,
        # ports, labels and annotation as controller/pods.cc writes) and the
        # headless Services. The pod size is checked against the operator's
        # own pods after step 1.
        sh(*kubectl, "create", "namespace", ns_raw)
        hosts = [f"raw-worker-{i}.{ns_raw}.svc:2222" for i in range(args.workers)]
        config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "raw-cluster-spec",
                                   "labels": {"distrain.io/job-name": "raw",
                                              "app.kubernetes.io/managed-by": "distrain-operator"},
                                   "annotations": {"distrain.io/cluster-spec-hash": "0" * 16}},
                      "data": {"cluster": json.dumps({"worker": hosts}, separators=(",", ":"))}}
        job_config = "y" * 1030  # DISTRAIN_JOB_CONFIG of this job is ~1 KB
        raw = []
        for i in range(args.workers):
            labels = {"distrain.io/job-name": "raw", "distrain.io/replica-type": "worker",
                      "distrain.io/replica-index": str(i), "app.kubernetes.io/managed-by": "distrain-operator"}
            if i == 0:
                labels["distrain.io/job-role"] = "master"
            field = lambda path: {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
            env = [{"name": "DISTRAIN_TF_CLUSTER",
                    "valueFrom": {"configMapKeyRef": {"name": "raw-cluster-spec", "key": "cluster"}}},
                   {"name": "TF_CONFIG", "value": '{"cluster":$(DISTRAIN_TF_CLUSTER),"task":{"type":"worker","index":%d},'
                                                  '"environment":"cloud"}' % i},
                   {"name": "DISTRAIN_JOB_CONFIG", "value": job_config},
                   {"name": "DISTRAIN_METRICS_PORT", "value": "9090"},
                   {"name": "POD_NAME", **field("metadata.name")},
                   {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                   {"name": "POD_IP", **field("status.podIP")}]
            raw.append((f"/api/v1/namespaces/{ns_raw}/pods",
                        {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"raw-worker-{i}", "labels": labels,
                                      "annotations": {"distrain.io/cluster-spec-hash": "0" * 16}},
                         "spec": {"restartPolicy": "Never", "hostname": f"raw-worker-{i}", "subdomain": f"raw-worker-{i}",
                                  "containers": [{"name": "distrain", "image": "localhost/distrain/worker:latest",
                                                  "command": ["distrain-worker"], "env": env,
                                                  "ports": [{"name": "distrain", "containerPort": 2222, "protocol": "TCP"},
                                                            {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]}]}}))
            raw.append((f"/api/v1/namespaces/{ns_raw}/services",
                        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"raw-worker-{i}", "labels": labels},
                         "spec": {"clusterIP": "None", "selector": {k: labels[k] for k in list(labels)[:3]},
                                  "publishNotReadyAddresses": True,
                                  "ports": [{"name": "distrain", "port": 2222, "targetPort": 2222, "protocol": "TCP"}]}}))
        cp0, py0 = control_plane_cpu(bindir), time.process_time()
        t_cm = api.create_raw(ns_raw, [(f"/api/v1/namespaces/{ns_raw}/configmaps", config_map)], connections=1)
        t_raw = t_cm + api.create_raw(ns_raw, raw)
        cp1 = control_plane_cpu(bindir)
        print(f"[bench] API server ceiling (bare client, 32 connections): the ConfigMap + {args.workers} pods + "
              f"Services in {t_raw:.2f} s = {args.workers / t_raw:.0f} pods/s")
        print(f"[bench]   control-plane CPU: {cpu_split(cp0, cp1, t_raw)}; the bare client "
              f"{time.process_time() - py0:.2f} s")
        raw_pod_bytes = stored_pod_bytes(kubectl, ns_raw, "raw-worker-1")
        figures["ceiling_pods_per_second"] = args.workers / t_raw
        # The namespace controller deletes those 1,000 objects in the
        # background; the operator's burst must not share the cores with it.
        sh(*kubectl, "delete", "namespace", ns_raw, "--timeout=300s")

        op = start_operator(ns)

        # 1. Creation throughput.
        stop = threading.Event()
        done = {}
        sel = "labelSelector=distrain.io%2Fjob-name%3Dbig"
        watchers = [
            threading.Thread(target=api.watch_count, args=(f"/api/v1/namespaces/{ns}/pods?{sel}", args.workers,
                                                           lambda t: done.__setitem__("pods", t), stop,
                                                           lambda t: done.__setitem__("first_pod", t))),
            threading.Thread(target=api.watch_count, args=(f"/api/v1/namespaces/{ns}/services?{sel}",
                                                           args.workers, lambda t: done.__setitem__("services", t), stop)),
        ]
        for w in watchers:
            w.start()
        time.sleep(0.5)  # the watches are open
        _, _, cpu0 = proc_stats(op.pid)
        cp0 = control_plane_cpu(bindir)
        t0 = time.monotonic()
        sh(*kubectl, "-n", ns, "apply", "-f", "-", input_text=job_yaml("big", args.workers))
        for w in watchers:
            w.join(timeout=600)
        _, _, cpu1 = proc_stats(op.pid)
        cp1 = control_plane_cpu(bindir)
        if "pods" not in done or "services" not in done:
            counts = {kind: len(sh(*kubectl, "-n", ns, "get", kind, "-o", "name").split()) for kind in ("pods", "services")}
            sys.exit(f"timed out after {time.monotonic() - t0:.0f} s: finished {sorted(done)}, present {counts}; "
                     f"operator: {op.stderr.read() if op.poll() is not None else 'running'}")
        t_pods = done["pods"] - t0
        t_all = max(done["pods"], done["services"]) - t0
        print(f"[bench] {args.workers}-worker job: first pod after {done['first_pod'] - t0:.2f} s, all pods after "
              f"{t_pods:.2f} s, pods + Services after {t_all:.2f} s")
        print(f"[bench] creation: {args.workers / t_all:.0f} pods/s (pods and Services all present), "
              f"{2 * args.workers / t_all:.0f} objects/s; pods alone {args.workers / t_pods:.0f} pods/s; "
              f"operator CPU {cpu1 - cpu0:.2f} s of {t_all:.2f} s wall")
        print(f"[bench]   control-plane CPU: {cpu_split(cp0, cp1, t_all)}")
        print(f"[bench] operator / API-server ceiling, same run: {(args.workers / t_all) / (args.workers / t_raw):.2f}x; "
              f"JobSet publishes 290 pods/s (its cluster, not this machine): {args.workers / t_all / 290:.2f}x")
        hwm, _, _ = proc_stats(op.pid)
        print(f"[bench] operator peak RSS during the burst: {hwm / 2**20:.1f} MiB")
        figures.update(pods_per_second=args.workers / t_all, objects_per_second=2 * args.workers / t_all,
                       pods_alone_per_second=args.workers / t_pods, first_pod_seconds=done["first_pod"] - t0,
                       operator_cpu_seconds=cpu1 - cpu0, ratio_to_ceiling=t_raw / t_all,
                       burst_peak_rss_mib=hwm / 2**20)
        print(f"[bench] a pod as stored (spec + labels + annotations): operator "
              f"{stored_pod_bytes(kubectl, ns, 'big-worker-1')} bytes, bare client {raw_pod_bytes} bytes")
        stop_operator(op)
        subprocess.run([*kubectl, "delete", "namespace", ns, "--wait=false"], capture_output=True)

        # 2. Footprint while watching many jobs: a fresh operator, as after a restart.
        sh(*kubectl, "create", "namespace", ns2)
        op = start_operator(ns2)
        docs = "---\n".join(job_yaml(f"j{i}", 1) for i in range(args.jobs))
        t1 = time.monotonic()
        sh(*kubectl, "-n", ns2, "apply", "-f", "-", input_text=docs)
        deadline = time.time() + 300
        while time.time() < deadline:
            n = len(sh(*kubectl, "-n", ns2, "get", "pods", "-o", "name").split())
            if n >= args.jobs:
                break
            time.sleep(1)
        print(f"[bench] {args.jobs} jobs reconciled (a pod each) in {time.monotonic() - t1:.1f} s")
        time.sleep(3)
        _, _, c0 = proc_stats(op.pid)
        w0 = time.monotonic()
        time.sleep(args.idle)
        hwm, rss, c1 = proc_stats(op.pid)
        idle_cpu = (c1 - c0) / (time.monotonic() - w0)
        print(f"[bench] watching {args.jobs} jobs: RSS {rss / 2**20:.1f} MiB now, peak {hwm / 2**20:.1f} MiB "
              f"({hwm / 1e6:.1f} MB; target <= 40 MB), CPU {100 * idle_cpu:.2f}% of a core while idle")
        figures.update(watching_rss_mib=rss / 2**20, watching_peak_rss_mib=hwm / 2**20,
                       idle_cpu_percent_of_core=100 * idle_cpu)
        if not args.no_record:
            headline = (f"{figures['pods_per_second']:.0f} pods/s for a {args.workers}-worker job "
                        f"({figures['ratio_to_ceiling']:.2f} of the API server's ceiling, same run); "
                        f"watching {args.jobs} jobs peak RSS {figures['watching_peak_rss_mib']:.1f} MiB")
            append_record("operator_scale", figures, load_before, {"headline": headline})
    finally:
        if op is not None:
            stop_operator(op)
        for n in (ns, ns2, ns_raw):
            subprocess.run([*kubectl, "delete", "namespace", n, "--wait=false"], capture_output=True)
        if started:
            subprocess.run([CP, "down"], capture_output=True)


if __name__ == "__main__":
    main()

"""Helpers shared by the benchmarks: free loopback ports, TF_CONFIG for N local
workers, running a group of processes that must all succeed (the first failure
kills the rest and stops the benchmark loudly), and the machine facts every
record carries (`uptime`, `cpu_info`)."""
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DISTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
PEERS_PY = os.path.join(os.path.expanduser(os.environ.get("DISTRAIN_CACHE", "~/.cache/distrain")),
                        "peers-venv", "bin", "python")


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_info():
    model = ""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    flags, mhz, family = set(), 0.0, None
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "cpu MHz" and not mhz:
                mhz = float(value)
            elif key == "cpu family" and family is None:
                family = int(value)
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    return {"model": model, "isa": isa, "cores": os.cpu_count(), "tsc_mhz": mhz, "family": family}


def append_record(benchmark, figures, uptime_before, extra=None):
    """Appends one JSON line to bench/records/<benchmark>.jsonl: the time, the
    commit (with "+dirty" for uncommitted changes other than the records and
    the table generated from them), the machine, the load
    before and after, and `figures` (every number the run printed that a
    document may quote). Returns the record's path."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--",
                            ".", ":(exclude)bench/records", ":(exclude)bench/README.md"],
                           capture_output=True, text=True).stdout.strip()
    record = {"benchmark": benchmark,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit + ("+dirty" if dirty else ""), "machine": cpu_info(),
              "uptime_before": uptime_before, "uptime_after": uptime(), "figures": figures}
    record.update(extra or {})
    path = os.path.join(ROOT, "bench", "records", f"{benchmark}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"recorded in {os.path.relpath(path, ROOT)}")
    # bench/README.md's table of recorded runs follows the records.
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "records_table.py")], check=False)
    return path


def torch_python():
    """The python of the PyTorch peers: $DISTRAIN_TORCH_PYTHON (a machine's own
    torch, e.g. a GPU machine without network), else the venv that
    bench/peers/setup_torch.sh installs on first use."""
    if os.environ.get("DISTRAIN_TORCH_PYTHON"):
        return os.environ["DISTRAIN_TORCH_PYTHON"]
    out = subprocess.run(["bash", os.path.join(ROOT, "bench", "peers", "setup_torch.sh")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"cannot install torch for the PyTorch peers:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def fail(message):
    """Exits naming the bench script that failed (messages start with its own words)."""
    sys.exit(f"{os.path.basename(sys.argv[0])}: {message}")


def free_ports(count):
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_configs(n):
    workers = [f"127.0.0.1:{p}" for p in free_ports(n)]
    return [json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i},
                        "environment": "cloud"}) for i in range(n)]


def job_credentials(tasks, root):
    """A fresh job's credentials (`distrain credentials`: a CA, a certificate
    per task, the ring key) under root/<type>-<index>/, for the
    DISTRAIN_CREDENTIALS_DIR of workers the benchmarks start themselves: jobs
    run mutual TLS by default, and the benchmarks measure the default."""
    tool = os.path.join(BUILD, "cli", "distrain")
    if not os.path.exists(tool):
        fail(f"{tool} is missing: build it (scripts/build.sh)")
    subprocess.run([tool, "credentials", "--job", "bench", "-o", root] +
                   [f"{t}:{i}" for t, i in tasks], check=True, stdout=subprocess.DEVNULL)
    return root


def run_group(name, commands, timeout, all_outputs=False):
    """Runs [(argv, env)] together; returns rank 0's output (every process's
    output, in order, with all_outputs). Kills the rest and fails loudly when
    one exits non-zero or the group passes `timeout`."""
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = [], []
        for i, (argv, env) in enumerate(commands):
            log = open(os.path.join(tmp, f"{i}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))

        def output(i):
            logs[i].flush()
            logs[i].seek(0)
            return logs[i].read()

        def kill_all():
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()

        deadline = time.time() + timeout
        while True:
            codes = [p.poll() for p in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                kill_all()
                i = bad[0]
                fail(f"{name}: process {i} ({' '.join(commands[i][0][:3])} ...) exited with "
                     f"code {codes[i]}:\n{output(i)[-4000:]}")
            if all(c == 0 for c in codes):
                return [output(i) for i in range(len(procs))] if all_outputs else output(0)
            if time.time() > deadline:
                kill_all()
                fail(f"{name}: still running after {timeout:.0f} s; rank 0 said:\n{output(0)[-4000:]}")
            time.sleep(0.05)

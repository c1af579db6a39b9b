#!/usr/bin/env python3
"""All-reduce bus bandwidth: distrain's ring vs Open MPI vs TensorFlow, same run.

For N = 2, 3, 4 processes on 127.0.0.1 and float32 buffers of 4 KiB ... 256 MiB
(powers of 4), every side runs a SUM all-reduce with one process per rank:

  distrain    build/bench/allreduce_busbw: RingCollective over TCP, bootstrapped
              by the coordination service from TF_CONFIG (what
              MultiWorkerMirrored uses)
  mpi         MPI_Allreduce (Open MPI, `--mca pml ob1 --mca btl tcp,self
              --mca btl_tcp_if_include lo`: TCP over loopback, no shared memory)
  tf          TensorFlow MultiWorkerMirroredStrategy, CommunicationOptions(RING),
              ReplicaContext.all_reduce in a tf.function
  gloo        torch.distributed all_reduce, gloo backend over TCP on lo (PyTorch's
              CPU collective; torch installed on first use into its own venv by
              bench/peers/setup_torch.sh, ~3 GB)
  loopback    build/bench/loopback_limit: aggregate TCP throughput of N
              concurrent streams (L_agg, best of 3 repeats, measured before
              and after the sides, the higher counts); one ring link can move
              at most L_agg / N, the ceiling for busbw. Also L_ring: the same
              N streams shaped as a ring of N single-threaded processes that
              each send one stream and receive another, from and into 64 MiB
              buffers (what a ring rank does, minus the reduction); see
              bench/README.md for why both are shown

Every side uses the same protocol: one all-reduce checked element by element
against the exact sum (a wrong result fails the run), warm-up iterations, then
individually timed iterations (enough for --target-seconds, at least
--min-iters); the median is reported. algbw = bytes / time,
busbw = algbw * 2 (N - 1) / N (the bytes each link carries in a ring, so
figures for different N compare, and a perfect ring reaches the link speed).

  bench/allreduce_busbw.py [--quick] [--ranks 2,3,4] [--sizes 4K,64K,64M]
                           [--sides distrain,mpi,tf,gloo]

Prints a table per N and the key ratios (64 MiB, N = 4: distrain/MPI,
distrain/TF, distrain/(L_agg/N), distrain/(L_ring/N), and the same two
ceilings in CPU terms — loopback CPU seconds per byte over distrain's — which
on a machine shared with other load say more than wall-clock ratios; 4 KiB
latency distrain vs MPI). Not a
pass/fail test: exit 0 when every side ran; non-zero with the failing side's
output when one did not.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (BUILD, PEERS_PY, ROOT, append_record, fail, run_group, tf_configs,  # noqa: E402
                      torch_python, uptime)


KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = [4 * KIB * 4 ** k for k in range(9)]           # 4 KiB ... 256 MiB
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB]
SIDES = ("distrain", "mpi", "tf", "gloo")


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)(i?[Bb])?\s*", text)
    if not m:
        fail(f"--sizes: cannot read '{text}' (use bytes or 4K, 64M, 1G)")
    value = int(m.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": 1 << 30}[m.group(2).lower()]
    if value <= 0 or value % 4:
        fail(f"--sizes: {text} is not a positive multiple of 4 bytes (float32)")
    return value


def human_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def human_time(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def parse_results(name, text, expect_sizes):
    results = {}
    for m in re.finditer(r"^RESULT (\{.*\})$", text, re.M):
        r = json.loads(m.group(1))
        results[r.get("bytes", r.get("streams"))] = r
    missing = [s for s in expect_sizes if s not in results]
    if missing:
        fail(f"{name}: no RESULT for {', '.join(human_size(s) for s in missing)}; output:\n{text[-4000:]}")
    return results


def binary(name):
    path = os.path.join(BUILD, "bench", name)
    if not os.path.exists(path):
        fail(f"{path} is missing: build it (scripts/build.sh, or ninja -C {BUILD} {name})")
    return path


def mpi_binary():
    path = os.path.join(BUILD, "bench", "mpi_allreduce")
    src = os.path.join(ROOT, "bench", "peers", "mpi_allreduce.c")
    if os.path.exists(path) and os.path.getmtime(path) >= os.path.getmtime(src):
        return path
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        fail("Open MPI is not installed (no mpicc): run scripts/setup.sh, or pass --sides distrain,tf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run([mpicc, "-O2", "-o", path, src], check=True)
    return path


def common_flags(args):
    return ["--warmup", str(args.warmup), "--min-iters", str(args.min_iters),
            "--max-iters", str(args.max_iters), "--target-seconds", str(args.target_seconds)]


def run_loopback(n, args, topology="streams", buffer_bytes=None):
    """Returns (bytes_per_second, cpu_s_per_byte) of loopback_limit."""
    argv = [binary("loopback_limit"), "--streams", str(n), "--topology", topology]
    if buffer_bytes:
        argv += ["--buffer-bytes", str(buffer_bytes)]
    out = run_group(f"loopback N={n} {topology}", [(argv, None)], 120)
    r = parse_results("loopback", out, [n])[n]
    return r["bytes_per_second"], r["cpu_s_per_byte"]


def run_ceilings(n, args):
    """L_agg (streams, 1 MiB buffers) and L_ring (ring, 64 MiB buffers)."""
    agg = run_loopback(n, args)
    ring = run_loopback(n, args, "ring", 64 * MIB)
    return {"agg": agg, "ring": ring}


def best_of(a, b):
    """A limit: the higher rate and the lower CPU per byte of two measurements."""
    return {k: (max(a[k][0], b[k][0]), min(a[k][1], b[k][1])) for k in a}


def run_distrain(n, sizes, args):
    argv = [binary("allreduce_busbw"), "--sizes", ",".join(map(str, sizes)),
            "--timeout-seconds", str(args.timeout)] + common_flags(args) + shlex.split(args.distrain_args)
    cmds = []
    for cfg in tf_configs(n):
        env = dict(os.environ, TF_CONFIG=cfg)
        cmds.append((argv, env))
    return parse_results(f"distrain N={n}", run_group(f"distrain N={n}", cmds, args.side_timeout), sizes)


def run_mpi(n, sizes, args):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        fail("Open MPI is not installed (no mpirun): run scripts/setup.sh, or pass --sides distrain,tf")
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo",
            mpi_binary(), "--sizes", ",".join(map(str, sizes))] + common_flags(args)
    return parse_results(f"mpi N={n}", run_group(f"mpi N={n}", [(argv, None)], args.side_timeout), sizes)


def run_tf(n, sizes, args):
    py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
    argv = [py, os.path.join(ROOT, "bench", "peers", "tf_collective_allreduce.py"),
            "--sizes", ",".join(map(str, sizes)), "--timeout-seconds", str(args.timeout)] + common_flags(args)
    cmds = [(argv, dict(os.environ, TF_CONFIG=cfg, TF_CPP_MIN_LOG_LEVEL="2")) for cfg in tf_configs(n)]
    return parse_results(f"tf N={n}", run_group(f"tf N={n}", cmds, args.side_timeout), sizes)


def run_gloo(n, sizes, args):
    argv = [torch_python(), os.path.join(ROOT, "bench", "peers", "gloo_allreduce.py"),
            "--sizes", ",".join(map(str, sizes)), "--timeout-seconds", str(args.timeout)] + common_flags(args)
    cmds = [(argv, dict(os.environ, TF_CONFIG=cfg)) for cfg in tf_configs(n)]
    return parse_results(f"gloo N={n}", run_group(f"gloo N={n}", cmds, args.side_timeout), sizes)


def peer_versions(sides):
    """What each peer side ran, for the record."""
    def first_line(argv):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unknown"
    versions = {}
    if "mpi" in sides:
        versions["mpi"] = first_line(["mpirun", "--version"])
    if "tf" in sides:
        py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
        versions["tf"] = first_line([py, "-c", "import tensorflow as tf; print(tf.__version__)"])
    if "gloo" in sides:
        versions["gloo"] = "torch " + first_line([torch_python(), "-c",
                                                  "import torch; print(torch.__version__)"])
    return versions


def busbw(n, size, seconds):
    return size / seconds * 2 * (n - 1) / n


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def cpu_efficiency(n, size, result, limits):
    """distrain's busbw relative to each ceiling in CPU terms: loopback CPU
    seconds per byte over distrain's (rank 0's CPU per operation over the bytes
    it sends per operation). Equal to the wall-clock ratio when both saturate
    the same cores; unlike it, unaffected by other load. (a, b) pairs for ratio()."""
    cpu = result.get("cpu_s_per_op")
    per_byte = cpu / (size * 2 * (n - 1) / n) if cpu and size else None
    return {k: (limits[k][1], per_byte) for k in limits}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="sizes 4K,64K,1M,16M,64M and N = 2,4 (unless --sizes/--ranks say otherwise)")
    ap.add_argument("--distrain-args", default="",
                    help="extra flags for build/bench/allreduce_busbw, for sweeps "
                         "(e.g. '--chunk-bytes 65536 --stage-slices 8')")
    ap.add_argument("--sizes", help="comma-separated buffer sizes in bytes (4K, 64M allowed); "
                                    "default 4K..256M in powers of 4")
    ap.add_argument("--ranks", help="comma-separated process counts; default 2,3,4")
    ap.add_argument("--sides", default="distrain,mpi,tf",
                    help="subset of distrain,mpi,tf,gloo (gloo installs torch on first use)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up iterations per size")
    ap.add_argument("--min-iters", type=int, default=5, help="timed iterations at least")
    ap.add_argument("--max-iters", type=int, default=20000, help="timed iterations at most")
    ap.add_argument("--target-seconds", type=float, default=0.5, help="timed iterations fill about this")
    ap.add_argument("--timeout", type=float, default=120, help="per-operation timeout inside each side (s)")
    ap.add_argument("--side-timeout", type=float, default=900, help="one side's run for one N (s)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    uptime_before = uptime()

    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else \
        (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else ([2, 4] if args.quick else [2, 3, 4])
    if any(r < 2 for r in ranks):
        fail("--ranks: every N must be at least 2")
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        fail(f"--sides: unknown {', '.join(unknown)} (use {', '.join(SIDES)})")
    runners = {"distrain": run_distrain, "mpi": run_mpi, "tf": run_tf, "gloo": run_gloo}

    started = time.time()
    load = os.getloadavg()[0]
    table = {}  # (n, side) -> {bytes: result}
    ceilings = {}  # n -> L_agg (bytes/s)
    limits = {}    # n -> {"agg"|"ring": (bytes/s, cpu s per byte)}
    for n in ranks:
        # The ceilings are limits: measured before and after the sides, the best counts.
        before = run_ceilings(n, args)
        for side in sides:
            t0 = time.time()
            table[(n, side)] = runners[side](n, sizes, args)
            print(f"N={n}: {side} done in {time.time() - t0:.0f} s", flush=True)
        after = run_ceilings(n, args)
        limits[n] = best_of(before, after)
        ceilings[n] = limits[n]["agg"][0]
        print(f"N={n}: loopback L_agg {before['agg'][0] / 1e9:.2f} GB/s before, "
              f"{after['agg'][0] / 1e9:.2f} GB/s after; ceiling L_agg/N {ceilings[n] / n / 1e9:.2f} GB/s; "
              f"L_ring {limits[n]['ring'][0] / 1e9:.2f} GB/s; CPU ns/byte: streams "
              f"{limits[n]['agg'][1] * 1e9:.3f}, ring {limits[n]['ring'][1] * 1e9:.3f}", flush=True)

    print()
    print(f"all-reduce float32 SUM on 127.0.0.1, {os.cpu_count()} cores, load {load:.2f} at start; "
          f"median time; busbw = bytes/time * 2(N-1)/N in GB/s (1e9)")
    for n in ranks:
        ceiling = ceilings[n] / n
        ring_ceiling = limits[n]["ring"][0] / n
        print(f"\nN = {n}   L_agg {ceilings[n] / 1e9:.2f} GB/s, ceiling L_agg/N {ceiling / 1e9:.2f} GB/s; "
              f"L_ring {limits[n]['ring'][0] / 1e9:.2f} GB/s, L_ring/N {ring_ceiling / 1e9:.2f} GB/s")
        head = f"{'size':>9}"
        for side in sides:
            head += f" | {side + ' time':>13} {'busbw':>6}"
        if "distrain" in sides:
            head += " | " + " ".join(f"{'d/' + s:>7}" for s in sides if s != "distrain") + \
                f" {'d/ceil':>7} {'d/ring':>7} {'cpu/ceil':>8} {'cpu/ring':>8}"
        print(head)
        for size in sizes:
            row = f"{human_size(size):>9}"
            bw = {}
            for side in sides:
                t = table[(n, side)][size]["median_s"]
                bw[side] = busbw(n, size, t)
                row += f" | {human_time(t):>13} {bw[side] / 1e9:6.2f}"
            if "distrain" in sides:
                row += " | " + " ".join(f"{ratio(bw['distrain'], bw[s]):>7}" for s in sides if s != "distrain")
                row += f" {ratio(bw['distrain'], ceiling):>7} {ratio(bw['distrain'], ring_ceiling):>7}"
                eff = cpu_efficiency(n, size, table[(n, "distrain")][size], limits[n])
                row += f" {ratio(*eff['agg']):>8} {ratio(*eff['ring']):>8}"
            print(row)

    print("\nkey figures")
    key_n, key_size, small = 4, 64 * MIB, 4 * KIB
    if key_n in ranks and key_size in sizes and "distrain" in sides:
        d = busbw(key_n, key_size, table[(key_n, "distrain")][key_size]["median_s"])
        line = f"  64 MiB, N=4: distrain busbw {d / 1e9:.2f} GB/s"
        for side in ("mpi", "tf", "gloo"):
            if side in sides:
                line += f"; /{side} {ratio(d, busbw(key_n, key_size, table[(key_n, side)][key_size]['median_s']))}"
        line += f"; /(L_agg/N) {ratio(d, ceilings[key_n] / key_n)}"
        line += f"; /(L_ring/N) {ratio(d, limits[key_n]['ring'][0] / key_n)}"
        eff = cpu_efficiency(key_n, key_size, table[(key_n, "distrain")][key_size], limits[key_n])
        line += f"; in CPU terms /(L_agg/N) {ratio(*eff['agg'])}, /(L_ring/N) {ratio(*eff['ring'])}"
        print(line)
    else:
        print("  (64 MiB at N=4 not in this sweep)")
    if small in sizes and "distrain" in sides and "mpi" in sides:
        for n in ranks:
            d = table[(n, "distrain")][small]["median_s"]
            m = table[(n, "mpi")][small]["median_s"]
            print(f"  4 KiB latency, N={n}: distrain {human_time(d)}, mpi {human_time(m)} "
                  f"(distrain/mpi time {d / m:.2f}x)")
    print(f"  wall time {time.time() - started:.0f} s; load {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    if not args.no_record:
        figures = []
        for n in ranks:
            for size in sizes:
                row = {"ranks": n, "bytes": size, "l_agg_bytes_per_s": ceilings[n],
                       "l_ring_bytes_per_s": limits[n]["ring"][0]}
                for side in sides:
                    t = table[(n, side)][size]["median_s"]
                    row[f"{side}_median_s"] = t
                    row[f"{side}_busbw"] = busbw(n, size, t)
                figures.append(row)
        append_record("allreduce_busbw", figures, uptime_before,
                      {"sides": sides, "distrain_args": args.distrain_args,
                       "peer_versions": peer_versions(sides)})


if __name__ == "__main__":
    main()

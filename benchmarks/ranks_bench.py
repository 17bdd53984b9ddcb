"""`perfd bench ranks`: what the agent's ranks collector (collectors/ranks) costs, per rank and per node.

    perfd bench ranks [--ranks 0,1,8,16] [--threads 64] [--collects 20] [--json]

Real processes stand for a node's ranks: each is a Python process with ``--threads`` sleeping
threads (Megatron-LM's rank processes hold ~100: the schedstat of each thread is read every collect,
so threads, not activity, are what costs), none of them on a CPU. For each count the collector follows
them (as the agent's notes would) and ``collect()`` runs ``--collects`` times at its 1 s interval's
work (no sleep between: the measure is the work of one collect), timed in wall time and in this
thread's CPU time; the first collect (no previous reading) is left out. ``per_rank_ms`` is the slope
over the counts (least squares of CPU ms against ranks), ``node_ms`` the fixed part at 0 ranks (the
node's CPU table, swap-in, PSI).

The contention scan (every process's /proc/<pid>/stat, run only while some rank waits for a CPU) is
timed apart: a rank pinned to one CPU beside a burner pinned there, so the scan runs each collect;
``scan_ms`` per scan and ``scan_us_per_process`` over the processes it read. ``cpu_share_at_1hz``: a
collect's CPU time at one collect a second, as a share of one core, for each count (add the scan's
while a rank waits).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfd.collectors.ranks import RanksCollector

RANK = ("import sys, threading, time\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
        "time.sleep(3600)\n")
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def _start(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)


def _stop(ps: list[subprocess.Popen[bytes]]) -> None:
    for p in ps:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


def _timed(c: RanksCollector, n: int) -> tuple[list[float], list[float]]:
    c.collect(time.time())  # the first reading: no deltas yet
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        c.collect(time.time())
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return wall, cpu


def run_counts(counts: list[int], threads: int, collects: int) -> list[dict[str, Any]]:
    out = []
    procs = [_start(RANK, str(threads)) for _ in range(max(counts))]
    try:
        time.sleep(1.0 + 0.02 * len(procs))  # their threads started
        for n in counts:
            c = RanksCollector({"job": "bench", "scan": False})
            for rank, p in enumerate(procs[:n]):
                c.note(p.pid, rank, "hook", uid=os.getuid())
            wall, cpu = _timed(c, collects)
            out.append({"ranks": n, "threads_per_rank": threads,
                        "collect_wall_ms_median": statistics.median(wall),
                        "collect_cpu_ms_median": statistics.median(cpu),
                        "collect_cpu_ms_max": max(cpu), "collect_cpu_ms_mean": statistics.fmean(cpu),
                        "cpu_share_at_1hz": statistics.fmean(cpu) / 1e3})
    finally:
        _stop(procs)
    return out


def run_scan(collects: int) -> dict[str, Any]:
    cpu = str(max(os.sched_getaffinity(0)))
    rank, burner = _start(SPIN, cpu), _start(SPIN, cpu)
    try:
        time.sleep(1.0)
        c = RanksCollector({"job": "bench"})
        c.note(rank.pid, 0, "hook", uid=os.getuid())
        scans: list[float] = []
        pids: list[int] = []
        for _ in range(collects + 2):
            time.sleep(0.3)
            c.collect(time.time())
            if c.contention.last_s is not None:
                scans.append(c.contention.last_s * 1e3)
                pids.append(c.contention.last_pids)
                c.contention.last_s = None
        if not scans:
            return {"error": "the rank never waited for a CPU: no scan ran"}
        ms = statistics.median(scans)
        return {"scans": len(scans), "scan_ms_median": ms, "processes_read_median": statistics.median(pids),
                "scan_us_per_process": 1e3 * ms / max(1.0, statistics.median(pids))}
    finally:
        _stop([rank, burner])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench ranks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="0,1,8,16",
                    help="comma-separated rank counts (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=64,
                    help="threads per rank process (default: %(default)s)")
    ap.add_argument("--collects", type=int, default=40,
                    help="timed collects per count (default: %(default)s; a multiple of THREAD_FULL_EVERY)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ns = ap.parse_args(argv)
    try:
        counts = sorted({int(x) for x in ns.ranks.split(",") if x.strip()})
    except ValueError:
        counts = []
    if not counts or min(counts) < 0 or ns.threads < 0 or ns.collects < 1:
        print("perfd bench ranks: --ranks (comma-separated, >= 0), --threads >= 0, --collects >= 1",
              file=sys.stderr)
        return 2
    if not sys.platform.startswith("linux"):
        print("perfd bench ranks: Linux only (/proc)", file=sys.stderr)
        return 2
    runs = run_counts(counts, ns.threads, ns.collects)
    xs, ys = [r["ranks"] for r in runs], [r["collect_cpu_ms_mean"] for r in runs]
    slope = statistics.linear_regression(xs, ys) if len(set(xs)) > 1 else None
    out: dict[str, Any] = {
        "command": "perfd bench ranks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "kernel": platform.release(), "date": time.strftime("%Y-%m-%d"),
        "processes_on_node": sum(1 for d in os.listdir("/proc") if d.isdigit()),
        "runs": runs,
        "per_rank_ms": slope.slope if slope else None, "node_ms": slope.intercept if slope else None,
        "scan": run_scan(ns.collects)}
    if ns.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['machine']}, {out['cpus']} CPUs, kernel {out['kernel']}, {out['processes_on_node']} "
          "processes")
    for r in runs:
        print(f"  {r['ranks']:3d} ranks x {r['threads_per_rank']} threads: collect "
              f"{r['collect_cpu_ms_mean']:.2f} ms CPU mean (median {r['collect_cpu_ms_median']:.2f}, max "
              f"{r['collect_cpu_ms_max']:.2f}: every thread read); {100 * r['cpu_share_at_1hz']:.2f}% of a "
              "core at 1 Hz")
    if slope:
        print(f"  per rank {slope.slope:.3f} ms CPU, per node {slope.intercept:.3f} ms CPU (least squares, "
              "means)")
    sc = out["scan"]
    if "error" in sc:
        print(f"  contention scan: {sc['error']}")
    else:
        print(f"  contention scan: {sc['scan_ms_median']:.2f} ms for {sc['processes_read_median']:.0f} "
              f"processes ({sc['scan_us_per_process']:.1f} us each), only while a rank waits for a CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Re-analysis cost of a growing run, from scratch against incremental (an AnalysisMemo, as the
aggregator's refresher keeps per job): what one new iteration costs once a run holds N iterations
of per-rank timers over R ranks. The log is the tail benchmark's (the real fixture's start-up block,
then per-rank ``all`` timer blocks), parsed once; only the analysis is timed (process CPU time).

    perfd bench analysis [--ranks 1000] [--iterations 200] [--new 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.tail_bench import write_log
from perfd.analytics.run.run_analysis import AnalysisMemo, analyze_run
from perfd.collectors.megatron import parse_lines


def _cpu(fn: Any) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def run(ranks: int, iterations: int, new: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "train.log"
        size = write_log(log, ranks, iterations)
        parsed = parse_lines(log.open(), job="bench")
    recs = sorted(parsed.records, key=lambda r: r.iteration)
    n = len(recs)
    scratch = [_cpu(lambda k=k: analyze_run(parsed.job_info, recs[:k]))
               for k in range(n - new + 1, n + 1)]
    memo = AnalysisMemo()
    analyze_run(parsed.job_info, recs[: n - new], memo=memo)
    incremental = [_cpu(lambda k=k: analyze_run(parsed.job_info, recs[:k], memo=memo))
                   for k in range(n - new + 1, n + 1)]
    s, i = statistics.median(scratch), statistics.median(incremental)
    return {"ranks": ranks, "iterations": n, "log_bytes": size, "new_iterations_timed": new,
            "scratch_s_median": round(s, 4), "incremental_s_median": round(i, 4),
            "speedup": round(s / i, 1) if i > 0 else None,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench analysis", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1000, help="ranks in the per-rank timer rows (default 1000)")
    ap.add_argument("--iterations", type=int, default=200, help="iterations in the run (default 200)")
    ap.add_argument("--new", type=int, default=5, help="new iterations timed one by one (default 5)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    if a.ranks < 1 or a.iterations < a.new + 2 or a.new < 1:
        print("perfd bench analysis: need --ranks >= 1, --new >= 1, --iterations >= --new + 2",
              file=sys.stderr)
        return 2
    r = run(a.ranks, a.iterations, a.new)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['iterations']} iterations x {r['ranks']} ranks ({r['log_bytes'] / 1e6:.0f} MB of log): "
              f"one new iteration costs {r['scratch_s_median'] * 1e3:.0f} ms of CPU from scratch, "
              f"{r['incremental_s_median'] * 1e3:.1f} ms incrementally ({r['speedup']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Log-tail rate of the agent's Megatron collector (file read + line split + parse), in MB of log per
second of CPU, on the heaviest log Megatron-LM writes: per-rank timers (``--timing-log-option all``),
where every iteration prints one line per rank per timer (about 1 MB an iteration at 1,000 ranks).

The collector runs exactly as in the agent (``MegatronCollector.collect`` with its per-call byte
budget) until it has read the whole file; CPU time is the process's own (``time.process_time``).

    perfd bench tail [--ranks 1000] [--iterations 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfd.collectors.megatron.collector import MegatronCollector

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
TIMERS = ("forward-backward", "forward-compute", "backward-compute", "batch-generator",
          "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
          "params-all-gather", "optimizer-copy-to-main-grad", "optimizer-clip-main-grad",
          "optimizer-count-zeros", "optimizer-inner-step", "optimizer-copy-main-to-model-params",
          "optimizer")


def write_log(path: Path, ranks: int, iterations: int) -> int:
    """A Megatron-LM log: the real fixture's start-up block, then ``iterations`` iteration lines
    each followed by an ``all`` timers block over ``ranks`` ranks. Returns its size in bytes."""
    lines = FIXTURE.read_text().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if re.search(r"\] iteration\s+1/", ln))
    template = next(ln for ln in lines if re.search(r"\] iteration\s+2/", ln))
    with path.open("w") as f:
        f.write("".join(lines[:first]))
        for it in range(1, iterations + 1):
            f.write(re.sub(r"iteration\s+2/\s+\d+", f"iteration {it:8d}/{iterations:8d}", template))
            f.write("INFO:megatron.core.timers:times across ranks (ms):\n")
            for t_i, name in enumerate(TIMERS):
                f.write(f"  {name}:\n")
                base = 100.0 + 37.0 * t_i
                f.writelines(f"     rank {r:2d}: {base + (r % 17) * 0.31 + it * 0.01:.2f}\n"
                             for r in range(ranks))
    return path.stat().st_size


def run_tail_bench(ranks: int = 1000, iterations: int = 20) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        size = write_log(log, ranks, iterations)
        c = MegatronCollector({"path": str(log), "job": "bench", "flush_after_s": 0.0})
        c.start()
        records = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            out = c.collect(time.time())
            records += len(out.steps)
            assert c.tail is not None
            if c.tail.counts.get("bytes", 0) >= size and not out.steps:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        c.stop()
    return {"ranks": ranks, "iterations": iterations, "log_bytes": size, "records": records,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "mb_per_cpu_s": round(size / 1e6 / cpu, 2) if cpu > 0 else None,
            "python": platform.python_version(), "machine": platform.machine()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="perfd bench tail", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=1000, help="ranks in each timers block (default 1000)")
    p.add_argument("--iterations", type=int, default=20, help="iterations in the log (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.ranks < 1 or a.iterations < 1:
        print("perfd bench tail: --ranks and --iterations must be >= 1", file=sys.stderr)
        return 2
    r = run_tail_bench(a.ranks, a.iterations)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['log_bytes'] / 1e6:.1f} MB ({r['iterations']} iterations x {r['ranks']} ranks of timers): "
              f"{r['records']} records, {r['cpu_s']:.2f} CPU-s, {r['mb_per_cpu_s']} MB per CPU-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Parse rate of the Megatron log parser on a real log (lines/s and MB/s), streaming line by line
as the agent does. Compare runs as ratios on one machine; absolute figures depend on the CPU.

    python -m benchmarks.parse_bench [--log FILE] [--repeat 20]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from perfd.collectors.megatron import MegatronLogParser

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def run_parse_bench(log: Path = DEFAULT_LOG, repeat: int = 20, rounds: int = 5) -> dict[str, Any]:
    lines = log.read_text().splitlines(keepends=True)
    nbytes = sum(len(x.encode()) for x in lines)
    rates = []
    records = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            p = MegatronLogParser(job="bench")
            for line in lines:
                records += len(p.feed(line))
            records += len(p.flush())
        dt = time.perf_counter() - t0
        rates.append(len(lines) * repeat / dt)
    med = statistics.median(rates)
    return {"log": log.name, "lines": len(lines), "repeat": repeat, "rounds": rounds,
            "lines_per_s": med, "mb_per_s": med * nbytes / len(lines) / 1e6,
            "iterations_per_s": med * (records / rounds / repeat) / len(lines),
            "python": platform.python_version(), "machine": platform.processor() or platform.machine()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG)
    ap.add_argument("--repeat", type=int, default=20)
    ns = ap.parse_args(argv)
    r = run_parse_bench(ns.log, ns.repeat)
    print(f"{r['log']}: {r['lines_per_s']:,.0f} lines/s, {r['mb_per_s']:.1f} MB/s, "
          f"{r['iterations_per_s']:,.0f} iterations/s (median of {r['rounds']} rounds of "
          f"{r['repeat']}x{r['lines']} lines; python {r['python']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Bytes a row of a run's iteration table spends on provenance (the ``sources`` field: every
metric's source or why it is absent), on the recorded Megatron-LM logs replicated to a long run.

Each log's step records are repeated, renumbered, until the run has ``--iterations`` of them (each
copy's records keep their own log line: the line number grows as in one long log), analysed
offline (``analyze_run``, ``live=False``: the table a finished log's analysis holds), and the
table's ``sources`` column is measured by a deep size (every object reached from it counted once:
its per-row values and what rows share, divided over the rows). The whole table's bytes per row are
printed beside it, and the process CPU time of the analysis.

    PYTHONPATH=$PWD python benchmarks/provenance_memory.py [--iterations 5000] [LOG ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

from perfd.analytics.run.run_analysis import analyze_run
from perfd.collectors.megatron import parse_lines
from perfd.core.model import Provenance, StepRecord

ROOT = Path(__file__).resolve().parents[1]
LOGS = [*sorted((ROOT / "tests" / "data" / "megatron").glob("*.log")),
        *sorted((ROOT / "tests" / "data" / "megatron").glob("*.log.gz")),
        ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"]


def deep_size(obj: object, seen: set[int]) -> int:
    """sys.getsizeof of ``obj`` and of everything it holds, each object once (``seen``)."""
    todo = [obj]
    total = 0
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            todo.extend(o)
        elif isinstance(o, str | bytes | int | float | array | type) or o is None:
            continue
        elif hasattr(o, "__dict__"):
            todo.append(vars(o))
        elif hasattr(o, "__slots__"):
            todo.extend(getattr(o, s) for s in o.__slots__ if hasattr(o, s))
    return total


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        yield from f


def replicated(records: list[StepRecord], n: int) -> list[StepRecord]:
    """``n`` records: copies of ``records`` renumbered after one another, each copy's log lines
    shifted past the previous copy's (a log ``n`` iterations long)."""
    # One run: a log's restarts (iterations logged again after a resume) keep their last record.
    recs = sorted({r.iteration: r for r in records}.values(), key=lambda r: r.iteration)
    span = recs[-1].iteration - recs[0].iteration + 1
    last_line = max((int(r.source.detail.rsplit(":", 1)[1]) for r in recs if r.source), default=0)
    out: list[StepRecord] = []
    k = 0
    while len(out) < n:
        for r in recs:
            if len(out) == n:
                break
            src = r.source
            if src is not None and k:
                name, line = src.detail.rsplit(":", 1)
                src = Provenance(src.collector, f"{name}:{int(line) + k * last_line}")
            out.append(dataclasses.replace(r, iteration=r.iteration + k * span, source=src,
                                           first_of_run=False))
        k += 1
    return out


def measure(path: Path, n: int) -> tuple[int, float, float, float]:
    parsed = parse_lines(_lines(path), job=path.name.split(".")[0], source_name=path.name)
    records = replicated(parsed.records, n)
    t0 = time.process_time()
    a = analyze_run(parsed.job_info, records, gpu_name="NVIDIA H100 80GB HBM3", live=False)
    cpu = time.process_time() - t0
    table = a.iterations
    rows = len(table)
    cols = table._cols
    sources = deep_size(cols["sources"], set()) / rows
    whole = deep_size(cols, set()) / rows
    return rows, sources, whole, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=5000)
    p.add_argument("logs", nargs="*", type=Path, default=LOGS)
    args = p.parse_args()
    print(f"{'log':<40} {'rows':>6} {'sources B/row':>14} {'table B/row':>12} {'analysis CPU s':>15}")
    for log in args.logs:
        rows, src, whole, cpu = measure(log, args.iterations)
        print(f"{log.name:<40} {rows:>6} {src:>14.1f} {whole:>12.1f} {cpu:>15.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

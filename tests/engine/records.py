"""A multi-rank job's step records built from real recordings: each rank's clock is one of the plain
PyTorch loops recorded on an H100 (tests/data/hook/plain_loop_h100/*.json.gz, one row a step:
iteration, begin, data ready, end, tokens, FLOPs, ...), as the step hook sends it (tests/loop_replay.py
does the same for one rank). Rank r plays recording r mod 5, from its own start, on a common clock."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, Provenance, StepRecord, TimerValue

LOOPS = Path(__file__).resolve().parents[1] / "data" / "hook" / "plain_loop_h100"
RECORDINGS = ("data_steps.json.gz", "data_steps_run2.json.gz", "varlen_steps.json.gz",
              "varlen_steps_run3.json.gz", "varlen_steps_stack_clean.json.gz")
RANKS_PER_NODE = 8
T0 = 1_795_000_000.0


def _rows(name: str) -> list[list[float]]:
    with gzip.open(LOOPS / name, "rt") as f:
        return [list(r) for r in json.load(f)["steps"]]


def job_records(job: str, nodes: int, iterations: int) -> dict[int, list[list[StepRecord]]]:
    """node -> per iteration (1..iterations) its ranks' records."""
    rows = {name: _rows(name) for name in RECORDINGS}
    world = nodes * RANKS_PER_NODE
    out: dict[int, list[list[StepRecord]]] = {n: [] for n in range(nodes)}
    for it in range(1, iterations + 1):
        for n in range(nodes):
            recs = []
            for lr in range(RANKS_PER_NODE):
                r = n * RANKS_PER_NODE + lr
                rs = rows[RECORDINGS[r % len(RECORDINGS)]]
                _, tb, td, te, tokens, flops, *_ = rs[it - 1]
                base = rs[0][1]
                d, s = (td - tb) * 1e3, (te - tb) * 1e3
                pid = 4000 + r
                recs.append(StepRecord(
                    job=job, iteration=it, rank=r, end_time=T0 + (te - base), step_time_ms=s, interval=1,
                    timers={HOOK_DATA_WAIT: TimerValue(d, d, {r: d}),
                            HOOK_COMPUTE: TimerValue(s - d, s - d, {r: s - d})},
                    source=Provenance("hook", f"rank{r}:pid{pid}"),
                    fields={"timing": "cuda", "pid": str(pid)},
                    # The loop's own counts for its step, as if every rank of the job ran one like it.
                    tokens_per_step=float(tokens) * world, flops_per_step=float(flops) * world))
            out[n].append(recs)
    return out

"""What one engine shard would spend folding every collective operation of its nodes' ranks into
per-window figures (perfd.analytics.collectives.shardfold), in one process, no engine: each node's
operations of an iteration reduced, encoded and decoded as a node's message is (perfd.engine.partial),
folded, then the iteration's step folds of its nodes, then the figures taken. The job is
``perfd bench collectives``'s (``--ops`` tensor-parallel all-reduces, one data-parallel all-reduce and
a world barrier a rank an iteration); ``--shard-nodes`` of its ``--nodes`` are this shard's.

    python -m benchmarks.shard_fold_bench [--nodes 12500] [--shard-nodes 3125] [--iterations 3]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from benchmarks.collectives_bench import ITERATION_NS, T0, _node_records
from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.collfold import reduce
from perfd.engine.partial import Partial, decode, encode
from perfd.model import ParallelLayout, StepRecord

PER_NODE = 8


def run(nodes: int, shard_nodes: int, iterations: int, ops: int) -> dict[str, object]:
    world = list(range(nodes * PER_NODE))
    rng = random.Random(1)
    sh = ShardCollectives()
    sh.set_layout("bench", ParallelLayout(world_size=len(world), tp=PER_NODE, pp=1, dp=nodes))
    fold_s = take_s = 0.0
    rows = figures = 0
    for it in range(iterations):
        msgs = [encode(f"node-{n}:e:{it}", f"node-{n}", 1, (),
                       collectives=[reduce("bench", _node_records(n, PER_NODE, nodes, it, ops, world, rng))])
                for n in range(shard_nodes)]
        end = (T0 + (it + 1) * ITERATION_NS - 50_000_000) / 1e9
        folds = []
        for n in range(shard_nodes):
            p = Partial("bench", it + 1)
            p.add_records([StepRecord(job="bench", iteration=it + 1, rank=n * PER_NODE + i, end_time=end,
                                      step_time_ms=2000.0) for i in range(PER_NODE)])
            fold = p.fold
            if fold is not None:
                folds.append(fold)
        t = time.process_time()
        for m in msgs:
            for part in decode(m).collectives:
                rows += len(part)
                sh.add(part)
        sh.add_steps(folds)
        fold_s += time.process_time() - t
        t = time.process_time()
        figures += sum(len(f) for f in sh.take())
        take_s += time.process_time() - t
    return {"ranks": shard_nodes * PER_NODE, "job_ranks": len(world), "iterations": iterations, "rows": rows,
            "decode_and_fold_cpu_s": round(fold_s, 2), "take_cpu_s": round(take_s, 2),
            "cpu_us_per_row": round(1e6 * (fold_s + take_s) / max(1, rows), 1),
            "cpu_s_per_iteration": round((fold_s + take_s) / iterations, 2), "figures": figures,
            "window_fold": sh.jobs["bench"].fold.counts.to_json()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--shard-nodes", type=int, default=3_125)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--ops", type=int, default=4)
    a = ap.parse_args(argv)
    print(json.dumps(run(a.nodes, a.shard_nodes, a.iterations, a.ops), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

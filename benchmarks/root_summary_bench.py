"""The engine root's CPU and the partials stream's bytes per iteration of an N-node job: the shards'
partials of per-rank rows (what they publish today) against their step summaries
(perfd.engine.stepsummary: one per partition, whatever its ranks). One process, no engine.

    perfd bench root-summaries [--nodes 1000] [--iterations 8] [--flushes 4] [--json]

Each node's message is the one the live bench's agents send (benchmarks/engine_bench.py: the step
hook's 8 ranks in one Partial, made by perfd's own encoder). An iteration's nodes reach the shards
(``--shards``, each holding ``--partitions`` / shards partitions: a node's partition is
perfd.engine.subjects.partition_of's) over ``--flushes`` flushes, in a shuffled order, as the nodes'
messages spread over an iteration's flushes.

- partials: each shard's flush merges what came into partials of at most MAX_PARTIAL_RANKS ranks and
  encodes them as the shard does (perfd.engine.partial.encode_batches); the root's own code folds
  them (perfd.engine.root.Root.handle: decode, RootFold, the fold's record for the store; a sink that
  keeps nothing, so the store's own cost is not in it; with ``--store``, the aggregator's own sink:
  every record checked against its bounds by the guard and taken by the store, as a live root's).
- summaries: each node's fold is summarised as it comes and merged into its partition's
  (stepsummary.PartitionSummaries); each shard's flush sends the summaries of the partitions that got
  nodes in it, of all their ranks of the iteration so far (a partition's newer summary replaces the one
  held), in one EngineBatch; the root decodes them, holds each partition's newest (SummaryFold) and merges and
  answers each iteration touched (stepsummary.merge, answer).

Reported per iteration (the mean over all but the first ``--warmup``): bytes on the partials stream,
the root's CPU (process time), and the shards' CPU to make what they publish (the merge of node
partials and the encode; for summaries, the summaries too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_bench import RANKS_PER_NODE, _rank_records, node_name
from perfd.core.model import JobInfo, StepRecord
from perfd.engine import stepsummary as ss
from perfd.engine import subjects as S
from perfd.engine import summary_codec as codec
from perfd.engine.partial import Partial, encode_batches, partials_of
from perfd.engine.root import Root
from perfd.engine.root_summaries import SummaryFold
from perfd.engine.shard import DEFAULT_MAX_PAYLOAD, MAX_PARTIAL_RANKS
from perfd.transport.gen import perfd_pb2 as pb

JOB = "bench-summaries"


class _Sink:
    """The root's sink, keeping nothing (the store's cost is another bench's: root-refresh)."""

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None) -> None:
        pass

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        pass

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        pass

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        return None

    def ingest_records(self, *args: Any) -> None:
        pass

    def ingest_collective_partial(self, *args: Any, **kw: Any) -> None:
        pass

    def ingest_window_figures(self, *args: Any) -> None:
        pass

    def admit_job(self, job: str) -> bool:
        return True

    def let_go(self, tokens: Collection[str]) -> list[str]:
        return []


def _copy(p: Partial) -> Partial:
    return Partial(p.job, p.iteration, p.fold, p.ranks, p.job_level, p.messages)


def _ids(prefix: str) -> Callable[[], str]:
    n = iter(range(1 << 30))
    return lambda: f"{prefix}:{next(n)}"


def _iteration_nodes(nodes: int, it: int) -> list[tuple[int, Partial]]:
    world = nodes * RANKS_PER_NODE
    end = 1_795_000_000.0 + 2.0 * it
    return [(n, partials_of(_rank_records(JOB, n, world, it, end), f"{node_name(n)}:e:{it}")[0])
            for n in range(nodes)]


def _store_sink() -> Any:
    """What a live root hands its records to: the aggregator's EngineSink (its guard, its store)."""
    from perfd.aggregator.engine_sink import EngineSink
    from perfd.aggregator.guard import Guard
    from perfd.aggregator.state import AggregatorState
    from perfd.core.limits import Limits
    from perfd.core.refusals import Refusals

    return EngineSink(AggregatorState(), Guard(Limits(), Refusals()))


def run(nodes: int, iterations: int, flushes: int, shards: int, partitions: int, warmup: int,
        store: bool = False) -> dict[str, Any]:
    part_of = {n: S.partition_of(JOB, node_name(n), partitions) for n in range(nodes)}
    shard_of = {p: p % shards for p in range(partitions)}
    rng = random.Random(1)
    root = Root(S.EngineConfig(servers=("nats://127.0.0.1:4222",)), _store_sink() if store else _Sink(),
                "bench")
    fold = SummaryFold()
    held = ss.PartitionSummaries()  # the shards' (each holds its own partitions': one object here)
    seq = 0
    rows: list[dict[str, float]] = []
    for it in range(1, iterations + 1):
        msgs = _iteration_nodes(nodes, it)
        rng.shuffle(msgs)
        per_flush = [msgs[k::flushes] for k in range(flushes)]
        old = {"bytes": 0.0, "root_cpu_s": 0.0, "shards_cpu_s": 0.0}
        new = dict(old)
        held.drop_before(JOB, it)
        for flush in per_flush:
            seq += 1
            for sh in range(shards):
                mine = [(n, p) for n, p in flush if shard_of[part_of[n]] == sh]
                if not mine:
                    continue
                # partials: merged up to MAX_PARTIAL_RANKS, encoded as the shard does
                t = time.process_time()
                out: list[Partial] = []
                for _, p in mine:
                    if out and len(out[-1].ranks) + len(p.ranks) <= MAX_PARTIAL_RANKS:
                        out[-1].merge(p)
                    else:
                        out.append(_copy(p))
                batches = encode_batches(_ids(f"s{sh}:{seq}"), f"s{sh}", 0, out, None,
                                         DEFAULT_MAX_PAYLOAD - 4096)
                old["shards_cpu_s"] += time.process_time() - t
                old["bytes"] += sum(len(b) for _, b in batches)
                t = time.process_time()
                root.handle([b for _, b in batches])
                old["root_cpu_s"] += time.process_time() - t
                # summaries: each node's fold summarised and merged into its partition's
                t = time.process_time()
                for n, p in mine:
                    assert p.fold is not None
                    held.add(part_of[n], p.fold, p.ranks, lambda r: 0)
                b = pb.EngineBatch(id=f"s{sh}:{seq}", sender=f"s{sh}", created_ns=0)
                for summary in held.take(1, seq):
                    codec.to_pb(summary, b.step_summaries.add())
                data = b.SerializeToString()
                new["shards_cpu_s"] += time.process_time() - t
                new["bytes"] += len(data)
                t = time.process_time()
                d = pb.EngineBatch()
                d.ParseFromString(data)
                keys = set()
                for m in d.step_summaries:
                    s = codec.from_pb(m)
                    fold.add(s)
                    keys.add((s.job, s.iteration))
                for job, i in keys:
                    merged = fold.merged(job, i)
                    assert merged is not None
                    ss.answer(merged, 1.1)
                new["root_cpu_s"] += time.process_time() - t
        if it > warmup:
            rows.append({**{f"partials_{k}": v for k, v in old.items()},
                         **{f"summaries_{k}": v for k, v in new.items()}})
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    ranks = nodes * RANKS_PER_NODE
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "processor": platform.machine()},
        "config": {"nodes": nodes, "ranks": ranks, "iterations": iterations, "flushes": flushes,
                   "shards": shards, "partitions": partitions, "warmup": warmup, "store": store},
        "per_iteration": {k: round(v, 6) for k, v in mean.items()},
        "per_rank_iteration": {
            "partials_bytes": round(mean["partials_bytes"] / ranks, 2),
            "summaries_bytes": round(mean["summaries_bytes"] / ranks, 3),
            "partials_root_cpu_us": round(mean["partials_root_cpu_s"] / ranks * 1e6, 3),
            "summaries_root_cpu_us": round(mean["summaries_root_cpu_s"] / ranks * 1e6, 3)},
        "root_summaries_held": sum(len(v) for v in fold.held.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench root-summaries", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="nodes of 8 ranks (default %(default)s)")
    ap.add_argument("--iterations", type=int, default=8, help="iterations (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="first iterations not counted (default %(default)s)")
    ap.add_argument("--flushes", type=int, default=4, help="shard flushes an iteration (default %(default)s)")
    ap.add_argument("--shards", type=int, default=4, help="shards (default %(default)s)")
    ap.add_argument("--partitions", type=int, default=S.DEFAULT_PARTITIONS,
                    help="partitions (default %(default)s)")
    ap.add_argument("--store", action="store_true",
                    help="the partials' records go to the aggregator's own sink (its guard and store), "
                    "as a live root's; default: a sink that keeps nothing")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.nodes < 1 or not 0 <= a.warmup < a.iterations or a.flushes < 1 or a.shards < 1:
        ap.error("--nodes >= 1, 0 <= --warmup < --iterations, --flushes >= 1, --shards >= 1")
    res = run(a.nodes, a.iterations, a.flushes, a.shards, a.partitions, a.warmup, a.store)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

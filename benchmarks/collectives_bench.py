"""The collective records of an N-node job on the engine path, reduced (perfd.core.collfold):
what a node's message costs (bytes, the agent's CPU to reduce and encode it, against its records as
sent), what the root spends reading it and merging it into its store (the keyed union, and the
per-window fold of every operation it newly merged: perfd.analytics.collectives.winfold), what the
store then holds, and what the analysis of it costs — with the per-iteration shares it gives. In one
process, no engine: the costs are the code's. Each rank runs, per iteration, ``--ops`` all-reduces on
its node's tensor-parallel group, one 128 MiB all-reduce on its data-parallel group (across nodes)
and a barrier on the world group (which lists every rank); each node's agent sends an iteration's
records once it ended, node after node, and the job's step record of the iteration comes after them.

    perfd bench collectives [--nodes 12500] [--ranks-per-node 8] [--iterations 4] [--ops 4]
                            [--every-operation] [--json]

The agents send what an engine agent sends (perfd.core.collfold.SENT_RETENTION: the store's share), or with
``--every-operation`` each rank's newest 512 (every operation here): what the root would spend to fold
them all.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import sys
import time
from typing import Any

from perfd.aggregator.collectives import CollectiveStore
from perfd.core.collfold import REDUCED_RETENTION, SENT_RETENTION, Retention, for_sending, reduce
from perfd.core.model import CollectiveRecord, ParallelLayout, StepRecord
from perfd.engine.partial import decode, encode
from perfd.transport.codec import encode_batch
from perfd.transport.series import SeriesTable

RAW_SAMPLE_NODES = 50  # nodes whose records as sent are encoded too (the comparison; it is slow)
T0 = 1_795_000_000_000_000_000
ITERATION_NS = 2_000_000_000


def _node_records(node: int, per: int, nodes: int, it: int, ops: int, world: list[int],
                  rng: random.Random) -> list[CollectiveRecord]:
    """The node's ranks' records of iteration ``it`` (what its agent sends after that iteration)."""
    out = []
    tp = [node * per + i for i in range(per)]
    for local in range(per):
        r = node * per + local
        dp = list(range(local, nodes * per, per))
        tp_pg, dp_pg = 1 + node, 1 + nodes + local  # every rank creates every group, in this order
        t = T0 + it * ITERATION_NS + 1_000_000
        for k in range(ops):
            out.append(CollectiveRecord(
                job="bench", source="flight_recorder", op="all_reduce", rank=r, pg_id=tp_pg,
                pg_name=str(tp_pg), pg_desc="TENSOR_MODEL_PARALLEL_GROUP", pg_ranks=tp, group_rank=local,
                group_size=per, collective_seq_id=it * ops + k, bytes=16 << 20, state="completed",
                time_created_ns=t, duration_ms=0.5 + rng.random() * 3, dtype="BFloat16",
                raw_op="nccl:all_reduce"))
            t += 50_000_000
        dur = 10 + rng.random() * 20
        out.append(CollectiveRecord(
            job="bench", source="flight_recorder", op="all_reduce", rank=r, pg_id=dp_pg,
            pg_name=str(dp_pg), pg_desc="DATA_PARALLEL_GROUP", pg_ranks=dp, group_rank=node,
            group_size=nodes, collective_seq_id=it, bytes=128 << 20, state="completed",
            time_created_ns=t, duration_ms=dur, busbw_gbs=(128 << 20) / dur / 1e6, dtype="BFloat16",
            raw_op="nccl:all_reduce"))
        out.append(CollectiveRecord(
            job="bench", source="flight_recorder", op="barrier", rank=r, pg_id=0, pg_name="0",
            pg_desc="default_pg", pg_ranks=world, group_rank=r, group_size=len(world),
            collective_seq_id=it, bytes=0, state="completed", time_created_ns=t + 900_000_000,
            duration_ms=0.3 + rng.random(), dtype="Float", raw_op="nccl:all_reduce"))
    return out


def _step(it: int) -> StepRecord:
    """The job's step record ending iteration ``it`` - 1 (the window of iteration ``it`` - 1's
    collectives is between the ends of step records ``it`` - 1 and ``it``): what the root's jobs store
    holds of the engine's step folds."""
    end_ns = T0 + it * ITERATION_NS - 50_000_000
    return StepRecord(job="bench", iteration=it, rank="last", end_time=end_ns / 1e9)


EVERY_OPERATION = Retention(per_rank=REDUCED_RETENTION.per_rank)  # no share of the job: a rank's newest


def run(nodes: int, per: int, iterations: int, ops: int, sent: Retention = SENT_RETENTION) -> dict[str, Any]:
    rng = random.Random(1)
    world = list(range(nodes * per))
    layout = ParallelLayout(world_size=len(world), tp=per, pp=1, dp=nodes)
    steps: list[StepRecord] = [_step(0)]
    store = CollectiveStore(min_recompute_s=0.0)  # the root's: REDUCED_RETENTION, its window fold
    store.fold_inputs = lambda job: ((len(steps), layout), lambda: (list(steps), layout))
    agent_s = root_s = 0.0
    msg_bytes: list[int] = []
    raw_bytes: list[int] = []
    records = rows_sent = messages = 0
    for it in range(iterations):  # each node's agent sends an iteration's records, node after node
        for node in range(nodes):
            recs = _node_records(node, per, nodes, it, ops, world, rng)
            records += len(recs)
            t = time.process_time()
            part = for_sending(reduce("bench", recs), sent)
            data = encode(f"node-{node}:e:{it}", f"node-{node}", 1, (), collectives=[part])
            agent_s += time.process_time() - t
            rows_sent += len(part)
            msg_bytes.append(len(data))
            messages += 1
            if node < RAW_SAMPLE_NODES and it == 0:
                raw_bytes.append(encode_batch("a", 1, (), (), (), SeriesTable(), collectives=recs).ByteSize())
            t = time.process_time()
            for got in decode(data).collectives:
                store.ingest_partial(f"node-{node}", got)
            root_s += time.process_time() - t
        steps.append(_step(it + 1))  # the iteration's step record comes once it ended
    jc = store.jobs["bench"]
    assert jc.partial is not None and jc.fold is not None
    t = time.process_time()
    a = store.analysis("bench", (len(steps),), lambda: (list(steps), layout, {}, None), force=True)
    finish_s = time.process_time() - t
    assert a is not None
    answer = json.dumps(a.to_json())
    return {
        "nodes": nodes, "ranks": len(world), "iterations": iterations, "records": records,
        "rows_sent": rows_sent, "rows_held": len(jc.partial), "retention": vars(REDUCED_RETENTION),
        "sent_retention": vars(sent),
        "message_bytes_mean": round(sum(msg_bytes) / len(msg_bytes)), "message_bytes_max": max(msg_bytes),
        "records_as_sent_bytes_mean_first_nodes": round(sum(raw_bytes) / len(raw_bytes)),
        "agent_cpu_ms_per_node_message": round(agent_s / messages * 1e3, 3),
        "root_cpu_ms_per_node_message": round(root_s / messages * 1e3, 3),
        "root_cpu_s_all_messages": round(root_s, 2), "finish_cpu_s": round(finish_s, 2),
        "window_fold": {**jc.fold.counts.to_json(), "pending": jc.fold.pending,
                        "blocks": len(jc.fold.blocks)},
        "answer_bytes": len(answer), "method": a.method,
        "iterations_with_shares": [{"iteration": i.iteration, "ranks": len(i.share_by_rank), "share": i.share,
                                    "by_group": i.by_group} for i in a.iterations],
        "comm_total_share": a.comm_total_share, "comm_share_by_group": a.comm_share_by_group,
        "summary_windows": a.n_windows, "waits_ranks": len(a.waits),
        "bandwidth_groups": [b.group for b in a.bandwidth],
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench collectives", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--ops", type=int, default=4, help="tensor-parallel all-reduces a rank an iteration")
    ap.add_argument("--every-operation", action="store_true",
                    help="agents send each rank's newest 512 operations, not the store's share")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    if min(a.nodes, a.ranks_per_node, a.iterations, a.ops) < 1:
        print("perfd bench collectives: every count must be >= 1", file=sys.stderr)
        return 2
    sent = EVERY_OPERATION if a.every_operation else SENT_RETENTION
    r = run(a.nodes, a.ranks_per_node, a.iterations, a.ops, sent)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['ranks']} ranks: a node's message {r['message_bytes_mean']} bytes (its records as sent "
              f"{r['records_as_sent_bytes_mean_first_nodes']}), "
              f"agent {r['agent_cpu_ms_per_node_message']} ms, "
              f"root {r['root_cpu_ms_per_node_message']} ms a message; {r['rows_held']} rows held; "
              f"{len(r['iterations_with_shares'])} iteration(s) with shares; the analysis "
              f"{r['finish_cpu_s']} s of CPU; max RSS {r['max_rss_mb']} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

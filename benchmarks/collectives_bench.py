"""The collective records of an N-node job on the engine path, reduced (perfd.collfold):
what a node's message costs (bytes, the agent's CPU to reduce and encode it, against its records as
sent), what the root spends reading and merging it, what the store then holds, and what the analysis
of it costs. In one process, no engine: the costs are the code's. Each rank runs, per iteration,
``--ops`` all-reduces on its node's tensor-parallel group, one 128 MiB all-reduce on its
data-parallel group (across nodes) and a barrier on the world group (which lists every rank).

    perfd bench collectives [--nodes 12500] [--ranks-per-node 8] [--iterations 2] [--ops 4] [--json]
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

from perfd.analytics.collectives.analysis import finish
from perfd.collfold import REDUCED_RETENTION, CollectivePartial, for_sending, reduce
from perfd.engine.partial import decode, encode
from perfd.model import CollectiveRecord, ParallelLayout
from perfd.transport.codec import encode_batch
from perfd.transport.series import SeriesTable

RAW_SAMPLE_NODES = 50  # nodes whose records as sent are encoded too (the comparison; it is slow)
T0 = 1_795_000_000_000_000_000


def _node_records(node: int, per: int, nodes: int, iterations: int, ops: int, world: list[int],
                  rng: random.Random) -> list[CollectiveRecord]:
    out = []
    tp = [node * per + i for i in range(per)]
    for local in range(per):
        r = node * per + local
        dp = list(range(local, nodes * per, per))
        tp_pg, dp_pg = 1 + node, 1 + nodes + local  # every rank creates every group, in this order
        for it in range(iterations):
            t = T0 + it * 2_000_000_000 + 1_000_000
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


def run(nodes: int, per: int, iterations: int, ops: int) -> dict[str, Any]:
    rng = random.Random(1)
    world = list(range(nodes * per))
    held = CollectivePartial("bench")
    agent_s = root_s = 0.0
    msg_bytes: list[int] = []
    raw_bytes: list[int] = []
    records = rows_sent = 0
    for node in range(nodes):
        recs = _node_records(node, per, nodes, iterations, ops, world, rng)
        records += len(recs)
        t = time.process_time()
        part = for_sending(reduce("bench", recs), REDUCED_RETENTION)
        data = encode(f"node-{node}:e:1", f"node-{node}", 1, (), collectives=[part])
        agent_s += time.process_time() - t
        rows_sent += len(part)
        msg_bytes.append(len(data))
        if node < RAW_SAMPLE_NODES:
            raw_bytes.append(encode_batch("a", 1, (), (), (), SeriesTable(), collectives=recs).ByteSize())
        t = time.process_time()
        for got in decode(data).collectives:
            held.absorb(got, REDUCED_RETENTION)
        root_s += time.process_time() - t
    layout = ParallelLayout(world_size=len(world), tp=per, pp=1, dp=nodes)
    t = time.process_time()
    a = finish(held, (), layout=layout)
    finish_s = time.process_time() - t
    answer = json.dumps(a.to_json())
    return {
        "nodes": nodes, "ranks": len(world), "iterations": iterations, "records": records,
        "rows_sent": rows_sent, "rows_held": len(held), "retention": vars(REDUCED_RETENTION),
        "message_bytes_mean": round(sum(msg_bytes) / len(msg_bytes)), "message_bytes_max": max(msg_bytes),
        "records_as_sent_bytes_mean_first_nodes": round(sum(raw_bytes) / len(raw_bytes)),
        "agent_cpu_ms_per_node_message": round(agent_s / nodes * 1e3, 3),
        "root_cpu_ms_per_node_message": round(root_s / nodes * 1e3, 3),
        "root_cpu_s_all_messages": round(root_s, 2), "finish_cpu_s": round(finish_s, 2),
        "answer_bytes": len(answer), "method": a.method, "waits_ranks": len(a.waits),
        "bandwidth_groups": [b.group for b in a.bandwidth],
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench collectives", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--ops", type=int, default=4, help="tensor-parallel all-reduces a rank an iteration")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    if min(a.nodes, a.ranks_per_node, a.iterations, a.ops) < 1:
        print("perfd bench collectives: every count must be >= 1", file=sys.stderr)
        return 2
    r = run(a.nodes, a.ranks_per_node, a.iterations, a.ops)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['ranks']} ranks: a node's message {r['message_bytes_mean']} bytes (its records as sent "
              f"{r['records_as_sent_bytes_mean_first_nodes']}), "
              f"agent {r['agent_cpu_ms_per_node_message']} ms, "
              f"root {r['root_cpu_ms_per_node_message']} ms a message; {r['rows_held']} rows held; the "
              f"analysis {r['finish_cpu_s']} s of CPU; max RSS {r['max_rss_mb']} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The distributed path gives the job the analysis one aggregator gives, byte for byte: the same
records (each rank's clock a real recorded H100 loop, tests/engine/records.py) sent by 4 nodes x 8
ranks to one aggregator's state, and through a real nats-server (JetStream), two shards and a root
into another; the analysis JSON (what /api/jobs/<job>/summary and /iterations serve) is compared
whole, and every node message is folded in exactly once."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from perfd.aggregator.http import job_iterations
from perfd.aggregator.state import AggregatorState
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from perfd.engine.root import Root
from perfd.engine.shard import Shard
from perfd.jobinfo_json import job_info_to_json
from perfd.model import HOOK_FRAMEWORK, JobInfo, ModelSpec
from perfd.report import analysis_json
from tests.engine.records import job_records
from tests.engine.test_natsd import _need_nats_server

JOB = "llm pretrain/8k"  # a name with a space and a slash: subject syntax it must not become
NODES, ITERATIONS = 4, 40


def _answer(state: AggregatorState) -> str:
    a = state.analysis(JOB, force=True)
    assert a is not None and a.iterations
    return json.dumps({"analysis": analysis_json(a, []), "iterations": job_iterations(state, JOB)},
                      sort_keys=True)


@pytest.mark.timeout(120)
def test_the_engine_path_gives_one_aggregators_analysis_byte_for_byte(tmp_path: Path):
    _need_nats_server()
    by_node = job_records(JOB, NODES, ITERATIONS)
    gpu = "NVIDIA H100 80GB HBM3"  # the recordings' GPU: MFU is in the answer compared
    single, rooted = AggregatorState(gpu_override=gpu), AggregatorState(gpu_override=gpu)
    # The job as its hooks describe it (the dtype: MFU is then in the answer), sent by node 0's agent.
    info = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"))
    single.ingest_job_info(f"node-0/{JOB}", JOB, info)
    for it in range(ITERATIONS):  # one aggregator: each node's agent sends its ranks' records
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])

    async def through_the_engine(urls: list[str]) -> tuple[dict[str, int], list[EngineClient], Root]:
        cfg = S.EngineConfig(tuple(urls), partitions=4)
        stop = asyncio.Event()
        shards = [Shard(cfg, f"shard-{i}") for i in range(2)]
        root = Root(cfg, rooted, "root-a")
        clients = [EngineClient(cfg, f"node-{n}/{JOB}", node=f"node-{n}") for n in range(NODES)]
        tasks = [asyncio.create_task(s.run(stop)) for s in shards] + [asyncio.create_task(root.run(stop))]
        senders = [asyncio.create_task(c.run()) for c in clients]
        clients[0].submit(job_info_json={JOB: job_info_to_json(info)})
        for it in range(ITERATIONS):
            for n, c in enumerate(clients):
                c.submit(steps=by_node[n][it])
            # 20 iterations a second, 100x a real job's pace: a shard's 0.25 s flush holds ~5 of them,
            # well inside the 16 the root keeps in memory (none is late).
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 60
        while root.stats.node_messages < NODES * ITERATIONS and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop.set()
        for t in senders:
            t.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, *senders, return_exceptions=True), 30)
        published = sum(c.published - c.duplicates for c in clients)
        shard_messages = sum(s.stats.node_messages for s in shards)
        return {"published": published, "shard_messages": shard_messages}, clients, root

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        counts, clients, root = asyncio.run(through_the_engine(cluster.urls))
    # Every node message folded in once (the job info went in a message of its own, with no records).
    assert counts["published"] == NODES * ITERATIONS + 1
    assert root.stats.node_messages == NODES * ITERATIONS == counts["shard_messages"] - 1
    assert root.stats.redelivered == 0 and root.stats.undecodable == 0 and root.stats.late == 0
    # Whole at the root: every iteration but perhaps the first (not counted while it was all the
    # job had shown, perfd.engine.root.RootFold).
    assert root.stats.complete >= ITERATIONS - 1
    assert all(c.spool.pending_count() == 0 for c in clients)
    assert _answer(rooted) == _answer(single)
    # What the comparison holds: 40 iterations of 32 ranks, each its slowest rank's step.
    its = job_iterations(rooted, JOB)
    assert its is not None and len(its["iterations"]) == ITERATIONS
    steady = [i for i in its["iterations"] if i.get("steady_state")]
    assert len(steady) > ITERATIONS // 2 and all(isinstance(i.get("mfu"), float) for i in steady), steady[:1]
    world = rooted.analysis(JOB)
    assert world is not None and world.job.layout.world_size == NODES * 8

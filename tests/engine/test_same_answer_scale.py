"""The same answer as one aggregator at a scale one aggregator still holds, through 4 shards: 1,000
nodes x 8 ranks (8,000 ranks, the 1,000 agents one aggregator holds in the hook's shape: docs/scale.md)
and 125 x 8, each rank's clock a real recorded H100 loop (tests/engine/records.py). One aggregator's
state takes every node's records as its agent sends them; the same records go, one message per node
and iteration made by the agent's own encoder (perfd.engine.partial: what EngineClient spools and
publishes, with its id as Nats-Msg-Id), through a real nats-server, four shards and a root into
another. The analysis JSON (what /api/jobs/<job>/summary and /iterations serve: MFU, the slowest
rank, every per-iteration figure) is compared whole, and every node message is counted folded once.

The nodes publish on one connection (1,000 agents' connections in this one test process would measure
the test, not the path: `perfd bench engine-storm` runs 2,000 real EngineClients)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout, StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.connect import connect, ensure_streams
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import encode, partials_of
from perfd.engine.root import Root
from perfd.engine.shard import Shard
from tests.engine.engine_driver import split_settled, until
from tests.engine.records import RANKS_PER_NODE, job_records
from tests.engine.test_natsd import _need_nats_server
from tests.engine.test_same_answer import AHEAD, GPU, JOB, _answer

SHARDS = 4
RETAIN_MIB = 1024
# AHEAD (tests.engine.test_same_answer) counts here past the oldest iteration the root has not yet made
# whole, not on the root's total count: under load one shard fell 16 iterations behind while the other
# three kept the total within the bound (CI, 10 partials late).


def _info(world: int) -> JobInfo:
    """The job as its hooks describe it: the dtype (MFU) and torch.distributed's world size."""
    return JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                   layout=ParallelLayout(world_size=world))


def _differences(got: object, want: object, path: str = "", out: list[str] | None = None) -> list[str]:
    """Where two JSON values differ (the first 20 paths, each with both values): what a failure says."""
    out = [] if out is None else out
    if len(out) >= 20:
        return out
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want)):
            _differences(got.get(k, "<absent>"), want.get(k, "<absent>"), f"{path}/{k}", out)
    elif isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _differences(g, w, f"{path}/{i}", out)
    elif got != want:
        out.append(f"{path}: engine {str(got)[:200]} != one aggregator {str(want)[:200]}")
    return out


def _agent(n: int) -> str:
    return f"node-{n}/{JOB}"


def _made_whole(root: Root, iteration: int) -> bool:
    """Whether the root has every rank of ``iteration`` (held in memory, or gone from it whole)."""
    held, gone = root.fold.jobs.get(JOB), root.fold.gone.get(JOB)
    acc = held.get(iteration) if held is not None else None
    if acc is not None:
        return acc.complete
    left = gone.get(iteration) if gone is not None else None
    return left is not None and left.complete


async def _through_the_engine(urls: list[str], rooted: AggregatorState, info: JobInfo,
                              by_node: dict[int, list[list[StepRecord]]]) -> tuple[int, Root, list[Shard]]:
    """Each node's message of each iteration through a real nats-server, ``SHARDS`` shards and a root
    into ``rooted``; returns the node messages published (the engine took each once), the root, the
    shards."""
    cfg = S.EngineConfig(tuple(urls), partitions=16)
    stop = asyncio.Event()
    shards = [Shard(cfg, f"shard-{i}") for i in range(SHARDS)]
    root = Root(cfg, EngineSink(rooted, Guard(Limits(), Refusals())), "root-a")
    nc = await connect(cfg, "nodes")
    await ensure_streams(nc, cfg, 1)
    js = nc.jetstream()
    tasks = [asyncio.create_task(s.run(stop)) for s in shards] + [asyncio.create_task(root.run(stop))]
    nodes, iterations = len(by_node), len(by_node[0])

    async def publish(n: int, mid: str, data: bytes) -> None:
        ack = await js.publish(S.node_subject(JOB, S.partition_of(JOB, _agent(n), cfg.partitions)), data,
                               timeout=30.0, headers={"Nats-Msg-Id": mid})
        assert not ack.duplicate, mid

    try:
        await until("the shards split the partitions for good before the job starts",
                    lambda: split_settled([s.stats.partitions for s in shards], cfg.partitions), 60)
        await publish(0, "node-0:info", encode("node-0:info", _agent(0), time.time_ns(), (),
                                               {JOB: job_info_to_json(info)}))
        for it in range(iterations):  # records' iterations are 1..iterations
            deadline = time.monotonic() + 120
            while (not all(_made_whole(root, i) for i in range(1, it - AHEAD + 1))
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.05)
            msgs = []
            for n in range(nodes):
                mid = f"{_agent(n)}:e:{it + 1}"  # the agent's id: sender, spool epoch, sequence
                data = encode(mid, _agent(n), time.time_ns(), partials_of(by_node[n][it], mid))
                msgs.append((n, mid, data))
            for i in range(0, nodes, 256):
                await asyncio.gather(*(publish(*m) for m in msgs[i:i + 256]))
        deadline = time.monotonic() + 180
        while root.stats.node_messages < nodes * iterations and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

        async def settled() -> bool:
            """Every node message acknowledged at the shards (a shard acknowledges once it has sent its
            partials: none left for the engine to deliver again and a shard to send twice), and the
            partials stream read by the root to its last message: a redelivery would be counted by now."""
            api: Any = js  # nats-py's, beyond the engine's own calls (perfd.engine.nats_api)
            for p in range(cfg.partitions):
                ci = await api.consumer_info(S.NODES_STREAM, S.shard_consumer(p))
                if ci.num_ack_pending or ci.num_pending:
                    return False
            return bool(root._read_to >= (await api.stream_info(S.PARTIALS_STREAM)).state.last_seq)

        deadline = time.monotonic() + 60
        while not await settled() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        await nc.close()
    return nodes * iterations, root, shards


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("nodes", "iterations"), [(125, 40), (1000, 20)], ids=["1000-ranks", "8000-ranks"])
def test_four_shards_give_one_aggregators_analysis_byte_for_byte_at_scale(tmp_path: Path, nodes: int,
                                                                         iterations: int) -> None:
    _need_nats_server()
    world = nodes * RANKS_PER_NODE
    by_node = job_records(JOB, nodes, iterations)
    info = _info(world)
    # Both hold every iteration of the replay (``perfd aggregator --retain-mib 1024``): with the default
    # 256 MiB, one aggregator holding 8,000 ranks' records with their timers keeps ~15 iterations (its
    # byte bound: docs/evidence/entries/48-scale-history.md), where the root's folds take a few hundred KB an
    # iteration.
    single, rooted = (AggregatorState(gpu_override=GPU, max_bytes_per_job=RETAIN_MIB << 20) for _ in range(2))
    single.ingest_job_info(_agent(0), JOB, info)
    for it in range(iterations):  # one aggregator: each node's agent sends its ranks' records
        for n in range(nodes):
            single.ingest_steps(_agent(n), by_node[n][it])

    t0 = time.monotonic()
    with NatsCluster(tmp_path / "nats", 1) as cluster:
        published, root, shards = asyncio.run(_through_the_engine(cluster.urls, rooted, info, by_node))
    took = time.monotonic() - t0
    st = root.stats
    print(f"FIGURES {world} ranks, {iterations} iterations, {SHARDS} shards: {published} node messages in "
          f"{took:.1f}s; root {st.to_json()}; shards {[s.stats.node_messages for s in shards]}, delivered "
          f"again {[s.stats.delivered_again for s in shards]}, resent "
          f"{[s.stats.messages_resent for s in shards]}; leases taken/lost "
          f"{[(s.stats.leases_taken, s.stats.leases_lost) for s in shards]}")
    # Every node message folded in once, at the shards (the job info's message too) and at the root. A
    # message the engine delivered again (its ack wait ran out: the root, the shards and this test share
    # one event loop, which a loaded machine can hold past the 10 s; or a lease lost, the fetch dropped)
    # comes to a shard again, and to the root again if its first delivery was folded, and is folded once;
    # the root sees none again that the engine did not deliver again or a shard did not send again (a
    # publish whose acknowledgement timed out under load, sent again, the engine having stored the first:
    # a loaded run's four shards each had one, 2,653 messages at the root again against 2,399 delivered
    # again). Every message is folded at a shard at least once, and at most once a delivery (a fetch
    # dropped with a lost lease folds none of its messages: a loaded run lost 4 leases a shard).
    again = sum(s.stats.delivered_again for s in shards)
    resent = sum(s.stats.messages_resent for s in shards)
    assert st.node_messages == published and st.late == 0 and st.undecodable == 0
    assert st.redelivered <= again + resent, (st.redelivered, again, resent)
    assert published + 1 <= sum(s.stats.node_messages for s in shards) <= published + 1 + again
    assert all(s.stats.node_messages > 0 for s in shards), "every shard held partitions"
    # Whole at the root, each iteration once, the first too: the info named the world.
    assert st.complete == iterations
    got, want = _answer(rooted), _answer(single)
    assert got == want, _differences(json.loads(got), json.loads(want))
    assert len(json.loads(want)["analysis"]["iterations"]) == iterations  # one aggregator held them all
    rows = rooted.analysis(JOB)
    assert rows is not None and rows.job.layout.world_size == world

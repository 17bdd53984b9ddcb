"""The shards' step summaries travel live, beside the partials: 125 nodes x 8 ranks (1,000 ranks), each
rank's clock a real recorded H100 loop (tests/engine/records.py) with Megatron's forward and backward
timers, stragglers and a tie (tests/engine/test_same_answer_summary.py's), one message per node and
iteration made by the agent's own encoder, through a real nats-server, two shards and a root.

The root's answer of each iteration it keeps (perfd.engine.root_summaries, as /api/stats shows it) is
the answer of stepsummary's offline merge of the same records (each partition's node folds summarised
and merged: equal, whole), and one aggregator's on the exact parts (ranks, the slowest rank's record,
the latest end, each timer's count, sum, min, max and each stage's count and sum), within the sketch's
stated error on the medians. A summary delivered again counts once (stale), a newer flush of the same
partition's holder replaces the one held: the counters say so, and the answer is unchanged."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from pathlib import Path

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_COMPUTE
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout, StepRecord
from perfd.core.refusals import Refusals
from perfd.core.sketch import SKETCH_ACCURACY
from perfd.core.stepfold import fold_ranks
from perfd.engine import shard_jobinfo
from perfd.engine import stepsummary as ss
from perfd.engine import subjects as S
from perfd.engine import summary_codec as codec
from perfd.engine.connect import connect, ensure_streams
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import Partial, encode, partials_of
from perfd.engine.root import Root
from perfd.engine.root_summaries import ANSWERS_KEPT
from perfd.engine.shard import Shard
from perfd.transport.gen import perfd_pb2 as pb
from tests.engine.engine_driver import split_settled, until
from tests.engine.records import RANKS_PER_NODE
from tests.engine.test_natsd import _need_nats_server
from tests.engine.test_same_answer import AHEAD, GPU, JOB
from tests.engine.test_same_answer_summary import PP, megatron

NODES, ITERATIONS, SHARDS, PARTITIONS = 125, 6, 2, 8
WORLD = NODES * RANKS_PER_NODE
LAYOUT = ParallelLayout(world_size=WORLD, tp=1, pp=PP, dp=WORLD // PP, cp=1)
INFO = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"), layout=LAYOUT)
A = SKETCH_ACCURACY


def _agent(n: int) -> str:
    return f"node-{n}/{JOB}"


def _partition(n: int) -> int:
    return S.partition_of(JOB, _agent(n), PARTITIONS)


def _held(root: Root, it: int) -> ss.StepSummary | None:
    return root.summaries.fold.merged(JOB, it)


def _offline(by_node: dict[int, list[list[StepRecord]]], it: int) -> ss.StepSummary:
    """Iteration ``it`` summarised offline as the shards do: each partition's node folds, merged."""
    folds: dict[int, list[StepRecord]] = {}
    for n, its in by_node.items():
        p = Partial(JOB, it)
        p.add_records(its[it - 1])
        assert p.fold is not None
        folds.setdefault(_partition(n), []).append(p.fold)
    stages = ss.stages_of(LAYOUT)
    return ss.merge(ss.summarize(JOB, it, fs, stages, partition=part) for part, fs in folds.items())


async def _through_the_engine(urls: list[str], by_node: dict[int, list[list[StepRecord]]],
                              join_after: int | None = None) -> tuple[Root, list[Shard], dict[str, int]]:
    """Each node's message of each iteration (its first with the job's info, as a hook job's agent
    sends it) through a real nats-server, the shards and a root; then one partition's summary of the
    last iteration published twice more: as it was (delivered again) and as a newer flush. Returns
    the root, the shards and the root's summary counters before those two. ``join_after``: the second
    shard starts once that many iterations are published (the first gives it half its partitions back
    while their iterations are folded), else both at the start."""
    cfg = S.EngineConfig(tuple(urls), partitions=PARTITIONS)
    stop = asyncio.Event()
    shards = [Shard(cfg, f"shard-{i}") for i in range(SHARDS)]
    rooted = AggregatorState(gpu_override=GPU)
    root = Root(cfg, EngineSink(rooted, Guard(Limits(), Refusals())), "root-a")
    nc = await connect(cfg, "nodes")
    await ensure_streams(nc, cfg, 1)
    js = nc.jetstream()
    first = shards[:1] if join_after is not None else shards
    tasks = [asyncio.create_task(s.run(stop)) for s in first] + [asyncio.create_task(root.run(stop))]
    info = {JOB: job_info_to_json(INFO)}

    async def publish(subject: str, mid: str, data: bytes) -> None:
        ack = await js.publish(subject, data, timeout=30.0, headers={"Nats-Msg-Id": mid})
        assert not ack.duplicate, mid

    def summaries_whole(it: int) -> bool:
        held = _held(root, it)
        return held is not None and held.ranks_in == WORLD

    try:
        await until("the shards split the partitions for good",
                    lambda: split_settled([s.stats.partitions for s in first], PARTITIONS), 60)
        for it in range(ITERATIONS):  # records' iterations are 1..ITERATIONS
            def caught_up(ahead: int = it - AHEAD) -> bool:  # at most AHEAD iterations past the root
                return root.stats.complete >= ahead

            await until(f"iteration {it - AHEAD} whole at the root", caught_up, 120, 0.05)
            msgs = []
            for n in range(NODES):
                mid = f"{_agent(n)}:e:{it + 1}"  # the agent's id: sender, spool epoch, sequence
                data = encode(mid, _agent(n), time.time_ns(), partials_of(by_node[n][it], mid),
                              info if it == 0 else None)
                msgs.append((S.node_subject(JOB, _partition(n)), mid, data))
            for i in range(0, NODES, 64):
                if it == join_after and i:
                    # Half the iteration folded by the one shard; the second joins and takes its share
                    # before the rest is sent: the partitions it takes have two holders of the iteration
                    half = NODES * it + i

                    def folded(n: int = half) -> bool:
                        return root.stats.node_messages >= n

                    await until("the first half folded at the root", folded, 60)
                    tasks.append(asyncio.create_task(shards[1].run(stop)))
                    await until("the second shard holds its share",
                                lambda: split_settled([s.stats.partitions for s in shards], PARTITIONS), 60)
                await asyncio.gather(*(publish(*m) for m in msgs[i:i + 64]))
        await until("every node message folded once at the root",
                    lambda: root.stats.node_messages >= NODES * ITERATIONS, 180)
        await until("every kept iteration's summaries whole at the root",
                    lambda: all(summaries_whole(it) for it in range(1, ITERATIONS + 1)), 60)
        # a shard that took partitions over may have had the bucket's answer late (a loaded machine):
        # its ranks folded meanwhile go into their stages when it lands, their summaries sent again
        await until("every shard holds the job's info",
                    lambda: all(s.summaries.has_info(JOB) for s in shards), 60)
        await until("every summary the shards sent read at the root, none left to send",
                    lambda: not any(s.summaries.touched for s in shards)
                    and root.stats.summaries == sum(s.stats.summaries_published for s in shards), 30)
        before = {k: getattr(root.stats, k) for k in ("summaries", "summaries_replaced", "summaries_stale")}
        # One partition's summary of the last iteration, as the root holds it: delivered again, then
        # as a newer flush of the same partition (the shard's next, with nothing new folded in)
        parts = root.summaries.fold.held[(JOB, ITERATIONS)]
        one = parts[min(parts)]
        for k, seq in enumerate((one.seq, one.seq + 1)):
            b = pb.EngineBatch(id=f"again-{k}", sender="test")
            codec.to_pb(one, b.step_summaries.add())
            b.step_summaries[0].seq = seq
            await publish(S.summaries_subject(JOB), b.id, b.SerializeToString())
        await until("the two copies read", lambda: root.stats.summaries >= before["summaries"] + 2, 30)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        await nc.close()
    return root, shards, before


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("join_after", "late"), [(None, False), (2, False), (2, True)],
                         ids=["together", "joined-mid-run", "joined-mid-run-info-late"])
def test_the_roots_summary_answers_are_the_offline_merges_and_one_aggregators(
        tmp_path: Path, join_after: int | None, late: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``joined-mid-run``: the partitions the second shard takes over have two holders' summaries of
    the iterations folded across the move, merged at the root (the newer holder's once replaced the
    former's, and those iterations' answers lacked ranks for good). ``-info-late``: the bucket's answer
    to the joining shard not waited on (GET_TIMEOUT_S 0: as a slow engine is), its ranks folded before it
    came grouped by stage when it came, their summaries sent again: the same answers."""
    _need_nats_server()
    if late:
        monkeypatch.setattr(shard_jobinfo, "GET_TIMEOUT_S", 0.0)
    by_node = megatron(NODES, ITERATIONS, JOB)
    with NatsCluster(tmp_path / "nats", 1) as cluster:
        root, shards, before = asyncio.run(_through_the_engine(cluster.urls, by_node, join_after))
    st = root.stats
    print(f"FIGURES summaries: {st.summaries} read, {st.summaries_replaced} replaced, {st.summaries_stale} "
          f"stale, holders dropped {st.summaries_holders_dropped}, overcounted {st.summaries_overcounted}; "
          f"partitions {[s.stats.partitions for s in shards]}; leases taken/lost, consumers restarted "
          f"{[(s.stats.leases_taken, s.stats.leases_lost, s.stats.consumer_restarts) for s in shards]}; "
          f"delivered again {[s.stats.delivered_again for s in shards]}; job-info gets late "
          f"{[s.stats.job_info_gets_late for s in shards]}, summaries restaged "
          f"{[s.stats.summaries_restaged for s in shards]}")
    assert st.summaries_holders_dropped == 0 and st.summaries_overcounted == 0
    # the first shard put the job's info in the bucket; the one that joined read it there, once (one get
    # a job, whichever of its partitions' consumers asked: the others fold on meanwhile, their ranks
    # grouped by stage when the answer comes)
    assert [s.stats.job_infos_read for s in shards] == ([0] * len(shards) if join_after is None else [0, 1])
    if late:
        assert [s.stats.job_info_gets_late for s in shards] == [0, 1]
        assert shards[1].stats.summaries_restaged >= 1
    holders = [root.summaries.fold.holders(JOB, it) for it in range(1, ITERATIONS + 1)]
    # joined: the iteration half folded when the second shard took its share has two holders
    assert holders == [1] * ITERATIONS if join_after is None else holders[join_after] == 2, holders
    # The partials path as before: every node message folded once, each iteration whole; none seen again
    # at the root that the engine did not deliver again (an ack wait run out on a loaded machine) or a
    # shard did not send again (a publish whose acknowledgement timed out, the engine having stored it)
    assert st.node_messages == NODES * ITERATIONS and st.undecodable == 0
    assert st.redelivered <= sum(s.stats.delivered_again + s.stats.messages_resent for s in shards)
    assert st.complete == ITERATIONS
    # Summaries went out (each flush sends a partition's iteration so far: the root held the newest)
    assert sum(s.stats.summaries_published for s in shards) == st.summaries - 2
    assert st.summaries_late == 0 and st.summaries_skipped == 0
    assert sum(s.stats.summaries_too_old for s in shards) == 0
    # The copy delivered again is stale (dropped), the newer flush replaced the one held: neither
    # counted twice
    assert (st.summaries_stale, st.summaries_replaced) == (before["summaries_stale"] + 1,
                                                          before["summaries_replaced"] + 1)

    shown = root.stats_json()["summary_answers"]
    assert isinstance(shown, dict)
    kept = shown[JOB]
    assert [a["iteration"] for a in kept] == list(range(ITERATIONS - ANSWERS_KEPT + 1, ITERATIONS + 1))
    for row in kept:
        it = row["iteration"]
        held = _held(root, it)
        assert held is not None
        got = ss.answer(held)
        want = ss.answer(_offline(by_node, it))
        assert row == {"iteration": it, **ss.answer_json(got)}  # as shown
        # the offline merge of the same records: the same answer, whole. Joined mid-run, the shard that
        # took partitions over read the job's info from the engine's job-info bucket (the agents send it
        # on change) before it folded the job's first message there: its ranks in their stages at once.
        assert got == want and not held.stage_unknown and not row.get("stage_unknown")

        # one aggregator's fold of the ranks: the exact parts equal, the medians within the error
        one = fold_ranks([r for its in by_node.values() for r in its[it - 1]])
        assert got.ranks_in == WORLD
        assert got.slowest is not None
        assert (got.slowest.step_time_ms, got.slowest.source, got.slowest.fields) == (
            one.step_time_ms, one.source, one.fields)
        assert got.end_time == one.end_time
        for name, tv in one.timers.items():
            assert got.timer_count[name] == len(tv.per_rank)
            assert got.timer_sum[name] == math.fsum(tv.per_rank.values())
            assert got.timer_min[name] == tv.min_ms
            top = max(tv.per_rank.items(), key=lambda rv: (rv[1], -rv[0]))
            assert got.timer_max[name] == (tv.max_ms, top[0])
            xs = sorted(tv.per_rank.values())
            median = xs[(len(xs) - 1) // 2]  # the quantile's rank: q·(n-1), rounded down
            assert abs(got.timer_quantiles[name][0.5] - median) <= A * median
        fwd, bwd = one.timers[FORWARD_COMPUTE].per_rank, one.timers[BACKWARD_COMPUTE].per_rank
        stages: dict[int, list[float]] = {}
        stage_of = ss.stages_of(LAYOUT)
        assert stage_of is not None
        for r in fwd:
            stage = stage_of(r)
            assert stage is not None
            stages.setdefault(stage, []).append(fwd[r] + bwd[r])
        assert got.stage_count == {s: len(g) for s, g in sorted(stages.items())}
        assert got.stage_sum == {s: math.fsum(g) for s, g in sorted(stages.items())}
        for s, g in stages.items():
            assert abs(got.stage_median[s] / statistics.median(g) - 1) <= A

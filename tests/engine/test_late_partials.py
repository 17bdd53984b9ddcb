"""Partials that reach a job's root late on purpose: one shard's partials of some
iterations held back while the job goes on — within the iterations the root keeps in memory
(perfd.engine.rootfold.KEEP_ITERATIONS), past them (it folds them with the store's record, counted
against what it kept of the iteration: rootfold.Gone), and past that too (GONE_ITERATIONS: it knows
nothing of the iteration but what the store holds). Whatever the delay, the job's per-iteration
answer is one aggregator's on the same records, byte for byte, and the counters say what happened:
each late partial counted late, each node message folded once (a redelivery counted as one, not
as a new message), each iteration counted whole once. A job whose collective operations the root
folds per step window (its agents send them on the records stream, on time) has, whatever the delay
of its step records, one aggregator's collective analysis.

The root's own code (perfd.engine.root.Root.handle: decode, fold, the store) takes the messages a
shard would publish (each node's partial made by the agent's encoder, a shard's nodes merged), with
no nats-server; one case goes through a real one (slow)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.collfold import SENT_RETENTION, for_sending, reduce
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout, StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import Partial, encode, partials_of
from perfd.engine.publisher import EngineClient
from perfd.engine.root import Root
from perfd.engine.rootfold import GONE_ITERATIONS, KEEP_ITERATIONS
from perfd.engine.shard import Shard
from perfd.report.collective_text import collectives_json
from tests.engine.engine_driver import Plan
from tests.engine.records import RANKS_PER_NODE, job_records
from tests.engine.test_engine_collectives_faults import Job
from tests.engine.test_natsd import _need_nats_server
from tests.engine.test_same_answer import GPU, JOB, _answer, logged_job

NODES = 4
SHARDS = ((0, 1), (2, 3))  # each shard's nodes: shard 0's partials are the ones held back
# Iteration -> shard 0's nodes whose messages of it come late: node 1's alone (node 0's came in time:
# the late partial makes the iteration whole), and once both (a late partial of two node messages).
LATE = {5: (1,), 6: (1,), 7: (1,), 8: (1,), 9: (0, 1)}
LATE_MESSAGES = sum(len(ns) for ns in LATE.values())
INFO = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
               layout=ParallelLayout(world_size=NODES * RANKS_PER_NODE))
# How long the late partials are held back: iterations published after the last late one before
# they come. In memory still; past the root's memory; past what it keeps of the iterations that left it.
DELAYS = {"in memory": 3, "past memory": KEEP_ITERATIONS + 2,
          "past what it keeps": KEEP_ITERATIONS + GONE_ITERATIONS + 2}
AFTER = 3  # iterations published after the late partials came


def _single(by_node: dict[int, list[list[StepRecord]]]) -> AggregatorState:
    """One aggregator: each node's agent sends its ranks' records, in order."""
    single = AggregatorState(gpu_override=GPU)
    single.ingest_job_info(f"node-0/{JOB}", JOB, INFO)
    for it in range(len(by_node[0])):
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])
    return single


def _partial(by_node: dict[int, list[list[StepRecord]]], nodes: tuple[int, ...], it: int) -> Partial:
    """A shard's partial of iteration ``it``: its ``nodes``' messages (each as the agent makes it,
    with its id) folded into one."""
    acc: Partial | None = None
    for n in nodes:
        mid = f"node-{n}/{JOB}:e:{it}"
        (p,) = partials_of(by_node[n][it - 1], mid)
        if acc is None:
            acc = p
        else:
            acc.merge(p)
    assert acc is not None
    return acc


def _root(state: AggregatorState) -> Root:
    return Root(S.EngineConfig(("nats://unused",)), EngineSink(state, Guard(Limits(), Refusals())), "root")


@pytest.mark.parametrize("delay", DELAYS.values(), ids=DELAYS.keys())
def test_late_partials_give_one_aggregators_answer_and_count_once(delay: int) -> None:
    release = max(LATE) + delay  # the late partials come after this iteration's
    iterations = release + AFTER
    by_node = job_records(JOB, NODES, iterations)
    rooted = AggregatorState(gpu_override=GPU)
    root = _root(rooted)
    held: list[Partial] = []
    for it in range(1, iterations + 1):
        parts = []
        for s, nodes in enumerate(SHARDS):
            behind = LATE.get(it, ()) if s == 0 else ()
            if set(nodes) - set(behind):
                parts.append(_partial(by_node, tuple(n for n in nodes if n not in behind), it))
            if behind:
                held.append(_partial(by_node, behind, it))
        info = {JOB: job_info_to_json(INFO)} if it == 1 else None
        root.handle([encode(f"shards:{it}", "shards", 1, parts, info)])
        if it == release:
            if delay > KEEP_ITERATIONS:  # every late iteration has left the root's memory
                assert min(root.fold.jobs[JOB]) > max(LATE)
            if delay > KEEP_ITERATIONS + GONE_ITERATIONS:  # ... and what it kept of them too
                assert min(root.fold.gone[JOB]) > max(LATE)
            root.handle([encode("shard-0:late", "shard-0", 1, held)])
    st = root.stats
    messages = NODES * iterations
    late = len(LATE) if delay > KEEP_ITERATIONS else 0
    assert (st.node_messages, st.redelivered, st.late, st.undecodable) == (messages, 0, late, 0)
    assert st.complete == iterations  # each once: the info named the world, the first counts too
    want = _answer(_single(by_node))
    assert _answer(rooted) == want
    if late:  # folded with the store's records, not taken back into memory
        assert not set(LATE) & set(root.fold.jobs[JOB])

    # The same partials again (a shard's redelivery, after its lease ran out): folded once, the
    # answer and every count but late and redelivered as they were. Past what the root keeps, it no
    # longer knows their messages: the ranks the store's records hold tell it.
    if delay > KEEP_ITERATIONS + GONE_ITERATIONS:
        assert not set(LATE) & set(root.fold.gone[JOB])
    root.handle([encode("shard-0:late-again", "shard-0", 1, held)])
    assert (st.node_messages, st.redelivered, st.late) == (messages, LATE_MESSAGES, 2 * late)
    assert st.complete == iterations
    assert _answer(rooted) == want


@pytest.mark.parametrize("delay", [DELAYS["in memory"], DELAYS["past memory"]],
                         ids=["in memory", "past memory"])
def test_late_step_partials_give_one_aggregators_collective_analysis(delay: int) -> None:
    """Each node's agent sends its ranks' collective operations on the records stream as they come
    (reduced, not to the shards' fold: the root folds their step windows), its step records as node
    messages; node 1's of the LATE iterations reach the root after ``delay`` more iterations, after
    its later ones. The root's store waits for those ends before it settles the ranks' windows over
    them (perfd.analytics.collectives.winfold.LATE_END_WINDOWS): one aggregator's analysis, byte
    for byte (without the wait: node 1's ranks' shares of iterations 5-9 absent, 10's read over
    all six)."""
    release = max(LATE) + delay
    plan = Plan(nodes=NODES, iterations=release + AFTER, period_s=0.5)
    job = Job(plan)
    rooted = AggregatorState()
    root = _root(rooted)
    held: list[Partial] = []
    for it in range(1, plan.iterations + 1):
        parts: list[Partial] = []
        for n in range(NODES):
            d = job.feed(n, it, 1000.0 + 0.5 * it)
            if d["collectives"]:
                mid = f"node-{n}:r:{it}"
                root.handle_records([encode(mid, f"node-{n}", 1, (), collectives=[
                    for_sending(reduce(plan.job, d["collectives"]), SENT_RETENTION)])])
            (p,) = partials_of(d["steps"], f"node-{n}:e:{it}")
            (held if n == 1 and it in LATE else parts).append(p)
        root.handle([encode(f"shards:{it}", "shards", 1, parts)])
        if it == release:
            root.handle([encode("late", "shard-0", 1, held)])
    st = root.stats
    assert (st.node_messages, st.redelivered, st.late) == (
        NODES * plan.iterations, 0, len(LATE) if delay > KEEP_ITERATIONS else 0)
    got = rooted.collective_analysis(plan.job, force=True)
    assert got is not None
    assert json.dumps(collectives_json(got), sort_keys=True) == job.one_aggregator()
    counts = rooted.collectives.fold_counts()  # the root folded the windows, and waited for every end
    assert counts["windows"] > 0 and counts["missing_end"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_nodes_messages_held_past_the_roots_memory_give_one_aggregators_answer(tmp_path: Path) -> None:
    """Through a real nats-server, two shards and a root: node 1's agent sends its messages of the
    LATE iterations only once the root has let them leave its memory (the other nodes' in; node 0's
    of iteration 9 held too). Its shard folds them as they come, the root folds them with the
    store's records: one aggregator's answer, every message folded once."""
    _need_nats_server()
    release = max(LATE) + KEEP_ITERATIONS + 2
    iterations = release + AFTER
    by_node = job_records(JOB, NODES, iterations)
    rooted = AggregatorState(gpu_override=GPU)
    with NatsCluster(tmp_path / "nats", 1) as cluster:
        root = asyncio.run(_through_the_engine(cluster.urls, rooted, by_node, release))
    st = root.stats
    assert (st.node_messages, st.redelivered, st.undecodable) == (NODES * iterations, 0, 0)
    # A late partial per late iteration, or one per late node message where a shard flushed them apart
    assert len(LATE) <= st.late <= LATE_MESSAGES
    assert st.complete == iterations
    assert _answer(rooted) == _answer(_single(by_node))


async def _through_the_engine(urls: list[str], rooted: AggregatorState,
                              by_node: dict[int, list[list[StepRecord]]], release: int) -> Root:
    """Each node's messages, an iteration at a time once the root has folded every one sent before,
    the LATE ones held back until after iteration ``release``'s."""
    cfg = S.EngineConfig(tuple(urls), partitions=4)
    stop = asyncio.Event()
    shards = [Shard(cfg, f"shard-{i}") for i in range(2)]
    root = Root(cfg, EngineSink(rooted, Guard(Limits(), Refusals())), "root-a")
    clients = [EngineClient(cfg, f"node-{n}/{JOB}", node=f"node-{n}") for n in range(NODES)]
    tasks = [asyncio.create_task(s.run(stop)) for s in shards] + [asyncio.create_task(root.run(stop))]
    senders = [asyncio.create_task(c.run()) for c in clients]
    deadline = time.monotonic() + 90  # a guard against a hang, not a figure: the test asserts on data

    async def folded(n: int) -> None:
        while root.stats.node_messages < n and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    clients[0].submit(job_info_json={JOB: job_info_to_json(INFO)})
    sent = 0
    try:
        for it in range(1, len(by_node[0]) + 1):
            for n, c in enumerate(clients):
                if n not in LATE.get(it, ()):
                    c.submit(steps=by_node[n][it - 1])
                    sent += 1
            await folded(sent)
            if it == release:
                assert min(root.fold.jobs[JOB]) > max(LATE)  # the late iterations left the root's memory
                for late_it, nodes in sorted(LATE.items()):
                    for n in nodes:
                        clients[n].submit(steps=by_node[n][late_it - 1])
                        sent += 1
                await folded(sent)
    finally:
        stop.set()
        for t in senders:
            t.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, *senders, return_exceptions=True), 30)
    assert all(c.spool.pending_count() == 0 for c in clients)
    return root


@pytest.mark.parametrize("delay", [DELAYS["in memory"], DELAYS["past memory"]],
                         ids=["in memory", "past memory"])
def test_a_logged_runs_first_record_come_late_is_still_its_start(delay: int) -> None:
    """A Megatron-LM job (the recorded H200 log, 2 ranks) whose ranks run the step hook: node 0's
    message of the first iteration (the log's first record, marked as the run's start) reaches the
    root after ``delay`` later iterations (its publish retried, or redelivered). The store took it
    for a restart (a start-up's record under later ones) and sent those to a digest of an "ended"
    run; then the analysis, reading the held records in the order they came, cut the run again where
    it stood: the job's view lost 2-25 iterations. Now it is the run's own start: one aggregator's
    answer on the same records in order, no new run. A resume's first record, ending after what is
    held, still begins one."""
    parsed, by_node, single = logged_job()
    first = parsed.records[0]
    assert first.first_of_run and not any(r.first_of_run for r in parsed.records[1:])
    rooted = AggregatorState(gpu_override="NVIDIA H200")
    root = _root(rooted)
    late = partials_of(by_node[0][0], f"node-0/{JOB}:e:0")
    for i in range(len(parsed.records)):
        parts = [p for n in (0, 1) if (n, i) != (0, 0)
                 for p in partials_of(by_node[n][i], f"node-{n}/{JOB}:e:{i}")]
        info = {JOB: job_info_to_json(parsed.job_info)} if i == 0 else None
        root.handle([encode(f"shards:{i}", "shards", 1, parts, info)])
        if i == delay:
            root.handle([encode("shard-0:late", "shard-0", 1, late)])
    assert root.stats.node_messages == 2 * len(parsed.records)
    assert root.stats.late == (1 if delay > KEEP_ITERATIONS else 0)
    assert rooted.job_stats.new_runs == 0
    assert _answer(rooted) == _answer(single)

    last = parsed.records[-1]
    assert last.end_time is not None
    resumed = dataclasses.replace(first, iteration=last.iteration - 5, end_time=last.end_time + 60.0)
    rooted.ingest_steps("root", [resumed])
    assert rooted.job_stats.new_runs == 1

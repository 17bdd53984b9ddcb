"""Many nodes' collective records through a real nats-server, reduced by their agents
(perfd.core.collfold) and merged by the root's store in whatever order the engine
hands them over: the synthetic 64-rank job of tests/collectives/test_collective_partial.py (TP groups
in a node, DP groups across nodes, the world group, a slow rank), each node's records submitted in
pieces, one node's twice (a redelivery after the engine's duplicate window: merged once), gives the
analysis JSON one aggregator fed the records as sent gives, byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.state import AggregatorState
from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.app.commands.engine import make_shard
from perfd.core.commsummary import CommAnswer, IterationAnswer
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.model import CollectiveRecord
from perfd.core.sketch import SKETCH_ACCURACY
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from perfd.engine.rootfold import RootStats
from perfd.report.collective_text import collectives_json
from tests.collectives.collective_helpers import MS, T0
from tests.collectives.test_collective_partial import NODES, PER_NODE, SLOW_RANK, synthetic_job
from tests.engine.engine_driver import split_settled
from tests.engine.test_engine_records import _until
from tests.engine.test_natsd import _need_nats_server

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _answer(state: AggregatorState) -> str:
    """The job's collective analysis as the aggregator serves it (its findings worded)."""
    got = state.collective_analysis("j", force=True)
    assert got is not None
    return json.dumps(collectives_json(got), sort_keys=True)


async def _through_the_engine(urls: list[str], feed: Callable[[list[EngineClient]], Awaitable[None]],
                              shards: int = 0, done: Callable[[Any], bool] = lambda stats: True,
                              at_shards: bool = True, want: str | None = None,
                              at_agents: bool = False) -> dict[str, Any]:
    """An aggregator leading as the job's root, ``shards`` shards as ``perfd shard`` makes them (the
    step partials' path, and the window fold of the operations sent beside them) and a client per
    node (``at_shards``: sending a job's operations to the shards once it sent its ranks' step
    records; ``at_agents``: folding them itself, as ``perfd agent`` does by default), fed by
    ``feed``; once every collective record submitted is at the root and
    ``done(root.stats)`` (and the answer is ``want``, for a while: the shards' last figures come a
    flush after the last message): the root's answer and counters."""
    # Folded at the agents, the shards summarise their partitions' rows in place of handing them on; a
    # partition whose lease is lost (this test's one event loop held past the TTL, as a loaded run did)
    # is read back from the engine by its next holder (perfd.engine.comm_rows), so the answer is the same
    # (the kill test in test_engine_collectives_faults.py is that path's own)
    cfg = S.EngineConfig(tuple(urls), partitions=4)
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], engine=cfg,
                                      engine_root_id="root-a"))
    await agg.start()
    stop = asyncio.Event()
    shard_list = [make_shard(cfg, f"shard-{i}", comm_summaries=at_agents) for i in range(shards)]
    shard_tasks = [asyncio.create_task(s.run(stop)) for s in shard_list]
    clients = [EngineClient(cfg, f"node-{n}/j", node=f"node-{n}", collectives_at_shards=at_shards,
                            window_fold=ShardCollectives() if at_agents else None) for n in range(NODES)]
    senders = [asyncio.create_task(c.run()) for c in clients]
    try:
        if shards:  # the partitions split between the shards before any record goes: else the first
            # shard up holds them all until the next balance, and the test's "each shard folded
            # some" reads the start-up order (seen once under load: one shard held all four)
            held = lambda: [s.stats.partitions for s in shard_list]  # noqa: E731
            await _until(lambda: split_settled(held(), cfg.partitions), 60, held)
        await feed(clients)
        for c in clients:
            assert await c.flush(60), c.stats()
        root = agg.engine_root
        assert root is not None  # started with --engine
        sent = sum(c.stats()["records_submitted"] for c in clients)
        await _until(lambda: root.stats.collectives == sent and done(root.stats), 60,
                     lambda: root.stats.to_json())
        if want is not None:
            # what it is then is compared by the caller; where the agents fold, the shards send summaries
            # in place of the figures, made at their cadence (a second), and the analysis reads those
            agrees = ((lambda: _summarised_agrees(json.loads(_answer(agg.state)), json.loads(want)) == "")
                      if at_agents else (lambda: _answer(agg.state) == want))
            with contextlib.suppress(AssertionError):
                await _until(agrees, 30, lambda: "")
        return {"got": _answer(agg.state), "stats": root.stats.to_json(), "comm": root.comm.answer("j"),
                "again": agg.state.collectives.merged_again, "fold": agg.state.collectives.fold_counts(),
                "shares": {"answered": agg.state.collectives.shares_answered > 0,
                           "mixed": agg.state.collectives.shares_mixed},
                "shards": [vars(s.windows.stats) for s in shard_list if s.windows is not None],
                "forwarded": [s.stats.figure_rows_forwarded for s in shard_list],
                "delivered_again": sum(s.stats.delivered_again for s in shard_list),
                "agents": [c.stats() for c in clients]}
    finally:
        stop.set()
        for t in senders:
            t.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        await asyncio.wait_for(asyncio.gather(*shard_tasks, return_exceptions=True), 30)
        for c in clients:
            c.close()
        await agg.stop()


def _comm_agrees(got: CommAnswer | None, want: dict[str, Any]) -> str:
    """Where the shards' summaries' answer (perfd.core.commsummary) differs from the analysis's JSON
    (collectives_json's): "" where it does not — the exact parts equal, the medians within the sketch's
    relative error."""
    near = lambda a, b: a is b or (a is not None and b is not None  # noqa: E731
                                   and abs(a - b) <= SKETCH_ACCURACY * abs(b) + 1e-12)
    if got is None:
        return "no summary"
    summ = want["summary"]
    ranked = sorted(((int(r), v) for r, v in summ["comm_share_by_rank"].items()),
                    key=lambda rv: (-rv[1], rv[0]))
    if list(got.top) != ranked[:RANK_RATIO_TOP_K]:
        return f"top {got.top} against {ranked[:RANK_RATIO_TOP_K]}"
    if not (near(got.share, summ["comm_total_share"]) and near(got.weighted, summ["weighted_share"])
            and got.windows == summ["windows"] and got.ranks == len(summ["comm_share_by_rank"])
            and got.by_group.keys() == summ["comm_share_by_group"].keys()
            and all(near(got.by_group[c], v) for c, v in summ["comm_share_by_group"].items())):
        return f"summary {got} against {summ}"
    if [a.iteration for a in got.iterations] != [it["iteration"] for it in want["iterations"]]:
        return f"iterations {[a.iteration for a in got.iterations]}"
    for a, it in zip(got.iterations, want["iterations"], strict=True):
        top = sorted(((int(r), v) for r, v in it["share_by_rank"].items()), key=lambda rv: (-rv[1], rv[0]))
        if not ((a.ranks, a.n_iterations, a.excluded) == (len(it["share_by_rank"]), it["n_iterations"],
                                                           it["excluded"])
                and near(a.share, it["share"]) and near(a.window_ms, it["window_ms"])
                and a.by_group.keys() == it["by_group"].keys()
                and all(near(a.by_group[c], v) for c, v in it["by_group"].items())
                and list(a.top) == top[:RANK_RATIO_TOP_K]):
            return f"iteration {a} against {it}"
    return ""


SHARE_PARTS = {"summary": ("comm_total_share", "weighted_share", "comm_share_by_group", "comm_share_by_rank"),
               "findings": ("comm-total-share", "comm-dp-high"), "recommendations": ("comm-dp-high",)}


def _summarised_agrees(got: dict[str, Any], want: dict[str, Any]) -> str:
    """Where the analysis that read its shares from the shards' summaries (``got``, served JSON) differs
    from the one that read every rank's figures (``want``): "" where the shares agree as the summaries'
    answer does (:func:`_comm_agrees`: its figures read back from ``got``'s JSON), the method says how
    many ranks were summarised, and everything else is the same, byte for byte."""
    summ, its = got["summary"], got["iterations"]
    answer = CommAnswer(
        ranks=got["method"]["summarised_ranks"], share=summ["comm_total_share"],
        weighted=summ["weighted_share"],
        by_group=summ["comm_share_by_group"], windows=summ["windows"],
        top=tuple(sorted(((int(r), v) for r, v in summ["comm_share_by_rank"].items()),
                         key=lambda rv: (-rv[1], rv[0]))),
        iterations=tuple(IterationAnswer(
            iteration=it["iteration"], ranks=it["ranks"], n_iterations=it["n_iterations"],
            window_ms=it["window_ms"], share=it["share"], by_group=it["by_group"], excluded=it["excluded"],
            top=tuple(sorted(((int(r), v) for r, v in it["share_by_rank"].items()),
                             key=lambda rv: (-rv[1], rv[0])))) for it in its))
    said = _comm_agrees(answer, want)
    if said:
        return said
    if [it["ranks"] for it in its] != [len(it["share_by_rank"]) for it in want["iterations"]]:
        return f"iteration ranks {[it['ranks'] for it in its]}"
    if "summarised" not in got["method"]["detail"] or want["method"]["summarised_ranks"] is not None:
        return f"method {got['method']} against {want['method']}"

    def rest(a: dict[str, Any]) -> dict[str, Any]:
        return {**a, "method": a["method"]["name"], "iterations": None,
                "summary": {k: v for k, v in a["summary"].items() if k not in SHARE_PARTS["summary"]},
                "findings": [f for f in a["findings"] if f["id"] not in SHARE_PARTS["findings"]],
                "recommendations": [r for r in a["recommendations"]
                                    if r["finding_id"] not in SHARE_PARTS["recommendations"]]}
    if rest(got) != rest(want):
        return f"the rest {rest(got)} against {rest(want)}"
    return ""


def test_many_nodes_reduced_through_the_engine_give_the_one_aggregator_answer(tmp_path: Path) -> None:
    _need_nats_server()
    recs, _ = synthetic_job()
    by_node: dict[int, list[CollectiveRecord]] = {n: [] for n in range(NODES)}
    for r in recs:
        by_node[(r.rank or 0) // PER_NODE].append(r)
    single = AggregatorState()
    for n in range(NODES):
        single.ingest_collectives(f"node-{n}/j", by_node[n])
    want = _answer(single)
    assert f"collective-last-rank-{SLOW_RANK}" in want

    async def feed(clients: list[EngineClient]) -> None:
        rng = random.Random(4)
        order = [(n, k) for n in range(NODES) for k in range(3)]
        rng.shuffle(order)
        for n, k in order:  # each node's records in three pieces, the nodes interleaved
            clients[n].submit(collectives=by_node[n][k::3])
        clients[2].submit(collectives=by_node[2])  # a node's all again: another message, merged once

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        out = asyncio.run(_through_the_engine(cluster.urls, feed))
    assert out["stats"]["collective_partials"] == 3 * NODES + 1 and out["stats"]["undecodable"] == 0
    assert out["again"] == len(by_node[2])
    assert out["got"] == want


@pytest.mark.parametrize("where", ["agents", "shards", "root"],
                         ids=["folded-at-the-agents", "folded-at-the-shards", "folded-at-the-root"])
def test_step_records_and_collectives_through_the_engine_give_one_aggregators_answer(
        tmp_path: Path, where: str) -> None:
    """The same job with its ranks' step records (the step hook's shape), each rank's end its own (up
    to 4 ms apart, as a real job's): each node's agent folds its ranks' records of an iteration into
    one, the shards and the root fold those. Sent as an agent sends, an iteration at a time (its
    steps, then the operations enqueued in it), the per-rank and per-iteration shares, and the whole
    collective analysis, are one aggregator's, fed the ranks' own records, byte for byte, whichever
    folds the windows: ``folded-at-the-agents``, each node's agent folds its ranks' operations and
    sends the figures beside its step partials, the shards hand them on and fold none (``perfd agent``'s
    default); ``folded-at-the-shards``, the agents send every operation beside their step
    partials and the two shards' window folds hand the root per-window figures (the root folds none
    itself); ``folded-at-the-root``, an agent that does not (the path before the shards' fold), the
    root's window fold reads each rank's own end from the fold (``StepRecord.rank_end_times``)."""
    _need_nats_server()
    recs, steps = synthetic_job()
    rng = random.Random(5)
    steps = [dataclasses.replace(s, end_time=(s.end_time or 0.0) + rng.random() * 0.004) for s in steps]
    its = sorted({s.iteration for s in steps})
    node_of = lambda rank: (rank or 0) // PER_NODE  # noqa: E731
    step_at = {(n, it): [s for s in steps if s.iteration == it and node_of(s.rank) == n]
               for n in range(NODES) for it in its}
    coll_at: dict[tuple[int, int], list[CollectiveRecord]] = {}
    for r in recs:  # the synthetic job's iteration N runs 100 ms from N x 100 ms
        it = ((r.time_created_ns or T0) - T0) // (100 * MS)
        coll_at.setdefault((node_of(r.rank), it), []).append(r)
    single = AggregatorState()
    for it in its:
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/j", step_at[n, it])
            single.ingest_collectives(f"node-{n}/j", coll_at.get((n, it), []))
    want = _answer(single)
    a = json.loads(want)
    assert a["method"]["name"] == "step_windows" and len(a["iterations"]) == len(its) - 2
    assert f"collective-last-rank-{SLOW_RANK}" in want

    async def feed(clients: list[EngineClient]) -> None:
        for it in its:
            for n, c in enumerate(clients):
                c.submit(steps=step_at[n, it], collectives=coll_at.get((n, it), []))
            await asyncio.sleep(0.05)

    windows = len(a["iterations"]) * NODES * PER_NODE  # (iteration, rank) rows of the shares

    def done(st: RootStats) -> bool:  # the store has all the root read
        return st.node_messages >= NODES * len(its) and st.held_back == 0

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        out = asyncio.run(_through_the_engine(cluster.urls, feed, shards=2, done=done,
                                              at_shards=where != "root", want=want,
                                              at_agents=where == "agents"))
    assert out["stats"]["undecodable"] == 0 and out["stats"]["late"] == 0, out["stats"]
    if where == "agents":  # every operation folded where it was sent from; the shards only summarise
        assert out["fold"]["folded"] == 0 and out["fold"]["received"] == 0, out["fold"]
        assert out["stats"]["collectives_folded"] == out["stats"]["collective_partials"] > 0, out["stats"]
        assert sum(a["operations_folded"] for a in out["agents"]) == len(recs), out["agents"]
        assert all(a["figure_rows_sent"] for a in out["agents"]), out["agents"]
        assert sum(s["operations"] for s in out["shards"]) == 0, out["shards"]
        # no row reaches the root: each partition's summary in their place, whose merge answers as the
        # analysis of every rank's rows, and the root's analysis reads its shares from it
        assert sum(out["forwarded"]) == 0, out["forwarded"]
        assert _comm_agrees(out["comm"], a) == "", _comm_agrees(out["comm"], a)
        got = json.loads(out["got"])
        assert got["method"]["summarised_ranks"] == NODES * PER_NODE, got["method"]
        assert _summarised_agrees(got, a) == "", _summarised_agrees(got, a)
        assert out["shares"] == {"answered": True, "mixed": 0}, out["shares"]
        return
    elif where == "shards":  # the windows were folded at the shards, from every operation; none at the root
        assert out["fold"]["folded"] == 0 and out["fold"]["received"] >= windows, out["fold"]
        assert out["stats"]["collectives_folded"] == out["stats"]["collective_partials"] > 0, out["stats"]
        # each operation once, but for the node messages the engine delivered again (an ack wait run out
        # under load: a CI run's shards took 21 messages twice), whose operations a shard takes again
        # (the root's join merges their figures once: the answer below is one aggregator's all the same)
        taken, most = sum(s["operations"] for s in out["shards"]), max(map(len, coll_at.values()))
        assert len(recs) <= taken <= len(recs) + out["delivered_again"] * most, (out["delivered_again"],
                                                                                  out["shards"])
        assert all(s["operations"] for s in out["shards"]), out["shards"]  # both shards folded some
    else:
        assert out["fold"]["folded"] > 0 and out["fold"]["received"] == 0, out["fold"]
    assert out["got"] == want, out["fold"]

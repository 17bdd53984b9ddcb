"""The per-window fold of the root's collective store (perfd.analytics.collectives.winfold): with a
retention far too small for the rows (2 operations a rank, as at 100,000 ranks), the per-iteration
communication shares are still there and are the ones the full rows give — byte for byte — fed as
the engine brings them: node by node, dump by dump, the step records that close a window after its
operations, a redelivery of operations the store let go. With a retention that holds every row, the
store's whole analysis is byte for byte one aggregator's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from perfd.aggregator.collectives import CollectiveStore
from perfd.analytics.collectives import winfold
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis, analyze_collectives
from perfd.analytics.collectives.collective_windows import step_windows
from perfd.analytics.collectives.winfold import WindowFold
from perfd.core.collfold import SENT_RETENTION, Retention, for_sending, reduce
from perfd.core.model import CollectiveRecord, ParallelLayout, StepRecord
from perfd.report.collective_text import collectives_json
from tests.collectives.collective_helpers import T0, load_fixture_records, step
from tests.collectives.test_collective_partial import (
    ITERATIONS,
    LAYOUT,
    PER_NODE,
    RANK_NODES,
    WORLD,
    synthetic_job,
)

TWO_A_RANK = Retention(per_rank=512, per_job=2 * WORLD)  # the store's REDUCED_RETENTION at 100,000 ranks


def _shares(a: CollectiveAnalysis) -> str:
    """What the step windows give: per iteration, and the summary over each rank's recent windows."""
    j = a.to_json()
    s = j["summary"]
    return json.dumps({"method": j["method"], "iterations": j["iterations"],
                       **{k: s[k] for k in ("comm_total_share", "comm_share_by_rank", "comm_share_by_group",
                                            "weighted_share", "windows", "absent_reason")}}, sort_keys=True)


class _Job:
    """A store fed as the engine's root feeds it, the job's step records growing beside it."""

    def __init__(self, keep: Retention, layout: ParallelLayout | None) -> None:
        self.store = CollectiveStore(reduced_retention=keep, min_recompute_s=0.0)
        self.steps: list[StepRecord] = []
        self.layout = layout
        self.store.fold_inputs = lambda job: ((len(self.steps), layout), lambda: (list(self.steps), layout))

    def send(self, node: str, recs: Sequence[CollectiveRecord]) -> None:
        if recs:  # as a node's agent sends them: reduced, its ranks' newest SENT_RETENTION
            self.store.ingest_partial(node, for_sending(reduce("j", recs), SENT_RETENTION))

    def analysis(self) -> CollectiveAnalysis:
        got = self.store.analysis("j", (len(self.steps),), lambda: (list(self.steps), self.layout, {}, None),
                                  force=True)
        assert got is not None
        return got


def _feed_by_iteration(job: _Job, recs: list[CollectiveRecord], steps: list[StepRecord],
                       node_of: Any, nodes: int) -> None:
    """Each iteration's operations node by node (the dumps of that iteration), then its step records."""
    its = sorted({s.iteration for s in steps})
    ends = {it: max(round((s.end_time or 0) * 1e9) for s in steps if s.iteration == it) for it in its}
    prev = None
    for it in its:
        batch = [r for r in recs if (prev is None or (r.time_created_ns or 0) > ends[prev])
                 and (r.time_created_ns or 0) <= ends[it]]
        for n in range(nodes):
            job.send(f"node-{n}", [r for r in batch if node_of(r) == n])
        job.steps.extend(s for s in steps if s.iteration == it)
        prev = it
    rest = [r for r in recs if prev is not None and (r.time_created_ns or 0) > ends[prev]]
    for n in range(nodes):
        job.send(f"node-{n}", [r for r in rest if node_of(r) == n])


@pytest.mark.slow
def test_two_operations_a_rank_held_and_the_per_iteration_shares_of_every_rank() -> None:
    recs, steps = synthetic_job()
    want = analyze_collectives("j", recs, steps, layout=LAYOUT)
    assert want.method == "step_windows" and len(want.iterations) == ITERATIONS - 1
    assert all(len(it.share_by_rank) == WORLD for it in want.iterations)

    def node_of(r: CollectiveRecord) -> int:
        return (r.rank or 0) // PER_NODE

    job = _Job(TWO_A_RANK, LAYOUT)
    _feed_by_iteration(job, recs, steps, node_of, WORLD // PER_NODE)
    jc = job.store.jobs["j"]
    assert jc.partial is not None and len(jc.partial) == 2 * WORLD  # 2 a rank held, the rest let go
    fold = jc.fold
    assert fold is not None and fold.counts.windows > 0 and fold.counts.late == 0
    assert fold.pending < len(recs) // 2  # the settled windows' operations are gone
    got = job.analysis()
    assert _shares(got) == _shares(want)

    # Without the fold the same 2 rows a rank give no iteration (absent, not invented)
    bare = analyze_collectives("j", jc.partial.records(), steps, layout=LAYOUT)
    assert not bare.iterations

    # Operations the store let go, delivered again (an agent's spool replayed): refused, counted once
    early = [r for r in recs if (r.time_created_ns or 0) < T0 + 300 * 1_000_000]
    job.send("node-0", [r for r in early if node_of(r) == 0])
    assert fold.counts.late == sum(1 for r in early if node_of(r) == 0)
    assert _shares(job.analysis()) == _shares(want)


@pytest.mark.slow
def test_every_row_held_the_store_answers_as_one_aggregator_byte_for_byte() -> None:
    recs, steps = synthetic_job()
    # the store names each rank's node by the agent that sent it, as one aggregator does
    want = json.dumps(collectives_json(analyze_collectives("j", recs, steps, layout=LAYOUT,
                                                           rank_nodes=RANK_NODES)), sort_keys=True)
    job = _Job(Retention(per_rank=512, per_job=250_000), LAYOUT)
    _feed_by_iteration(job, recs, steps, lambda r: (r.rank or 0) // PER_NODE, WORLD // PER_NODE)
    assert job.store.jobs["j"].fold is not None and job.store.jobs["j"].fold.counts.windows > 0
    assert json.dumps(collectives_json(job.analysis()), sort_keys=True) == want


def _recorded_job() -> tuple[list[CollectiveRecord], list[StepRecord]]:
    """The recorded H200 dumps (2 ranks, TP of a DDP run: bursts of 4 all-reduces ~203 ms apart, a
    sequence gap where the ring wrapped) with job step records closing each burst, from its clocks."""
    recs = load_fixture_records("timing")
    bursts = sorted(r.time_created_ns or 0 for r in recs if r.rank == 0 and r.op == "all_reduce"
                    and r.pg_desc == "default_pg" and (r.collective_seq_id or 0) % 4 == 1)
    steps = [step("last", i, (t - 1_000 - T0) / 1e6) for i, t in enumerate(bursts)]
    return recs, steps


def test_the_recorded_dumps_as_the_agent_sends_them_two_operations_a_rank() -> None:
    recs, steps = _recorded_job()
    want = analyze_collectives("j", recs, steps)
    assert want.method == "step_windows" and len(want.iterations) >= 5
    job = _Job(Retention(per_rank=512, per_job=4), None)  # 2 a rank
    # In the order the agent's tracker emitted them, a few at a time (its dumps), steps as they end
    done = 0
    for i in range(0, len(recs), 16):
        piece = recs[i:i + 16]
        for rank in (0, 1):
            job.send(f"node-{rank}", [r for r in piece if r.rank == rank])
        newest = max(r.time_created_ns or 0 for r in piece)
        while done < len(steps) and round((steps[done].end_time or 0) * 1e9) <= newest:
            job.steps.append(steps[done])
            done += 1
    job.steps.extend(steps[done:])
    jc = job.store.jobs["j"]
    assert jc.partial is not None and len(jc.partial) == 4
    assert jc.fold is not None and jc.fold.counts.windows > 0 and jc.fold.counts.uncovered > 0
    assert _shares(job.analysis()) == _shares(want)


def test_waiting_operations_are_bounded_and_their_windows_come_out_uncovered() -> None:
    """Past PENDING a rank's oldest waiting operations leave without their windows: those windows
    are absent (uncovered), never computed from part of their operations; the windows of those that
    stay are the full rows' figures."""
    recs, steps = synthetic_job()
    per_it = len(recs) // WORLD // (ITERATIONS + 1)
    fold = WindowFold(pending=Retention(per_rank=2 * per_it + per_it // 2))  # 2.5 iterations a rank
    fold.add(row for rs in reduce("j", recs).streams.values() for row in rs.values())
    # no step record yet: everything waited, the newest 2.5 iterations a rank at most
    assert fold.pending == (2 * per_it + per_it // 2) * WORLD
    assert fold.counts.pending_dropped == len(recs) - fold.pending
    fold.set_steps(1, steps, LAYOUT)
    fold.advance()
    rank_windows, job_windows = step_windows(steps)
    got = fold.view().figures(lambda r: rank_windows.get(r) or job_windows, LAYOUT, fold.cfg.order)
    full = analyze_collectives("j", recs, steps, layout=LAYOUT)
    want = {it.iteration: it.share_by_rank for it in full.iterations}
    # the last covered window of every rank is there (its ops waited whole), the ones before it not
    assert {w.iteration for figs in got.values() for w, _, _ in figs} == {ITERATIONS - 1}
    for rank, figs in got.items():
        ((w, comm, _),) = figs
        assert comm / (w.end_ns - w.start_ns) == want[w.iteration][rank]


def _late_ends(job: _Job, recs: list[CollectiveRecord], steps: list[StepRecord], late: set[tuple[int, int]],
               send_late: bool) -> None:
    """Fed by iteration as the root feeds its store (_feed_by_iteration), but the step records of the
    ``late`` (node, iteration)s come after every other (``send_late``; or never): the rank's later ends
    are in while those are not, as a node's fold the root hands on after its later ones."""
    def node_of(r: CollectiveRecord | StepRecord) -> int:
        return (r.rank if isinstance(r.rank, int) else 0) // PER_NODE

    held = [s for s in steps if (node_of(s), s.iteration) in late]
    _feed_by_iteration(job, recs, [s for s in steps if (node_of(s), s.iteration) not in late], node_of,
                       WORLD // PER_NODE)
    if send_late:
        job.steps.extend(held)


LATE_ENDS = {(1, 3), (1, 4)}  # node 1's ranks' step records of iterations 3 and 4


def test_a_ranks_step_end_that_comes_after_its_later_ones_splits_its_window_as_one_aggregator() -> None:
    """The rank's window (2, 5] waits while the job's records show iterations 3 and 4 without its
    ends (they are on their way: a late node's fold at the root): its operations are not settled
    over the three iterations and let go, and once the ends come each iteration has the rank's own
    share, byte for byte one aggregator's (fails without the wait: the rank's shares of 3 and 4
    absent, 5's read over all three)."""
    recs, steps = synthetic_job()
    want = json.dumps(collectives_json(analyze_collectives("j", recs, steps, layout=LAYOUT,
                                                           rank_nodes=RANK_NODES)), sort_keys=True)
    job = _Job(Retention(per_rank=512, per_job=250_000), LAYOUT)
    _late_ends(job, recs, steps, LATE_ENDS, send_late=True)
    fold = job.store.jobs["j"].fold
    assert fold is not None and fold.counts.windows > 0
    assert json.dumps(collectives_json(job.analysis()), sort_keys=True) == want
    assert fold.counts.missing_end == 0 and fold.counts.late == 0


def test_a_step_end_that_never_comes_is_waited_for_a_bound_then_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ends of node 1's iterations 3 and 4 never come: past LATE_END_WINDOWS windows the rank's
    window over them settles as the records give it — the rows' answer on the same records, each of
    those windows counted (``missing_end``), its iteration read over three (n_iterations)."""
    monkeypatch.setattr(winfold, "LATE_END_WINDOWS", 2)
    recs, steps = synthetic_job()
    sent = [s for s in steps if ((s.rank if isinstance(s.rank, int) else 0) // PER_NODE, s.iteration)
            not in LATE_ENDS]
    want = analyze_collectives("j", recs, sent, layout=LAYOUT, rank_nodes=RANK_NODES)
    job = _Job(Retention(per_rank=512, per_job=250_000), LAYOUT)
    _late_ends(job, recs, steps, LATE_ENDS, send_late=False)
    fold = job.store.jobs["j"].fold
    assert fold is not None
    assert fold.counts.missing_end == PER_NODE  # node 1's ranks, one window (2, 5] each
    got = job.analysis()
    assert json.dumps(collectives_json(got), sort_keys=True) == json.dumps(collectives_json(want),
                                                                            sort_keys=True)
    spanned = next(it for it in got.iterations if it.iteration == 5)
    assert spanned.n_iterations == 3

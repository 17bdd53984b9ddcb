"""Analyses of one job run at once (the refresher, the API, the rules and the W&B task each ask), outside
the store's lock: the one held is the one that read the newest records, whichever ends last. An older
one ending after a newer once put back an analysis without the job's last iteration, served until the
next record came (for a finished job, never): the offline W&B run of a 40-iteration job lacked its 40th.

Each interleaving is made by the test, not by timing: a thread waits at a gate the test opens."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator import jobs as jobs_module
from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.job_inputs import NoInputs
from perfd.aggregator.job_runs import digest_runs
from perfd.aggregator.jobs import JobStore
from perfd.aggregator.snapshot import Analysed
from perfd.aggregator.state import AggregatorState
from perfd.analytics.run.run_analysis import analyze_run
from perfd.collectors.megatron import parse_file
from perfd.core.model import CollectiveRecord, StepRecord
from tests.gates import Gate, GatedLock, joined, started

ROOT = Path(__file__).resolve().parents[1]
DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def _by_iteration(records: list[StepRecord]) -> dict[int, list[StepRecord]]:
    out: dict[int, list[StepRecord]] = {}
    for r in records:
        out.setdefault(r.iteration, []).append(r)
    return out


PARSED = parse_file(DEMO_LOG, job="j")  # the demo job's 40 iterations (a real Megatron-LM log)
ITS = _by_iteration(PARSED.records)
LAST = max(ITS)


def _fed(holder: JobStore | AggregatorState, upto: int) -> None:
    """The job's info and its iterations up to ``upto``, from agent "a"."""
    holder.ingest_job_info("a", "j", PARSED.job_info)
    holder.ingest_steps("a", [r for i in sorted(ITS) if i <= upto for r in ITS[i]])


@pytest.mark.parametrize("first", ["newer", "older"])
def test_the_analysis_held_is_the_newer_whichever_ends_last(first: str) -> None:
    """"older" reads the records without the last iteration and waits to compute; the last arrives and
    "newer" reads them all; the one let through first is stored first. The newer is held either way."""
    store = JobStore(min_recompute_s=0.0)
    _fed(store, LAST - 1)
    gate = Gate()
    store.jobs["j"].analysis_lock = GatedLock(gate)  # type: ignore[assignment]
    out: dict[str, Any] = {}
    older = started("older", lambda: store.analysis("j"), out)
    gate.wait_arrived("older")
    store.ingest_steps("a", ITS[LAST])  # the last iteration arrives
    newer = started("newer", lambda: store.analysis("j", force=True), out)
    gate.wait_arrived("newer")
    for name, t in sorted([("newer", newer), ("older", older)], key=lambda nt: nt[0] != first):
        gate.open(name)
        joined(t)
    held = store.jobs["j"].analysis
    assert held is not None and held is out["newer"] and held.iterations[-1].iteration == LAST
    if first == "newer":  # the older ended last: its caller is handed the newer, held
        assert out["older"] is held
    else:
        assert out["older"].iterations[-1].iteration == LAST - 1
    assert store.analysis("j") is held  # nothing new: the held one, not a recompute's
    assert store.stats.analysis_errors == 0


def _ops(seq: int) -> list[CollectiveRecord]:
    """One all-reduce of two ranks, as Flight Recorder dumps it."""
    return [CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=r, pg_id=0,
                             collective_seq_id=seq, bytes=1 << 20, state="completed") for r in range(2)]


def test_an_older_collective_analysis_ending_last_does_not_replace_the_newer() -> None:
    store = CollectiveStore()
    store.ingest("a", _ops(1))
    gate = Gate()

    def inputs() -> tuple[list[StepRecord], None, dict[int, str], None]:
        gate.pass_through()  # read its records under the lock, then waits to analyse them
        return [], None, {}, None

    out: dict[str, Any] = {}
    older = started("older", lambda: store.analysis("j", (0, 0.0), inputs), out)
    gate.wait_arrived("older")
    store.ingest("a", _ops(2))
    newer = started("newer", lambda: store.analysis("j", (0, 0.0), inputs, force=True), out)
    gate.wait_arrived("newer")
    gate.open("newer")
    joined(newer)
    gate.open("older")
    joined(older)
    assert store.held("j") is out["newer"] is out["older"]
    assert out["newer"] is not None and out["newer"].n_records == 4  # both operations


def test_an_analysis_waits_for_the_digest_of_a_replaced_run_another_is_making(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart sends the old run's records to a digest made by the next analysis; a second analysis
    that came meanwhile found none pending and read the runs without it, and, the newer, was kept:
    the job's analysis without its earlier run. It waits for the digest now."""
    store = JobStore(min_recompute_s=0.0)
    _fed(store, 20)
    first = ITS[1][0]
    assert first.end_time is not None
    restart = [dataclasses.replace(first, first_of_run=True, end_time=first.end_time + 3600.0)]
    store.ingest_steps("a", restart)  # the job started again: the 20 iterations held are a run replaced
    assert len(store.jobs["j"].closed) == 1
    digest_gate, lock_gate = Gate(), Gate()
    real = digest_runs

    def gated_digest(*args: Any, **kw: Any) -> Any:
        digest_gate.pass_through()
        return real(*args, **kw)

    monkeypatch.setattr(jobs_module, "digest_runs", gated_digest)
    store.jobs["j"].digest_lock = GatedLock(lock_gate)  # type: ignore[assignment]
    lock_gate.open("digesting")
    lock_gate.open("second")
    out: dict[str, Any] = {}
    digesting = started("digesting", lambda: store.analysis("j"), out)
    digest_gate.wait_arrived("digesting")  # it took the replaced run and is digesting it
    second = started("second", lambda: store.analysis("j", force=True), out)
    lock_gate.wait_arrived("second")  # the second comes to the digest lock, and waits there
    digest_gate.open("digesting")
    joined(digesting)
    joined(second)
    held = store.jobs["j"].analysis
    assert held is not None and held.summary.runs.current == 2
    assert [d.run for d in held.summary.runs.earlier] == [1]  # the replaced run, digested
    assert [d.run for d in store.jobs["j"].runs] == [1]


def test_a_run_that_closes_while_an_analysis_reads_is_digested_into_the_next() -> None:
    """The restart lands between an analysis' digest check and its read of the records (it asks the
    aggregator's other parts there, outside the store's lock): that analysis is of the new run with no
    digest of the old; the next one digests it, and the job's analysis is made again with it."""
    store = JobStore(min_recompute_s=0.0)
    _fed(store, 20)
    first = ITS[1][0]
    assert first.end_time is not None
    restart = [dataclasses.replace(first, first_of_run=True, end_time=first.end_time + 3600.0)]

    class RestartMidway(NoInputs):
        def class_inputs(self, job: str, span: tuple[float | None, float | None]) -> Any:
            if not store.jobs["j"].closed and store.jobs["j"].run == 1:
                store.ingest_steps("a", restart)  # the job started again, now
            return super().class_inputs(job, span)

    during = store.analysis("j", inputs=RestartMidway())
    assert during is not None and during.summary.runs.current == 2 and not during.summary.runs.earlier
    after = store.analysis("j")  # the next (the refresher's tick): the old run digested, and read
    assert after is not None and after is not during
    assert [d.run for d in after.summary.runs.earlier] == [1]


def test_an_older_analysis_succeeding_after_a_newer_failed_keeps_the_failure_said(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newer analysis (of the last iteration) fails; the older, of fewer iterations, then succeeds:
    the failure stays said and the analysis held stays the one before both (the older is not the job's
    newest answer, and its success does not mean the job's records analyse)."""
    store = JobStore(min_recompute_s=0.0)
    _fed(store, LAST - 2)
    before = store.analysis("j")
    assert before is not None and before.iterations[-1].iteration == LAST - 2
    real = analyze_run

    def failing_on_the_last(info: Any, records: Any, **kw: Any) -> Any:
        if any(r.iteration == LAST for r in records):
            raise ValueError("a value no check foresaw")
        return real(info, records, **kw)

    monkeypatch.setattr(jobs_module, "analyze_run", failing_on_the_last)
    store.ingest_steps("a", ITS[LAST - 1])
    gate = Gate()
    store.jobs["j"].analysis_lock = GatedLock(gate)  # type: ignore[assignment]
    out: dict[str, Any] = {}
    older = started("older", lambda: store.analysis("j"), out)
    gate.wait_arrived("older")
    store.ingest_steps("a", ITS[LAST])
    newer = started("newer", lambda: store.analysis("j", force=True), out)
    gate.wait_arrived("newer")
    gate.open("newer")  # it fails
    joined(newer)
    gate.open("older")  # then the older succeeds
    joined(older)
    js = store.jobs["j"]
    assert js.analysis is before and out["older"] is before
    assert js.analysis_failure is not None and "a value no check foresaw" in js.analysis_failure
    assert store.stats.analysis_errors == 1


def test_a_thread_handed_an_older_analysis_tracks_nothing_after_the_newer() -> None:
    """Thread ``older`` is handed the analysis the store held, then waits; ``newer`` keeps a newer one
    and tracks its incidents; ``older`` then tracks nothing (the older's incidents would reopen what the
    newer closed), and a snapshot asked for now is the newer's."""
    st = AggregatorState(min_recompute_s=0.0)
    _fed(st, LAST - 1)
    analyses = st._analyses
    store_analysis = analyses.jobs.analysis
    gate = Gate()

    def handed(job: str, force: bool = False, inputs: Any = None) -> Any:
        a = store_analysis(job, force, inputs) if inputs is not None else store_analysis(job, force)
        if threading.current_thread().name == "older":
            gate.pass_through()  # handed its analysis; the newer comes meanwhile
        return a

    analyses.jobs.analysis = handed  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    older = started("older", lambda: st.analysis("j"), out)
    gate.wait_arrived("older")
    st.ingest_steps("a", ITS[LAST])
    newer = st.analysis("j", force=True)
    assert newer is not None and newer.iterations[-1].iteration == LAST
    gate.open("older")
    joined(older)
    assert out["older"] is not newer and out["older"].iterations[-1].iteration == LAST - 1
    assert analyses._tracked["j"] is newer  # not the older, tracked after it
    snap = st.snapshot("j", Analysed.CURRENT)
    assert snap is not None and snap.analysis is newer


def test_a_current_snapshot_is_of_the_analysis_held_while_another_thread_tracks_it() -> None:
    """The refresher keeps a new analysis and tracks its incidents (its snapshot is rebuilt after them);
    meanwhile a scrape had built a snapshot at the state's current version, of the analysis before.
    A snapshot asked for CURRENT then (the W&B task's last round) is of the new one, not that."""
    st = AggregatorState(min_recompute_s=0.0)
    _fed(st, LAST - 1)
    before = st.analysis("j")
    st.ingest_steps("a", ITS[LAST])
    scraped = st.snapshot("j")  # a scrape: the cached analysis, at the version after the ingest
    assert scraped is not None and scraped.analysis is before
    analyses = st._analyses
    track = analyses._track_incidents
    gate = Gate()

    def tracking(job: str, a: Any) -> None:
        if threading.current_thread().name == "refresher":
            gate.pass_through()  # the new analysis kept and taken as tracked; its incidents under way
        track(job, a)

    analyses._track_incidents = tracking  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    refresher = started("refresher", lambda: st.analysis("j"), out)
    gate.wait_arrived("refresher")
    snap = st.snapshot("j", Analysed.CURRENT, force=True)
    gate.open("refresher")
    joined(refresher)
    held = st._analyses.jobs.cached_analysis("j")
    assert held is out["refresher"] and held is not before and held.iterations[-1].iteration == LAST
    assert snap is not None and snap.analysis is held


def test_an_analysis_of_a_run_a_restart_replaced_meanwhile_is_not_held() -> None:
    """An analysis reads run 1's records; the job restarts (run 1's incidents retired, its records sent
    to a digest) before it is kept. It is not held: tracked, its incidents came back open in run 2."""
    store = JobStore(min_recompute_s=0.0)
    _fed(store, 20)
    before = store.analysis("j")
    assert before is not None and before.summary.runs.current == 1
    store.ingest_steps("a", ITS[21])  # more of run 1: the next analysis reads it
    gate = Gate()
    store.jobs["j"].analysis_lock = GatedLock(gate)  # type: ignore[assignment]
    out: dict[str, Any] = {}
    reading = started("reading", lambda: store.analysis("j"), out)
    gate.wait_arrived("reading")  # run 1's 21 iterations read
    first = ITS[1][0]
    assert first.end_time is not None
    store.ingest_steps("a", [dataclasses.replace(first, first_of_run=True, end_time=first.end_time + 3600.0)])
    assert store.jobs["j"].run == 2
    gate.open("reading")
    joined(reading)
    assert store.jobs["j"].analysis is before and out["reading"] is before  # not run 1's newer one
    gate.open("MainThread")
    after = store.analysis("j")
    assert after is not None and after.summary.runs.current == 2
    assert [d.run for d in after.summary.runs.earlier] == [1]


def test_two_refreshes_run_one_after_the_other() -> None:
    """The refresh loop and the rules tick each refresh, on two worker threads: two stall checks of one
    job at once opened its stall twice, or brought back one the other had withdrawn. The second waits."""
    st = AggregatorState(min_recompute_s=0.0)
    _fed(st, 10)
    analyses = st._analyses
    lock_gate, tick_gate = Gate(), Gate()
    analyses._refresh_lock = GatedLock(lock_gate)  # type: ignore[assignment]
    tick = analyses.stalls.tick

    def held_tick(*args: Any, **kw: Any) -> Any:
        tick_gate.pass_through()
        return tick(*args, **kw)

    analyses.stalls.tick = held_tick  # type: ignore[method-assign]
    lock_gate.open("one")
    lock_gate.open("two")
    tick_gate.open("two")
    out: dict[str, Any] = {}
    one = started("one", st.refresh, out)
    tick_gate.wait_arrived("one")  # inside its refresh: the job's stall check
    two = started("two", st.refresh, out)
    lock_gate.wait_arrived("two")  # comes to the refresh lock, held by "one"
    assert "two" not in tick_gate.arrived
    tick_gate.open("one")
    joined(one)
    joined(two)
    assert tick_gate.arrived == {"one", "two"}

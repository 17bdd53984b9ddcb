"""Analyses of one job run at once (the refresher, the API, the rules and the W&B task each ask), outside
the store's lock: the one held is the one that read the newest records, whichever ends last. An older
one ending after a newer once put back an analysis without the job's last iteration, served until the
next record came (for a finished job, never): the offline W&B run of a 40-iteration job lacked its 40th.

Each interleaving is made by the test, not by timing: a thread waits at a gate the test opens."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator import jobs as jobs_module
from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.job_runs import digest_runs
from perfd.aggregator.jobs import JobStore
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


def test_an_older_step_analysis_ending_last_does_not_replace_the_newer() -> None:
    parsed = parse_file(DEMO_LOG, job="j")
    its = _by_iteration(parsed.records)
    last = max(its)
    store = JobStore(min_recompute_s=0.0)
    store.ingest_job_info("a", "j", parsed.job_info)
    store.ingest_steps("a", [r for i in sorted(its) if i < last for r in its[i]])
    gate = Gate()
    store.jobs["j"].analysis_lock = GatedLock(gate)  # type: ignore[assignment]
    out: dict[str, Any] = {}
    # "older" reads the records without the last iteration, then waits to compute
    older = started("older", lambda: store.analysis("j"), out)
    gate.wait_arrived("older")
    store.ingest_steps("a", its[last])  # the last iteration arrives
    newer = started("newer", lambda: store.analysis("j", force=True), out)
    gate.wait_arrived("newer")
    gate.open("newer")  # the newer computes and is stored first
    joined(newer)
    assert out["newer"].iterations[-1].iteration == last
    gate.open("older")  # then the older ends
    joined(older)
    held = store.jobs["j"].analysis
    assert held is out["newer"] and held.iterations[-1].iteration == last
    assert out["older"] is out["newer"]  # what the older's caller is handed is the newer, held
    assert store.analysis("j") is held  # nothing new: the held one, not a recompute's
    assert store.stats.analysis_errors == 0


def test_the_older_ending_first_is_replaced_by_the_newer_as_before() -> None:
    parsed = parse_file(DEMO_LOG, job="j")
    its = _by_iteration(parsed.records)
    last = max(its)
    store = JobStore(min_recompute_s=0.0)
    store.ingest_steps("a", [r for i in sorted(its) if i < last for r in its[i]])
    gate = Gate()
    store.jobs["j"].analysis_lock = GatedLock(gate)  # type: ignore[assignment]
    out: dict[str, Any] = {}
    older = started("older", lambda: store.analysis("j"), out)
    gate.wait_arrived("older")
    store.ingest_steps("a", its[last])
    newer = started("newer", lambda: store.analysis("j", force=True), out)
    gate.wait_arrived("newer")
    gate.open("older")
    joined(older)
    assert out["older"] is not None and out["older"].iterations[-1].iteration == last - 1
    gate.open("newer")
    joined(newer)
    held = store.jobs["j"].analysis
    assert held is not None and held is out["newer"] and held.iterations[-1].iteration == last


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
    parsed = parse_file(DEMO_LOG, job="j")
    its = _by_iteration(parsed.records)
    store = JobStore(min_recompute_s=0.0)
    store.ingest_job_info("a", "j", parsed.job_info)
    store.ingest_steps("a", [r for i in sorted(its) if i <= 20 for r in its[i]])
    first = its[1][0]
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

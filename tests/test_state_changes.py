"""The state's one change count (perfd.aggregator.state_changes): every write path is marked and moves
it, a job's snapshot is rebuilt after a write and only then, and nothing outside the state reaches the
job store through it."""

from __future__ import annotations

import inspect
from pathlib import Path

from perfd.aggregator.job_analyses import JobAnalyses
from perfd.aggregator.snapshot import Analysed
from perfd.aggregator.stalls import StallWatch
from perfd.aggregator.state import AggregatorState
from perfd.aggregator.state_changes import is_write
from perfd.aggregator.state_ingest import StateIngest
from perfd.aggregator.state_reads import StateReads
from perfd.core.model import CollectiveRecord, StepRecord

ROOT = Path(__file__).resolve().parents[1]
READS_OF_THE_INGEST_SIDE = {"held_fold"}  # the engine's root reads what it folds into
COLL = CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=0)


def _public(cls: type) -> dict[str, object]:
    return {n: f for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")}


def test_every_write_path_is_marked() -> None:
    ingest = _public(StateIngest)
    assert {n for n, f in ingest.items() if not is_write(f)} == READS_OF_THE_INGEST_SIDE
    assert is_write(StallWatch.tick) and is_write(JobAnalyses.track_live_incidents)
    assert not any(is_write(f) for f in _public(StateReads).values())


def _steps(first: int, n: int) -> list[StepRecord]:
    return [StepRecord(job="j", iteration=i, end_time=1_800_000_000.0 + i, step_time_ms=500.0)
            for i in range(first, first + n)]


def test_a_snapshot_is_rebuilt_after_each_write_and_only_then() -> None:
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("a", ["j"])
    st.ingest_steps("a", _steps(1, 20))
    st.refresh()
    snap = st.snapshot("j")
    assert snap is not None
    for read in (lambda: st.job_names(), lambda: st.gpu_view("j"), lambda: st.placed_ranks("j"),
                 lambda: st.stats_json(), lambda: st.collective_rows(),
                 lambda: st.snapshot("j", Analysed.SERVED)):
        read()
        assert st.snapshot("j") is snap  # a read changes nothing: the same snapshot
    writes = [
        lambda: st.hello("b", ["j"]),
        lambda: st.ingest_steps("a", _steps(21, 1)),
        lambda: st.ingest_events("a", [{"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"},
                                        "payload": [{"pid": 1, "rank": 0}]}]),
        lambda: st.ingest_collectives("a", [COLL]),
        lambda: st.set_new_normal("j", 5),
        lambda: st.stalls.tick(st, "j"),
        lambda: st.forget_agent("b"),
    ]
    for write in writes:
        before = st.snapshot("j")
        write()
        after = st.snapshot("j")
        assert after is not None and after is not before
        assert st.snapshot("j") is after


def test_nothing_reaches_the_job_store_through_the_state() -> None:
    assert not hasattr(AggregatorState(), "jobs")
    outside = [p for p in [*ROOT.joinpath("perfd").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"),
                           *ROOT.joinpath("perfd", "collectors").rglob("*.py")]
               if "aggregator" not in p.relative_to(ROOT).parts[:2]]
    assert outside
    needle = ".state" + ".jobs."  # not this file's own text
    reaches = [str(p.relative_to(ROOT)) for p in outside if needle in p.read_text()]
    assert not reaches, reaches

"""The engine root's per-iteration answer is made incrementally: at each refresh only the
iterations whose fold changed are computed again (perfd.analytics.run.run_analysis.AnalysisMemo, keyed
by the fold record the root handed on and the job's context), and a costly collective analysis is made
off the refresh that renews that answer (perfd.aggregator.job_analyses: its worker). What is served
must be what a full rebuild gives: a late node's partial for an iteration already answered, or job
info that comes late, changes the answer exactly as an analysis made from scratch of the same records.
No nats-server: the root's own code (perfd.engine.root.Root.handle) folds the messages perfd's encoder
makes into an aggregator's state."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from perfd.aggregator import collectives as coll_store
from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.http import job_iterations
from perfd.aggregator.state import AggregatorState
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis, finish
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout, StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.partial import encode, partials_of
from perfd.engine.root import Root
from perfd.report import analysis_json
from tests.collectives.collective_helpers import fr
from tests.engine.records import job_records

JOB = "inc-job"
GPU = "NVIDIA H100 80GB HBM3"
NODES, ITERATIONS, LATE = 3, 8, 4  # node 1's message of iteration LATE comes after the last iteration's


def _info(dtype: str) -> JobInfo:
    return JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype=dtype),
                   layout=ParallelLayout(world_size=NODES * 8))


def _message(recs: list[StepRecord], node: int, it: int) -> bytes:
    mid = f"node-{node}:{it}"
    return encode(mid, f"node-{node}", 1, partials_of(recs, mid))


def _root(state: AggregatorState) -> Root:
    return Root(S.EngineConfig(("nats://unused",)), EngineSink(state, Guard(Limits(), Refusals())), "root")


def _answer(state: AggregatorState) -> str:
    a = state.analysis(JOB, force=True)
    assert a is not None and a.iterations
    return json.dumps({"analysis": analysis_json(a, []), "iterations": job_iterations(state, JOB)},
                      sort_keys=True, default=str)


def _row(state: AggregatorState, it: int) -> dict[str, object]:
    its = job_iterations(state, JOB)
    assert its is not None
    return next(r for r in its["iterations"] if r["iteration"] == it)


@pytest.mark.parametrize("late", ["record", "job_info"])
def test_a_late_input_changes_an_answered_iteration_as_a_full_rebuild_does(late: str) -> None:
    by_node = job_records(JOB, NODES, ITERATIONS)
    # The late node's ranks were the slowest of that iteration: their records change its answer
    by_node[1][LATE - 1] = [dataclasses.replace(r, step_time_ms=(r.step_time_ms or 0) * 2, end_time=(
        r.end_time or 0) + 0.05) for r in by_node[1][LATE - 1]]
    held: list[bytes] = []
    live = AggregatorState(min_recompute_s=0.0, gpu_override=GPU)
    root = _root(live)
    first_info = _info("bf16" if late == "record" else "fp8")
    root.handle([encode("info", "node-0", 1, (), {JOB: job_info_to_json(first_info)})])
    for it in range(1, ITERATIONS + 1):
        msgs = [_message(by_node[n][it - 1], n, it) for n in range(NODES)]
        if late == "record" and it == LATE:
            held.append(msgs.pop(1))  # its ranks' records come last
        root.handle(msgs)
        live.refresh()  # the answer of each iteration made as it comes, as the root's refresher does
    before = _row(live, LATE)
    memo = live._analyses.jobs.jobs[JOB].memo
    hits = memo.hits
    live.refresh()  # nothing new: nothing computed again
    assert memo.hits == hits
    if late == "record":
        misses = memo.misses
        root.handle([_message(by_node[2][LATE - 1], 2, LATE)])  # a redelivery changes nothing
        live.refresh()
        assert memo.misses == misses and _row(live, LATE) == before
        root.handle(held)
    else:  # the job's info says another dtype: every iteration's MFU is read against another peak
        root.handle([encode("info2", "node-0", 1, (), {JOB: job_info_to_json(_info("bf16"))})])
    misses = memo.misses
    live.refresh()
    after = _row(live, LATE)
    assert after != before  # the late input changed the answered iteration ...
    # ... and only the iteration it touched was computed again (the job's info: every iteration)
    assert memo.misses - misses == (1 if late == "record" else ITERATIONS)

    # The full rebuild: every message at once into a state that never analysed the job
    whole = AggregatorState(min_recompute_s=0.0, gpu_override=GPU)
    root2 = _root(whole)
    root2.handle([encode("info", "node-0", 1, (), {JOB: job_info_to_json(_info("bf16"))})])
    for it in range(1, ITERATIONS + 1):
        root2.handle([_message(by_node[n][it - 1], n, it) for n in range(NODES)])
    assert _answer(live) == _answer(whole)


def _collective_job(state: AggregatorState, iterations: int) -> None:
    """A 2-rank job's step records and Flight Recorder records, its iterations 100 ms apart."""
    steps = [StepRecord(job=JOB, iteration=it, rank=r, end_time=1_795_000_000.0 + it * 0.1,
                        step_time_ms=100.0) for it in range(1, iterations + 1) for r in (0, 1)]
    state.ingest_steps("a", steps)
    state.ingest_collectives("a", [fr(r, it, it * 100.0 + 10, 20.0, job=JOB)
                                   for it in range(1, iterations + 1) for r in (0, 1)])


def test_a_costly_collective_analysis_does_not_hold_the_per_iteration_answer_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = finish

    def slow_finish(*args: object, **kw: object) -> object:  # the 100,000-rank job's ~20 s, held here
        release.wait(30)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(coll_store, "finish", slow_finish)
    monkeypatch.setattr(coll_store, "COSTLY_ROWS", 1)  # this job's few operations count as costly
    state = AggregatorState(min_recompute_s=0.0)
    _collective_job(state, 5)
    _refresh_publishes(state, 5, "the refresh waited for the collective analysis")
    assert state.collective_analysis(JOB) is None  # its first is still being made
    release.set()
    got = _first_collective_analysis(state)
    assert got is not None
    want = state.collective_analysis(JOB, force=True)
    assert want is not None and json.dumps(got.to_json()) == json.dumps(want.to_json())


def test_a_hang_in_a_costly_collective_analysis_opens_its_incident_without_a_new_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung job makes no new step analysis: the worker's collective analysis carries its hang to
    the job's incidents itself."""
    monkeypatch.setattr(coll_store, "COSTLY_ROWS", 1)
    monkeypatch.setattr(coll_store, "COSTLY_ANALYSIS_S", 0.0)  # every analysis of this job is costly
    state = AggregatorState(min_recompute_s=0.0)
    state._analyses.collectives.min_recompute_s = 0.0
    _collective_job(state, 5)

    def made(n: int) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = state.collective_analysis(JOB)
            if got is not None and len(got.hangs) >= n:
                return True
            time.sleep(0.02)
        return False

    state.refresh()
    assert made(0) and not state._analyses.incidents.has_open(JOB)
    labels = {"job": JOB, "process_group": "0", "op": "all_reduce", "seq": "6", "stuck_ranks": "0",
              "ranks_not_joined": "1"}
    state.ingest_events("a", [{"kind": "nccl_hang", "time": time.time(), "job": JOB, "labels": labels,
                               "text": "all_reduce #6 on process group 0 stuck 7s on rank(s) 0"}])
    state.refresh()
    assert made(1)
    deadline = time.monotonic() + 10
    while not state._analyses.incidents.has_open(JOB) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state._analyses.incidents.has_open(JOB)


def test_the_refresh_publishes_a_new_answer_while_the_collective_store_is_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's loop holds the collective store's lock while it merges a node's operations (and
    held it 1-3 s at 8,000 ranks while it made the job's step windows): the refresh asks whether the
    job's collective analysis is costly before it publishes a new step analysis, and must not wait on
    that lock for the answer (fails with CollectiveStore.costly reading under the lock)."""
    monkeypatch.setattr(coll_store, "COSTLY_ROWS", 1)
    monkeypatch.setattr(coll_store, "COSTLY_ANALYSIS_S", 0.0)  # every analysis of this job is costly
    state = AggregatorState(min_recompute_s=0.0)
    _collective_job(state, 5)
    state.refresh()
    assert _first_collective_analysis(state) is not None  # its first is made: it is known to be costly
    state.ingest_steps("a", [StepRecord(job=JOB, iteration=6, rank=r, end_time=1_795_000_000.6,
                                        step_time_ms=100.0) for r in (0, 1)])
    with state._analyses.collectives._lock:  # the loop merging a node's operations
        _refresh_publishes(state, 6, "the refresh waited on the collective store's lock")


def _refresh_publishes(state: AggregatorState, iteration: int, why: str) -> None:
    """A refresh on its own thread ends within 10 s and the job's snapshot shows ``iteration``."""
    done = threading.Thread(target=state.refresh, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), why
    snap = state.snapshot(JOB)
    assert snap is not None and snap.latest is not None and snap.latest.iteration == iteration


def _first_collective_analysis(state: AggregatorState) -> CollectiveAnalysis | None:
    """The job's collective analysis once the worker has made it (None after 30 s)."""
    deadline = time.monotonic() + 30
    while state.collective_analysis(JOB) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return state.collective_analysis(JOB)

"""Each job's rank placement is held until a process list changes in a way that can move it
(NodeView.placement_version) or the job's agents change; job_overview's liveness reads it; one analysis
pass's incident snapshots read the job's GPUs once, and a big job's snapshots keep that view as long as
its steady sightings are apart (less BASELINE_EVERY_S), a small job's never."""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks.baseline_bench import JOB, build
from perfd.aggregator import snapshot as snapshot_mod
from perfd.aggregator.incidents import BASELINE_EVERY_S, BASELINE_RANKS_PER_EVERY_S
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.attribution import place_ranks
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.steps import liveness
from perfd.core.events import GPU_PROCESSES

NODE = "n1"


def _procs(state: AggregatorState, agent: str, gpu: str, procs: list[dict[str, Any]],
           node: str = NODE) -> None:
    state.ingest_events(agent, [{"kind": GPU_PROCESSES.name, "severity": "info", "time": 1.0,
                                 "labels": {"node": node, "gpu": gpu}, "payload": procs}])


def _proc(pid: int, rank: int, job: str = "gpt", mem: int = 1 << 30) -> dict[str, Any]:
    return {"pid": pid, "rank": rank, "local_rank": rank, "world_size": 2, "job": job,
            "used_memory_bytes": mem, "name": "python"}


def _state() -> AggregatorState:
    st = AggregatorState()
    st.hello(f"{NODE}/gpt", ["gpt"])
    st.hello(f"{NODE}/other", ["other"])
    _procs(st, f"{NODE}/gpt", "0", [_proc(10, 0)])
    _procs(st, f"{NODE}/gpt", "1", [_proc(11, 1)])
    return st


def _plain(st: AggregatorState, job: str) -> dict[int, tuple[str, str, int]]:
    return {r: (p.node, p.gpu, p.pid) for r, p in st.placed_ranks(job).items()}


def _fresh(st: AggregatorState, job: str, world_size: int | None = None) -> dict[int, tuple[str, str, int]]:
    return {r: (p.node, p.gpu, p.pid) for r, p in place_ranks(st.gpu_procs(job), world_size, job=job).items()}


@pytest.mark.slow
def test_the_held_placement_is_place_ranks_and_a_copy() -> None:
    st = _state()
    assert _plain(st, "gpt") == _fresh(st, "gpt") == {0: (NODE, "0", 10), 1: (NODE, "1", 11)}
    assert st.placed_ranks("gpt", world_size=3) == {} and _fresh(st, "gpt", 3) == {}
    got = st.placed_ranks("gpt")
    got.clear()  # a caller's copy: the held one is untouched
    assert _plain(st, "gpt") == _fresh(st, "gpt")
    agg, _agents = build(3, 8)
    assert agg.state.placed_ranks(JOB) == place_ranks(agg.state.gpu_procs(JOB), job=JOB)


def test_an_unchanged_resend_keeps_it_a_changed_list_or_a_moved_gpu_does_not() -> None:
    st = _state()
    first = st.placed_ranks("gpt")
    v = st.nodes.placement_version
    _procs(st, f"{NODE}/gpt", "0", [_proc(10, 0)])  # the collector's resend: same processes
    _procs(st, f"{NODE}/gpt", "1", [_proc(11, 1, mem=2 << 30)])  # memory moved: no placement moves
    assert st.nodes.placement_version == v
    again = st.placed_ranks("gpt")
    assert again == first and all(again[r] is first[r] for r in first)  # held, not placed anew

    _procs(st, f"{NODE}/gpt", "1", [_proc(12, 1)])  # a new process for rank 1 (a restart)
    assert st.nodes.placement_version == v + 1
    assert _plain(st, "gpt") == _fresh(st, "gpt") == {0: (NODE, "0", 10), 1: (NODE, "1", 12)}

    _procs(st, f"{NODE}/gpt", "1", [_proc(12, 1, job="other")])  # GPU 1 now runs the other job
    assert _plain(st, "gpt") == _fresh(st, "gpt") == {0: (NODE, "0", 10)}
    assert _plain(st, "other") == _fresh(st, "other") == {1: (NODE, "1", 12)}

    _procs(st, f"{NODE}/other", "1", [_proc(12, 1, job="other")])  # the same list from another agent
    assert st.nodes.placement_version == v + 3
    assert _plain(st, "other") == _fresh(st, "other")


def test_a_changed_agent_set_places_anew() -> None:
    st = AggregatorState()
    st.hello("a", ["gpt"])
    _procs(st, "b", "0", [{"pid": 5, "rank": 3}], node="n2")  # declares no job: its agent's GPUs only
    assert st.placed_ranks("gpt") == {}
    st.hello("b", ["gpt"])  # now an agent of the job
    assert _plain(st, "gpt") == _fresh(st, "gpt") == {3: ("n2", "0", 5)}


def test_job_overview_liveness_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    alive: list[bool | None] = []
    real = liveness.job_state

    def seen(age: Any, step_s: Any, alive_: bool | None, stale: Any) -> Any:
        alive.append(alive_)
        return real(age, step_s, alive_, stale)

    monkeypatch.setattr(snapshot_mod, "job_state", seen)
    st = AggregatorState()
    st.hello("a", ["gpt"])
    assert overview_of(st.snapshot("gpt")) is not None and alive[-1] is None  # no process list: unknown
    _procs(st, "a", "0", [{"pid": 5, "name": "python"}])  # a process list, no rank placed
    assert overview_of(st.snapshot("gpt")) is not None and alive[-1] is False
    _procs(st, "a", "0", [{"pid": 5, "rank": 0, "job": "gpt"}])  # a rank placed: alive
    assert overview_of(st.snapshot("gpt")) is not None and alive[-1] is True
    _procs(st, "a", "0", [{"pid": 5, "rank": 0, "job": "other"}])  # the GPU went to another job
    assert overview_of(st.snapshot("gpt")) is not None and alive[-1] is None  # as place_ranks over gpu_procs
    assert st.gpu_procs("gpt") == {}


def _incidents(ranks_a: list[int]) -> list[Incident]:
    common: dict[str, Any] = {"first_iteration": 1, "last_iteration": 2, "n_iterations": 2, "cost_s": 1.0,
                              "steady_step_ms": 1.0, "median_step_ms": 1.0, "max_step_ms": 1.0, "open": True}
    return [Incident(id="a", kinds=["straggler"], ranks=ranks_a, **common),
            Incident(id="b", kinds=["slow-steps"], ranks=[], **common)]


def _count_view_reads(st: AggregatorState, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    reads: list[float] = []
    real = st.nodes.gpu_view

    def counted(*a: Any, **k: Any) -> Any:
        reads.append(time.time())
        return real(*a, **k)

    monkeypatch.setattr(st.nodes, "gpu_view", counted)
    return reads


def _pass(st: AggregatorState, job: str, incs: list[Incident]) -> None:
    """What an analysis pass hands the tracker, for these incidents (an analysis with no iteration:
    no steady sighting, no collective hang)."""
    st.track_live_incidents(job, incs, time.time())


def test_two_open_incidents_in_one_pass_read_the_view_once(monkeypatch: pytest.MonkeyPatch) -> None:
    agg, _agents = build(2, 8)
    st = agg.state
    reads = _count_view_reads(st, monkeypatch)
    _pass(st, JOB, _incidents([3]))
    assert len(reads) == 1
    kept = {i["id"]: i for i in st.incidents.incidents(JOB)}
    assert set(kept) == {"a", "b"} and "3" in kept["a"]["evidence"]["gpu"]
    _pass(st, JOB, _incidents([3]))  # a small job: a fresh view at every pass
    assert len(reads) == 2


def test_a_big_jobs_snapshots_keep_the_view_a_small_ones_never(monkeypatch: pytest.MonkeyPatch) -> None:
    agg, _agents = build(2, 8)
    st = agg.state
    now = [1e9]
    monkeypatch.setattr(time, "time", lambda: now[0])
    big = 8 * BASELINE_RANKS_PER_EVERY_S
    st.gpu_baseline.add(JOB, {r: [] for r in range(big)}, now[0])  # its last sighting: 8,192 ranks
    keep_s = st.gpu_baseline.interval_s(JOB) - BASELINE_EVERY_S
    assert keep_s == 7 * BASELINE_EVERY_S
    reads = _count_view_reads(st, monkeypatch)
    first = st.sightings.view(JOB)
    now[0] += keep_s * 0.9
    assert st.sightings.view(JOB) is first and len(reads) == 1
    snap = st.sightings.gpu_snapshot(JOB, _incidents([3])[0], first)
    assert snap[3].taken_at == first.taken_at == 1e9  # when it was read, not now
    now[0] += keep_s * 0.2
    later = st.sightings.view(JOB)
    assert later is not first and later.taken_at == now[0] and len(reads) == 2

    st.gpu_baseline.add(JOB, {r: [] for r in range(BASELINE_RANKS_PER_EVERY_S)}, now[0])  # up to the size
    a = st.sightings.view(JOB)
    b = st.sightings.view(JOB)  # the same instant: read anew all the same
    assert a is not b and len(reads) == 4


def test_a_kept_view_is_no_new_sighting_of_an_incidents_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    agg, _agents = build(2, 8)
    st = agg.state
    now = [1e9]
    monkeypatch.setattr(time, "time", lambda: now[0])
    st.gpu_baseline.add(JOB, {r: [] for r in range(8 * BASELINE_RANKS_PER_EVERY_S)}, now[0])
    _pass(st, JOB, _incidents([3]))
    before = st.incidents.incidents(JOB)
    now[0] += 1.0
    _pass(st, JOB, _incidents([3]))  # the view kept: the evidence stays as it was sighted
    after = st.incidents.incidents(JOB)
    assert [i["evidence"]["gpu"] for i in after] == [i["evidence"]["gpu"] for i in before]
    assert [i["evidence"]["gpu_observed"] for i in after] == [i["evidence"]["gpu_observed"] for i in before]
    now[0] += 7 * BASELINE_EVERY_S  # past the kept view's age: sighted anew
    _pass(st, JOB, _incidents([3]))
    assert any(i["evidence"]["gpu"]["3"]["taken_at"] == now[0] for i in st.incidents.incidents(JOB)
               if "3" in i["evidence"]["gpu"])


def test_a_slow_placement_is_held_over_changes_for_a_multiple_of_its_cost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A placement that took long (a 100,000-rank job's ~0.4 s) is not computed again on every change
    while its nodes' process lists come in: held PLACE_EVERY times its cost, then computed anew. A
    quick one (every job here, unpatched) follows each change at once."""
    from perfd.aggregator import gpu_views

    st = _state()
    assert _plain(st, "gpt")[1] == (NODE, "1", 11)
    _procs(st, f"{NODE}/gpt", "1", [_proc(12, 1)])  # rank 1 restarted: a new pid
    assert _plain(st, "gpt")[1] == (NODE, "1", 12)  # quick: at once
    monkeypatch.setattr(gpu_views, "PLACE_SLOW_S", -1.0)  # every placement counts as slow
    monkeypatch.setattr(gpu_views, "PLACE_EVERY", 1e9)
    _procs(st, f"{NODE}/gpt", "1", [_proc(13, 1)])
    assert _plain(st, "gpt")[1] == (NODE, "1", 12)  # held over the change
    monkeypatch.setattr(gpu_views, "PLACE_EVERY", 0.0)  # its time is up
    assert _plain(st, "gpt")[1] == (NODE, "1", 13)

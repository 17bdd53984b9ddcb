"""A slow stretch whose steps change cause is one incident per cause (perfd.analytics.incidents.split).

Seen in CI on a loaded 2-core machine: the CPU-only hook loop's 40 data-slow steps (40 ms waits on
~12 ms steps) joined ~130 steps slowed by the load after them into one stretch (iterations 60-230,
2.9x the steady step); the load's excess was most of its cost, so neither the median step nor the
cost named the data wait and the whole read "not explained: its timers and host showed nothing
unusual". The data-slow steps are a data-loading incident; the load-slowed ones another.

The sequences are shaped as that run's hook records (data wait, compute in ms per step), with
analyses as the live aggregator takes them (every 25 steps) and once more at the end as
``perfd analyze`` does.
"""

from __future__ import annotations

from typing import Any

from perfd.aggregator.incidents import IncidentTracker
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.attribution import GpuSeen
from perfd.analytics.incidents.detect import Incident, detect_incidents
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind
from perfd.analytics.incidents.incident_evidence import RankSnapshot
from perfd.analytics.incidents.split import split_by_cause
from perfd.analytics.steps.iteration import IterationResult
from tests.incidents.hook_steps import hook_state, jitter

JOB = "split"
STEADY_MS = 16.0  # 4 ms data wait + 12 ms compute


def _steady(n: int) -> list[tuple[float, float]]:
    return [(4 + jitter(i), 12.0) for i in range(n)]


def _data_slow(n: int) -> list[tuple[float, float]]:
    return [(40 + jitter(i), 12.0 + jitter(i + 3)) for i in range(n)]


def _load_slow(n: int) -> list[tuple[float, float]]:
    """Compute slowed by other processes on the CPUs (~2.9x the steady step), no data growth."""
    return [(4 + jitter(i), 42.0 + 3 * jitter(i + 5)) for i in range(n)]


def _state(shape: list[tuple[float, float]]) -> AggregatorState:
    return hook_state(JOB, shape)


def _incidents(st: AggregatorState) -> list[dict[str, Any]]:
    return [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 0.5]


def _seen(incs: list[dict[str, Any]]) -> list[tuple[int, int, float, str]]:
    return [(i["first_iteration"], i["last_iteration"], i["cost_s"], i["cause"]) for i in incs]


def _over(incs: list[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
    return max(incs, key=lambda i: len(range(max(i["first_iteration"], first),
                                              min(i["last_iteration"], last) + 1)))


def _excess_s(shape: list[tuple[float, float]], first: int, last: int) -> float:
    return sum(d + c - STEADY_MS for d, c in shape[first - 1:last]) / 1e3


def test_data_slow_steps_then_many_load_slowed_ones_are_two_incidents() -> None:
    shape = _steady(60) + _data_slow(40) + _load_slow(130) + _steady(60)  # iterations 61-100, 101-230
    incs = _incidents(_state(shape))
    data, load = _over(incs, 61, 100), _over(incs, 101, 230)
    assert data is not load, _seen(incs)
    assert (data["first_iteration"], data["last_iteration"]) == (61, 100), _seen(incs)
    assert data["verdict"]["cause"] == "data_wait", _seen(incs)
    assert data["cause"].startswith("data loading took up to")
    assert (load["first_iteration"], load["last_iteration"]) == (101, 230), _seen(incs)
    assert load["verdict"]["cause"] is None  # nothing names the load here (no host evidence)
    assert "not explained" in load["cause"]
    # Each its own cost, no step counted twice and none lost: the two costs are the stretch's.
    assert abs(data["cost_s"] - _excess_s(shape, 61, 100)) < 0.1
    assert abs(load["cost_s"] - _excess_s(shape, 101, 230)) < 0.2
    assert data["median_step_ms"] > 50 and 44 < load["median_step_ms"] < 50


def test_data_slow_steps_inside_load_slowed_ones_are_three_incidents() -> None:
    """The load around the data slowdown: before it, the data-slow steps, after it."""
    shape = _steady(40) + _load_slow(50) + _data_slow(40) + _load_slow(80) + _steady(60)
    incs = _incidents(_state(shape))
    before, data, after = _over(incs, 41, 90), _over(incs, 91, 130), _over(incs, 131, 210)
    assert len({id(before), id(data), id(after)}) == 3, _seen(incs)
    assert [(i["first_iteration"], i["last_iteration"]) for i in (before, data, after)] == \
        [(41, 90), (91, 130), (131, 210)], _seen(incs)
    assert data["verdict"]["cause"] == "data_wait"
    assert before["verdict"]["cause"] is None and after["verdict"]["cause"] is None
    assert abs(sum(i["cost_s"] for i in (before, data, after)) - _excess_s(shape, 41, 210)) < 0.3


def test_a_few_load_slowed_steps_after_a_data_stretch_stay_with_it() -> None:
    """Too cheap to be an incident alone (under the floor): kept in the data incident, never jitter."""
    shape = _steady(60) + _data_slow(40) + _load_slow(10) + _steady(70)
    incs = _incidents(_state(shape))
    (inc,) = [i for i in incs if i["first_iteration"] <= 80 <= i["last_iteration"]]
    assert inc["last_iteration"] == 110, _seen(incs)
    assert inc["verdict"]["cause"] == "data_wait"


def test_one_cause_throughout_is_never_split() -> None:
    """A long data slowdown whose waits vary, and a long load with a little data growth in it."""
    shape = (_steady(60) + [(30 + 20 * ((i // 7) % 2) + jitter(i), 12.0) for i in range(120)]
             + _steady(60) + [(5 + jitter(i), 40.0 + jitter(i)) for i in range(120)] + _steady(60))
    incs = _incidents(_state(shape))
    data, load = _over(incs, 61, 180), _over(incs, 241, 360)
    assert (data["first_iteration"], data["last_iteration"]) == (61, 180), _seen(incs)
    assert (load["first_iteration"], load["last_iteration"]) == (241, 360), _seen(incs)
    assert data["verdict"]["cause"] == "data_wait" and load["verdict"]["cause"] is None


def test_the_pieces_cover_the_stretch_in_order() -> None:
    """The rule alone: a part's run, the sides each at the floor or more, split again the same way."""
    run = list(range(10, 40))
    excess = {i: 30.0 for i in run}
    data = {i: 30.0 if 20 <= i < 25 or 32 <= i < 36 else 0.0 for i in run}
    pieces = split_by_cause(run, excess, [data, dict.fromkeys(run)], floor_ms=100.0)
    assert pieces == [list(range(10, 20)), list(range(20, 25)), list(range(25, 32)), list(range(32, 36)),
                      list(range(36, 40))]
    # Under the floor a later part's run splits nothing; a side under it stays with the part's run.
    assert split_by_cause(run, excess, [data], floor_ms=130.0) == [list(range(10, 20)), list(range(20, 25)),
                                                                   list(range(25, 40))]
    short = list(range(20))
    grew = {i: 30.0 if 8 <= i < 15 else 0.0 for i in short}
    assert split_by_cause(short, dict.fromkeys(short, 30.0), [grew], floor_ms=200.0) == \
        [list(range(8)), list(range(8, 20))]
    assert split_by_cause(run, excess, [data], floor_ms=1000.0) == [run]
    assert split_by_cause(run, excess, [dict.fromkeys(run, 0.0)], floor_ms=100.0) == [run]


def test_what_the_host_showed_while_the_load_slowed_steps_ran_is_theirs_live() -> None:
    """Live, the stretch is one open incident until the load's steps cost an incident of their own;
    a CPU contention sighted meanwhile (after the data-slow steps ended) goes with the load's piece
    and never names the data-slow steps before it (host evidence leads a data wait)."""
    shape = _steady(60) + _data_slow(40) + _load_slow(130) + _steady(60)
    its = [IterationResult(i, step_time_ms=d + c, data_share=d / (d + c))
           for i, (d, c) in enumerate(shape, start=1)]
    ends: dict[int, float | None] = {}
    t = 1000.0
    for it in its:
        t += (it.step_time_ms or 0.0) / 1e3
        ends[it.iteration] = t
    load_from, load_to = ends[100] or 0.0, ends[230] or 0.0

    def snapshot_at(now: float) -> Any:
        items = (Evidence(EvidenceKind.CPU_CONTENTION, 0, "", 0.6, now, now, 1,
                          {"wait_ratio": 0.6, "others_share": 0.7}),) if load_from < now <= load_to else ()

        def snap(inc: Incident) -> dict[int, RankSnapshot]:
            return {0: RankSnapshot(0, "n0", None, False, GpuSeen.NO_GPU, {}, items, {}, (), now)}
        return snap

    tr = IncidentTracker(lambda events: None)
    for upto in range(25, len(its) + 1, 25):
        now = ends[upto] or 0.0
        found = detect_incidents(its[:upto], ends, {}, 5, None, world_size=1, cpu_only=True)
        tr.update("j", found.incidents, snapshot_at(now), [], now)
    incs = tr.incidents("j")
    data, load = _over(incs, 61, 100), _over(incs, 101, 230)
    assert (data["first_iteration"], data["last_iteration"]) == (61, 100), _seen(incs)
    assert data["verdict"]["cause"] == "data_wait", _seen(incs)
    assert [e["kind"] for e in data["evidence"]["gpu_observed"]] == []
    assert load["verdict"]["cause"] == "cpu_contention", _seen(incs)
    (seen,) = load["evidence"]["gpu_observed"]
    assert seen["first_seen"] == ends[125]  # sighted while it was still part of the data's stretch

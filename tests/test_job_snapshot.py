"""Each job's JobSnapshot (perfd.aggregator.snapshot): immutable, keyword-built, built at an analysis
refresh and again only when the state changed since; what changes with the clock alone (the job's
state, its stalled seconds) is computed when read."""

from __future__ import annotations

import dataclasses
import inspect
import re
import time
from pathlib import Path

import pytest

from perfd.aggregator import rule_scopes, stalls
from perfd.aggregator.snapshot import Analysed, JobSnapshot, latest_of_running, overview_of, overviews_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.steps.liveness import ENDED, RUNNING, STALLED
from perfd.collectors.megatron import parse_file

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def _state() -> AggregatorState:
    st = AggregatorState(gpu_override="NVIDIA H200", min_recompute_s=0.0)
    parsed = parse_file(LOG, job="j")
    st.hello("agent-1", ["j"])
    st.ingest_job_info("agent-1", "j", parsed.job_info)
    st.ingest_steps("agent-1", parsed.records)
    st.ingest_events("agent-1", [{"kind": "gpu_processes", "labels": {"node": "n1", "gpu": str(r)},
                                  "payload": [{"pid": 100 + r, "rank": r, "world_size": 2}]} for r in (0, 1)])
    return st


def test_a_snapshot_is_immutable_and_keyword_built() -> None:
    st = _state()
    st.refresh()
    snap = st.snapshot("j")
    assert snap is not None and snap.analysis is not None and snap.latest == snap.analysis.iterations[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.job = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        JobSnapshot("j")  # type: ignore[call-arg]
    assert {r: (p.node, p.gpu) for r, p in snap.placed_ranks.items()} == {0: ("n1", "0"), 1: ("n1", "1")}
    assert snap.nodes == frozenset({"n1"}) and snap.processes_alive is True
    assert st.snapshot("nobody") is None and overview_of(st.snapshot("nobody")) is None
    # /api/jobs: a job listed whose snapshot is gone by its read (pruned meanwhile) is left out, not null
    now = time.time()
    listed = overviews_of([st.snapshot("nobody"), snap, None], now)
    assert [o["job"] for o in listed] == ["j"] and listed[0] == overview_of(snap, now)


def test_built_once_until_the_state_changes() -> None:
    st = _state()
    st.refresh()
    first = st.snapshot("j")
    assert first is not None and st.snapshot("j") is first  # nothing changed: the same one
    st.refresh()
    again = st.snapshot("j")
    # a refresh builds one, of the same analysis (no record came)
    assert again is not first and again is not None and again.analysis is first.analysis
    st.ingest_events("agent-1", [{"kind": "gpu_processes", "labels": {"node": "n1", "gpu": "1"},
                                  "payload": []}])
    moved = st.snapshot("j")
    assert moved is not None and moved is not again and set(moved.placed_ranks) == {0}
    assert st.snapshot("j", Analysed.CURRENT) is not None


def test_what_changes_with_the_clock_is_computed_when_read() -> None:
    st = _state()
    st.refresh()
    snap = st.snapshot("j")
    assert snap is not None
    last = snap.overview.last_step_time
    assert last is not None
    now = time.time()
    assert snap.state_at(now)[0] == RUNNING and snap.stalled_seconds(now) == 0.0
    later = float(last) + 3600.0  # an hour without a step, its processes still on their GPUs: hung
    assert snap.state_at(later)[0] == STALLED
    assert snap.stalled_seconds(later) == pytest.approx(3600.0)
    ov = snap.overview_at(later)
    assert ov["state"] == STALLED and ov["last_step_age_s"] == pytest.approx(3600.0)
    assert list(ov)[:11] == list(snap.overview.to_json())  # the store's keys, in their order, first
    its = snap.iterations
    assert its is not None and latest_of_running([snap], now) == {"j": its}
    assert snap.latest == its[len(its) - 1]
    assert latest_of_running([snap], later) == {}
    st.ingest_events("agent-1", [{"kind": "gpu_processes", "labels": {"node": "n1", "gpu": str(r)},
                                  "payload": []} for r in (0, 1)])
    gone = st.snapshot("j")
    assert gone is not None and gone.state_at(later)[0] == ENDED and gone.stalled_seconds(later) is None


def test_the_consumers_take_no_state_of_their_own() -> None:
    """The stall watch reads a Protocol, not the state (no import cycle); the rule scopes are typed."""
    assert not re.search(r"perfd\.aggregator\.state\b", inspect.getsource(stalls))  # state_changes is fine
    assert "Any" not in inspect.getsource(rule_scopes)


def test_a_jobs_overview_lists_its_agents_sorted_as_they_come() -> None:
    """The overview's agents (kept sorted between reads: a 100,000-GPU job has 12,500) are every agent
    the job has had, sorted, after each new one, whichever way it came."""
    from perfd.aggregator.jobs import JobStore

    store = JobStore()
    store.hello("n2/agent", ["j"])
    seen = []
    for agent in ("n3/agent", "n1/agent", "n3/agent", "n0/agent"):
        store.add_agent("j", agent)
        ov = store.overview("j")
        assert ov is not None
        seen.append(ov.agents)
    assert seen == [("n2/agent", "n3/agent"), ("n1/agent", "n2/agent", "n3/agent"),
                    ("n1/agent", "n2/agent", "n3/agent"), ("n0/agent", "n1/agent", "n2/agent", "n3/agent")]
    ov = store.overview("j")
    assert ov is not None
    listed = ov.to_json()["agents"]
    assert isinstance(listed, list)
    listed.append("x")  # a reader's copy: the next overview is not changed by it
    again = store.overview("j")
    assert again is not None and again.agents == ("n0/agent", "n1/agent", "n2/agent", "n3/agent")

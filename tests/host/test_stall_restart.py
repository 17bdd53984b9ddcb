"""Two silences that are not the job's stall, seen on the H100 (Megatron-LM resumed under ncu:
docs/evidence/entries/28-nsight-compute-by-rule-in-the-answer-2026-11-24-1-h100.md), through the
aggregator's state in process with the real ranks collector's readings of real idle processes
(tests/host/test_stall_aggregator.py's harness, whose clock is the test's):

- a new run starting: the job's last step was before its rank processes began (a restart from a
  checkpoint that loads for 42 s before its first step, on the H100) — held, never opened;
- records that came late: the job's own clock (the records' end times) shows no gap where their
  arrival did — the stall is withdrawn, with its reason, when they arrive.

And the pure check (perfd.analytics.incidents.stall) on its edges."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from perfd.analytics.incidents.evidence import StallReason
from perfd.analytics.incidents.incident_evidence import Withdrawal
from perfd.analytics.incidents.stall import (
    STARTING,
    RankSeen,
    StallCheck,
    StallInputs,
    Status,
    check_stall,
    delivery_only,
    job_clock_gap_s,
)
from perfd.core import events
from perfd.core.typed import obj
from tests.host.test_stall_aggregator import JOB, Harness
from tests.host.test_stall_aggregator import ranks as ranks  # the fixture, re-exported

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _observe_as_started(h: Harness, started_at: float) -> None:
    """What the ranks collector reports of the stand-in processes, their start moved to ``started_at``
    (this test's clock: the job's last record is moved back, so is the processes' start)."""
    out = h.collector.collect(time.time())
    time.sleep(0.5)
    out = h.collector.collect(time.time())
    evs = []
    for ev in out.events:
        rows = [{**r, "started_at": started_at} for r in ev["payload"]["ranks"]]
        payload = {**ev["payload"], "ranks": rows}
        evs.append({**ev, "labels": {**ev["labels"], "node": "node-a"}, "payload": payload})
    h.st.ingest_events("agent-a", evs)


@pytest.mark.slow
def test_a_new_run_loading_before_its_first_step_is_not_a_stall(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    now = h.silent_for(40.0)  # the old run's last step 40 s ago
    _observe_as_started(h, now - 30.0)  # both rank processes began 10 s after it, idle since (loading)
    check = h.st.stalls.tick(h.st, JOB, now)
    assert check.status is Status.HELD and check.phase is not None and check.phase[0] == STARTING
    assert not h.incidents()
    # One rank process from before the last step (the old run's, still there): no new run; idle, silent
    # past the limit: a stall.
    _observe_as_started(h, now - 60.0)
    assert h.st.stalls.tick(h.st, JOB, now).status is Status.STALLED
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]


def test_records_that_came_late_withdraw_the_stall(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    now = h.silent_for(12.0)
    _observe_as_started(h, now - 3600.0)
    check = h.st.stalls.tick(h.st, JOB, now)
    assert check.status is Status.STALLED and check.reasons == (StallReason.IDLE,)
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]
    # The records come, their own end times those of a job that stepped on through the silence.
    h.ingest(h.parsed.records[20:30])
    h.st.analysis(JOB, force=True)
    h.tick()
    assert not h.incidents()
    assert h.st.stalls.late_total[JOB] == 1
    closed = [e for e in h.st.recent_events(JOB) if e["kind"] == events.INCIDENT_CLOSED.name]
    assert closed and obj(closed[-1]["payload"])["withdrawn"] == Withdrawal.LATE_RECORDS.value


def test_records_made_after_the_silence_keep_the_stall_with_the_jobs_own_gap(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    now = h.silent_for(12.0)
    _observe_as_started(h, now - 3600.0)
    assert h.st.stalls.tick(h.st, JOB, now).status is Status.STALLED
    # The job's clock shows the gap: 9 s of it (the records arrived 3 s later still).
    h.ingest(h.after_stop(h.parsed.records[20:30], 9.0))
    h.st.analysis(JOB, force=True)
    h.tick()
    (inc,) = h.incidents()
    assert inc["kinds"] == ["stall"] and not inc["open"]
    stall = inc["evidence"]["stall"]
    e20, e21 = (h.parsed.records[i].end_time for i in (19, 20))
    assert e20 is not None and e21 is not None
    assert stall["silent_s"] == pytest.approx(e21 + 9.0 - e20, abs=0.01)  # the job's clock, not 12 s+
    assert inc["cost_s"] == pytest.approx(stall["silent_s"] - stall["cadence_s"], abs=0.01)


# ---- the pure check ----------------------------------------------------------------------------------
def _rank(started: float | None, state: str = "sleeping") -> RankSeen:
    return RankSeen(0, state, 0.0, None, 100, "n1", started)


def test_start_up_holds_only_when_every_rank_began_after_the_last_step() -> None:
    now, last = 1000.0, 900.0

    def check(*ranks: RankSeen, phase_max_s: float = 1800.0) -> StallCheck:
        return check_stall(StallInputs(now, last, 0.5, ranks, phase_max_s=phase_max_s))

    assert check(_rank(950.0)).status is Status.HELD
    assert check(_rank(950.0), RankSeen(1, "sleeping", 0.0, None, 101, "n1", 800.0)).status is Status.STALLED
    assert check(_rank(None)).status is Status.STALLED  # its start unknown: no new run to speak of
    assert check(_rank(950.0, "stopped")).status is Status.STALLED  # a stopped process is not loading
    assert check(_rank(950.0), phase_max_s=30.0).status is Status.STALLED  # loading longer than the cap


def test_the_jobs_clock_gap_and_what_it_overrules() -> None:
    assert job_clock_gap_s([10.0, 10.5, 11.2, 11.6]) == pytest.approx(0.7)
    assert job_clock_gap_s([10.0, None, 11.0]) is None  # one record without its own time
    assert job_clock_gap_s([10.0]) is None
    idle = StallCheck(Status.STALLED, 30.0, 5.0, 0.5, (StallReason.IDLE,))
    assert delivery_only(idle, 0.7) and not delivery_only(idle, 6.0) and not delivery_only(idle, None)
    stopped = StallCheck(Status.STALLED, 30.0, 5.0, 0.5, (StallReason.STOPPED,))
    assert not delivery_only(stopped, 0.7)  # the kernel's word stands

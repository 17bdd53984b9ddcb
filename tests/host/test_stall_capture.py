"""perfd's own capture is never a stall, through the aggregator's state in process: a
real Megatron-LM DP=2 log's records (tests/data/megatron/dp2_all_timers.log), two real idle processes
standing for the ranks as the real ranks collector reports them (idle: the stall watch's corroboration,
as a rank blocked on ncu's kernel replay reads), a capture asked for through the real capture
coordinator and its progress as an agent reports it. The job's step record stops for 38 s while the
capture's range holds a step (what the H100 showed for an ncu range on Megatron-LM): no stall opens,
no incident follows, the step is the capture's disturbance and the capture's record carries how long
its range held the step. The clock is the test's (tests/host/test_stall_aggregator.py)."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import pytest

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.snapshot import Analysed, overview_of
from perfd.analytics.incidents.stall import Status
from perfd.transport.codec import Command
from tests.host.test_stall_aggregator import JOB, Harness
from tests.host.test_stall_aggregator import ranks as ranks  # the fixture, re-exported

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

HELD_S = 38.0  # the profiled step (the H100's Megatron-LM step under an ncu range)


def _rebased(h: Harness, last_end: float) -> None:
    """The log's records moved so that iteration 20 ends at ``last_end`` (the capture's events carry
    the wall clock; the records of a recording carry theirs)."""
    end20 = h.parsed.records[19].end_time
    assert end20 is not None
    shift = last_end - end20
    h.parsed.records[:] = [dataclasses.replace(r, end_time=r.end_time + shift) if r.end_time is not None
                           else r for r in h.parsed.records]


def _coordinator(h: Harness) -> tuple[CaptureCoordinator, list[tuple[str, Command]]]:
    sent: list[tuple[str, Command]] = []

    def send(agent: str, cmd: Command) -> bool:
        sent.append((agent, cmd))
        return True

    return CaptureCoordinator(h.st, None, send), sent


def _progress(h: Harness, kind: str, cid: str, at: float, payload: dict[str, Any] | None = None) -> None:
    h.st.ingest_events("agent-a", [{"kind": kind, "time": at, "job": JOB, "text": kind,
                                    "labels": {"job": JOB, "tool": "ncu", "ranks": "0"},
                                    "links": {"command_id": cid, "capture_id": "c-agent-1"},
                                    "payload": payload}])


def test_an_ncu_range_that_holds_a_step_for_38_s_is_the_captures_not_a_stall(ranks: Any) -> None:
    h = Harness(ranks)
    now = time.time()
    t20 = now - HELD_S  # iteration 20 ended (and its record arrived) 38 s ago
    _rebased(h, t20)
    h.records(20)
    h.observe()
    coord, sent = _coordinator(h)
    # A rule asks for rank 0 under ncu just after iteration 20; the hook opens the range at step 21.
    rec = coord.request(JOB, [0], "ncu", 1, "rule:ncu-deep-dive", now=t20 + 0.3)
    assert rec.status == "requested" and [a for a, _ in sent] == ["agent-a"]
    _progress(h, "capture_started", rec.id, t20 + 0.5)
    assert coord.captures[rec.id].status == "started"
    check = h.st.stalls.tick(h.st, JOB, h.silent_for(HELD_S))
    # Silent past the limit, the ranks idle (a stall's corroboration), yet held: the capture holds it.
    assert check.status is Status.HELD and check.capture == rec.id
    assert check.silent_s is not None and check.limit_s is not None and check.silent_s > check.limit_s
    assert h.incidents() == [] and overview_of(h.st.snapshot(JOB))["state"] == "running"  # type: ignore[index]
    # The step ends when ncu's replay does: its record took the whole range; the capture finishes
    # with the range's held time, and the job steps on.
    recs = h.parsed.records
    slow = dataclasses.replace(recs[20], step_time_ms=HELD_S * 1e3, end_time=t20 + HELD_S)
    h.ingest([slow])
    _progress(h, "capture_finished", rec.id, t20 + HELD_S + 4.0,
              {"status": "ok", "range_held_s": HELD_S - 0.2, "ranks": {}})
    later = [dataclasses.replace(r, end_time=(r.end_time or 0.0) + HELD_S) for r in recs[21:]]
    h.ingest(later)
    h.st.analysis(JOB, force=True)
    for _ in range(2):
        assert h.tick().status is Status.RUNNING
        h.st.refresh()
    assert h.incidents() == []  # no stall, no slow-step incident: the capture's step
    assert h.st.stalls.opened_total.get(JOB, 0) == 0
    a = h.st.snapshot(JOB, Analysed.SERVED).analysis  # type: ignore[union-attr]
    assert a is not None
    dist = a.summary.capture_disturbances
    assert dist.n >= 1 and any(s.first_iteration <= 21 <= s.last_iteration for s in dist.stretches)
    assert a.incidents == [] and 21 not in a.steady.iterations
    done = coord.book.of_job(JOB)[0]
    assert done.status == "finished" and done.range_held_s == pytest.approx(HELD_S - 0.2)


def test_without_the_capture_the_same_silence_is_a_stall(ranks: Any) -> None:
    """The control: the same records, ranks and silence, no capture: a stall opens."""
    h = Harness(ranks)
    now = time.time()
    _rebased(h, now - HELD_S)
    h.records(20)
    h.observe()
    check = h.st.stalls.tick(h.st, JOB, h.silent_for(HELD_S))
    assert check.status is Status.STALLED and check.capture is None
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]


def test_a_capture_asked_for_after_the_job_went_silent_holds_nothing_back(ranks: Any) -> None:
    """A rule that captures a stalled job: its capture is not the silence's cause."""
    h = Harness(ranks)
    now = time.time()
    t20 = now - HELD_S
    _rebased(h, t20)
    h.records(20)
    h.observe()
    coord, _ = _coordinator(h)
    rec = coord.request(JOB, [0], "kineto", 3, "rule:on-incident", now=t20 + 30.0)
    _progress(h, "capture_started", rec.id, t20 + 30.5)
    check = h.st.stalls.tick(h.st, JOB, h.silent_for(HELD_S))
    assert check.status is Status.STALLED
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]

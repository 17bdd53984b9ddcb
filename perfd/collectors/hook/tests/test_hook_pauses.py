"""A pause a rank announces through its step hook (``with hook.phase("checkpoint")``) is timed by
the hook's clock and reaches goodput as a checkpoint save or an evaluation, not as a gap: real
StepHooks on the same machine, the real collector, the aggregator's fold per iteration."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from perfd.aggregator.jobs import job_level_steps
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.steps.goodput import StepSpan, job_goodput
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.hook.peers import Sender
from perfd.collectors.hook.tests.test_hook_collector import collect_until
from perfd.core.model import HOOK_PAUSE_TIMERS, JobInfo
from perfd.hook import StepHook, wire

Hook = functools.partial(StepHook, flush_interval_s=0, cuda=False)
SAVE, EVAL = HOOK_PAUSE_TIMERS["checkpoint"], HOOK_PAUSE_TIMERS["evaluation"]


def test_an_announced_save_and_evaluation_are_timed_onto_the_next_record(tmp_path: Path) -> None:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    c.start()
    try:
        outer: dict[tuple[int, str], float] = {}  # the test's own clock around each pause
        # Two ranks, each on its own thread as each is a process of its own in a job, meeting in every
        # step as a data-parallel job's all-reduce makes them: the rank done pausing first waits there.
        meet = threading.Barrier(2)

        def pause(h: StepHook, rank: int, phase: str, s: float) -> None:
            t0 = time.monotonic()
            with h.phase(phase):
                time.sleep(s)
            outer[(rank, phase)] = time.monotonic() - t0

        def run_rank(r: int) -> None:
            h = Hook(c.config.socket_path, rank=r)
            for step in range(1, 11):
                with h.step():
                    time.sleep(0.002)
                    meet.wait(timeout=10)
                if step == 5:  # a save after step 5 on both ranks, rank 1's longer; an evaluation on rank 0
                    pause(h, r, "checkpoint", 0.15 if r == 0 else 0.3)
                    if r == 0:
                        pause(h, 0, "evaluation", 0.1)
            h.close()

        ranks = [threading.Thread(target=run_rank, args=(r,)) for r in (0, 1)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(timeout=30)
        out = collect_until(c, 20, n_events=6)
    finally:
        c.stop()
    by = {(s.rank, s.iteration): s for s in out.steps}
    assert len(by) == 20 and c.errors == {}
    slept = {(0, "checkpoint"): 0.15, (1, "checkpoint"): 0.3, (0, "evaluation"): 0.1}
    for (rank, phase), sleep_s in slept.items():
        tv = by[(rank, 6)].timers[HOOK_PAUSE_TIMERS[phase]]
        assert tv.per_rank == {rank: tv.max_ms}
        # The hook's begin -> end lies between the sleep and the test's own clock around the block.
        assert sleep_s <= (tv.max_ms or 0) / 1e3 <= outer[(rank, phase)]
    assert EVAL not in by[(1, 6)].timers
    assert not any(n in s.timers for s in out.steps if s.iteration != 6 for n in (SAVE, EVAL))

    # Each rank's step 6 period holds its own pauses no more (the hook took them out): rank 1's is a
    # step's work, rank 0's that and its wait in the step for rank 1, still saving.
    save1 = (by[(1, 6)].timers[SAVE].max_ms or 0) / 1e3
    paused0 = sum((by[(0, 6)].timers[n].max_ms or 0) / 1e3 for n in (SAVE, EVAL))
    assert (by[(1, 6)].step_time_ms or 0) / 1e3 < 0.1
    assert (by[(0, 6)].step_time_ms or 0) / 1e3 == pytest.approx(save1 - paused0, abs=0.05)
    summary = analyze_run(JobInfo(framework="pytorch"), job_level_steps(out.steps)).summary
    gp = summary.to_json()["goodput"]
    # The job waited for the slowest rank's save (0.3 s), while rank 0 saved and evaluated (0.25 s):
    # the time between steps 5 and 6 is the pauses', none of it a gap (a stall or "other"); of it, the
    # part rank 0 waited for rank 1 is the slowest step's, so checkpoint and evaluation together take
    # what rank 0 paused, and the save at least the shorter of the two saves.
    assert gp["parts_s"]["stall"] == 0 and gp["parts_s"]["other"] < 0.02
    assert gp["parts_s"]["checkpoint"] + gp["parts_s"]["evaluation"] == pytest.approx(paused0, abs=0.02)
    assert gp["parts_s"]["checkpoint"] >= (by[(0, 6)].timers[SAVE].max_ms or 0) / 1e3 - 0.02


def test_an_end_without_its_begin_is_counted_not_timed(tmp_path: Path) -> None:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    me = os.getpid()
    msg = wire.PhaseMsg(rank=0, pid=me, phase=wire.PHASE_CODES["checkpoint"], state=wire.PHASE_END, step=3,
                        time_ns=time.time_ns())
    out = Collected()
    c._handle(wire.pack_phase(msg), "addr", Sender(me, os.getuid(), os.getgid()), time.time(), out)
    assert c.counts["pause_end_unmatched"] == 1 and len(out.events) == 1  # the event still goes
    assert c.pauses.held == {}


@pytest.mark.parametrize(("step_ns", "took_us", "held_ms"),
                         [(4_000_000_000, 150_000, 150.0), (-4_000_000_000, 150_000, 150.0),
                          (4_000_000_000, 0, 4_150.0)])
def test_a_pause_is_timed_by_the_hooks_monotonic_length_where_it_says_one(step_ns: int, took_us: int,
                                                                          held_ms: float) -> None:
    """The wall clock stepped 4 s forward (or back) during a 150-ms save: the end's monotonic length
    (through the wire) is the pause's; an older hook's end (no length: 0) is timed by the two wall
    stamps."""
    c = HookCollector({"job": "j"})
    me, code = os.getpid(), wire.PHASE_CODES["checkpoint"]
    sender, out = Sender(me, os.getuid(), os.getgid()), Collected()
    t0 = time.time_ns()
    for state, at, took in ((wire.PHASE_BEGIN, t0, 0), (wire.PHASE_END, t0 + step_ns + 150_000_000, took_us)):
        msg = wire.PhaseMsg(rank=0, pid=me, phase=code, state=state, step=3, time_ns=at, took_us=took)
        c._handle(wire.pack_phase(msg), "addr", sender, time.time(), out)
    assert c.pauses.held == {0: {"checkpoint": held_ms}} and c.errors == {}


def test_a_real_hooks_end_says_its_pause_length_and_its_begin_none(tmp_path: Path) -> None:
    path = str(tmp_path / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    try:
        h = Hook(path, rank=0)
        with h.phase("checkpoint"):
            pass
        msgs: list[wire.PhaseMsg] = []
        while len(msgs) < 2:
            data = sock.recv(65536)
            records, problem = wire.split_records(data)
            assert problem is None
            msgs += [wire.unpack_phase(r) for kind, r in records if kind == wire.KIND_PHASE]
        h.close()
    finally:
        sock.close()
    begin, end = msgs
    assert (begin.state, end.state) == (wire.PHASE_BEGIN, wire.PHASE_END)
    assert begin.took_us == 0 and end.took_us >= 1


def test_the_phase_wire_carries_a_pause_length_up_to_its_field_and_not_past_it() -> None:
    m = wire.PhaseMsg(rank=1, pid=2, phase=1, state=wire.PHASE_END, step=3, time_ns=4, took_us=2**32 - 1)
    assert wire.unpack_phase(wire.pack_phase(m)) == m
    assert wire.unpack_phase(wire.pack_phase(dataclasses.replace(m, took_us=2**32))).took_us == 0


def test_goodput_counts_a_long_pause_before_a_record_as_its_kind_not_a_stall() -> None:
    # Step records 1 s apart; 30 s between records 5 and 6, of which the hook timed a 29 s save.
    def spans(before: dict[str, float]) -> list[StepSpan]:
        ends = [float(i) for i in range(1, 6)] + [35.0 + i for i in range(5)]
        return [StepSpan(i + 1, e, 1.0, before_s=before if i == 5 else {}) for i, e in enumerate(ends)]

    without = job_goodput(spans({}))
    with_save = job_goodput(spans({"checkpoint": 29.0}))
    assert without is not None and with_save is not None
    assert without.parts["stall"] == pytest.approx(29.0) and without.parts["checkpoint"] == 0
    assert with_save.parts["checkpoint"] == pytest.approx(29.0) and with_save.parts["stall"] == 0
    assert with_save.wall_s == without.wall_s


def test_every_hook_phase_has_a_pause_timer_and_is_a_goodput_kind() -> None:
    from perfd.analytics.steps.goodput import KINDS

    assert set(HOOK_PAUSE_TIMERS) == set(wire.PHASES.values()) and set(HOOK_PAUSE_TIMERS) <= set(KINDS)

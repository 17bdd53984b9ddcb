"""A pause a rank announces through its step hook (``with hook.phase("checkpoint")``) is timed by
the hook's clock and reaches goodput as a checkpoint save or an evaluation, not as a gap: real
StepHooks on the same machine, the real collector, the aggregator's fold per iteration."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

from collectors.hook import HookCollector
from collectors.hook.peers import Sender
from collectors.hook.tests.test_hook_collector import collect_until
from perfd.aggregator.jobs import job_level_steps
from perfd.analytics.steps.goodput import StepSpan, job_goodput
from perfd.analytics.steps.run_analysis import analyze_run
from perfd.collector import Collected
from perfd.hook import StepHook, wire
from perfd.model import HOOK_PAUSE_TIMERS, JobInfo

Hook = functools.partial(StepHook, flush_interval_s=0, cuda=False)
SAVE, EVAL = HOOK_PAUSE_TIMERS["checkpoint"], HOOK_PAUSE_TIMERS["evaluation"]


def test_an_announced_save_and_evaluation_are_timed_onto_the_next_record(tmp_path: Path) -> None:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    c.start()
    try:
        hooks = [Hook(c.config.socket_path, rank=r) for r in (0, 1)]
        outer: dict[tuple[int, str], float] = {}  # the test's own clock around each pause

        def pause(h: StepHook, rank: int, phase: str, s: float) -> None:
            t0 = time.monotonic()
            with h.phase(phase):
                time.sleep(s)
            outer[(rank, phase)] = time.monotonic() - t0

        for step in range(1, 11):
            for h in hooks:
                with h.step():
                    time.sleep(0.002)
            if step == 5:  # a save after step 5 on both ranks, rank 1's longer; an evaluation on rank 0
                pause(hooks[0], 0, "checkpoint", 0.15)
                pause(hooks[1], 1, "checkpoint", 0.3)
                pause(hooks[0], 0, "evaluation", 0.1)
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

    summary = analyze_run(JobInfo(framework="pytorch"), job_level_steps(out.steps)).summary
    gp = summary.to_json()["goodput"]
    # The slowest rank's save, which the job waits for; the evaluation beside it.
    assert gp["parts_s"]["checkpoint"] == pytest.approx((by[(1, 6)].timers[SAVE].max_ms or 0) / 1e3)
    assert gp["parts_s"]["evaluation"] == pytest.approx((by[(0, 6)].timers[EVAL].max_ms or 0) / 1e3)


def test_an_end_without_its_begin_is_counted_not_timed(tmp_path: Path) -> None:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    me = os.getpid()
    msg = wire.PhaseMsg(rank=0, pid=me, phase=wire.PHASE_CODES["checkpoint"], state=wire.PHASE_END, step=3,
                        time_ns=time.time_ns())
    out = Collected()
    c._handle(wire.pack_phase(msg), "addr", Sender(me, os.getuid(), os.getgid()), time.time(), out)
    assert c.counts["pause_end_unmatched"] == 1 and len(out.events) == 1  # the event still goes
    assert c._paused_ms == {}


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

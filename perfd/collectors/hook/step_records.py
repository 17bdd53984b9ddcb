"""A hook's step message as a StepRecord, and the pauses its rank announced before it.

The wire's numbers under the names perfd.core.model declares (the step time, its period or the time inside
the step, the data wait, compute and the time outside the step as timers, the rolling percentiles as
fields), and each announced checkpoint save or evaluation (``with hook.phase(...)``) timed by the
hook's own clock and put on the rank's next record (``HOOK_PAUSE_TIMERS``): goodput counts it as the
pause it was instead of an unexplained gap (a stall).

Apart from the collector (collectors/hook/collector.py: the socket, the senders' checks, the job and
the requests back to the hooks) because this is what a step record says, read and changed on its own
whenever the hook's timing or the record's fields change.
"""

from __future__ import annotations

from collections.abc import Callable

from perfd.core.model import (
    HOOK_COMPUTE,
    HOOK_DATA_WAIT,
    HOOK_DATA_WAIT_FROM_FIELD,
    HOOK_IN_STEP_FIELD,
    HOOK_OUTSIDE,
    HOOK_PAUSE_TIMERS,
    HOOK_STEP_IN_STEP,
    HOOK_STEP_PERIOD,
    HOOK_STEP_TIME_FIELD,
    Provenance,
    StepRecord,
    TimerValue,
)
from perfd.hook import wire

# Ranks of one node whose announced pauses are held at once (open, or ended and waiting for the
# rank's next record): far above a node's GPUs; past it a pause is counted, not timed.
MAX_PAUSE_RANKS = 4096


class Pauses:
    """The pauses each rank announced (``job_phase`` records), held until its next step record.
    ``count``: the collector's counter (a pause past MAX_PAUSE_RANKS, an end without its begin)."""

    def __init__(self, count: Callable[[str], None]) -> None:
        self._count = count
        self.began: dict[int, tuple[str, int]] = {}  # rank -> (phase, hook's time_ns) while open
        self.held: dict[int, dict[str, float]] = {}  # rank -> phase -> ms, until its next record
        # rank -> wall ns the last pause held ended: a KIND_STEP2 record takes the pauses only when it
        # ended after them (its period holds them; the hook took them out of it), not the record of
        # a step the GPU finished earlier that the hook had still to send.
        self.until: dict[int, int] = {}

    def time(self, m: wire.PhaseMsg, phase: str, state: str) -> None:
        """The pause's length by the hook's own monotonic clock (begin -> end), held for the rank's next
        record (``HOOK_PAUSE_TIMERS``): goodput counts it as a checkpoint save or an evaluation in
        the window before that record instead of an unexplained gap (a stall)."""
        if state == "begin":
            if m.rank in self.began or len(self.began) < MAX_PAUSE_RANKS:
                self.began[m.rank] = (phase, m.time_ns)
            else:
                self._count("pause_over_cap")
            return
        began = self.began.pop(m.rank, None)
        # an end without its begin (a hook started mid-phase); an end stamped before its begin is one
        # only where no monotonic length says otherwise (the wall clock may have stepped back)
        if began is None or began[0] != phase or (not m.took_us and m.time_ns < began[1]):
            self._count("pause_end_unmatched")
            return
        if m.rank not in self.held and len(self.held) >= MAX_PAUSE_RANKS:
            self._count("pause_over_cap")
            return
        held = self.held.setdefault(m.rank, {})
        # the hook's monotonic length where it says one; the wall stamps' difference from an older hook
        took_ms = m.took_us / 1e3 if m.took_us else (m.time_ns - began[1]) / 1e6
        held[phase] = held.get(phase, 0.0) + took_ms
        self.until[m.rank] = max(m.time_ns, self.until.get(m.rank, 0))

    def take(self, m: wire.StepMsg, kind: int) -> dict[str, float] | None:
        """The pauses held for ``m``'s rank (phase -> ms), taken by its step whether or not it becomes
        a record; None when none, or when a KIND_STEP2 step ended before them (they are its next's)."""
        if kind != wire.KIND_STEP2 or m.end_time_ns >= self.until.get(m.rank, 0):
            paused = self.held.pop(m.rank, None)
            self.until.pop(m.rank, None)
            return paused
        return None


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def step_record(m: wire.StepMsg, kind: int, job: str, paused: dict[str, float] | None) -> StepRecord:
    """The record of a step message of a rank that is known (``m.rank`` >= 0); ``paused``: the pauses
    its rank announced before it (:meth:`Pauses.take`)."""
    warmup = bool(m.flags & wire.FLAG_WARMUP)
    fields: dict[str, str] = {"timing": "cuda" if m.flags & wire.FLAG_CUDA else "host",
                              "pid": str(m.pid), "percentile_window": str(m.window_n)}
    # The step time: its period where the hook measured one (previous end -> this end: the
    # time between the steps is the job's too), else the time inside the step (the first step
    # of a series; a hook older than KIND_STEP2, whose steps said nothing of the time between).
    step_ns = m.step_ns if m.period_ns is None else m.period_ns
    fields[HOOK_STEP_TIME_FIELD] = HOOK_STEP_PERIOD if m.period_ns is not None else HOOK_STEP_IN_STEP
    if kind == wire.KIND_STEP2:
        fields[HOOK_IN_STEP_FIELD] = f"{m.step_ns / 1e6:.6g}"
    if m.flags & wire.FLAG_HAS_DATA:
        fields[HOOK_DATA_WAIT_FROM_FIELD] = wire.data_wait_from(m.flags)
    for key, val in (("step_time_p50_ms", m.p50_ns), ("step_time_p90_ms", m.p90_ns),
                     ("step_time_p99_ms", m.p99_ns), ("compute_ms", m.compute_ns)):
        if val is not None:
            fields[key] = f"{val / 1e6:.6g}"
    if warmup:
        fields["warmup"] = "true"
    if m.send_drops or m.harvest_drops:
        fields["hook_send_drops"] = str(m.send_drops)
        fields["hook_harvest_drops"] = str(m.harvest_drops)
    timers: dict[str, TimerValue] = {}
    # The hook's phases under the timer names perfd.core.model declares.
    for name, ns in ((HOOK_DATA_WAIT, m.data_wait_ns), (HOOK_COMPUTE, m.compute_ns),
                     (HOOK_OUTSIDE, m.outside_ns)):
        ms = _ms(ns)
        if ms is not None:
            timers[name] = TimerValue(min_ms=ms, max_ms=ms, per_rank={m.rank: ms})
    for phase, ms in (paused or {}).items():
        timers[HOOK_PAUSE_TIMERS[phase]] = TimerValue(min_ms=ms, max_ms=ms, per_rank={m.rank: ms})
    return StepRecord(
        job=job, iteration=m.step, rank=m.rank, end_time=m.end_time_ns / 1e9,
        step_time_ms=step_ns / 1e6, interval=1, fields=fields, timers=timers,
        source=Provenance("hook", f"rank{m.rank}:pid{m.pid}"),
        disturbed_by_capture=bool(m.flags & wire.FLAG_PROFILING),
        armed=bool(m.flags & wire.FLAG_ARMED),
        tokens_per_step=m.tokens_per_step, flops_per_step=m.flops_per_step,
    )

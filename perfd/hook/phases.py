"""Pauses a rank announces between its steps (``with hook.phase("checkpoint"): ...``): the
``PhaseControl`` base class of ``StepHook``.

The announcement goes out at once (a ``job_phase`` event at the agent: a save or an evaluation is
not a stall); the pause's host time, and the fetches inside it (an evaluation's loader), are taken
out of the period and the data wait of the step it falls in (perfd.hook.harvest), the collector
counting the pause itself as checkpoint or evaluation time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

from perfd.hook import wire
from perfd.hook.hook_state import HookState, Slot
from perfd.hook.loader import FetchClock
from perfd.hook.sender import DatagramSender

# An announcement waits at most this long for a harvester pass to end (it then goes out with the
# harvester's next pass): the loop is about to pause anyway, a few ms are nothing.
_PHASE_LOCK_TIMEOUT_S = 0.05


class PhaseContext:
    """``with hook.phase("checkpoint"): save(...)``: begin on enter, end on exit (raised or not)."""

    def __init__(self, hook: PhaseControl, phase: str, step: int | None) -> None:
        self._hook, self._phase, self._step = hook, phase, step

    def __enter__(self) -> PhaseControl:
        self._hook.phase_begin(self._phase, self._step)
        return self._hook

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._hook.phase_end()


class PhaseControl(HookState):
    """Announced pauses; ``StepHook`` sets the state declared here."""

    enabled: bool
    sender: DatagramSender
    _lock: threading.Lock
    _outbox: deque[bytes]
    _next_step: int
    _cur: Slot | None
    _phase_open: str | None
    _pause_at: tuple[int, int] | None
    _paused_ns: int
    _paused_fetch_ns: int
    # StepHook's and Harvester's (declared, not defined: a definition here would come first in
    # StepHook's method order and hide theirs), and the fetch clock it reads (perfd.hook.loader)
    _resolve_rank: Callable[[], None]
    _flush: Callable[[], None]
    _drain_later: Callable[[], None]
    _fetch: FetchClock

    def phase(self, phase: str, step: int | None = None) -> PhaseContext:
        """``with hook.phase("checkpoint"): ...`` around a checkpoint save (or ``"evaluation"``
        around an evaluation pass): the agent hears at once that the loop pauses on purpose, and
        perfd does not call the pause a stall (perfd.analytics.incidents.stall).

        Args:
            phase: ``"checkpoint"`` or ``"evaluation"``.
            step: the step the pause follows; None: the last one begun.

        Returns:
            The context manager: begins the phase on enter, ends it on exit (raised or not).
        """
        return PhaseContext(self, phase, step)

    def phase_begin(self, phase: str, step: int | None = None) -> None:
        """A checkpoint save or an evaluation begins. Sent at once, after the records batched so far;
        never blocks the loop for long nor raises (an unknown phase name is counted in
        ``counters()["internal_errors"]`` and ignored).

        Args:
            phase: ``"checkpoint"`` or ``"evaluation"``.
            step: the step the pause follows; None: the last one begun.
        """
        self._phase(phase, wire.PHASE_BEGIN, step)

    def phase_end(self) -> None:
        """The phase begun last has ended."""
        self._phase(self._phase_open or "", wire.PHASE_END, None)

    def _phase(self, phase: str, state: int, step: int | None) -> None:
        if not self.enabled:
            return
        try:
            code = wire.PHASE_CODES.get(phase)
            if code is None:
                raise ValueError(f"unknown phase {phase!r} (one of {', '.join(wire.PHASE_CODES)})")
            self._phase_open = phase if state == wire.PHASE_BEGIN else None
            took_ns = self._time_pause(state)
            if self._rank is None:
                self._resolve_rank()
            at = self._next_step - 1 if step is None else step
            rec = wire.pack_phase(wire.PhaseMsg(self._rank or 0, self.pid, code, state, at, time.time_ns(),
                                                max(1, took_ns // 1000) if took_ns is not None else 0))
            if self._lock.acquire(timeout=_PHASE_LOCK_TIMEOUT_S):
                try:
                    self._flush()  # the steps before the pause reach the agent first
                    # kept as the steps are while the agent is away or too busy to read: a save whose
                    # announcement is lost reads as a stall
                    self.sender.send(rec, keep=True)
                    self._drain_later()
                finally:
                    self._lock.release()
            else:  # the harvester is busy: it sends the announcement at its next pass
                self._outbox.append(rec)
        except Exception as exc:
            self._internal(exc)

    def _time_pause(self, state: int) -> int | None:
        """The pause's host time and its fetches (an evaluation's loader) leave the period of the
        step they fall in, and its data wait: the collector counts the pause as checkpoint or
        evaluation time (its ``paused-*`` timer) on the record whose period holds it. Returns an
        end's pause length (ns, this monotonic clock's), which its end message carries."""
        now, fetched = time.perf_counter_ns(), self._fetch.total_ns
        if state == wire.PHASE_BEGIN:
            self._pause_at = (now, fetched)
            return None
        began, self._pause_at = self._pause_at, None
        if began is None:
            return None
        took, fetch = now - began[0], fetched - began[1]
        cur = self._cur
        if cur is not None:
            cur.paused_in_ns += took
            cur.gap_fetch_ns -= fetch
        else:
            self._paused_ns += took
            self._paused_fetch_ns += fetch
        return took

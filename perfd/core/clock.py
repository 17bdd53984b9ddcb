"""The one clock the aggregator's time-dependent parts read: the stall watch, job liveness, incident
detection, the rules, retention and the tick that drives them.

Why it exists: each of those parts decides by how much time has passed (a silence past the stall
limit, a job's last step older than its stale limit, a rule's ``for:``, an ended job past its
retention). Read from ``time`` directly, they can be tested only by waiting real seconds, and under
load the seconds a test waits are not the ones it meant: it then reads the machine, not the code.
Taking a :class:`Clock` instead, every one of them runs on the real clock in the product
(:data:`REAL_CLOCK`) and on a :class:`ManualClock` in tests, which move it (``advance``, ``set``) and
call the part's tick: the time that passes is exactly the time the test says.

Two readings, as ``time`` has them: ``time()`` (the wall clock: what is compared with the times
records and events carry, and stored) and ``monotonic()`` (for intervals only: never steps back).
Imports nothing of perfd: every layer may take one.
"""

from __future__ import annotations

import time as _time
from typing import Final, Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (the wall clock)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never step back (intervals only)."""
        ...


class RealClock:
    """The machine's clocks: ``time.time`` and ``time.monotonic``."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()


REAL_CLOCK: Final[Clock] = RealClock()


class ManualClock:
    """A clock that moves only when told: ``advance(dt)`` moves both readings by ``dt``; ``set(now)``
    puts the wall clock at ``now`` (the monotonic reading moves on by as much, never back)."""

    def __init__(self, now: float = 1_700_000_000.0, monotonic: float = 0.0) -> None:
        self._now = float(now)
        self._mono = float(monotonic)

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, dt: float) -> float:
        """Let ``dt`` seconds pass (``dt`` >= 0); returns the wall clock's new reading."""
        if dt < 0:
            raise ValueError(f"time does not run backwards: advance({dt})")
        self._now += dt
        self._mono += dt
        return self._now

    def set(self, now: float) -> float:
        """The wall clock reads ``now`` from here (it may step back, as a real one can); returns it."""
        self._mono += max(0.0, now - self._now)
        self._now = float(now)
        return self._now

"""Each job's GPM of its last steady window: the readings taken while it stepped with no incident
open (the newest STEADY_GPM_READINGS, at most one a second). Their field-by-field median stands for
the job after it stops, so that the idle readings as it ends do not decide its class."""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections import deque
from collections.abc import Sequence

from perfd.analytics.breakdown.bottleneck import GpmReading

STEADY_GPM_READINGS = 60  # readings (one a second at most) whose median is the job's last steady window
STEADY_GPM_EVERY_S = 1.0


def median_reading(rs: Sequence[GpmReading] | None) -> GpmReading | None:
    """Field by field, the median of the readings that have the field."""
    if not rs:
        return None
    out: dict[str, float | None] = {}
    for f in dataclasses.fields(GpmReading):
        xs = [v for r in rs if (v := getattr(r, f.name)) is not None]
        out[f.name] = statistics.median(xs) if xs else None
    return GpmReading(**out)


class SteadyGpm:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[str, deque[GpmReading]] = {}
        self._at: dict[str, float] = {}

    def due(self, job: str, now: float) -> bool:
        with self._lock:
            return now - self._at.get(job, 0.0) >= STEADY_GPM_EVERY_S

    def add(self, job: str, gpm: GpmReading, now: float) -> None:
        with self._lock:
            self._readings.setdefault(job, deque(maxlen=STEADY_GPM_READINGS)).append(gpm)
            self._at[job] = now

    def window(self, job: str) -> GpmReading | None:
        """The median of the job's steady readings; None when none was taken."""
        with self._lock:
            rs = list(self._readings.get(job, ()))
        return median_reading(rs)

    def forget(self, job: str) -> None:
        with self._lock:
            self._readings.pop(job, None)
            self._at.pop(job, None)

"""One simulated clock for the step hook and the loop it times, in place of real sleeps.

``perf_counter_ns`` reads a counter that only ``advance`` moves (the loop's fetches and its steps' work),
``time_ns`` the wall time at the start plus what was advanced; the rest is the real ``time`` module (the
hook's waits at close, its sender's retries). Installed as ``time`` in the hook's modules, every period,
wait and step the hook measures is exactly what the loop advanced, whatever the machine's load."""

from __future__ import annotations

import time
from typing import Any

import pytest

import perfd.hook.harvest
import perfd.hook.loader
import perfd.hook.phases
import perfd.hook.step
import perfd.hook.timing

# the modules that read the host clock for a step's times (perfd.hook.sender keeps the real one)
HOOK_MODULES = (perfd.hook.step, perfd.hook.harvest, perfd.hook.loader, perfd.hook.timing, perfd.hook.phases)


class SimClock:
    def __init__(self) -> None:
        self.t = 1_000_000_000
        self._wall0 = time.time_ns() - self.t

    def advance(self, s: float) -> None:
        """Time passing in the loop: ``s`` seconds, to the ns."""
        self.t += round(s * 1e9)

    def perf_counter_ns(self) -> int:
        return self.t

    def perf_counter(self) -> float:
        return self.t / 1e9

    def time_ns(self) -> int:
        return self._wall0 + self.t

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> SimClock:
        for mod in HOOK_MODULES:
            monkeypatch.setattr(mod, "time", self)
        return self

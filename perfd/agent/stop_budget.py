"""The agent's stop budget: on SIGTERM each step of the stop (collectors, captures, the stream's flush,
its task, the HTTP server) is given what is left of one deadline, by the agent's own monotonic clock,
so the whole stop keeps the promise however busy a step is.

Two steps must run however late they come (the stream task's cancel, the HTTP server's close: each is
given at least FLOOR_S), so the deadline the other steps share ends that much earlier: the floors are
inside the budget, not after it."""

from __future__ import annotations

from collections.abc import Callable

# SIGTERM is honoured within 5 s (docs/reliability.md); the agent's own steps get 4 of them, the rest
# is the interpreter's exit.
SHUTDOWN_BUDGET_S = 4.0
# The captures' share of it: a capture in flight is told to end and the Kineto daemon's armings are
# cancelled, then its thread gets this long (measured: 0.08 s with a capture waiting for a rank's poll,
# tests/captures/test_agent_stop.py; 4.45 s before, when the stop waited for the arming to expire).
CAPTURE_STOP_S = 1.0
# The least a step that must run is given: an asyncio task's cancel handled, a server's sockets closed.
FLOOR_S = 0.05


class StopBudget:
    """One stop's deadline and the marks of its steps (``name seconds-since-start``, for the log)."""

    def __init__(self, monotonic: Callable[[], float], budget_s: float = SHUTDOWN_BUDGET_S,
                 floors: int = 2) -> None:
        self._now = monotonic
        self.t0 = monotonic()
        self.deadline = self.t0 + budget_s - floors * FLOOR_S
        self.phases: list[str] = []

    def left(self, share: float = 1.0) -> float:
        """``share`` of what is left before the shared deadline (0 once it has passed)."""
        return max(0.0, (self.deadline - self._now()) * share)

    def floored(self, share: float = 1.0) -> float:
        """What a step that must run is given: its share of what is left, at least FLOOR_S."""
        return max(FLOOR_S, self.left(share))

    def mark(self, name: str) -> None:
        self.phases.append(f"{name} {self.took():.2f}s")

    def took(self) -> float:
        return self._now() - self.t0

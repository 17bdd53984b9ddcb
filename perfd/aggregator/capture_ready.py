"""Whether a firing capture rule's target can take the capture now, for the capture
coordinator (perfd.aggregator.captures): on the H100 a rule fired 34 s after a job restarted under ncu,
on its warm-up steps and before the rank's step hook had sent a record; the capture failed ("the step
hook is unreachable"), took the rule's one-hour cooldown, and the next firing was suppressed.

So a rule's capture waits, sending nothing and taking none of its budget, while the job's latest steps
are its run's warm-up, or while the tool opens its range through the step hook (ncu) and a target
rank's hook has sent no record lately; and a capture its agent reports as not ready (the typed cause
perfd.core.model.CaptureFailure.NOT_READY) gives the rule its budget back and is asked again after a pause
that doubles from RETRY_FIRST_S to RETRY_MAX_S (a rank restarting under ncu loads for ~40 s on the
H100 here).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from perfd.aggregator.snapshot import JobSnapshot
from perfd.analytics.steps.steady import Exclusion
from perfd.rules.evaluator import TargetWait
from perfd.rules.rule_types import CaptureAction

RETRY_FIRST_S, RETRY_MAX_S = 5.0, 60.0
# A target rank's step hook counts as reachable while its latest record is this recent (at least; three
# of the job's steps where they are longer): a step hook sends its records every step, batched.
HOOK_FRESH_S = 30.0
# The tools whose capture opens its range through the target's step hook, whatever the agent picks.
HOOK_TOOLS = frozenset({"ncu"})


class ReadyGate:
    """The readiness check and the retry pauses of the rules' captures, per (rule, job)."""

    def __init__(self, snapshot: Callable[[str], JobSnapshot | None],
                 hook_seen: Callable[[str], dict[int, tuple[str, float]]]) -> None:
        self.snapshot, self.hook_seen = snapshot, hook_seen
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, str], tuple[float, float]] = {}  # -> (ask again from, its pause)

    def wait(self, rule: str, job: str, action: CaptureAction, ranks: tuple[int, ...] | None,
             now: float) -> TargetWait | None:
        """Why the rule's capture must wait for its target, or None: its agent said the target was not
        ready a moment ago, the job's latest steps are warm-up, or a target rank's hook is silent."""
        with self._lock:
            hold = self._holds.get((rule, job))
        if hold is not None and now < hold[0]:
            return TargetWait.RETRY
        snap = self.snapshot(job)
        a = snap.analysis if snap is not None else None
        if a is not None and len(a.iterations):
            if a.steady.kinds.get(a.iterations[-1].iteration) is Exclusion.WARMUP:
                return TargetWait.WARMUP
        if action.tool in HOOK_TOOLS:
            step_s = snap.median_step_s if snap is not None else None
            fresh = max(HOOK_FRESH_S, 3 * (step_s or 0.0))
            live = {r for r, (_pid, at) in self.hook_seen(job).items() if now - at <= fresh}
            if not live or (ranks is not None and not set(ranks) <= live):
                return TargetWait.NO_HOOK
        return None

    def not_ready(self, rule: str, job: str, now: float) -> float:
        """The agent said the rule's target was not ready: the pause before it is asked again."""
        with self._lock:
            pause = self._holds.get((rule, job), (0.0, RETRY_FIRST_S / 2))[1] * 2
            pause = min(max(pause, RETRY_FIRST_S), RETRY_MAX_S)
            self._holds[(rule, job)] = (now + pause, pause)
        return pause

    def ran(self, rule: str, job: str) -> None:
        """The rule's capture ran (or failed for real): the next not-ready pause starts short again."""
        with self._lock:
            self._holds.pop((rule, job), None)

    def forget_job(self, job: str) -> None:
        with self._lock:
            self._holds = {k: v for k, v in self._holds.items() if k[1] != job}

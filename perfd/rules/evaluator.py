"""Evaluate rules over the current metric values: pending → firing with ``for:``, capture budgets,
and one capture per process at a time.

All time comes from the ``now`` argument (the engine's perfd.core.clock.Clock is only a default), so every
behaviour is testable without sleeping. Semantics follow Prometheus alerting rules: a condition that
holds starts *pending* at that evaluation; once it has held for ``for`` seconds it is *firing* and
stays so on every evaluation while it holds; the first evaluation where it does not hold (or its scope or a
value is gone: absent never fires) resolves it and the next episode starts a fresh ``for`` wait.

Scope keys: a job name (``str``) for job scope, ``(job, rank)`` for rank scope, and
``(job, node, gpu)`` for gpu scope. The caller passes one metric dict per key; each rule runs over
the keys of its own scope.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from perfd.core.clock import REAL_CLOCK, Clock
from perfd.rules.expr import Values
from perfd.rules.rule_types import Action, Annotations, CaptureAction, CaptureTargets, Rule, Scope, Severity

ScopeKey = str | tuple[str, int] | tuple[str, str, str]
# Mapping is invariant in its key type: a TypeVar lets callers pass dict[str, ...] for jobs alone.
K = TypeVar("K", bound=ScopeKey)
# Given the job, the firing's scope key, the rule's targets and the scope's values: the ranks to
# capture, or None when they are not known here (the executor resolves them; the arbiter then holds
# the whole job).
TargetResolver = Callable[[str, ScopeKey, CaptureTargets, Values], tuple[int, ...] | None]

HOUR_S = 3600.0

# Why a firing capture rule did not get to capture. NOT_READY: its target cannot take the capture yet
# (Firing.waiting says why): nothing is sent and no budget is taken, and the next evaluation while
# the rule fires tries again.
COOLDOWN, RATE, QUOTA, BUSY, NOT_READY = "cooldown", "rate", "quota", "busy", "not_ready"


class TargetWait(str, enum.Enum):
    """Why a firing capture rule waits for its target (the caller's readiness check decides)."""

    WARMUP = "warmup"  # the job's latest steps are its run's warm-up: not what the rule means to show
    NO_HOOK = "no_hook"  # the tool opens its range through the step hook, and the target's hook has
    # sent no record lately (a process still starting: under ncu, loading takes tens of seconds)
    RETRY = "retry"  # the target's agent said it was not ready: asked again after a pause


# (the rule, the firing's scope key, its capture action, the ranks it targets (None: the whole job),
# now) -> why the target cannot take the capture yet, or None
ReadyCheck = Callable[[Rule, ScopeKey, CaptureAction, "tuple[int, ...] | None", float], "TargetWait | None"]


def scope_of(key: ScopeKey) -> Scope:
    if isinstance(key, str):
        return "job"
    if len(key) == 2:
        return "rank"
    if len(key) == 3:
        return "gpu"
    raise ValueError(f"not a scope key: {key!r}")


def job_of(key: ScopeKey) -> str:
    return key if isinstance(key, str) else key[0]


@dataclass
class Firing:
    """A rule firing for one scope key at one evaluation."""

    rule: Rule
    key: ScopeKey
    values: dict[str, float | None]  # the values the condition read (the evidence)
    since: float  # when the condition started holding (start of pending)
    firing_since: float  # the evaluation at which it turned from pending to firing
    new: bool  # True at the evaluation where it turned firing (once per episode)
    capture_allowed: bool = False
    suppressed_reason: str | None = None  # cooldown | rate | quota | busy | not_ready (capture rules)
    ranks: tuple[int, ...] | None = None  # ranks reserved in the arbiter; None = the whole job
    waiting: TargetWait | None = None  # not_ready: why the target cannot take the capture yet
    budget_time: float | None = None  # when its capture took the rule's budget (refund() gives it back)

    @property
    def job(self) -> str:
        return job_of(self.key)

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    @property
    def labels(self) -> Mapping[str, str]:
        return self.rule.labels

    @property
    def annotations(self) -> Annotations:
        return self.rule.annotations

    @property
    def action(self) -> Action:
        return self.rule.action

    def to_dict(self) -> dict[str, object]:
        """Plain values for events and the JSON API."""
        action = self.rule.action
        key: object = self.key if isinstance(self.key, str) else list(self.key)
        return {
            "rule": self.rule.name, "scope": scope_of(self.key), "key": key, "job": self.job,
            "severity": self.severity, "labels": dict(self.labels),
            "annotations": self.annotations.as_dict(), "values": dict(self.values), "since": self.since,
            "firing_since": self.firing_since, "new": self.new,
            "action": action.as_dict() if isinstance(action, CaptureAction) else {"type": "alert"},
            "capture_allowed": self.capture_allowed, "suppressed_reason": self.suppressed_reason,
            "ranks": None if self.ranks is None else list(self.ranks),
            "waiting": self.waiting.value if self.waiting is not None else None,
        }


@dataclass
class AlertState:
    rule: str
    key: ScopeKey
    pending_since: float
    firing_since: float | None = None

    @property
    def state(self) -> str:
        return "pending" if self.firing_since is None else "firing"


class CaptureArbiter:
    """At most one capture per process (rank) at a time: one CUPTI client (docs/design.md §3).

    ``ranks=None`` reserves the whole job (targets not resolved to ranks yet). Thread-safe: the
    executor releases from its own thread when a capture ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[str, set[int]] = {}
        self._whole: set[str] = set()

    def try_acquire(self, job: str, ranks: Collection[int] | None) -> bool:
        with self._lock:
            held = self._ranks.get(job, set())
            if job in self._whole or (ranks is None and held):
                return False
            if ranks is None:
                self._whole.add(job)
                return True
            if held & set(ranks):
                return False
            self._ranks.setdefault(job, set()).update(ranks)
            return True

    def release(self, job: str, ranks: Collection[int] | None) -> None:
        with self._lock:
            if ranks is None:
                self._whole.discard(job)
                return
            held = self._ranks.get(job)
            if held is not None:
                held.difference_update(ranks)
                if not held:
                    del self._ranks[job]

    def busy(self, job: str, rank: int | None = None) -> bool:
        with self._lock:
            if job in self._whole:
                return True
            held = self._ranks.get(job, set())
            return bool(held) if rank is None else rank in held


@dataclass
class _Budget:
    """Captures of one rule for one job: the times they started (last hour)."""

    times: deque[float] = field(default_factory=deque)

    def check(self, action: CaptureAction, now: float, used_bytes: int) -> str | None:
        while self.times and self.times[0] <= now - HOUR_S:
            self.times.popleft()
        if self.times and now < self.times[-1] + action.cooldown_s:
            return COOLDOWN
        if len(self.times) >= action.max_per_hour:
            return RATE
        if action.disk_quota_bytes is not None and used_bytes >= action.disk_quota_bytes:
            return QUOTA
        return None


def default_targets(job: str, key: ScopeKey, targets: CaptureTargets,
                    values: Values) -> tuple[int, ...] | None:
    """Explicit ranks, or the rank of a rank-scope firing; anything else is resolved by the executor."""
    if targets.ranks is not None:
        return targets.ranks
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int) and targets.slowest_rank:
        return (key[1],)  # a rank-scope rule naming "the slowest rank" means the rank that fired
    return None


class RuleEngine:
    def __init__(self, rules: Iterable[Rule], clock: Clock = REAL_CLOCK,
                 arbiter: CaptureArbiter | None = None,
                 resolve_targets: TargetResolver | None = None, ready: ReadyCheck | None = None) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate rule names: {', '.join(dupes)}")
        self.clock = clock
        self.arbiter = arbiter if arbiter is not None else CaptureArbiter()
        self.resolve_targets = resolve_targets or default_targets
        self.ready = ready  # None: every target counts as ready
        self._states: dict[tuple[str, ScopeKey], AlertState] = {}
        self._budgets: dict[tuple[str, str], _Budget] = {}
        # (rule, key) pairs resolved by the last evaluate() call (they had been pending or firing).
        self.last_resolved: list[AlertState] = []

    def reads(self, scope: Scope) -> frozenset[str]:
        """The series keys the rules of ``scope`` read: a caller gathers only these."""
        return frozenset(k for r in self.rules if r.scope == scope for k in r.expr.keys)

    def evaluate(self, now: float | None, scope_values: Mapping[K, Values],
                 disk_used: Mapping[str, int] | None = None) -> list[Firing]:
        """One evaluation round. ``disk_used``: bytes of captures already on disk, per job."""
        t = self.clock.time() if now is None else now
        used = disk_used or {}
        by_scope: dict[Scope, list[tuple[ScopeKey, Values]]] = {"job": [], "rank": [], "gpu": []}
        for k, v in scope_values.items():
            by_scope[scope_of(k)].append((k, v))
        firings: list[Firing] = []
        live: set[tuple[str, ScopeKey]] = set()
        for rule in self.rules:
            for key, values in by_scope[rule.scope]:
                if not rule.expr.evaluate(values):
                    continue
                sk = (rule.name, key)
                live.add(sk)
                st = self._states.get(sk)
                if st is None:
                    st = self._states[sk] = AlertState(rule.name, key, t)
                if st.firing_since is None:
                    if t - st.pending_since < rule.for_s:
                        continue
                    st.firing_since = t
                    new = True
                else:
                    new = False
                f = Firing(rule, key, rule.expr.snapshot(values), st.pending_since, st.firing_since, new)
                if isinstance(rule.action, CaptureAction):
                    self._try_capture(f, rule.action, t, used.get(f.job, 0), values)
                firings.append(f)
        self.last_resolved = [st for sk, st in self._states.items() if sk not in live]
        for st in self.last_resolved:
            del self._states[(st.rule, st.key)]
        return firings

    def _try_capture(self, f: Firing, action: CaptureAction, now: float, used_bytes: int,
                     values: Values) -> None:
        budget = self._budgets.setdefault((f.rule.name, f.job), _Budget())
        reason = budget.check(action, now, used_bytes)
        if reason is None:
            ranks = self.resolve_targets(f.job, f.key, action.targets, values)
            wait = self.ready(f.rule, f.key, action, ranks, now) if self.ready is not None else None
            if wait is not None:
                f.suppressed_reason, f.waiting = NOT_READY, wait
                return
            if self.arbiter.try_acquire(f.job, ranks):
                budget.times.append(now)  # cooldown and the hourly window count from the start
                f.capture_allowed, f.ranks, f.budget_time = True, ranks, now
                return
            reason = BUSY
        f.suppressed_reason = reason

    def refund(self, firing: Firing) -> bool:
        """Give back the budget a firing's capture took (its target was not ready: the capture never
        ran), so that no cooldown holds the next try. True when there was one to give back."""
        b = self._budgets.get((firing.rule.name, firing.job))
        t = firing.budget_time
        if b is None or t is None or t not in b.times:
            return False
        b.times.remove(t)
        firing.budget_time = None
        return True

    def capture_finished(self, firing: Firing) -> None:
        """Release the processes a capture held (call when it ends, however it ends)."""
        if firing.capture_allowed:
            self.arbiter.release(firing.job, firing.ranks)

    def states(self) -> list[AlertState]:
        """Every pending or firing (rule, scope key), in no particular order."""
        return list(self._states.values())

    def budgets(self) -> dict[tuple[str, str], _Budget]:
        """(rule, job) -> the start times of its captures in the last hour (cooldown, max_per_hour)."""
        return dict(self._budgets)

    def restore(self, states: Iterable[tuple[str, ScopeKey, float, float | None]],
                budgets: Mapping[tuple[str, str], deque[float]]) -> None:
        """Back from a state store: pending/firing states of rules that still exist, and budgets."""
        names = {r.name for r in self.rules}
        for rule, key, pending, firing in states:
            if rule in names:
                self._states[(rule, key)] = AlertState(rule, key, pending, firing)
        for (rule, job), times in budgets.items():
            if rule in names:
                self._budgets[(rule, job)] = _Budget(times)

    def forget_job(self, job: str) -> None:
        """The job was pruned: its pending/firing states and capture budgets go."""
        self._states = {k: s for k, s in self._states.items() if job_of(s.key) != job}
        self._budgets = {k: b for k, b in self._budgets.items() if k[1] != job}

    def captures_in_last_hour(self, rule: str, job: str, now: float) -> int:
        b = self._budgets.get((rule, job))
        return 0 if b is None else sum(1 for x in b.times if x > now - HOUR_S)

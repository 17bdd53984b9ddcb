"""The shapes every analyzer returns: a Finding (an observation with its evidence), a Recommendation
(an action tied to a finding), and the closed set of severities. Apart from
perfd.analytics.run.run_findings so that every analyzer module (run, budget, capture, collectives,
serving, incidents) can import them without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.common import TextEnum
from perfd.core.record_json import JsonWritten, unwritten


class Severity(TextEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def order(self) -> int:
        return _ORDER[self]


_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
SEVERITY_ORDER: dict[str, int] = {s.value: i for s, i in _ORDER.items()}  # by value, for JSON readers


class FindingOrigin(TextEnum):
    """What made a finding: the run's analyzers, or an incident (perfd.analytics.incidents.detect), whose
    findings a report remakes from the incidents the live aggregator kept."""

    RUN = "run"
    INCIDENT = "incident"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSpan:
    """The steps a run finding's figures are over, its ``iterations`` where it is shown
    (perfd.report.finding_text.span_text): the first and last steady iteration and how many (0: none),
    the run they are of where the job has had more than one (None: its only run), and whether they are
    an earlier run's because every step of the current one is armed (``reference``)."""

    first: int | None = None
    last: int | None = None
    n: int = 0
    run: int | None = None
    reference: bool = False


@dataclass
class Finding(JsonWritten):
    """An observation with its evidence (numbers and the iterations they cover). Its JSON: every field
    but those kept in the process (``unwritten``), the same whoever made it."""

    id: str
    severity: Severity
    title: str
    observation: str
    evidence: dict[str, Any] = field(default_factory=dict)
    iterations: str = ""  # e.g. "iterations 5–40 (36 steady)"
    source: str = ""
    # Kept in the process, not in the JSON: a finding's JSON is the same whoever made it.
    origin: FindingOrigin = field(default=FindingOrigin.RUN, metadata=unwritten())
    # The steps a run finding is over, worded into ``iterations`` where it is shown (None: as it is).
    steps: StepSpan | None = field(default=None, metadata=unwritten())

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        """Back from :meth:`to_json` (a kept record; what the process kept alone takes its default, a
        key this version does not know is left out). Raises KeyError, TypeError or ValueError for what
        is not a finding."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "severity": Severity(d["severity"])})


class DataAction(TextEnum):
    """The one action for slow data, whether an incident's verdict or the run's data share asks for
    it, by what the rank's CPUs allow (perfd.analytics.incidents.host_evidence.CpuUse): its words are
    perfd.report.data_text.DATA_ACTIONS. Recommendations with the same one (and
    the same ``cpu_only``) are one: :func:`order_findings` keeps the one of most gain."""

    LOAD_FASTER = "load-faster"  # the CPUs unknown: more workers, pinned memory, prefetch
    MORE_WORKERS = "more-workers"  # the CPUs have room
    CHEAPER_BATCHES = "cheaper-batches"  # the CPUs are full: more workers would only share them


@dataclass(frozen=True)
class DataLoading:
    """A recommendation's typed data-loading action: the action, and whether the job computes on its
    CPUs (no GPU advice: its words differ)."""

    action: DataAction
    cpu_only: bool = False


@dataclass
class Recommendation(JsonWritten):
    """An action, tied to a finding; priority 1 is the first thing to do. Its JSON: every field but
    those kept in the process (``unwritten``)."""

    id: str
    finding_id: str
    priority: int
    action: str
    detail: str = ""
    impact: float | None = None  # estimated share of the step at stake, for ordering
    # What a remedy fitted to the job adds (perfd.analytics.advice.remedies), typed for readers that act on
    # it:
    remedy: str | None = None  # its RemedyId
    gain_ms: list[float] | None = None  # [low, high] step time saved per step (negative: slower)
    flags: list[str] = field(default_factory=list)  # options to add, as the job's release spells them
    remove: list[str] = field(default_factory=list)  # options to take out
    needs: list[str] = field(default_factory=list)  # packages the job lacks that it needs
    effort: str | None = None  # perfd.analytics.advice.remedies.Effort value: a flag, an install, code
    # The typed action of a data-loading recommendation, what merges it (order_findings); in the
    # process only: its JSON is the action's words.
    data_loading: DataLoading | None = field(default=None, metadata=unwritten())
    # What else makes two recommendations one (an incident's action: its kind, cause and ranks, the
    # inputs its words are made of); in the process only. None: merged with none.
    same_as: Hashable | None = field(default=None, metadata=unwritten())


def order_findings(f: list[Finding], r: list[Recommendation]) -> tuple[list[Finding], list[Recommendation]]:
    """Findings by severity; recommendations by expected gain (impact), numbered R1, R2, ...; of
    recommendations with the same typed data-loading action (an incident's, the run's data share's,
    the data-loader remedy's), or the same ``same_as``, the one of most gain stays. Merged on typed
    values, never on words."""
    f.sort(key=lambda x: SEVERITY_ORDER.get(str(x.severity), 3))
    r.sort(key=lambda x: -(x.impact if x.impact is not None else -1.0))
    kept: list[Recommendation] = []
    for rec in r:
        key = rec.data_loading if rec.data_loading is not None else rec.same_as
        if key is None or all(key != (k.data_loading if k.data_loading is not None else k.same_as)
                              for k in kept):
            kept.append(rec)
    r = kept
    for i, rec in enumerate(r, start=1):
        rec.priority, rec.id = i, f"R{i}"
    return f, r

"""A capture as the aggregator's capture coordinator (perfd/aggregator/captures.py) records it, typed.

What its agent reported (``result``: the capture's event payload, perfd.capture.manager, as it came
over the wire) and what the aggregator made of it (its step budget, class, findings and remedies, and
whether it is of the job at all: perfd.analytics.advice.capture_findings and capture_match), held as
the typed values. JSON only at the edges: :meth:`CaptureRecord.to_json` gives the keys the API, the
W&B sink and the state store have always carried, in the same order; :meth:`CaptureRecord.from_json`
is the state store's load, the one place such JSON becomes a record again.

Split from captures.py so that the state's readers of the records (perfd/aggregator/class_inputs.py,
stalls.py, incidents.py) import them without the coordinator (which imports the state).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.aggregator.jobs import RecordsLayout
from perfd.analytics.breakdown.bottleneck import BottleneckClass, ClassBasis, Quoted
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.capture_match import CaptureMatch
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, devices_of
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.breakdown.ncu_rows import (
    CategorySummary,
    Coverage,
    JoinedKernel,
    KernelChoiceNote,
    NcuCategory,
)
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.run.arming import ArmingCost, measure_arming
from perfd.core import limits as L
from perfd.core.model import CaptureFailure, CaptureStatus, CaptureTool, capture_tool
from perfd.core.record_json import JsonWritten, unwritten
from perfd.core.typed import obj, objs
from perfd.report.bottleneck_text import vote_reason


def findings_of(got: object) -> list[Finding]:
    """Findings read back from their JSON (the state store's load); one that is not one is left out."""
    out = []
    for f in got if isinstance(got, list) else []:
        try:
            out.append(Finding.from_json(f))
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
    return out


@dataclass(frozen=True)
class RankReport:
    """One rank's part of a capture's report: its device breakdowns (None: the part holds no list of
    them) and its Nsight Compute rows, read from the agent's event (perfd.capture.ncu_capture
    .event_rows): the category summaries, the joined kernel rows, the timeline capture they were joined
    to, how the kernels were chosen and what the profiled launches covered."""

    devices: tuple[DeviceBreakdown, ...] | None = None
    ncu_categories: tuple[CategorySummary, ...] = ()
    ncu_kernels: tuple[JoinedKernel, ...] = ()
    ncu_joined_to: str | None = None
    ncu_kernel_choice: KernelChoiceNote | None = None
    ncu_coverage: Coverage | None = None

    @classmethod
    def of(cls, part: object) -> RankReport:
        p = obj(part)
        devices, joined_to, cov = p.get("devices"), p.get("ncu_joined_to"), p.get("ncu_coverage")
        return cls(devices_of(devices) if isinstance(devices, list) else None,
                   tuple(c for d in objs(p.get("ncu_categories")) if (c := CategorySummary.from_json(d))),
                   tuple(k for d in objs(p.get("ncu_kernels")) if (k := JoinedKernel.from_json(d))),
                   joined_to if isinstance(joined_to, str) else None,
                   KernelChoiceNote.from_json(p.get("ncu_kernel_choice")),
                   Coverage.from_json(cov) if isinstance(cov, Mapping) else None)


def _when(v: object) -> float | None:
    """An epoch time from a payload: a finite number, else absent."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _json_bytes(value: object) -> int:
    """``value``'s size as JSON (an event's payload: at most perfd.core.limits.MAX_EVENT_BYTES on the
    wire)."""
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError, RecursionError):  # not JSON after all: counted as the cap's worth
        return L.MAX_EVENT_BYTES


def record_bytes(rec: CaptureRecord) -> int:
    """About what a record holds beyond its fixed fields: its names, texts, ranks and reported result
    (what the records' byte cap, perfd.core.limits.MAX_CAPTURE_RECORD_BYTES, counts)."""
    result = rec.result.raw_bytes if rec.result is not None else 0
    return len(rec.job) + len(rec.origin) + len(rec.reason) + 8 * len(rec.ranks or ()) + result


@dataclass(frozen=True)
class CaptureResult:
    """What an agent reported of a capture (its event's payload, perfd.capture.manager), read once where
    it arrives: each rank's report, how long the range held the step, when ncu armed each rank, the
    artifacts' size and why it did not run. ``raw`` is the payload as it came, kept whole for the API and
    the state store (the edges that show and keep it); nothing in the aggregator reads it."""

    raw: Mapping[str, object]
    ranks: Mapping[str, RankReport] = field(default_factory=dict)
    range_held_s: float | None = None
    armed_at: Mapping[int, float] = field(default_factory=dict)
    artifact_bytes: int | None = None
    # when the ranks' trace was written (the agent's clock, as the event's): what the capture did in the
    # ranks' processes ended then; its agent's analysis of the trace, after it, does not touch them
    trace_ready_at: float | None = None
    cause: CaptureFailure | None = None
    raw_bytes: int = 0  # ``raw`` as JSON: what the records' byte cap counts of it (MAX_CAPTURE_RECORD_BYTES)

    @classmethod
    def of(cls, payload: object) -> CaptureResult:
        """The typed reading of a payload; what is not of the expected type reads as absent."""
        p = obj(payload)
        ranks = p.get("ranks")
        held, size = p.get("range_held_s"), p.get("artifact_bytes")
        armed = obj(p.get("ncu_armed_at"))
        return cls(
            dict(p),
            {str(r): RankReport.of(part) for r, part in ranks.items()} if isinstance(ranks, Mapping) else {},
            float(held) if isinstance(held, (int, float)) and not isinstance(held, bool) and held >= 0
            else None,
            # a rank of 12 digits at most: int() of thousands raises (and is no rank)
            {int(r): float(t) for r, t in armed.items()
             if str(r).isdigit() and len(str(r)) <= 12
             and isinstance(t, (int, float)) and not isinstance(t, bool)},
            size if isinstance(size, int) and not isinstance(size, bool) else None,
            _when(p.get("trace_ready_at")),
            CaptureFailure.of(p.get("cause")),
            _json_bytes(p))

    def devices(self, rank: str) -> tuple[DeviceBreakdown, ...]:
        """The device breakdowns the report holds for ``rank`` (none: an empty tuple)."""
        part = self.ranks.get(rank)
        return (part.devices or ()) if part is not None else ()


@dataclass(frozen=True)
class Decided(JsonWritten):
    """The (rank, device) whose step budget decided a capture's class, with the breakdowns its agent
    reported for that rank's devices (``devices``, from the record's ``result``: the job's budget is
    built from the deciding device's, the capture match reads them all)."""

    rank: str
    device: int
    devices: tuple[DeviceBreakdown, ...] = field(default=(), compare=False, metadata=unwritten())

    @property
    def breakdown(self) -> DeviceBreakdown | None:
        """The deciding device's breakdown (None: the result holds none of that device)."""
        return next((d for d in self.devices if d.device == self.device), None)

    def of_result(self, result: CaptureResult) -> Decided:
        """The same decision over another result of the capture (its agent reported again)."""
        return dataclasses.replace(self, devices=result.devices(self.rank))

    @classmethod
    def from_json(cls, d: object, result: CaptureResult | None) -> Decided | None:
        """Back from :meth:`to_json` (the state store's load), its devices from the record's result."""
        if not isinstance(d, Mapping) or not isinstance(d.get("device"), int) or "rank" not in d:
            return None
        rank = str(d["rank"])
        return cls(rank, int(d["device"]), result.devices(rank) if result is not None else ())


@dataclass
class CaptureRecord:
    id: str
    job: str
    ranks: list[int] | None
    tool: CaptureTool
    steps: int
    origin: str  # "rule:NAME" | "manual" | "alertmanager:ALERTNAME"
    requested_at: float
    agents: list[str] = field(default_factory=list)
    status: CaptureStatus = CaptureStatus.REQUESTED
    reason: str = ""
    updated_at: float = 0.0
    result: CaptureResult | None = None  # what the agent reported (its event's payload), typed
    agent_capture_ids: list[str] = field(default_factory=list)  # the agents' store ids
    started_at: float | None = None  # epoch s, when an agent reported the capture running
    finished_at: float | None = None
    findings: list[Finding] = field(default_factory=list)  # perfd.analytics.advice.capture_findings
    recommendations: list[Recommendation] = field(default_factory=list)
    bottleneck: BottleneckClass | None = None  # the class the captured timeline supports
    # why the timeline supports that class (its words: perfd.report.capture_text.class_reason, given
    # as ``bottleneck_reason`` where the record is served); Quoted: an older store's record, in words
    basis: ClassBasis | Quoted | None = None
    decided: Decided | None = None  # the (rank, device) whose step budget decided the class
    budget: StepBudget | None = None  # that device's step budget (perfd.analytics.breakdown.budget)
    slowdown: dict[str, float] = field(default_factory=dict)  # rank -> kernels' slowdown vs steady
    stack: bool = False  # Kineto with Python stacks (module names; a slower capture)
    # How long the capture's range held the step it profiled, as its agent measured it (an ncu range:
    # tens of seconds while ncu replays the kernels); those steps are the capture's, never a stall.
    range_held_s: float | None = None
    # What arming ncu costs the captured ranks, measured from the job's steps when the capture ended
    # (perfd.analytics.run.arming; the job's report measures it again over the steps it then holds).
    arming: ArmingCost | None = None
    # Why it did not run, as its agent typed it (perfd.core.model.CaptureFailure value): "not_ready" is asked
    # again when the target is, with no rule cooldown taken; None: it ran, or an agent that says nothing.
    cause: CaptureFailure | None = None
    # Whether it is of the job's run as the job's analysis has it when it finished (perfd.analytics.
    # breakdown.capture_match, the decided rank's, else the first rank's): refused, it never informs the
    # job's budget or class, and its findings say why.
    match: CaptureMatch | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            if k == "basis":  # served in words, and kept typed for the store's load
                out["bottleneck_reason"] = vote_reason(self.basis) if self.basis is not None else None
                out["class_basis"] = self.basis.to_json() if isinstance(self.basis, ClassBasis) else None
            else:
                out[k] = getattr(self, k)
        out.update(result=self.result.raw if self.result is not None else None,
                   findings=[f.to_json() for f in self.findings],
                   recommendations=[r.to_json() for r in self.recommendations],
                   bottleneck=self.bottleneck.value if self.bottleneck is not None else None,
                   decided=self.decided.to_json() if self.decided is not None else None,
                   budget=self.budget.to_json() if self.budget is not None else None,
                   arming=self.arming.to_json() if self.arming is not None else None,
                   match=self.match.to_json() if self.match is not None else None)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaptureRecord:
        """Back from :meth:`to_json` (the state store's load); keys it does not know are left out."""
        known = cls.__dataclass_fields__
        tool = capture_tool(d.get("tool"))
        if tool is None:
            raise ValueError(f"not a capture tool: {str(d.get('tool'))[:40]!r}")
        kept = {k: v for k, v in d.items()
                if k in known and k not in ("status", "cause", "result", "tool", "basis")}
        rec = cls(**kept, tool=tool)
        said = d.get("bottleneck_reason")
        rec.basis = ClassBasis.from_json(d.get("class_basis")) \
            or (Quoted(said) if isinstance(said, str) else None)
        got_result = d.get("result")
        rec.result = CaptureResult.of(got_result) if got_result is not None else None
        rec.status = CaptureStatus.of(d.get("status", CaptureStatus.REQUESTED.value))
        rec.cause = CaptureFailure.of(d.get("cause"))
        rec.findings = findings_of(d.get("findings"))
        rec_keys = {f.name for f in dataclasses.fields(Recommendation)}
        rec.recommendations = []
        for r in d.get("recommendations") or []:
            try:
                rec.recommendations.append(Recommendation(**{k: v for k, v in r.items() if k in rec_keys}))
            except (AttributeError, TypeError):  # not one (an older version's): left out
                continue
        got = d.get("bottleneck")
        rec.bottleneck = BottleneckClass.of(got) if got is not None else None
        rec.decided = Decided.from_json(d.get("decided"), rec.result)
        rec.budget = StepBudget.from_json(d.get("budget"))
        rec.arming = ArmingCost.from_json(d.get("arming"))
        match = d.get("match")
        rec.match = CaptureMatch.from_json(match) if isinstance(match, Mapping) else None
        return rec

    def timeline(self) -> TimelineClass | None:
        """What the capture gives the job's analysis: the class it supports and the breakdown of the
        device that decided it (None: it supports no class, or it is another job's or run's)."""
        if self.bottleneck is None or self.bottleneck is BottleneckClass.UNKNOWN:
            return None
        if self.match is not None and self.match.refused:  # another job's (or run's): never informs this one
            return None
        # The agents' ids of the capture beside the request's: ncu-prefix and the kernel choice name the
        # capture by the agent's id (c2026...), the budget by the request's; one report shows both.
        stored = ", ".join(str(x) for x in self.agent_capture_ids[:4])
        dec = self.decided
        return TimelineClass(self.bottleneck, self.basis if self.basis is not None else Quoted(""),
                             f"capture {self.id} ({self.tool}, ranks {self.ranks}"
                             + (f"; {stored}" if stored else "") + ")",
                             dec.breakdown if dec is not None else None, self.steps, self.id,
                             devices=dec.devices if dec is not None else ())


@dataclass(frozen=True)
class NcuRows:
    """A job's latest finished Nsight Compute capture, as the budget reads it: its id, its per-category
    summaries (each with how the kernels were chosen and what the range covered), its joined kernel
    rows and the timeline capture they were joined to."""

    capture_id: str = ""
    categories: tuple[NcuCategory, ...] = ()
    kernels: tuple[JoinedKernel, ...] = ()
    joined_to: str | None = None


RecordsOf = Callable[[str], RecordsLayout | None]


def arming_of(recs: Sequence[CaptureRecord], records_of: RecordsOf,
              windows_of: Callable[[str], list[tuple[float, float]]]) -> ArmingCost | None:
    """What arming ncu cost the ranks of the first of ``recs`` that says when its ranks were armed,
    measured from its job's steps (``records_of``: the job store's records and layout) outside its
    captures' windows; None when unmeasured."""
    for rec in recs:
        at = dict(rec.result.armed_at) if rec.result is not None else {}
        got = records_of(rec.job)
        if at and got is not None:
            return measure_arming(got[0], at, windows_of(rec.job))
    return None


def ncu_of(captures: Sequence[CaptureRecord]) -> NcuRows:
    """The rows of a job's latest finished Nsight Compute capture (none: an empty NcuRows), from what its
    agent reported."""
    for c in sorted(captures, key=lambda c: c.finished_at or 0.0, reverse=True):
        if c.tool != "ncu" or c.status is not CaptureStatus.FINISHED or c.result is None:
            continue
        for part in c.result.ranks.values():
            if part.ncu_categories:
                cats = tuple(NcuCategory(x, c.id, part.ncu_kernel_choice, part.ncu_coverage)
                             for x in part.ncu_categories)
                return NcuRows(c.id, cats, part.ncu_kernels, part.ncu_joined_to)
    return NcuRows()


@dataclass(frozen=True)
class CaptureSeen(JsonWritten):
    """A capture taken during an incident, as the incident keeps it (perfd.aggregator.incident_records):
    what it was and when it ran, its findings, the class it supports and its kernels' slowdown."""

    id: str
    tool: CaptureTool
    ranks: tuple[int, ...] | None
    status: CaptureStatus
    origin: str
    requested_at: float | None
    started_at: float | None
    finished_at: float | None
    findings: tuple[Finding, ...] = ()
    bottleneck: BottleneckClass | None = None
    slowdown: Mapping[str, float] = field(default_factory=dict)  # rank -> kernels' slowdown vs steady

    @classmethod
    def of(cls, c: CaptureRecord) -> CaptureSeen:
        return cls(c.id, c.tool, tuple(c.ranks) if c.ranks is not None else None, c.status, c.origin,
                   c.requested_at, c.started_at, c.finished_at, tuple(c.findings), c.bottleneck,
                   dict(c.slowdown))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaptureSeen | None:
        """Back from :meth:`to_json` (the state store's load of an incident); None: not one (no tool
        this version knows)."""
        ranks, got = d.get("ranks"), d.get("bottleneck")
        slowdown = d.get("slowdown")
        tool = capture_tool(d.get("tool"))
        if tool is None:
            return None
        return cls(str(d.get("id")), tool,
                   tuple(int(r) for r in ranks) if isinstance(ranks, list) else None,
                   CaptureStatus.of(d.get("status")),
                   str(d.get("origin")), d.get("requested_at"), d.get("started_at"), d.get("finished_at"),
                   tuple(findings_of(d.get("findings"))),
                   BottleneckClass.of(got) if got is not None else None,
                   {str(k): float(v) for k, v in slowdown.items()} if isinstance(slowdown, Mapping) else {})

"""Rule packs as plain frozen dataclasses (built by :mod:`perfd.rules.pack_loader`).

Keys follow Prometheus alerting rules where they mean the same (``expr``, ``for``, ``labels``,
``annotations``); ``scope`` and ``action`` are perfd's own: where a condition is evaluated, and what
happens when it fires (an alert, or a targeted capture under a budget).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from perfd.core.catalog import MetricDef
from perfd.core.model import CAPTURE_TOOLS, CaptureTool
from perfd.rules.expr import BYTE_UNITS, TIME_UNITS, Expr

Severity = Literal["info", "warning", "critical"]
Scope = Literal["job", "rank", "gpu"]
Tool = CaptureTool

SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
SCOPES: tuple[Scope, ...] = ("job", "rank", "gpu")
TOOLS: tuple[Tool, ...] = CAPTURE_TOOLS

# Capture budget defaults. A Kineto trace of 3 iterations was ~43 MB per rank on the shared
# Megatron run (docs/design.md §3), so 2 GiB holds a few captures of a handful of ranks.
DEFAULT_STEPS = 3
DEFAULT_COOLDOWN_S = 30 * 60.0
DEFAULT_MAX_PER_HOUR = 2
DEFAULT_DISK_QUOTA_BYTES = 2 * 2**30

# Labels that identify each scope: a rule reads only metrics whose own scope labels fit in these
# (a job-scope rule cannot read a per-GPU metric: that value would not be there, and perfd does not
# invent one). A rank's GPU and node metrics are joined onto it, so rank scope sees them.
SCOPE_LABELS: dict[Scope, frozenset[str]] = {
    "job": frozenset({"job_name"}),
    "rank": frozenset({"job_name", "rank", "node", "gpu"}),
    "gpu": frozenset({"job_name", "node", "gpu"}),
}


# Labels of the scope a series belongs to, beyond job_name (which every scope has).
_PLACE_LABELS = frozenset({"rank", "node", "gpu"})


def carrying_scopes(metric: MetricDef) -> tuple[frozenset[Scope], str]:
    """The scopes whose values hold ``metric`` on the aggregator (perfd.aggregator.rule_scopes builds
    them), and why when there are none. A job series (labelled ``job_name``: everything /metrics
    exports for a job) is at the scope its rank, node and gpu labels name; a GPU series at gpu scope
    and, joined onto the rank that runs on that GPU, at rank scope. A histogram has no one value,
    and host and perfd's own series are not per job: no scope holds them."""
    if metric.kind == "histogram":
        return frozenset(), "a histogram has no single value (query its buckets in PromQL)"
    place = frozenset(metric.labels) & _PLACE_LABELS
    if "job_name" in metric.labels:
        if "rank" in place:
            return frozenset({"rank"}), ""
        if place == {"node"}:  # where a job runs (perfd_job_node_info): a node, no GPU, no scope
            return frozenset(), "a job's node, not a rule scope (join it in PromQL: on(node))"
        return frozenset({"gpu" if place else "job"}), ""
    if {"node", "gpu"} <= place:
        return frozenset({"gpu", "rank"}), ""
    return frozenset(), "not a per-job series (a host's or perfd's own; /metrics only)"


# Durations (for, cooldown) and sizes (disk_quota) in pack keys.
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_BYTES_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration: a number (seconds) or Prometheus-style ``30s``, ``5m``, ``1h30m``."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0 or not math.isfinite(text):
            raise ValueError(f"duration must be >= 0, not {text!r}")
        return float(text)
    s = text.strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * TIME_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    return total


def parse_bytes(text: str | int | float) -> int:
    """Bytes in a size: a number (bytes) or ``500MB``, ``2GiB`` (decimal and binary prefixes)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, (int, float)):
        return int(text)
    m = _BYTES_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 500MB, 2GiB)")
    return int(float(m.group(1)) * BYTE_UNITS[m.group(2) or "B"])


@dataclass(frozen=True)
class Annotations:
    summary: str = ""
    description: str = ""
    recommendation: str = ""
    runbook_url: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("summary", self.summary), ("description", self.description),
                                  ("recommendation", self.recommendation),
                                  ("runbook_url", self.runbook_url)) if v}


@dataclass(frozen=True)
class AlertAction:
    type: Literal["alert"] = "alert"


@dataclass(frozen=True)
class CaptureTargets:
    """Exactly one way of naming the ranks to capture; the capture executor resolves it."""

    slowest_rank: bool = False
    pp_stage: int | None = None
    ranks: tuple[int, ...] | None = None
    node: str | None = None
    incident_ranks: bool = False  # the ranks the job's open incidents name (a one-rank job: its rank)

    @property
    def kind(self) -> str:
        if self.incident_ranks:
            return "incident_ranks"
        if self.ranks is not None:
            return "ranks"
        if self.pp_stage is not None:
            return "pp_stage"
        if self.node is not None:
            return "node"
        return "slowest_rank"

    def as_dict(self) -> dict[str, object]:
        if self.incident_ranks:
            return {"incident_ranks": True}
        if self.ranks is not None:
            return {"ranks": list(self.ranks)}
        if self.pp_stage is not None:
            return {"pp_stage": self.pp_stage}
        if self.node is not None:
            return {"node": self.node}
        return {"slowest_rank": True}


@dataclass(frozen=True)
class CaptureAction:
    tool: Tool = "auto"
    targets: CaptureTargets = field(default_factory=lambda: CaptureTargets(slowest_rank=True))
    steps: int = DEFAULT_STEPS
    cooldown_s: float = DEFAULT_COOLDOWN_S
    max_per_hour: int = DEFAULT_MAX_PER_HOUR
    disk_quota_bytes: int | None = DEFAULT_DISK_QUOTA_BYTES
    stack: bool = False  # Kineto: record Python stacks too (module names for the step budget; slower)
    type: Literal["capture"] = "capture"

    def as_dict(self) -> dict[str, object]:
        return {"type": self.type, "tool": self.tool, "targets": self.targets.as_dict(), "steps": self.steps,
                "cooldown_s": self.cooldown_s, "max_per_hour": self.max_per_hour,
                "disk_quota_bytes": self.disk_quota_bytes, "stack": self.stack}


Action = AlertAction | CaptureAction


@dataclass(frozen=True)
class Rule:
    name: str
    expr: Expr
    for_s: float = 0.0  # YAML key "for"
    severity: Severity = "warning"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Annotations = field(default_factory=Annotations)
    scope: Scope = "job"
    action: Action = field(default_factory=AlertAction)
    origin: str = ""  # "FILE:LINE" of the rule, for messages
    # YAML "override: true": replaces the rule of the same name in an earlier pack of the set
    # (perfd.rules.ruleset); without it two packs naming one rule are an error.
    override: bool = False

    @property
    def is_capture(self) -> bool:
        return isinstance(self.action, CaptureAction)


@dataclass(frozen=True)
class RulePack:
    name: str
    path: str
    rules: tuple[Rule, ...]

    def get(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)


@dataclass(frozen=True)
class RuleError:
    """One problem in a pack, printed ``FILE:LINE: rule NAME: reason``."""

    path: str
    line: int | None  # 1-based; None when the file could not be read at all
    rule: str | None  # rule name (or "#N" for a rule without a usable name); None outside rules
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        who = f" rule {self.rule}:" if self.rule is not None else ""
        return f"{where}:{who} {self.message}"


class RulePackError(ValueError):
    """Raised by ``load_pack`` when a pack has errors; carries all of them."""

    def __init__(self, errors: list[RuleError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors

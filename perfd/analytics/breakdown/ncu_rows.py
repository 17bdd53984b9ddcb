"""Nsight Compute rows as they travel: each profiled kernel joined to a timeline (:class:`JoinedKernel`),
the summaries per category (:class:`CategorySummary`), what a range profiled (:class:`Coverage`) and
how its kernels were chosen (:class:`KernelChoiceNote`), and a summary as a budget part carries it
(:class:`NcuCategory`).

Typed values, read once from the JSON an agent's capture event carries (``from_json``) and written
back the same (``to_json``: the keys in the order the agent wrote them, each number as it came, so
that the aggregator's answers read as before). Here, below the step budget, because a budget part
holds them; the join that makes them is perfd.analytics.ncu (join, launches). Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind, NcuKernel
from perfd.analytics.common import TextEnum
from perfd.core.record_json import JsonRecord, JsonWritten, flat, key
from perfd.core.typed import obj, objs


def _num(v: object) -> float | None:
    """A JSON number as it came (an int stays an int: written back, it reads the same), None else."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


class Phase(TextEnum):
    """The pass a profiled launch ran in (perfd.analytics.ncu.launches)."""

    FORWARD = "forward"
    BACKWARD = "backward"  # launched by the autograd engine running a backward node
    OTHER = "other"  # the optimizer, zeroing, between steps: no forward or backward op


class MatchHow(TextEnum):
    EXACT = "exact"  # every launch of the window agrees at one offset (or at offsets that agree)
    PARTIAL = "partial"  # at least MIN_AGREEMENT of them agree at the best offset
    NONE = "none"  # no offset agrees: the timeline is not of this job's shapes, or the filter differs


@dataclass(frozen=True)
class Coverage(JsonRecord):
    """What a range's profiled launches were: by phase, layer and part (the report says it with the
    rows, perfd.report.ncu_text.coverage_text)."""

    launches: int
    matched: int  # launches whose part the timeline decided
    how: MatchHow
    phases: Mapping[str, int] = field(default_factory=dict)  # Phase value -> launches
    layers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # Phase value -> layers profiled
    layers_total: int | None = None
    parts: Mapping[str, int] = field(default_factory=dict)  # part -> launches
    microbatches: tuple[int, ...] = ()
    filtered_per_step: float | None = None  # launches a step passing the filter: what a range may see

    @property
    def both_passes(self) -> bool:
        return bool(self.phases.get(Phase.FORWARD.value)) and bool(self.phases.get(Phase.BACKWARD.value))


@dataclass(frozen=True)
class KernelChoiceNote(JsonRecord):
    """How a range's kernels were chosen (perfd.capture.ncu_exec.NcuOptions.choice_json), for the
    report: ``text`` says it."""

    how: str  # perfd.capture.ncu_exec.KernelChoice value
    source: str | None = field(metadata=key("from"))  # the capture whose timeline named them
    text: str
    launch_skip: int = 0
    window_layer: int | None = None
    window_layers: int | None = None


@dataclass(frozen=True)
class JoinedKernel(JsonWritten):
    kernel: NcuKernel = field(metadata=flat())  # its keys first in the row's JSON
    category: str  # perfd.analytics.breakdown.kernels category (of the timeline name when matched)
    match: MatchKind
    timeline_name: str | None = None
    captured_ms: float | None = None  # the timeline kernel's total over the capture
    captured_share: float | None = None  # its share of the captured kernel time
    candidates: int = 0  # timeline kernels with the same function
    # The steps the joined timeline holds (marked in its trace, else as its capture asked): its
    # captured_ms over them is the kernel's time per step. None: not known (older records).
    timeline_steps: float | None = None
    # LAUNCH: the budget part, phase (forward/backward) and layers of the op that launched these
    # launches, and the op ("aten::bmm"); captured_ms is then that op's launches of the kernel only
    part: str | None = None
    phase: str | None = None
    layers: tuple[int, ...] = ()
    op: str = ""

    @property
    def step_ms(self) -> float | None:
        """The timeline kernel's ms per step (None: no match, or the timeline's steps unknown)."""
        if self.captured_ms is None or not self.timeline_steps or self.timeline_steps <= 0:
            return None
        return self.captured_ms / self.timeline_steps

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> JoinedKernel | None:
        """A row as a capture's event carries it; None when it is not one (no name)."""
        k = NcuKernel.from_json(d)
        if k is None:
            return None
        try:
            match = MatchKind(d.get("match"))
        except ValueError:
            match = MatchKind.NONE
        layers = d.get("layers")
        cands = d.get("candidates")
        return cls(k, str(d.get("category") or ""), match, _str(d.get("timeline_name")),
                   _num(d.get("captured_ms")), _num(d.get("captured_share")),
                   cands if isinstance(cands, int) and not isinstance(cands, bool) else 0,
                   _num(d.get("timeline_steps")), _str(d.get("part")) or None, _str(d.get("phase")) or None,
                   tuple(x for x in layers if isinstance(x, int)) if isinstance(layers, list) else (),
                   str(d.get("op") or ""))


@dataclass(frozen=True)
class CategorySummary(JsonWritten):
    """The profiled kernels of one category: means weighted by profiled time (ratios in [0, 1])."""

    category: str
    kernels: int  # ncu rows (name, grid, block[, op]) in the category
    profiled_ms: float  # their profiled time (duration × invocations, under ncu's clocks)
    captured_share: float | None  # the category's share of the captured kernel time
    covered_share: float | None  # share of the captured kernel time of the matched timeline kernels
    compute_throughput: float | None
    memory_throughput: float | None
    dram_throughput: float | None
    tensor_pipe: float | None
    achieved_occupancy: float | None
    bound: KernelBound | None  # the class holding most of the category's profiled time
    bound_ms: Mapping[str, float]  # class -> profiled ms
    top_stall: str | None  # the stall with the most weighted cycles
    part: str | None = None  # the budget part its launches' op is in (rows joined launch by launch)

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> CategorySummary | None:
        """A summary as a capture's event carries it; None when it is not one (no category)."""
        cat, kernels = d.get("category"), d.get("kernels")
        if not isinstance(cat, str):
            return None
        try:
            bound = KernelBound(d["bound"]) if d.get("bound") else None
        except ValueError:
            bound = None
        profiled = _num(d.get("profiled_ms"))
        return cls(cat, kernels if isinstance(kernels, int) and not isinstance(kernels, bool) else 0,
                   profiled if profiled is not None else 0.0, _num(d.get("captured_share")),
                   _num(d.get("covered_share")), _num(d.get("compute_throughput")),
                   _num(d.get("memory_throughput")), _num(d.get("dram_throughput")),
                   _num(d.get("tensor_pipe")), _num(d.get("achieved_occupancy")), bound,
                   {str(k): ms for k, v in obj(d.get("bound_ms")).items() if (ms := _num(v)) is not None},
                   _str(d.get("top_stall")), _str(d.get("part")) or None)


@dataclass(frozen=True)
class NcuCategory:
    """One category summary of an Nsight Compute capture on the budget part its kernels' time is in:
    with the capture, how its kernels were chosen and what its range profiled."""

    summary: CategorySummary
    capture: str = ""  # the ncu capture's id
    kernel_choice: KernelChoiceNote | None = None
    coverage: Coverage | None = None

    def to_json(self) -> dict[str, object]:
        out = self.summary.to_json()
        if self.kernel_choice is not None:
            out["kernel_choice"] = self.kernel_choice.to_json()
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_json()
        out["capture"] = self.capture
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> NcuCategory | None:
        s = CategorySummary.from_json(d)
        if s is None:
            return None
        cov = d.get("coverage")
        return cls(s, str(d.get("capture") or ""), KernelChoiceNote.from_json(d.get("kernel_choice")),
                   Coverage.from_json(cov) if isinstance(cov, Mapping) else None)


def categories_of(v: object) -> tuple[NcuCategory, ...]:
    """The readable category summaries of a JSON list (a budget part's ``ncu`` detail read back)."""
    return tuple(c for d in objs(v) if (c := NcuCategory.from_json(d)) is not None)

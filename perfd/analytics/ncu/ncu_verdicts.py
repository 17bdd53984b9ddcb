"""What an Nsight Compute capture's rows say to do, per budget part.

The step budget carries, on each part (BudgetPart.ncu), the per-category summaries of the job's latest
ncu capture (perfd.analytics.breakdown.ncu_rows.CategorySummary: compute and memory speed of light weighted
by each kernel's profiled time). Read against the ceilings, they decide what kind of remedy can help
that part's kernels — which is not always a faster kernel:

- GEMMs near the compute ceiling (compute SOL at NVIDIA's high bar): the kernel is as fast as the GPU
  goes; only fewer FLOPs help (less recomputation, a smaller model, a shorter sequence), never a kernel.
  Where the timeline measured the linear layers' FLOP rate against the matmul ceiling, that decides
  (once the budget's "98% of the ceiling" stood beside ncu's "far below" on the same GEMMs); attention's
  batched matmuls, the same kernels by name, are attention's (rows joined launch by launch) and get no
  GEMM verdict.
- GEMMs far below it (under NVIDIA's latency bar): the shape starves the GPU (tiles half-empty, a grid
  that fills few SMs): sizes that are multiples of the tile, a larger micro-batch.
- Pointwise or normalisation kernels at high DRAM throughput: near what such a kernel reaches; only
  moving fewer bytes (fusing them into their neighbours) helps.
- Pointwise kernels ncu's rule calls compute-bound while the tensor pipes idle (a ``masked_fill`` at
  SM 65%, memory 36% on the H100): their SM work is issue slots and integer index arithmetic, not
  math; the row says so, and fusion is still what helps.

Each verdict is typed (:class:`RowVerdict`); the findings carry it (:class:`NcuFinding`,
:class:`NcuRecommendation`) and their words are made where they are shown (perfd.report.ncu_text). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.advice_registry import ncu_classes
from perfd.analytics.breakdown.bottleneck import BottleneckClass, RowsWhy
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.kernel_rows import RowVerdict, figure, verdict_of
from perfd.analytics.breakdown.ncu_rows import CategorySummary, Coverage
from perfd.analytics.finding_types import Finding, Recommendation, Severity
from perfd.core.record_json import JsonWritten, unwritten

CLASS_COVERAGE = th.NCU_CLASS_COVERAGE.value
# NVIDIA's kernel bound -> the class ncu rows vote for (the registry's ClassEntry.ncu_bound)
NCU_CLASSES = ncu_classes()


@dataclass(frozen=True)
class PartVerdict(JsonWritten):
    """One category's verdict on one budget part, with the figures that decided it."""

    verdict: RowVerdict
    part: str  # perfd.analytics.breakdown.budget.Part value
    category: str
    kernels: int
    part_ms: float  # the part's ms per step in the budget
    compute: float | None
    memory: float | None
    dram: float | None
    tensor: float | None
    capture: str
    chosen: str = ""  # how the profiled kernels were chosen (perfd.capture.ncu_exec.KernelChoice text)
    covered: Coverage | None = None  # what the profiled launches were (worded: perfd.report.ncu_text)
    of: str | None = None  # the part of the op that launched the kernels, where the budget has no such part


@dataclass
class NcuFinding(Finding):
    """An Nsight Compute verdict's finding: its title, observation and evidence's coverage sentence are
    the report's (perfd.report.ncu_text), from ``facts``."""

    facts: PartVerdict | None = field(default=None, metadata=unwritten())


@dataclass
class NcuRecommendation(Recommendation):
    """What an Nsight Compute verdict calls for, its action and detail left to the report."""

    facts: PartVerdict | None = field(default=None, metadata=unwritten())


def _f(v: float | None) -> float | None:
    return float(v) if v is not None else None


def part_verdicts(b: StepBudget) -> list[PartVerdict]:
    """Every category summary on the budget's parts that calls for a verdict, costliest part first."""
    out = []
    for p in sorted(b.parts, key=lambda p: -p.ms):
        for row in p.ncu or ():
            c = row.summary
            # the part of the op that launched them where matched launch by launch (on a timers'
            # budget it sits on the undivided compute part, but attention's GEMMs stay attention's)
            compute, dram, tensor = _f(c.compute_throughput), _f(c.dram_throughput), _f(c.tensor_pipe)
            v = verdict_of(c.category, compute, dram, tensor, c.bound, c.part or p.part.value,
                           figure(p.detail, "of_ceiling"))
            if v is not None:
                out.append(PartVerdict(v, p.part.value, c.category, c.kernels, p.ms, compute,
                                       _f(c.memory_throughput), dram, tensor, row.capture,
                                       row.kernel_choice.text if row.kernel_choice is not None else "",
                                       row.coverage, c.part if c.part != p.part.value else None))
    return out


def ncu_rows(b: StepBudget, label: str) -> tuple[list[Finding], list[Recommendation]]:
    """A finding and a recommendation for each verdict the ncu rows on the budget's parts give; the
    recommendation's impact is left unstated (the rows say what kind of change helps, not how much)."""
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    for v in part_verdicts(b):
        fid = f"ncu-{v.part}-{v.of}-{v.category}" if v.of else f"ncu-{v.part}-{v.category}"
        fs.append(NcuFinding(fid, Severity.INFO, "", "", {"ncu_verdict": v.to_json()}, "", label or b.basis,
                             facts=v))
        rs.append(NcuRecommendation("", fid, 0, "", "", None, v.verdict.value, facts=v))
    return fs, rs


def rows_class(categories: Sequence[CategorySummary], compute_ms: float | None
               ) -> tuple[BottleneckClass, RowsWhy, float | None]:
    """(class, why, coverage) from an ncu capture's category summaries, for a job with no timeline: the
    rows' profiled time against the step's compute time (``compute_ms``, the budget's) is their
    coverage; at CLASS_COVERAGE or more, the class NVIDIA's rule gives most of their time (compute- or
    memory-bound; neither holding half of it: mixed); under it, unknown, and the reason says why."""
    profiled = sum(float(c.profiled_ms) for c in categories)
    if not compute_ms or compute_ms <= 0 or profiled <= 0:
        return BottleneckClass.UNKNOWN, RowsWhy(None), None
    coverage = profiled / compute_ms
    if coverage < CLASS_COVERAGE:  # too little to class the step
        return BottleneckClass.UNKNOWN, RowsWhy(coverage), coverage
    by: dict[str, float] = {}
    for c in categories:
        for bound, ms in c.bound_ms.items():
            by[bound] = by.get(bound, 0.0) + float(ms)
    total = sum(by.values())
    top = max(by, key=lambda k: by[k]) if by else None
    cls = NCU_CLASSES.get(top or "", BottleneckClass.MIXED)
    if top is None or by[top] < 0.5 * total:
        cls = BottleneckClass.MIXED
    share = by[top] / total if top is not None and total > 0 else 0.0
    return cls, RowsWhy(coverage, True, top, share), coverage

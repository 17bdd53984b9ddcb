"""The one advice registry: for every bottleneck class, every part of the step budget and every MFU
grade, one typed entry that says what applies to it — which parts a class is the time of, what a
part is called and what its finding opens with, which parts the run's timers speak for, a grade's
band, its severity and how it is explained (a grade's words are the report's:
perfd.report.grade_text). Every consumer derives from these tables: the budget's class
(perfd.analytics.breakdown.budget), the ncu rows' class (perfd.analytics.ncu.ncu_verdicts), the
budget's findings (perfd.analytics.advice.budget_findings), the run's grade and its findings
(perfd.analytics.run.run_grade, run_findings), the report and the generated docs (`perfd catalog --doc`).

It sits in ``breakdown`` because its keys are breakdown's types (the class, the part, the kernel
bound) and nothing above: the advice, the ncu verdicts and the run read it from above. Adding a class
is its enum member (perfd.analytics.breakdown.bottleneck), its :data:`CLASSES` entry here (and the
parts that are its time name it, in :data:`PARTS`), and a case in tests/analytics/test_advice_registry.py;
a member with no entry fails at import (:func:`_one_each`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.bottleneck import BottleneckClass
from perfd.analytics.breakdown.ncu_kernels import KernelBound
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import DataAction, DataLoading, Severity
from perfd.analytics.incidents.host_evidence import CpuRoom, CpuUse
from perfd.core.shared_thresholds import Threshold

B = BottleneckClass


# --- classes ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClassEntry:
    """A bottleneck class: its short name (a column heading's "bound by", a budget's shares), and the
    kernel bound of NVIDIA's rule that makes ncu rows vote for it. The parts that are its time are
    declared on the parts (:attr:`PartEntry.cls`): a part is one class's time or none's."""

    cls: BottleneckClass
    short: str
    ncu_bound: KernelBound | None = None


# In the order a budget's shares are listed and ranked (a tie goes to the one listed first).
CLASSES: tuple[ClassEntry, ...] = (
    ClassEntry(B.COMPUTE, "compute", KernelBound.COMPUTE),
    ClassEntry(B.MEMORY, "memory", KernelBound.MEMORY),
    ClassEntry(B.LAUNCH, "launch"),
    ClassEntry(B.SYNC, "sync"),
    ClassEntry(B.DATA, "data"),
    ClassEntry(B.COMMUNICATION, "communication"),
    ClassEntry(B.PIPELINE, "pipeline"),
    ClassEntry(B.MIXED, "mixed"),  # a budget with no class ahead by th.CLASS_MIXED_MARGIN
    ClassEntry(B.UNKNOWN, "unknown"),
)


# --- parts --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartEntry:
    """A part of the step budget. ``name``: what the report calls it; ``holds``: its finding's opening
    words (what it holds, said once); ``cls``: the class whose time it is (None: no class's, the
    timers' undivided compute); ``fused_cls``: the class it counts for when one fused kernel runs it;
    ``math``: it runs the model's GEMMs (its efficiency is the GEMM finding's, never a warning of its
    own); ``finding``: the budget names it in a finding of its own; ``timers_key``: the run's steady
    median whose presence means the run's timer analyzers speak for it (``stages``: only with
    pipeline stages)."""

    part: Part
    name: str
    holds: str = ""
    cls: BottleneckClass | None = None
    fused_cls: BottleneckClass | None = None
    math: bool = False
    finding: bool = True
    timers_key: str | None = None
    stages: bool = False


_GAP_MS = f"{th.SHORT_GAP_S.value * 1e3:g}"

PARTS: tuple[PartEntry, ...] = (
    PartEntry(Part.ATTENTION, "attention",
              "Core attention (QKᵀ, the mask, softmax, dropout and ·V, their backward and the copies "
              "autograd makes of the scores) takes", B.MEMORY, fused_cls=B.COMPUTE),
    PartEntry(Part.LINEAR, "linear layers", "The linear layers' GEMMs take", B.COMPUTE, math=True),
    PartEntry(Part.GEMM, "GEMMs (op unknown)", "Matmul kernels (their ops unknown) take", B.COMPUTE,
              math=True),
    PartEntry(Part.ACTIVATION, "MLP activation", "The MLP activation takes", B.MEMORY),
    PartEntry(Part.NORM, "normalisation", "Normalisation takes", B.MEMORY),
    PartEntry(Part.LOSS, "loss (cross-entropy)", "The cross-entropy over the logits takes", B.MEMORY),
    PartEntry(Part.EMBEDDING, "embedding", "The embedding takes", B.MEMORY),
    PartEntry(Part.OPTIMIZER, "optimizer", "The optimizer (step, gradient norm, zeroing) takes", B.MEMORY),
    PartEntry(Part.GRAD_REDUCE, "gradient reduction",
              "Gradient accumulation (autograd's main_grad +=) and the data-parallel machinery's kernels "
              "take", B.MEMORY),
    PartEntry(Part.POINTWISE, "other pointwise",
              "Other pointwise work (residual adds, hidden dropout, casts, reshapes) takes", B.MEMORY),
    PartEntry(Part.MEMCPY, "copies and memsets", "Copies and memsets no op above claims take", B.MEMORY),
    PartEntry(Part.COMM_EXPOSED, "exposed communication", "Collectives run with no compute beside them for",
              B.COMMUNICATION, timers_key="comm_exposed_share"),
    PartEntry(Part.PIPELINE, "pipeline wait", "Pipeline p2p waits (the bubble, not link bandwidth) take",
              B.PIPELINE, timers_key="pp_idle_max", stages=True),
    PartEntry(Part.DATA, "data wait", "The step waits for its batch for", B.DATA, timers_key="data_share"),
    PartEntry(Part.IDLE_SYNC, "idle after synchronisations",
              "The GPU waits after host synchronisations (the host stood until the device drained, then "
              "refilled the queue: the short gaps while it was still behind are the sync's too) for", B.SYNC),
    PartEntry(Part.IDLE_SHORT, "idle, launch gaps",
              f"The GPU waits in gaps under {_GAP_MS} ms with no synchronisation before them (the host "
              "issuing work slower than the GPU runs it) for", B.LAUNCH),
    PartEntry(Part.IDLE_SWITCH, "idle, kernel switches",
              f"The GPU waits in gaps under {_GAP_MS} ms before kernels the host had launched before the "
              "gap began (the GPU's own switch from one kernel to the next: the host was ahead) for",
              B.LAUNCH),
    PartEntry(Part.IDLE_LONG, "idle, host elsewhere",
              f"The GPU waits in gaps of {_GAP_MS} ms or more with no synchronisation or data wait before "
              "them (the host elsewhere: Python between steps, garbage collection) for", B.SYNC),
    PartEntry(Part.COMPUTE, "compute (not divided)", finding=False),
)


# --- MFU grades ---------------------------------------------------------------------------------------
class Grade(TextEnum):
    """An MFU band (docs/design.md §2 "MFU"), or why there is none."""

    SEVERE = "severe"
    COMMUNICATION_OVERHEAD = "communication-overhead"
    GOOD = "good"
    EXCELLENT = "excellent"
    IMPOSSIBLE = "impossible"  # above th.MFU_POSSIBLE: the peak it was divided by is wrong
    UNGRADED = "ungraded"  # an MFU from fewer steady steps than th.MIN_GRADE_STEPS: no band
    UNKNOWN = "unknown"  # no MFU


class GradeBasis(TextEnum):
    """What explains a grade: its band's usual causes, a capture's step budget, or the band's usual
    causes ruled out by the job's own measurements."""

    BAND = "band"
    BUDGET = "budget"
    NOT_COMMUNICATION = "not-communication"  # 30–40%: exposed communication measured small
    RULED_OUT = "ruled-out"  # severe: data loading and/or exposed communication measured small


@dataclass(frozen=True, slots=True)
class GradeEntry:
    """A grade: ``band``: it is a band of MFU (the others say there is none); ``severity``: the MFU
    finding's; ``below``: the band's upper bound (``inclusive``: the bound itself is in the band; None:
    no bound, the last band); ``explained_by``: which of the job's own measurements may explain the band
    instead of its usual causes (None: the band's sentence alone). Its words — the band's range, its
    sentence, how a headline shows it — are the report's (perfd.report.grade_text)."""

    grade: Grade
    band: bool = False
    severity: Severity = Severity.INFO
    below: Threshold | None = None
    inclusive: bool = False
    explained_by: GradeBasis | None = None


# The bands in MFU order, then the grades that are no band.
GRADES: tuple[GradeEntry, ...] = (
    GradeEntry(Grade.SEVERE, True, Severity.CRITICAL, th.MFU_SEVERE, explained_by=GradeBasis.RULED_OUT),
    GradeEntry(Grade.COMMUNICATION_OVERHEAD, True, Severity.WARNING, th.MFU_GOOD,
               explained_by=GradeBasis.NOT_COMMUNICATION),
    GradeEntry(Grade.GOOD, True, below=th.MFU_EXCELLENT, inclusive=True),
    GradeEntry(Grade.EXCELLENT, True),
    GradeEntry(Grade.IMPOSSIBLE, severity=Severity.WARNING),  # above th.MFU_POSSIBLE: the peak is wrong
    GradeEntry(Grade.UNGRADED),  # fewer steady steps than th.MIN_GRADE_STEPS
    GradeEntry(Grade.UNKNOWN),
)


# --- the tables by key, and what derives from them -----------------------------------------------------
def _one_each(keys: list[object], members: list[object]) -> None:
    """Every member of a closed set has exactly one entry: a member added without one fails at import."""
    missing = [str(m) for m in members if m not in keys]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if missing or twice:
        raise ValueError(f"advice registry: no entry for {missing}, more than one for {twice}")


_one_each([c.cls for c in CLASSES], list(BottleneckClass))
_one_each([p.part for p in PARTS], list(Part))
_one_each([g.grade for g in GRADES], list(Grade))

CLASS: Mapping[BottleneckClass, ClassEntry] = {c.cls: c for c in CLASSES}
PART: Mapping[Part, PartEntry] = {p.part: p for p in PARTS}
GRADE: Mapping[Grade, GradeEntry] = {g.grade: g for g in GRADES}


def class_parts(classes: tuple[ClassEntry, ...] = CLASSES, parts: tuple[PartEntry, ...] = PARTS
                ) -> dict[BottleneckClass, tuple[Part, ...]]:
    """Each class and the parts whose time it is, in the classes' order; a class no part is the time of
    (mixed, unknown) is left out: no budget holds it."""
    out = {c.cls: tuple(p.part for p in parts if p.cls is c.cls) for c in classes}
    return {c: ps for c, ps in out.items() if ps}


def ncu_classes(classes: tuple[ClassEntry, ...] = CLASSES) -> dict[str, BottleneckClass]:
    """NVIDIA's kernel bound (its value, as the ncu rows carry it) -> the class it votes for."""
    return {c.ncu_bound.value: c.cls for c in classes if c.ncu_bound is not None}


def short_name(text: str) -> str:
    """A class's short name from its text (a summary's JSON); any other text as it is."""
    try:
        return CLASS[BottleneckClass(text)].short
    except ValueError:
        return text


MATH_PARTS: tuple[Part, ...] = tuple(p.part for p in PARTS if p.math)
BANDS: tuple[GradeEntry, ...] = tuple(g for g in GRADES if g.band)


# --- data loading -------------------------------------------------------------------------------------
# One action for slow data, whether an incident's verdict, the run's data share or the data-loader
# remedy asks for it: the report merges recommendations with the same typed action
# (perfd.analytics.finding_types.order_findings, on DataLoading). Which one depends on the rank's CPUs
# (collectors/ranks, perfd.analytics.incidents.host_evidence.cpu_use): with room, more workers load
# more batches at once; full, another worker only shares the same CPUs. Its words are the report's
# (perfd.report.data_text.DATA_ACTIONS).
def data_loading(use: CpuUse | None, cpu_only: bool = False) -> DataLoading:
    """The data-loading action that fits the rank's CPUs (unknown: the general one); ``cpu_only``: a
    job that computes on its CPUs (no GPU advice)."""
    if use is None:
        return DataLoading(DataAction.LOAD_FASTER, cpu_only)
    if use.room is CpuRoom.FULL:
        return DataLoading(DataAction.CHEAPER_BATCHES, cpu_only)
    return DataLoading(DataAction.MORE_WORKERS, cpu_only)

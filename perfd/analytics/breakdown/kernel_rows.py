"""The top Nsight Compute kernels of each step-budget part ("the report and HTML show the
top rows beside the budget part they explain").

An ncu capture's joined rows (perfd.analytics.breakdown.ncu_rows.JoinedKernel, read from the capture's
event: ``ncu_kernels``) go to the part their category's time is in
(perfd.analytics.breakdown.job_budget.with_ncu), and there become :class:`KernelRow`: one per timeline
kernel (the ncu rows that joined the same timeline kernel, several grids of one GEMM, are one row: the
timeline counts their time once), one per ncu row that joined none. Each row holds:

- its time per step: the joined timeline kernel's time over the steps that timeline holds
  (:attr:`TimeBasis.TIMELINE`), and its share of the part; with no match, the time ncu measured of
  its profiled launches in the replay (:attr:`TimeBasis.REPLAY`: under ncu's clock control and
  cache flushes, and only the launches the kernel budget let it profile), and no share;
- its figures, means weighted by profiled time where rows merged: compute and memory speed of light,
  DRAM, tensor pipe, achieved occupancy (absent where ncu has none);
- what bounds it: ncu's class (NVIDIA's SOLBottleneck rule) and perfd's reading of the figures
  behind it (:class:`Reading`), e.g. a pointwise kernel "compute-bound" with its tensor pipes idle
  is issue slots and integer index arithmetic;
- the verdict it leads to (perfd.analytics.breakdown.kernel_rows.RowVerdict, the same rule as the category
  summaries'), or none.

Typed values only: the report layer (perfd.report.ncu_view) writes the English. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind, NcuKernel, occupancy_capped
from perfd.analytics.breakdown.ncu_rows import JoinedKernel
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum
from perfd.core.record_json import JsonWritten

NCU_KERNEL_ROWS = 3  # the top profiled kernels each budget part carries (and the report shows)
_POINTWISE = (kc.ELEMENTWISE, kc.NORMALIZATION, kc.REDUCTION, kc.OTHER)
_MATCHED = (MatchKind.LAUNCH, MatchKind.EXACT, MatchKind.FUNCTION, MatchKind.TEMPLATE)


class RowVerdict(TextEnum):
    FEWER_FLOPS = "fewer_flops"  # GEMMs at the compute ceiling
    SHAPE = "shape"  # GEMMs far below it
    FUSION_ONLY = "fusion_only"  # pointwise at high DRAM throughput
    ISSUE_BOUND = "issue_bound"  # pointwise "compute-bound" with idle tensor pipes


# The parts whose GEMMs a GEMM verdict speaks of: attention's batched matmuls (Q·Kᵀ, ·V) run the same
# kernels as the linear layers but are attention's part, whose remedy is fusing it (the budget's)
_GEMM_PARTS = (Part.LINEAR.value, Part.GEMM.value, Part.COMPUTE.value)


def verdict_of(category: str, compute: float | None, dram: float | None, tensor: float | None,
               bound: KernelBound | None, part: str | None = None,
               of_ceiling: float | None = None) -> RowVerdict | None:
    """The verdict of one category summary or kernel row by its figures (None: they call for none of
    the four). ``part``: the budget part its kernels are in, where known; ``of_ceiling``: that part's
    FLOP rate against the measured matmul ceiling as the timeline measured it (the budget's linear
    layers), which a GEMM verdict never contradicts: ncu replays each kernel alone, cache flushed, and
    its SM figures are the kernel's, not the step's."""
    if category == kc.GEMM:
        if part is not None and part not in _GEMM_PARTS:
            return None
        if of_ceiling is not None:  # the trace measured these GEMMs' rate: it decides
            if of_ceiling >= th.GEMM_EFFICIENT.value:
                return RowVerdict.FEWER_FLOPS
            return RowVerdict.SHAPE if compute is None or compute < th.SOL_HIGH.value else None
        if compute is None:
            return None
        if compute >= th.SOL_HIGH.value:
            return RowVerdict.FEWER_FLOPS
        if compute < th.SOL_LATENCY.value:
            return RowVerdict.SHAPE
        return None
    if category in _POINTWISE:
        if dram is not None and dram >= th.NCU_FUSION_DRAM.value:
            return RowVerdict.FUSION_ONLY
        if bound is KernelBound.COMPUTE and tensor is not None and tensor < th.NCU_TENSOR_IDLE.value:
            return RowVerdict.ISSUE_BOUND
    return None


class TimeBasis(TextEnum):
    TIMELINE = "timeline"  # the joined timeline kernel's time over the steps that timeline holds
    TIMELINE_TOTAL = "timeline_total"  # joined, but the timeline's steps unknown: its share only
    REPLAY = "replay"  # no timeline match: ncu's own duration of its profiled launches (replayed)


class Reading(TextEnum):
    """perfd's reading of what bounds a kernel, beside ncu's class."""

    ISSUE_SLOTS = "issue_slots"  # pointwise, "compute-bound", tensor pipes idle: issue slots, integer work
    TENSOR_MATH = "tensor_math"  # compute-bound or balanced with the tensor pipes busy: matrix math
    DRAM_BANDWIDTH = "dram_bandwidth"  # memory-bound, DRAM near what such a kernel reaches
    CACHE_TRAFFIC = "cache_traffic"  # memory-bound, DRAM well under the memory SOL: L1/L2 traffic
    STALLS = "stalls"  # latency-bound: neither unit busy, its warps wait (the top stall says on what)
    # latency-bound whatever ncu's rule reads of its SM: no matrix math, and its own registers or shared
    # memory cap its occupancy (perfd.analytics.breakdown.ncu_kernels.occupancy_capped): too few warps
    OCCUPANCY = "occupancy"


@dataclass(frozen=True)
class KernelRow(JsonWritten):
    """One kernel (or the ncu rows of one timeline kernel) on one budget part. Ratios in [0, 1];
    None: the input has no such figure."""

    name: str  # ncu's name (demangled as ncu prints it; the capture's event keeps 200 characters)
    category: str  # perfd.analytics.breakdown.kernels category
    match: MatchKind
    time_basis: TimeBasis
    rows: int  # ncu rows (name, grid, block) merged into this one
    invocations: int  # launches ncu profiled
    profiled_ms: float | None  # their time in ncu's replay (duration × launches)
    step_ms: float | None  # TIMELINE: the timeline kernel's ms per step
    part_share: float | None  # step_ms of the part's ms per step
    captured_share: float | None  # the timeline kernel's share of the captured kernel time
    compute: float | None
    memory: float | None
    dram: float | None
    tensor: float | None
    occupancy: float | None
    bound: KernelBound | None  # ncu's class (the one holding most of the merged rows' profiled time)
    reading: Reading | None
    top_stall: str | None  # ncu's name of the stall with the most cycles per issued instruction
    top_stall_share: float | None  # of the cycles between two issued instructions
    verdict: RowVerdict | None
    candidates: int = 0  # timeline kernels with the same function (an ambiguous match's)
    timeline: str | None = None  # the capture the rows were joined to
    capture: str = ""  # the ncu capture
    # TIMELINE: the kernel's time by name is more than the part holds by op (its launches serve other
    # parts too: the dropout kernel of attention and of the residual path, seen on the H100): no share.
    spans_parts: bool = False
    # LAUNCH: the pass and layers its profiled launches ran in, and the op that launched them
    phase: str | None = None
    layers: tuple[int, ...] = ()
    op: str = ""
    theoretical_occupancy: float | None = None
    occupancy_limiter: str | None = None  # registers, shared_mem, barriers: what caps its occupancy

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KernelRow | None:
        """A row read back (the report's budget JSON); None when it is not one."""
        try:
            return cls(
                name=str(d["name"]), category=str(d.get("category") or ""), match=MatchKind(d["match"]),
                time_basis=TimeBasis(d["time_basis"]), rows=int(d.get("rows") or 1),
                invocations=int(d.get("invocations") or 0), profiled_ms=figure(d, "profiled_ms"),
                step_ms=figure(d, "step_ms"), part_share=figure(d, "part_share"),
                captured_share=figure(d, "captured_share"), compute=figure(d, "compute"),
                memory=figure(d, "memory"),
                dram=figure(d, "dram"), tensor=figure(d, "tensor"), occupancy=figure(d, "occupancy"),
                bound=KernelBound(d["bound"]) if d.get("bound") else None,
                reading=Reading(d["reading"]) if d.get("reading") else None,
                top_stall=str(d["top_stall"]) if d.get("top_stall") else None,
                top_stall_share=figure(d, "top_stall_share"),
                verdict=RowVerdict(d["verdict"]) if d.get("verdict") else None,
                candidates=int(d.get("candidates") or 0),
                timeline=str(d["timeline"]) if d.get("timeline") else None,
                capture=str(d.get("capture") or ""), spans_parts=bool(d.get("spans_parts")),
                phase=str(d["phase"]) if d.get("phase") else None,
                layers=tuple(int(x) for x in d.get("layers") or ()), op=str(d.get("op") or ""),
                theoretical_occupancy=figure(d, "theoretical_occupancy"),
                occupancy_limiter=str(d["occupancy_limiter"]) if d.get("occupancy_limiter") else None)
        except (KeyError, ValueError, TypeError):
            return None


def figure(d: Mapping[str, object], key: str) -> float | None:
    """A numeric figure of an ncu row or category summary (JSON), None where absent or not a number."""
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def reading(category: str, bound: KernelBound | None, compute: float | None, memory: float | None,
            dram: float | None, tensor: float | None, capped: bool = False) -> Reading | None:
    """What the figures behind ncu's class say bounds the kernel (None: they say no more than it).
    ``capped``: its own resources cap its occupancy
    (perfd.analytics.breakdown.ncu_kernels.occupancy_capped)."""
    if bound is KernelBound.LATENCY:
        return Reading.STALLS
    if capped and bound in (KernelBound.COMPUTE, KernelBound.BALANCED):
        return Reading.OCCUPANCY
    if bound is KernelBound.COMPUTE and category in _POINTWISE and tensor is not None \
            and tensor < th.NCU_TENSOR_IDLE.value:
        return Reading.ISSUE_SLOTS
    # the tensor pipes at least at the latency bar: the SM work is matrix math
    if bound in (KernelBound.COMPUTE, KernelBound.BALANCED) and tensor is not None \
            and tensor >= th.SOL_LATENCY.value:
        return Reading.TENSOR_MATH
    if bound is KernelBound.MEMORY and dram is not None:
        if dram >= th.NCU_FUSION_DRAM.value:
            return Reading.DRAM_BANDWIDTH
        # memory SOL is the busiest of DRAM, L1 and L2: well above DRAM, a cache is what is busy
        if memory is not None and memory - dram >= th.SOL_BALANCED_MARGIN.value:
            return Reading.CACHE_TRAFFIC
    return None


def _measured(r: JoinedKernel, key: str) -> float | None:
    v = getattr(r.kernel, key)
    return float(v) if v is not None else None


def _weighted(rows: Sequence[JoinedKernel], key: str) -> float | None:
    """The mean of the kernels' ``key`` over ``rows`` weighted by profiled time; with no weights, the
    plain mean of the rows that have it; None where no row has it."""
    got = [(v, _profiled(r)) for r in rows if (v := _measured(r, key)) is not None]
    if not got:
        return None
    if len(got) == 1:  # one row: ncu's own figure, as it is
        return got[0][0]
    den = sum(w or 0.0 for _, w in got)
    if den > 0:
        return sum(v * (w or 0.0) for v, w in got) / den
    return sum(v for v, _ in got) / len(got)


def _profiled(r: JoinedKernel) -> float | None:
    d = r.kernel.duration_ms
    return float(d) * r.kernel.invocations if d is not None else None


def _stall(rows: Sequence[JoinedKernel]) -> tuple[str | None, float | None]:
    """The stall with the most cycles weighted by profiled time, and its share (of the row that has
    the most of it: shares of different kernels do not add)."""
    cycles: dict[str, float] = {}
    share: dict[str, float] = {}
    for r in rows:
        w = _profiled(r) or 1.0
        for s in r.kernel.stalls:
            cycles[s.reason] = cycles.get(s.reason, 0.0) + float(s.cycles) * w
            if s.share is not None:
                share[s.reason] = max(share.get(s.reason, 0.0), float(s.share))
    if not cycles:
        return None, None
    top = max(cycles, key=lambda k: cycles[k])
    return top, share.get(top)


def _bound(rows: Sequence[JoinedKernel]) -> KernelBound | None:
    by: dict[KernelBound, float] = {}
    for r in rows:
        if r.kernel.bound is not None:
            by[r.kernel.bound] = by.get(r.kernel.bound, 0.0) + (_profiled(r) or 0.0)
    return max(by, key=lambda b: by[b]) if by else None


def _row(rows: Sequence[JoinedKernel], part_ms: float | None, capture: str, of_ceiling: float | None = None,
         joined_to: str | None = None) -> KernelRow:
    first = rows[0]
    match = first.match
    captured = float(first.captured_ms) if first.captured_ms is not None else None
    matched = match in _MATCHED and captured is not None
    steps = first.timeline_steps
    step_ms = (captured or 0.0) / steps if matched and steps and steps > 0 else None
    basis = TimeBasis.REPLAY if not matched else TimeBasis.TIMELINE if step_ms is not None \
        else TimeBasis.TIMELINE_TOTAL
    category = first.category or kc.category(first.kernel.name)
    compute, memory = _weighted(rows, "compute_throughput"), _weighted(rows, "memory_throughput")
    dram, tensor = _weighted(rows, "dram_throughput"), _weighted(rows, "tensor_pipe")
    bound = _bound(rows)
    stall, stall_share = _stall(rows)
    profiled = [p for r in rows if (p := _profiled(r)) is not None]
    theo = _weighted(rows, "theoretical_occupancy")
    limiter = next((r.kernel.occupancy_limiter for r in rows if r.kernel.occupancy_limiter), None)
    capped = occupancy_capped(NcuKernel(first.kernel.name, None, None, 1, (), tensor_pipe=tensor,
                                        theoretical_occupancy=theo, occupancy_limiter=limiter), category)
    effective = KernelBound.LATENCY if capped and bound in (KernelBound.COMPUTE, KernelBound.BALANCED) \
        else bound
    share = step_ms / part_ms if step_ms is not None and part_ms and part_ms > 0 else None
    return KernelRow(
        name=first.kernel.name, category=category, match=match, time_basis=basis, rows=len(rows),
        invocations=sum(r.kernel.invocations for r in rows),
        profiled_ms=sum(profiled) if profiled else None, step_ms=step_ms,
        part_share=share if share is not None and share <= 1.0 else None,
        captured_share=float(first.captured_share) if matched and first.captured_share is not None else None,
        compute=compute, memory=memory, dram=dram, tensor=tensor,
        occupancy=_weighted(rows, "achieved_occupancy"), bound=bound,
        reading=reading(category, bound, compute, memory, dram, tensor, capped), top_stall=stall,
        top_stall_share=stall_share,
        verdict=verdict_of(category, compute, dram, tensor, effective, first.part, of_ceiling),
        candidates=first.candidates, timeline=joined_to or None, capture=capture,
        spans_parts=share is not None and share > 1.0, phase=first.phase,
        layers=tuple(sorted({x for r in rows for x in r.layers})), op=first.op, theoretical_occupancy=theo,
        occupancy_limiter=limiter)


def _order(r: KernelRow) -> tuple[int, float]:
    """Rows with a time per step first, by it; then joined rows by their share of the captured time;
    then the rows with only ncu's replayed time, by it (not per step: after the others)."""
    if r.step_ms is not None:
        return 0, -r.step_ms
    if r.captured_share is not None:
        return 1, -r.captured_share
    return 2, -(r.profiled_ms or 0.0)


def kernel_rows(kernels: Sequence[JoinedKernel], part_ms: float | None, capture: str = "",
                n: int = NCU_KERNEL_ROWS, of_ceiling: float | None = None,
                joined_to: str | None = None) -> list[KernelRow]:
    """The top ``n`` rows of one part's ncu kernels, the ncu rows of one timeline kernel (of one op and
    pass, where joined launch by launch) merged. ``of_ceiling``: the part's measured FLOP rate against
    the matmul ceiling (a GEMM verdict never contradicts it); ``joined_to``: the timeline's capture id,
    where there was one."""
    groups: dict[tuple[object, ...], list[JoinedKernel]] = {}
    for k in kernels:
        tl, ms = k.timeline_name, k.captured_ms
        joined = tl and ms is not None and k.match in _MATCHED
        key = ("timeline", tl, ms, k.part, k.phase) if joined \
            else ("ncu", k.kernel.name, k.kernel.grid, k.kernel.block, k.part, k.phase)
        groups.setdefault(key, []).append(k)
    rows = [_row(g, part_ms, capture, of_ceiling, joined_to) for g in groups.values()]
    return sorted(rows, key=_order)[:n]

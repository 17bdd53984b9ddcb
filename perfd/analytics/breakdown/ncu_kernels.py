"""Nsight Compute (ncu) kernels as perfd reads them (the kernel deep dive): the
typed per-kernel row and its class. Pure data and one rule.

The rows come from ncu's CSV export, parsed by :mod:`perfd.capture.ncu_report` beside the other
tool-output parsers; the join with a timeline capture, the kernel rows and their verdicts read them
here. A field whose inputs are missing is absent (None), never 0. The class of a kernel
(:func:`classify`) follows NVIDIA's own SOLBottleneck rule (sections/SpeedOfLight.py) with its
thresholds declared in :mod:`perfd.analytics.thresholds`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.core.record_json import JsonWritten

# A measured field of a kernel (one of the parser's FIELDS): written in to_json in declaration order.
_MEASURED = {"measured": True}


class KernelBound(str, enum.Enum):
    """What limits a kernel, from its speed-of-light percentages (NVIDIA's SOLBottleneck rule)."""

    COMPUTE = "compute-bound"  # the SM pipelines are the most used unit, at least the latency bar
    MEMORY = "memory-bound"  # the memory system is the most used unit, at least the latency bar
    BALANCED = "balanced"  # both above the latency bar and within a few points of each other
    LATENCY = "latency-bound"  # neither reaches the latency bar: stalls, small grids, occupancy


@dataclass(frozen=True)
class StallReason:
    reason: str  # ncu's name: long_scoreboard, barrier, math_pipe_throttle, ...
    cycles: float  # warp cycles spent in this state per issued instruction
    share: float | None  # of all cycles between two issued instructions


@dataclass(frozen=True)
class NcuKernel(JsonWritten):
    """One kernel of a report: the launches with the same name, grid and block (as ncu's per-kernel
    summary groups them). Ratios in [0, 1]; None: the report does not hold that value."""

    name: str  # as ncu names it (demangled; the details page prints templates' own names: T1, T2)
    grid: str | None
    block: str | None
    invocations: int
    ids: tuple[int, ...]  # ncu's launch IDs
    duration_ms: float | None = field(default=None, metadata=_MEASURED)  # mean per launch
    # the SM clock while profiled: says whether ncu locked it
    sm_clock_hz: float | None = field(default=None, metadata=_MEASURED)
    dram_clock_hz: float | None = field(default=None, metadata=_MEASURED)
    compute_throughput: float | None = field(default=None, metadata=_MEASURED)  # SM speed of light
    # memory speed of light (max of DRAM, L1, L2)
    memory_throughput: float | None = field(default=None, metadata=_MEASURED)
    dram_throughput: float | None = field(default=None, metadata=_MEASURED)
    achieved_occupancy: float | None = field(default=None, metadata=_MEASURED)
    theoretical_occupancy: float | None = field(default=None, metadata=_MEASURED)
    registers_per_thread: float | None = field(default=None, metadata=_MEASURED)
    threads_per_block: float | None = field(default=None, metadata=_MEASURED)
    grid_blocks: float | None = field(default=None, metadata=_MEASURED)
    warp_cycles_per_issue: float | None = field(default=None, metadata=_MEASURED)
    tensor_pipe: float | None = field(default=None, metadata=_MEASURED)
    stalls: tuple[StallReason, ...] = ()  # the top ones, most cycles first
    bound: KernelBound | None = None
    # what caps its theoretical occupancy below the SM's own caps: registers, shared_mem, barriers
    occupancy_limiter: str | None = None

    @property
    def profiled_ms(self) -> float | None:
        """Time of all its profiled launches (under ncu's clock control)."""
        return None if self.duration_ms is None else self.duration_ms * self.invocations

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> NcuKernel | None:
        """A kernel as :meth:`to_json` wrote it (a capture event's row); None when it has no name. Each
        number is kept as it came (written back, it reads the same)."""
        name, n, ids = d.get("name"), d.get("invocations"), d.get("ids")
        if not isinstance(name, str):
            return None
        grid, block = d.get("grid"), d.get("block")
        measured = {f.name: v for f in dataclasses.fields(cls) if f.metadata.get("measured")
                    and isinstance(v := d.get(f.name), (int, float)) and not isinstance(v, bool)}
        stalls = []
        raw = d.get("stalls")
        for s in raw if isinstance(raw, list) else []:
            if isinstance(s, Mapping) and isinstance(s.get("reason"), str) \
                    and isinstance(c := s.get("cycles"), (int, float)):
                sh = s.get("share")
                stalls.append(StallReason(str(s["reason"]), c, sh if isinstance(sh, (int, float)) else None))
        try:
            bound = KernelBound(d["bound"]) if d.get("bound") else None
        except ValueError:
            bound = None
        limiter = d.get("occupancy_limiter")
        return cls(name, grid if isinstance(grid, str) else None, block if isinstance(block, str) else None,
                   n if isinstance(n, int) and not isinstance(n, bool) else 0,
                   tuple(x for x in ids if isinstance(x, int)) if isinstance(ids, list) else (),
                   stalls=tuple(stalls), bound=bound,
                   occupancy_limiter=limiter if isinstance(limiter, str) else None,
                   **measured)


def classify(compute: float | None, memory: float | None) -> KernelBound | None:
    """The class from the SM and memory speed-of-light ratios (None when either is missing).

    NVIDIA's SOLBottleneck rule: both under the latency bar → latency-bound; else, where one unit is
    past the high bar or the two differ by the balance margin, the busier unit; else balanced."""
    if compute is None or memory is None:
        return None
    bar, high, margin = th.SOL_LATENCY.value, th.SOL_HIGH.value, th.SOL_BALANCED_MARGIN.value
    if compute < bar and memory < bar:
        return KernelBound.LATENCY
    if compute < high and memory < high and abs(compute - memory) < margin:
        return KernelBound.BALANCED
    return KernelBound.COMPUTE if compute >= memory else KernelBound.MEMORY


def occupancy_capped(k: NcuKernel, category: str = "") -> bool:
    """The kernel does no matrix math (tensor pipes idle) and its own resources (registers, shared
    memory) cap its occupancy at NCU_OCCUPANCY_CAP or less: too few warps to hide its latencies, however
    busy ncu's rule reads its SM (a softmax at "compute" 79% with occupancy register-capped at 62.5% on
    the H100, at 37.5% on a larger one). GEMMs run few warps by design: never."""
    if category == "gemm" or k.occupancy_limiter is None or k.theoretical_occupancy is None:
        return False
    if k.tensor_pipe is not None and k.tensor_pipe >= th.NCU_TENSOR_IDLE.value:
        return False
    return k.theoretical_occupancy <= th.NCU_OCCUPANCY_CAP.value


def effective_bound(k: NcuKernel, category: str = "") -> KernelBound | None:
    """ncu's class, except a kernel whose occupancy its own resources cap (occupancy_capped) that the
    rule calls compute-bound or balanced: latency-bound, its SM busy with too few warps."""
    if k.bound in (KernelBound.COMPUTE, KernelBound.BALANCED) and occupancy_capped(k, category):
        return KernelBound.LATENCY
    return k.bound


class MatchKind(str, enum.Enum):
    # launch by launch: each profiled launch matched to the timeline launch it was, by launch order
    # (perfd.analytics.ncu.launches): its row belongs to the op that launched it
    LAUNCH = "launch"
    EXACT = "exact"  # the same string
    FUNCTION = "function"  # one timeline kernel with the same function, one side without templates
    # (nsys lists bare functions: its share is that of every instantiation of the function)
    TEMPLATE = "template"  # the same function and template arguments alike (MIN_TEMPLATE_SIMILARITY)
    AMBIGUOUS = "ambiguous"  # several alike, none closer than the others: no share is given
    NONE = "none"  # not among the timeline's kernels (the capture lists its top ones only)

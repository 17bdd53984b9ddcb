"""Bottleneck class from what is available (docs/design.md §2 "Bottleneck class").

Timer shares decide first (they are measured inside the step): data-bound, communication-bound,
pipeline-bound. GPM counters, when a collector supplies them, separate compute-bound,
memory-bound and launch-overhead; ``classify_gpm`` is a separate pure function so the NVML
collector's readings can feed it directly. Otherwise the class is "unknown", with the reason.
Each reason is a code and the figures it quotes (:class:`GpmWhy`, :class:`SharesWhy`, and the votes'
of perfd.analytics.breakdown.diagnosis), worded where it is shown (perfd.report.bottleneck_text).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.common import TextEnum
from perfd.analytics.steps.untimed import Untimed


class BottleneckClass(TextEnum):
    COMPUTE = "compute-bound"
    MEMORY = "memory-bound"
    LAUNCH = "launch-overhead"
    COMMUNICATION = "communication-bound"
    SYNC = "sync-bound"
    DATA = "data-bound"
    PIPELINE = "pipeline-bound"
    # a capture's step budget with no class ahead by perfd.analytics.breakdown.budget's margin
    MIXED = "mixed"
    UNKNOWN = "unknown"

    @staticmethod
    def of(text: object) -> BottleneckClass:
        """A class from its text (a kept record, a capture's JSON); unknown for anything else."""
        try:
            return BottleneckClass(str(text))
        except ValueError:
            return BottleneckClass.UNKNOWN


B = BottleneckClass
BOTTLENECK_CLASSES: tuple[str, ...] = tuple(c.value for c in BottleneckClass)

# Thresholds: perfd/analytics/thresholds.py (declared once, with why; the rule packs are checked
# against them).
DATA_BOUND_SHARE = th.DATA_BOUND_SHARE.value
DATA_HEALTHY_SHARE = th.DATA_HEALTHY_SHARE.value
COMM_BOUND_SHARE = th.COMM_BOUND_SHARE.value
PIPELINE_BOUND_SHARE = th.PIPELINE_BOUND_SHARE.value
GPM_TENSOR_BUSY = th.GPM_TENSOR_BUSY.value
GPM_DRAM_BUSY = th.GPM_DRAM_BUSY.value
GPM_SM_BUSY = th.GPM_SM_BUSY.value
GPM_SM_STARVED = th.GPM_SM_STARVED.value
GPM_NVML_ACTIVE = th.GPM_NVML_ACTIVE.value
GPM_IDLE = th.GPM_IDLE.value


class ClassSource(str, enum.Enum):
    TIMERS = "timers"
    CAPTURE = "capture"
    GPM = "gpm"


class GpmWhen(TextEnum):
    """When the GPM a vote reads was taken (perfd.aggregator.class_inputs picks it)."""

    STEPPING = "stepping"  # while the job stepped
    LAST_STEADY = "last-steady"  # the job's last steady window: it is not stepping now


@dataclass(frozen=True)
class GpmReading:
    """GPM / NVML utilisation over a window, as ratios in [0, 1] (GPM reports percent: ÷100)."""

    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_util: float | None = None
    dram_bw_util: float | None = None
    nvml_util: float | None = None


# --- why a class: codes and the figures they quote, worded where shown (perfd.report.bottleneck_text) -----
class GpmSaid(TextEnum):
    """What GPM ratios say (:func:`classify_gpm`)."""

    NO_COUNTERS = "no-counters"
    IDLE = "idle"  # the GPU idle in the window
    TENSOR_OVER_DRAM = "tensor-over-dram"  # both busy, the tensor cores more
    DRAM_OVER_TENSOR = "dram-over-tensor"
    TENSOR = "tensor"
    DRAM = "dram"
    TINY_KERNELS = "tiny-kernels"  # kernels resident (NVML) while the SMs idle (GPM)
    SM_BUSY = "sm-busy"  # SMs busy without tensor-core or DRAM saturation
    NO_PATTERN = "no-pattern"


@dataclass(frozen=True, slots=True)
class GpmWhy:
    """Why GPM gives its class: the pattern and the reading it was read from."""

    said: GpmSaid
    reading: GpmReading


class ShareSaid(TextEnum):
    """Which timer share passed its threshold (:func:`classify`), or none did."""

    DATA = "data"
    GRAD_SYNC = "grad-sync"
    PIPELINE = "pipeline"
    EXPOSED = "exposed"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class SharesWhy:
    """Why the timers' shares give their class: the share over its threshold (th.DATA_BOUND_SHARE,
    COMM_BOUND_SHARE, PIPELINE_BOUND_SHARE) and, for the data wait, what the job calls it; none: the shares
    checked and what GPM said instead (None: no GPM)."""

    said: ShareSaid
    share: float | None = None
    data_timer: str = ""
    checked: tuple[tuple[str, float], ...] = ()
    gpm: GpmWhy | None = None


class ComputeSaid(TextEnum):
    """What the timers say where no share passes its threshold and compute fills (most of) the step
    (perfd.analytics.breakdown.diagnosis)."""

    UNDER = "under"  # compute under th.COMPUTE_FILLS_STEP: no part dominates
    CPU_ONLY = "cpu-only"  # the job computes on its CPUs
    CANNOT_TELL = "cannot-tell"  # MFU low: slow kernels or slow launches, no GPU-side evidence to tell
    KERNEL_EFFICIENCY = "kernel-efficiency"  # MFU low, a kernel resident nearly always: the kernels
    FILLS = "fills"  # MFU shows the model's math


@dataclass(frozen=True, slots=True)
class ComputeWhy:
    """The timers' vote without a decisive share: compute's share and the parts beside it (the pipeline's
    idle where the job has stages; the groups whose collectives the timers do not see), the MFU and how
    long a kernel was resident (NVML; None: not read)."""

    said: ComputeSaid
    compute: float
    data: float
    comm: float
    pipe_idle: float | None = None
    untimed: Untimed = ()
    mfu: float | None = None
    resident: float | None = None


@dataclass(frozen=True, slots=True)
class GpmVoteWhy:
    """GPM's vote: what its counters say, or (``host_launch``) that the SMs idle while compute fills the
    step; ``not_matrix``: the tensor cores under th.GPM_TENSOR_LOW (most kernel time is not matrix math)."""

    gpm: GpmWhy
    host_launch: bool = False
    not_matrix: bool = False


@dataclass(frozen=True)
class BudgetClass:
    """The class a budget supports (perfd.analytics.breakdown.budget.classify): the class whose parts
    hold most of the step, "mixed" when the runner-up is within th.CLASS_MIXED_MARGIN of it; ``shares``:
    every class's share of the step (said where shown, the largest first:
    perfd.report.budget_text.class_shares_text)."""

    cls: BottleneckClass
    shares: Mapping[BottleneckClass, float]
    lead: float  # the winner's share minus the runner-up's

    def shares_json(self) -> dict[str, float]:
        return {c.value: s for c, s in self.shares.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassBasis:
    """What a capture's class rests on (perfd.analytics.advice.capture_findings), worded where it is
    shown (perfd.report.capture_text.class_reason): the class of the device that decided and where it
    is (the capture's label and device); without one, whether the capture had any device (``where``:
    its label)."""

    decided: BudgetClass | None = None
    where: str = ""
    devices: bool = False

    def to_json(self) -> dict[str, object]:
        d = self.decided
        return {"decided": {"class": d.cls.value, "shares": d.shares_json(), "lead": d.lead}
                if d is not None else None, "where": self.where, "devices": self.devices}

    @staticmethod
    def from_json(v: object) -> ClassBasis | None:
        """Back from :meth:`to_json` (the state store's load); None: not one."""
        if not isinstance(v, Mapping):
            return None
        d = v.get("decided")
        try:
            decided = BudgetClass(BottleneckClass(str(d["class"])),
                                  {BottleneckClass(str(c)): float(s) for c, s in d["shares"].items()},
                                  float(d["lead"])) if isinstance(d, Mapping) else None
        except (KeyError, ValueError, TypeError, AttributeError):
            return None
        return ClassBasis(decided=decided, where=str(v.get("where") or ""), devices=bool(v.get("devices")))


@dataclass(frozen=True, slots=True)
class RowsWhy:
    """Why an Nsight Compute capture's rows give their class (perfd.analytics.ncu.ncu_verdicts.rows_class):
    their coverage of the step's compute time (None: either time unknown), whether it is enough
    (CLASS_COVERAGE) and then the kernel bound that holds most of their time and its share (worded where
    it is shown: perfd.report.ncu_text.rows_class_text)."""

    coverage: float | None
    enough: bool = False
    bound: str | None = None
    share: float = 0.0


@dataclass(frozen=True, slots=True)
class Quoted:
    """A capture's reason in the words an older version's state store kept it in (a record restored
    with no typed basis, perfd.aggregator.capture_records); nothing of this version makes one."""

    text: str


# Why a capture (its timeline, or its ncu rows with no timeline) supports its class
CaptureWhy = ClassBasis | RowsWhy | Quoted
VoteWhy = SharesWhy | ComputeWhy | GpmVoteWhy | CaptureWhy


class Decided(TextEnum):
    """Why the winning source decides the job's class (perfd.analytics.breakdown.diagnosis), or that none
    can."""

    SHARE = "share"  # a timer share beyond its threshold
    CAPTURE = "capture"
    GPM = "gpm"
    TIMERS = "timers"  # only the timers speak: compute fills the step
    NONE = "none"


class Missing(TextEnum):
    """What would let a source decide where none can."""

    DATA_SHARE = "data-share"
    COMM = "comm"
    GPM = "gpm"
    CAPTURE = "capture"


@dataclass(frozen=True, slots=True)
class Voted:
    """The job's class from its sources' votes (:attr:`Bottleneck.votes`, ``winner``, ``decided``); where
    none decides, what is missing."""

    missing: tuple[Missing, ...] = ()


@dataclass(frozen=True, slots=True)
class EarlierRun:
    """The class is an earlier run's (every step of the current run armed: perfd.analytics.run.runs): that
    run's number and its class with its reason (None: its digest holds none)."""

    run: int
    of: Bottleneck | None = None


@dataclass(frozen=True, slots=True)
class TooFewSteps:
    """No class from ``n_steady`` steady steps, under th.MIN_GRADE_STEPS."""

    n_steady: int


ClassWhy = GpmWhy | SharesWhy | Voted | EarlierRun | TooFewSteps


@dataclass(frozen=True)
class Vote:
    """A source's class, why, and its numbers; ``label``: the capture's (what it is, as the capture's
    record names it), ``when``: the GPM's."""

    source: ClassSource
    cls: BottleneckClass
    reason: VoteWhy
    numbers: dict[str, float] = field(default_factory=dict)
    label: str = ""
    when: GpmWhen | None = None


@dataclass(frozen=True)
class Bottleneck:
    """A class from BOTTLENECK_CLASSES, why, and the numbers behind it: each source's vote, the one
    that decided and why (the words, and the JSON a summary serves them in:
    perfd.report.bottleneck_text)."""

    cls: BottleneckClass
    reason: ClassWhy
    evidence: dict[str, float] = field(default_factory=dict)
    sources: dict[str, ClassSource] = field(default_factory=dict)  # evidence key -> the source it is of
    votes: tuple[Vote, ...] = ()  # each source's class and numbers
    winner: ClassSource | None = None  # the source whose vote decided
    decided: Decided | None = None  # why that source decided (None: no vote was taken)


def classify_gpm(
    sm_util: float | None = None,
    sm_occupancy: float | None = None,
    tensor_util: float | None = None,
    dram_bw_util: float | None = None,
    nvml_util: float | None = None,
) -> Bottleneck:
    """compute-bound / memory-bound / launch-overhead (or unknown) from GPM ratios."""
    g = GpmReading(sm_util, sm_occupancy, tensor_util, dram_bw_util, nvml_util)
    ev = {k: v for k, v in (("sm_util", sm_util), ("sm_occupancy", sm_occupancy),
                            ("tensor_util", tensor_util), ("dram_bw_util", dram_bw_util),
                            ("nvml_util", nvml_util)) if v is not None}
    if not ev:
        return Bottleneck(B.UNKNOWN, GpmWhy(GpmSaid.NO_COUNTERS, g))
    if (nvml_util is not None and nvml_util < GPM_IDLE
            and (sm_util is None or sm_util < GPM_IDLE)):
        return Bottleneck(B.UNKNOWN, GpmWhy(GpmSaid.IDLE, g), ev)
    tensor_busy = tensor_util is not None and tensor_util >= GPM_TENSOR_BUSY
    dram_busy = dram_bw_util is not None and dram_bw_util >= GPM_DRAM_BUSY
    if tensor_busy and dram_busy:
        assert tensor_util is not None and dram_bw_util is not None
        if tensor_util >= dram_bw_util:
            return Bottleneck(B.COMPUTE, GpmWhy(GpmSaid.TENSOR_OVER_DRAM, g), ev)
        return Bottleneck(B.MEMORY, GpmWhy(GpmSaid.DRAM_OVER_TENSOR, g), ev)
    if tensor_busy:
        return Bottleneck(B.COMPUTE, GpmWhy(GpmSaid.TENSOR, g), ev)
    if dram_busy:
        return Bottleneck(B.MEMORY, GpmWhy(GpmSaid.DRAM, g), ev)
    if (sm_util is not None and sm_util < GPM_SM_STARVED
            and nvml_util is not None and nvml_util >= GPM_NVML_ACTIVE):
        return Bottleneck(B.LAUNCH, GpmWhy(GpmSaid.TINY_KERNELS, g), ev)  # many tiny kernels
    if sm_util is not None and sm_util >= GPM_SM_BUSY:
        return Bottleneck(B.COMPUTE, GpmWhy(GpmSaid.SM_BUSY, g), ev)  # CUDA-core or latency-bound kernels
    return Bottleneck(B.UNKNOWN, GpmWhy(GpmSaid.NO_PATTERN, g), ev)  # moderate load everywhere


def classify(
    data_share: float | None,
    comm_exposed: float | None,
    comm_grad_sync: float | None,
    pp: int | None,
    pp_idle_max: float | None,
    pp_bubble_analytic: float | None,
    gpm: GpmReading | None = None,
    *,
    data_timer: str = "batch-generator",
) -> Bottleneck:
    """The dominant bottleneck from timer shares, then GPM; "unknown" with what was checked.
    ``data_timer``: what the job's source calls its data wait (Megatron's batch-generator, the step
    hook's data wait)."""
    ev: dict[str, float] = {}
    for k, v in (("data_share", data_share), ("comm_exposed", comm_exposed),
                 ("comm_grad_sync", comm_grad_sync), ("pp_idle_max", pp_idle_max),
                 ("pp_bubble_analytic", pp_bubble_analytic)):
        if v is not None:
            ev[k] = v
    if data_share is not None and data_share > DATA_BOUND_SHARE:
        return Bottleneck(B.DATA, SharesWhy(ShareSaid.DATA, data_share, data_timer), ev)
    if comm_grad_sync is not None and comm_grad_sync > COMM_BOUND_SHARE:
        return Bottleneck(B.COMMUNICATION, SharesWhy(ShareSaid.GRAD_SYNC, comm_grad_sync), ev)
    pipe = max((x for x in (pp_idle_max, pp_bubble_analytic) if x is not None), default=None)
    if pp is not None and pp > 1 and pipe is not None and pipe > PIPELINE_BOUND_SHARE:
        # p2p waits are bubble: the pipeline, not the links
        return Bottleneck(B.PIPELINE, SharesWhy(ShareSaid.PIPELINE, pipe), ev)
    if comm_exposed is not None and comm_exposed > COMM_BOUND_SHARE:
        return Bottleneck(B.COMMUNICATION, SharesWhy(ShareSaid.EXPOSED, comm_exposed), ev)
    gpm_why: GpmWhy | None = None
    if gpm is not None:
        g = classify_gpm(gpm.sm_util, gpm.sm_occupancy, gpm.tensor_util, gpm.dram_bw_util,
                         gpm.nvml_util)
        if g.cls is not B.UNKNOWN:
            return Bottleneck(g.cls, g.reason, {**ev, **g.evidence})
        assert isinstance(g.reason, GpmWhy)
        gpm_why = g.reason
    return Bottleneck(B.UNKNOWN, SharesWhy(ShareSaid.NONE, checked=tuple(ev.items()), gpm=gpm_why), ev)

"""Bottleneck class from what is available (docs/design.md §2 "Bottleneck class").

Timer shares decide first (they are measured inside the step): data-bound, communication-bound,
pipeline-bound. GPM counters, when a collector supplies them, separate compute-bound,
memory-bound and launch-overhead; ``classify_gpm`` is a separate pure function so the NVML
collector's readings can feed it directly. Otherwise the class is "unknown", with the reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.common import TextEnum


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


@dataclass(frozen=True)
class Vote:
    source: ClassSource
    cls: BottleneckClass
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    detail: str = ""  # where the source's data came from (a capture id, "GPM while stepping", ...)

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source.value,
            "class": str(self.cls),
            "reason": self.reason,
            "numbers": dict(self.numbers),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class GpmReading:
    """GPM / NVML utilisation over a window, as ratios in [0, 1] (GPM reports percent: ÷100)."""

    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_util: float | None = None
    dram_bw_util: float | None = None
    nvml_util: float | None = None


@dataclass(frozen=True)
class Bottleneck:
    """A class from BOTTLENECK_CLASSES, why, and the numbers behind it."""

    cls: BottleneckClass
    reason: str
    evidence: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # evidence key -> where it comes from
    votes: tuple[Vote, ...] = ()  # each source's class and numbers
    winner: str | None = None  # the source whose vote decided
    why: str = ""  # why that source decided

    def evidence_json(self) -> dict[str, Any]:
        """``bottleneck_evidence`` of a summary: each source's vote, the winner and why."""
        return {"votes": [v.to_json() for v in self.votes], "winner": self.winner, "why": self.why,
                "numbers": dict(self.evidence)}


def classify_gpm(
    sm_util: float | None = None,
    sm_occupancy: float | None = None,
    tensor_util: float | None = None,
    dram_bw_util: float | None = None,
    nvml_util: float | None = None,
) -> Bottleneck:
    """compute-bound / memory-bound / launch-overhead (or unknown) from GPM ratios."""
    ev = {k: v for k, v in (("sm_util", sm_util), ("sm_occupancy", sm_occupancy),
                            ("tensor_util", tensor_util), ("dram_bw_util", dram_bw_util),
                            ("nvml_util", nvml_util)) if v is not None}
    if not ev:
        return Bottleneck(B.UNKNOWN, "no GPM counters (GPU without GPM support or not sampled)")
    if (nvml_util is not None and nvml_util < GPM_IDLE
            and (sm_util is None or sm_util < GPM_IDLE)):
        return Bottleneck(B.UNKNOWN, "GPU idle in the window: the job waits on the host or is not "
                                     "running", ev)
    tensor_busy = tensor_util is not None and tensor_util >= GPM_TENSOR_BUSY
    dram_busy = dram_bw_util is not None and dram_bw_util >= GPM_DRAM_BUSY
    if tensor_busy and dram_busy:
        assert tensor_util is not None and dram_bw_util is not None
        if tensor_util >= dram_bw_util:
            return Bottleneck(B.COMPUTE, f"tensor cores busy {tensor_util:.0%} (DRAM "
                                               f"{dram_bw_util:.0%})", ev)
        return Bottleneck(B.MEMORY, f"DRAM bandwidth {dram_bw_util:.0%} (tensor "
                                          f"{tensor_util:.0%})", ev)
    if tensor_busy:
        return Bottleneck(B.COMPUTE, f"tensor cores busy {tensor_util:.0%}", ev)
    if dram_busy:
        return Bottleneck(B.MEMORY, f"DRAM bandwidth utilisation {dram_bw_util:.0%}", ev)
    if (sm_util is not None and sm_util < GPM_SM_STARVED
            and nvml_util is not None and nvml_util >= GPM_NVML_ACTIVE):
        return Bottleneck(B.LAUNCH, f"kernels resident {nvml_util:.0%} of the time (NVML) but "
                                             f"SMs busy only {sm_util:.0%} (GPM): many tiny kernels", ev)
    if sm_util is not None and sm_util >= GPM_SM_BUSY:
        return Bottleneck(B.COMPUTE, f"SMs busy {sm_util:.0%} without tensor-core or DRAM "
                                           "saturation (CUDA-core or latency-bound kernels)", ev)
    return Bottleneck(B.UNKNOWN, "GPM counters match no pattern (moderate load everywhere)", ev)


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
        return Bottleneck(B.DATA, f"{data_timer} takes {data_share:.1%} of the step "
                                        f"(> {DATA_BOUND_SHARE:.0%})", ev)
    if comm_grad_sync is not None and comm_grad_sync > COMM_BOUND_SHARE:
        return Bottleneck(B.COMMUNICATION, f"gradient sync exposed {comm_grad_sync:.1%} of the "
                                                 f"step (> {COMM_BOUND_SHARE:.0%})", ev)
    pipe = max((x for x in (pp_idle_max, pp_bubble_analytic) if x is not None), default=None)
    if pp is not None and pp > 1 and pipe is not None and pipe > PIPELINE_BOUND_SHARE:
        return Bottleneck(B.PIPELINE, f"a pipeline stage idles {pipe:.1%} of forward-backward "
                                            f"(> {PIPELINE_BOUND_SHARE:.0%}); p2p waits are bubble", ev)
    if comm_exposed is not None and comm_exposed > COMM_BOUND_SHARE:
        return Bottleneck(B.COMMUNICATION, f"exposed communication {comm_exposed:.1%} of the "
                                                 f"step (> {COMM_BOUND_SHARE:.0%})", ev)
    if gpm is not None:
        g = classify_gpm(gpm.sm_util, gpm.sm_occupancy, gpm.tensor_util, gpm.dram_bw_util,
                         gpm.nvml_util)
        if g.cls is not B.UNKNOWN:
            return Bottleneck(g.cls, g.reason, {**ev, **g.evidence})
        gpm_note = g.reason
    else:
        gpm_note = "no GPM counters"
    checked = ", ".join(f"{k} {v:.1%}" for k, v in ev.items()) or "no timer shares available"
    return Bottleneck(B.UNKNOWN, f"no timer share beyond its threshold ({checked}); {gpm_note}", ev)

"""The job's bottleneck class from every source present (DESIGN.md §2 "Bottleneck class").

The ladder, most direct evidence first:

1. timer shares of the step (perfd.analytics.bottleneck.classify): data loading, gradient sync,
   pipeline idle, exposed communication beyond their thresholds;
2. the latest capture's timeline (perfd.analytics.capture_findings): what the kernels were;
3. GPM counters of the job's GPUs (tensor / SM / DRAM utilisation);
4. the timers alone: when data, communication and pipeline idle leave compute filling the step,
   the class is compute-bound, and with a low MFU the reason says so — the kernels themselves run
   below peak (kernel efficiency), and what a capture shows or would show.

"unknown" only when none of them can decide, naming what is missing. Every class carries its
evidence, each number with its source. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.analytics import bottleneck as bn

COMPUTE_FILLS_STEP = 0.8  # 1 − data − exposed comm − pipeline idle: compute fills the step
LOW_MFU = 0.4  # below the "good" grade: the kernels run far below peak
GPM_TENSOR_LOW = 0.3  # tensor cores mostly idle while the SMs work: not GEMM-bound work


@dataclass(frozen=True)
class TimelineClass:
    """The class a capture's timeline supports (perfd.analytics.capture_findings)."""

    cls: str
    reason: str
    source: str  # e.g. "capture c2026... (kineto, rank 1)"


def classify_job(data_share: float | None, comm_exposed: float | None, comm_grad_sync: float | None,
                 pp: int | None, pp_idle_max: float | None, pp_bubble_analytic: float | None,
                 mfu: float | None = None, gpm: bn.GpmReading | None = None,
                 timeline: TimelineClass | None = None) -> bn.Bottleneck:
    timers = bn.classify(data_share, comm_exposed, comm_grad_sync, pp, pp_idle_max, pp_bubble_analytic)
    ev = dict(timers.evidence)
    src = {k: "megatron timers (perfd.analytics.metrics)" for k in ev}
    if timers.cls != "unknown":
        return bn.Bottleneck(timers.cls, timers.reason + " [timers]", ev, src)
    g = None
    if gpm is not None:  # its numbers are evidence whichever source decides
        g = bn.classify_gpm(gpm.sm_util, gpm.sm_occupancy, gpm.tensor_util, gpm.dram_bw_util, gpm.nvml_util)
        ev.update(g.evidence)
        src.update({k: "collectors/nvml GPM of the job's GPUs (mean)" for k in g.evidence})
    if timeline is not None and timeline.cls != "unknown":
        gpm_note = f"; GPM: {g.reason}" if g is not None else ""
        return bn.Bottleneck(timeline.cls, f"{timeline.reason} [{timeline.source}]{gpm_note}", ev,
                             {**src, "timeline": timeline.source})
    if g is not None and g.cls != "unknown":
        return bn.Bottleneck(g.cls, g.reason + " [GPM]", ev, src)
    known = [x for x in (data_share, comm_exposed) if x is not None]
    pipe = pp_idle_max if pp and pp > 1 else 0.0
    if data_share is not None and comm_exposed is not None and pipe is not None:
        compute = 1.0 - sum(known) - pipe
        ev["compute_share"] = compute
        src["compute_share"] = "1 − data − exposed comm − pipeline idle (megatron timers)"
        if compute >= COMPUTE_FILLS_STEP:
            why = (f"compute fills {compute:.0%} of the step (data {data_share:.1%}, exposed comm "
                   f"{comm_exposed:.1%}" + (f", pipeline idle {pipe:.1%}" if pp and pp > 1 else "") + ")")
            if mfu is not None and mfu < LOW_MFU:
                ev["mfu"] = mfu
                src["mfu"] = "perfd.analytics.metrics (model FLOPs ÷ peak)"
                why += f" yet MFU is {mfu:.0%}: kernel efficiency — the kernels themselves run far below peak"
                tensor = gpm.tensor_util if gpm is not None else None
                if tensor is not None and tensor < GPM_TENSOR_LOW:
                    why += (f"; GPM tensor-core use {tensor:.0%} (SM "
                            + (f"{gpm.sm_util:.0%}" if gpm is not None and gpm.sm_util is not None else "n/a")
                            + "): most kernel time is not matrix math — unfused elementwise/softmax work "
                              "or small GEMMs")
                why += ("; a capture's kernel categories show which kernels (perfd capture --job J "
                        "--steps 3)")
            return bn.Bottleneck("compute-bound", why, ev, src)
    missing = [name for name, v in (("data share (batch-generator timer)", data_share),
                                    ("exposed communication (comm timers)", comm_exposed)) if v is None]
    if gpm is None:
        missing.append("GPM counters (agent with NVML on a Hopper or newer GPU)")
    if timeline is None:
        missing.append("a capture of the job")
    gpm_note = f"; GPM: {g.reason}" if g is not None else ""
    return bn.Bottleneck("unknown", f"{timers.reason}{gpm_note}; missing: {', '.join(missing)}", ev, src)

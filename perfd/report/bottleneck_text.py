"""The job's bottleneck class as it reads: why each source votes for its class (the timers'
shares and compute, GPM's counters, a capture's timeline), why the winner decides, what is missing where
none can, and where each of its numbers comes from, from the codes and figures of
perfd.analytics.breakdown.bottleneck and diagnosis; and the summary's keys that serve them
(:func:`bottleneck_json`: ``bottleneck_reason``, ``bottleneck_evidence``, ``bottleneck_sources``). Pure."""

from __future__ import annotations

from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.bottleneck import (
    B,
    Bottleneck,
    ClassBasis,
    ClassSource,
    ComputeSaid,
    ComputeWhy,
    Decided,
    EarlierRun,
    GpmSaid,
    GpmVoteWhy,
    GpmWhen,
    GpmWhy,
    Missing,
    RowsWhy,
    ShareSaid,
    SharesWhy,
    TooFewSteps,
    Vote,
    Voted,
    VoteWhy,
)
from perfd.analytics.steps.iteration import json_value
from perfd.analytics.steps.untimed import Group, Untimed
from perfd.report.capture_text import class_reason as capture_class_reason
from perfd.report.ncu_text import rows_class_text

# Where each source's numbers come from (a vote's detail, the summary's bottleneck_sources).
TIMERS_SOURCE = "step timers (perfd.analytics.steps.metrics)"
GPM_SOURCE = "collectors/nvml GPM of the job's GPUs (mean)"
GPM_WHEN_TEXT: dict[GpmWhen, str] = {
    GpmWhen.STEPPING: "GPM while the job stepped",
    GpmWhen.LAST_STEADY: "GPM of the job's last steady window (the job is not stepping now)",
}
# Why the winning source decides.
DECIDED_TEXT: dict[Decided, str] = {
    Decided.SHARE: "a share of the step beyond its threshold decides: it is where the step's time goes",
    Decided.CAPTURE: ("the capture's timeline saw every kernel: the most direct view of what the compute "
                      "time is"),
    Decided.GPM: "GPM shows how the GPU spends the compute time; no capture to say more",
    Decided.TIMERS: "only the timers speak: compute fills the step",
    Decided.NONE: "no source can decide",
}
# What would let a source decide.
MISSING_TEXT: dict[Missing, str] = {
    Missing.DATA_SHARE: "data share (a data-wait timer)",
    Missing.COMM: "exposed communication (comm timers)",
    Missing.GPM: "GPM counters while the job steps (agent with NVML on a Hopper or newer GPU)",
    Missing.CAPTURE: "a capture of the job",
}


# What each group's collectives the step timers do not time are (perfd.analytics.steps.untimed).
UNTIMED_WHAT: dict[Group, str] = {
    Group.TP: "tensor-parallel all-reduces",
    Group.CP: "context-parallel attention exchanges",
    Group.EP: "expert-parallel token all-to-alls",
}


def untimed_text(groups: Untimed) -> str:
    """"the TP=2 tensor-parallel all-reduces, inside compute, are not timed" (empty: none): said wherever
    exposed communication is (the timers' vote, the run's communication finding, the MFU grade)."""
    if not groups:
        return ""
    what = " and the ".join(f"{g.value}={n} {UNTIMED_WHAT[g]}" for g, n in groups)
    return f"the {what}, inside compute, are not timed"


def gpm_text(w: GpmWhy) -> str:
    """What GPM's counters say: "tensor cores busy 94% (DRAM 18%)"."""
    g = w.reading
    t, d, sm, nvml = g.tensor_util, g.dram_bw_util, g.sm_util, g.nvml_util
    match w.said:
        case GpmSaid.NO_COUNTERS:
            return "no GPM counters (GPU without GPM support or not sampled)"
        case GpmSaid.IDLE:
            return "GPU idle in the window: the job waits on the host or is not running"
        case GpmSaid.TENSOR_OVER_DRAM:
            return f"tensor cores busy {t:.0%} (DRAM {d:.0%})"
        case GpmSaid.DRAM_OVER_TENSOR:
            return f"DRAM bandwidth {d:.0%} (tensor {t:.0%})"
        case GpmSaid.TENSOR:
            return f"tensor cores busy {t:.0%}"
        case GpmSaid.DRAM:
            return f"DRAM bandwidth utilisation {d:.0%}"
        case GpmSaid.TINY_KERNELS:
            return (f"kernels resident {nvml:.0%} of the time (NVML) but SMs busy only {sm:.0%} (GPM): many "
                    "tiny kernels")
        case GpmSaid.SM_BUSY:
            return (f"SMs busy {sm:.0%} without tensor-core or DRAM saturation (CUDA-core or latency-bound "
                    "kernels)")
    return "GPM counters match no pattern (moderate load everywhere)"


def shares_text(w: SharesWhy) -> str:
    """Which timer share passed its threshold: "batch-generator takes 31.0% of the step (> 20%)"."""
    comm = th.COMM_BOUND_SHARE.value
    match w.said:
        case ShareSaid.DATA:
            return f"{w.data_timer} takes {w.share:.1%} of the step (> {th.DATA_BOUND_SHARE.value:.0%})"
        case ShareSaid.GRAD_SYNC:
            return f"gradient sync exposed {w.share:.1%} of the step (> {comm:.0%})"
        case ShareSaid.PIPELINE:
            return (f"a pipeline stage idles {w.share:.1%} of forward-backward (> "
                    f"{th.PIPELINE_BOUND_SHARE.value:.0%}); p2p waits are bubble")
        case ShareSaid.EXPOSED:
            return f"exposed communication {w.share:.1%} of the step (> {comm:.0%})"
    checked = ", ".join(f"{k} {v:.1%}" for k, v in w.checked) or "no timer shares available"
    return (f"no timer share beyond its threshold ({checked}); "
            + (gpm_text(w.gpm) if w.gpm is not None else "no GPM counters"))


def compute_text(w: ComputeWhy) -> str:
    """The timers' vote where no share decides: what compute fills and whether they can tell more."""
    pipe = f", pipeline idle {w.pipe_idle:.1%}" if w.pipe_idle is not None else ""
    untimed = f"; {untimed_text(w.untimed)}" if w.untimed else ""
    why = (f"compute fills {w.compute:.0%} of the step (data {w.data:.1%}, exposed comm {w.comm:.1%}"
           f"{' of the timed collectives' if untimed else ''}{pipe}{untimed})")
    mfu = w.mfu
    low = f" yet MFU is {mfu:.{0 if mfu >= 0.1 else 1}%}" if mfu is not None else " (MFU unknown)"
    match w.said:
        case ComputeSaid.UNDER:
            return why + f" — under {th.COMPUTE_FILLS_STEP.value:.0%}, no part dominates"
        case ComputeSaid.CPU_ONLY:
            return why + ": the job computes on its CPUs (no CUDA)"
        case ComputeSaid.CANNOT_TELL:
            seen = (f"kernels resident only {w.resident:.0%} of the time (NVML)" if w.resident is not None
                    else "no GPU-side evidence")
            return why + (f"{low}: slow kernels or slow launches — the timers cannot tell which, and {seen} "
                          "(a capture or GPM can)")
        case ComputeSaid.KERNEL_EFFICIENCY:
            return why + (f"{low} with kernels resident {w.resident:.0%} of the time (NVML): kernel "
                          "efficiency — the kernels run far below peak (the timers cannot say which kernels: "
                          "a capture's kernel categories can)")
    return why


def gpm_vote_text(w: GpmVoteWhy) -> str:
    """GPM's vote: the host too slow to launch, or what its counters say (and that the tensor cores idle)."""
    g = w.gpm.reading
    if w.host_launch:
        return (f"SMs busy only {g.sm_util:.0%} (GPM) while compute fills the step: the host cannot launch "
                "kernels as fast as the GPU runs them")
    said = gpm_text(w.gpm)
    if w.not_matrix:
        sm = f" (SM {g.sm_util:.0%})" if g.sm_util is not None else ""
        said += (f"; tensor-core use {g.tensor_util:.0%}{sm}: most kernel time is not matrix math (unfused "
                 "elementwise/softmax work or small GEMMs)")
    return said


def vote_reason(w: VoteWhy) -> str:
    """Why a source votes for its class."""
    match w:
        case SharesWhy():
            return shares_text(w)
        case ComputeWhy():
            return compute_text(w)
        case GpmVoteWhy():
            return gpm_vote_text(w)
        case ClassBasis():
            return capture_class_reason(w)
        case RowsWhy():
            return rows_class_text(w)
    return w.text  # a capture's, in the words an older version kept it in


def vote_detail(v: Vote) -> str:
    """Where a vote's numbers come from."""
    if v.source is ClassSource.GPM:
        return GPM_WHEN_TEXT[v.when] if v.when is not None else ""
    return TIMERS_SOURCE if v.source is ClassSource.TIMERS else v.label


def too_few(n_steady: int) -> str:
    """Why no grade (and no class) is given from ``n_steady`` steady steps."""
    return (f"too few steady steps to grade: {n_steady} seen, at least {int(th.MIN_GRADE_STEPS.value)} "
            "needed")


def _voted(b: Bottleneck, missing: tuple[Missing, ...]) -> str:
    """The class from its votes: the winner's reason, who agrees and who says otherwise; none: what each
    said and what is missing."""
    winner = next((v for v in b.votes if v.source is b.winner), None)
    if winner is None:
        said = "; ".join(f"{v.source.value}: {vote_reason(v.reason)}" for v in b.votes)
        return (said + "; " if said else "") + (
            "missing: " + ", ".join(MISSING_TEXT[m] for m in missing) if missing else "no source passes its "
            "threshold")
    others = [v for v in b.votes if v is not winner]
    agree = [v.source.value for v in others if v.cls == winner.cls]
    differ = [f"{v.source.value} says {v.cls}" for v in others if v.cls not in (winner.cls, B.UNKNOWN)]
    # The timers' "cannot tell slow kernels from slow launches" is what a capture tells: not repeated.
    differ += [f"{v.source.value}: {vote_reason(v.reason)}" for v in others if v.cls == B.UNKNOWN
               and not (winner.source is ClassSource.CAPTURE and v.source is ClassSource.TIMERS)]
    note = (f"; {', '.join(agree)} agree" if agree else "") + (f"; {'; '.join(differ)}" if differ else "")
    return f"{vote_reason(winner.reason)} [{winner.source.value}]{note}"


def class_reason(b: Bottleneck) -> str:
    """Why the job is of its class (the summary's ``bottleneck_reason``)."""
    w = b.reason
    match w:
        case Voted():
            return _voted(b, w.missing)
        case EarlierRun():
            said = class_reason(w.of) if w.of is not None else ""
            return f"{said} (run {w.run}, the job's last run without ncu)" if said else ""
        case TooFewSteps():
            return too_few(w.n_steady)
        case GpmWhy():
            return gpm_text(w)
    return shares_text(w)


def vote_json(v: Vote) -> dict[str, object]:
    return {"source": v.source.value, "class": str(v.cls), "reason": vote_reason(v.reason),
            "numbers": dict(v.numbers), "detail": vote_detail(v)}


def source_text(b: Bottleneck, source: ClassSource) -> str:
    """Where one of the class's numbers comes from (``bottleneck_sources``)."""
    vote = next((v for v in b.votes if v.source is source), None)
    if source is ClassSource.GPM:
        return f"{GPM_SOURCE}, {vote_detail(vote) if vote is not None else ''}"
    return TIMERS_SOURCE if source is ClassSource.TIMERS else (vote.label if vote is not None else "")


def bottleneck_json(b: Bottleneck) -> dict[str, Any]:
    """The summary's keys after ``bottleneck`` as served: its reason, each source's vote, the winner and
    why it decides, the numbers and where each comes from."""
    evidence = {"votes": [vote_json(v) for v in b.votes],
                "winner": b.winner.value if b.winner is not None else None,
                "why": DECIDED_TEXT[b.decided] if b.decided is not None else "", "numbers": dict(b.evidence)}
    out = {"bottleneck_reason": class_reason(b), "bottleneck_evidence": evidence,
           "bottleneck_sources": {k: source_text(b, s) for k, s in b.sources.items()}}
    value = json_value(out)
    assert isinstance(value, dict)
    return value

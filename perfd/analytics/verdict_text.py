"""Sentences for typed evidence and verdicts (perfd.analytics.evidence): the one place they become
English. Nothing reads these sentences back: decisions are made on the typed values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perfd.analytics.evidence import Evidence, EvidenceKind, Missing, Verdict

# One action for slow data, whether an incident's verdict or the run's data share asks for it: the
# report merges recommendations with the same action (perfd.analytics.findings.order_findings).
DATA_LOADING_ACTION = ("Speed up data loading: more data-loader workers, pinned memory, prefetch; check "
                       "the storage the data comes from")

K = EvidenceKind
CMDLINE_CHARS = 80  # a foreign process's command line as shown in one line (whitespace collapsed)


def _mhz(hz: float | None) -> str:
    return "n/a" if hz is None else f"{hz / 1e6:.0f} MHz"


def _gib(b: Any) -> str:
    return f"{float(b) / 2**30:.1f} GiB" if isinstance(b, (int, float)) else "GPU memory not visible"


def _seen(e: Evidence) -> str:
    if e.first_seen is None or e.last_seen is None or e.last_seen <= e.first_seen:
        return ""
    return f", seen over {e.last_seen - e.first_seen:.0f} s"


def _gpu(e: Evidence) -> str:
    return f"rank {e.rank}'s GPU" if e.rank is not None else "a GPU of the job"


def _foreign(e: Evidence) -> str:
    d = e.detail
    cmd = " ".join(str(d.get("cmdline") or d.get("name") or "command line not visible").split())
    cmd = cmd if len(cmd) <= CMDLINE_CHARS else cmd[: CMDLINE_CHARS - 1] + "…"
    return (
        f"{_gpu(e)} was shared with another process: pid {d.get('pid', e.key)} ({cmd}; "
        f"{_gib(d.get('used_memory_bytes'))}){_seen(e)}"
    )


def _power(e: Evidence) -> str:
    d = e.detail
    lim = d.get("power_limit_watts")
    watts = (
        f"{e.worst:.0f} W" + (f" of a {lim:.0f} W limit" if isinstance(lim, (int, float)) else "")
        if e.worst is not None
        else "power n/a"
    )
    return f"{_gpu(e)} was power-capped (sw_power_cap; {watts}){_seen(e)}"


def _thermal(e: Evidence) -> str:
    d = e.detail
    med = d.get("median_celsius")
    temp = (
        (
            f"{e.worst:.0f} C"
            + (f" against the job's median {med:.0f} C" if isinstance(med, (int, float)) else "")
        )
        if e.worst is not None
        else "temperature n/a"
    )
    why = ", ".join(d.get("reasons") or []) or "temperature"
    return f"{_gpu(e)} ran hot ({why}; {temp}){_seen(e)}"


def _hw(e: Evidence) -> str:
    return f"{_gpu(e)} was slowed by the hardware ({', '.join(e.detail.get('reasons') or [e.key])}){_seen(e)}"


def _xid(e: Evidence) -> str:
    code = e.detail.get("xid_last")
    return (
        f"{_gpu(e)} reported XID errors"
        + (f" (last XID {code:.0f})" if isinstance(code, (int, float)) else "")
        + _seen(e)
    )


def _clock(e: Evidence) -> str:
    med = e.detail.get("median_hertz")
    below = (
        f", {100 * (1 - e.worst / med):.0f}% below the job's median {_mhz(med)}"
        if isinstance(med, (int, float)) and med and e.worst is not None
        else ""
    )
    return f"{_gpu(e)}: SM clock {_mhz(e.worst)}{below}"


def _capture(e: Evidence) -> str:
    d = e.detail
    return (
        f"capture {d.get('capture', e.key)} during it shows rank {e.rank}'s kernels ran "
        f"{e.worst:.1f}× slower than in steady state"
        if e.worst is not None
        else f"capture {d.get('capture', e.key)} ran during it"
    ) + (" with the same kernel mix: contention on the GPU" if d.get("same_mix") else "")


def _after_capture(e: Evidence) -> str:
    d = e.detail
    span = f"iterations {d.get('capture_first')}–{d.get('capture_last')}"
    if e.worst is None:
        return f"it began as perfd's own capture ended ({span})"
    return (f"it began as perfd's own capture ended ({span}) and the steps stayed {e.worst:.2f}× the median "
            "before it: the profiler's cost outlasted the capture")


def _data(e: Evidence) -> str:
    d = e.detail
    base = d.get("steady")
    return (
        f"data loading took up to {e.worst:.0%} of the step" if e.worst is not None else "data loading grew"
    ) + (f" (steady {base:.0%})" if isinstance(base, (int, float)) else "")


def _ratio(e: Evidence) -> str:
    return (
        f"rank {e.rank} computed up to {e.worst:.2f}× its stage's median"
        if e.worst is not None
        else f"rank {e.rank} computed longer than its peers"
    )


def _line(e: Evidence) -> str:
    return f"the straggler detector named rank {e.rank} the slowest in {e.n} iteration(s)"


def _comm(e: Evidence) -> str:
    base = e.detail.get("steady")
    return (
        f"exposed communication took up to {e.worst:.0%} of the step"
        if e.worst is not None
        else "exposed communication grew"
    ) + (f" (steady {base:.0%})" if isinstance(base, (int, float)) else "")


_SENTENCE: dict[EvidenceKind, Callable[[Evidence], str]] = {
    K.XID: _xid,
    K.HW_SLOWDOWN: _hw,
    K.FOREIGN_PROCESS: _foreign,
    K.THERMAL: _thermal,
    K.POWER_CAP: _power,
    K.CLOCK_DROP: _clock,
    K.AFTER_CAPTURE: _after_capture,
    K.CAPTURE_FINDING: _capture,
    K.DATA_WAIT: _data,
    K.RANK_COMPUTE_RATIO: _ratio,
    K.STRAGGLER_LINE: _line,
    K.EXPOSED_COMM: _comm,
}

_MISSING: dict[Missing, str] = {
    Missing.PER_RANK_TIMERS: "no per-rank data names a rank (per-rank timers: --timing-log-option all, "
    "--log-straggler or the step hook on every rank would)",
    Missing.GPU_STATE: "no GPU state of the job's ranks (an agent with NVML on their nodes would show it)",
    Missing.RANK_PLACEMENT: "the rank's GPU is unknown (no process on the job's nodes declares its RANK; "
    "the agent needs the host pid namespace)",
}


def sentence(e: Evidence) -> str:
    """One observation as a person reads it."""
    return _SENTENCE[e.kind](e)


def missing_text(m: Missing) -> str:
    return _MISSING[m]


def cause_text(v: Verdict, slow: str, single_rank: bool = False) -> str:
    """The incident's one line: the lead cause, how slow, and what the lead also explains."""
    if v.lead is None:
        gaps = [missing_text(m) for m in v.missing if not (single_rank and m is Missing.PER_RANK_TIMERS)]
        why = "; ".join(gaps) if gaps else "its GPU and timers showed nothing unusual"
        if single_rank:
            rank = v.rank if v.rank is not None else 0
            return f"the job's only rank ({rank}) ran {slow}; not explained: {why}"
        return f"{slow}; not explained: {why}"
    text = f"{sentence(v.lead)}; {slow}"
    if v.effects:
        text += "; with its effects: " + "; ".join(sentence(e) for e in v.effects)
    return text


def action_text(v: Verdict | None, ranks: Sequence[int] = ()) -> str:
    """The first thing to do about an incident with this verdict."""
    r = v.rank if v is not None and v.rank is not None else (ranks[0] if ranks else None)
    who = f"rank {r}'s GPU" if r is not None else "the job's GPUs"
    if v is None or v.lead is None:
        if r is not None:
            return (
                f"Check rank {r}: its GPU (clocks, throttle reasons, other processes, XID errors), then "
                "uneven data or sharding and host-side stalls"
            )
        return (
            "Look for host-side causes of the slow stretch: checkpointing, evaluation, other jobs on the node"
        )
    d: Mapping[str, Any] = v.lead.detail
    if v.cause in (K.XID, K.HW_SLOWDOWN):
        return (
            f"Drain {who} and check its health (XID codes in the driver log, nvidia-smi -q, the node's "
            "hardware monitoring); reschedule the job without it"
        )
    if v.cause is K.FOREIGN_PROCESS:
        return (
            f"Keep other processes off {who} (exclusive-process compute mode, or the scheduler's GPU "
            f"isolation): pid {d.get('pid', v.lead.key)} ran there during the incident"
        )
    if v.cause is K.THERMAL:
        return f"Check {who}'s cooling: airflow, fans, inlet temperature (no other process explains it)"
    if v.cause is K.POWER_CAP:
        return (
            f"Check {who}'s power limit and power delivery (nvidia-smi -q -d POWER: enforced against "
            "default limit); no other process explains it"
        )
    if v.cause is K.CLOCK_DROP:
        return f"Check {who}'s clocks: locked or application clocks, throttle reasons"
    if v.cause is K.AFTER_CAPTURE:
        return (
            "perfd's capture cost this: stop on-demand captures of this job (raise the rule's cooldown or "
            "drop the rule) and restart its ranks when convenient to shed the profiler's overhead"
        )
    if v.cause is K.CAPTURE_FINDING:
        return (
            f"Look for contention on {who}: the same kernels ran slower while captured (other processes, "
            "MPS clients, clocks)"
        )
    if v.cause is K.DATA_WAIT:
        return DATA_LOADING_ACTION
    if v.cause in (K.RANK_COMPUTE_RATIO, K.STRAGGLER_LINE):
        gpu_known = Missing.GPU_STATE not in v.missing and Missing.RANK_PLACEMENT not in v.missing
        if gpu_known:
            return (
                f"Check rank {v.rank}'s own work: uneven data or sharding, host-side stalls (CPU "
                "contention, garbage collection); its GPU showed no fault, no co-tenant, no throttling"
            )
        return (
            f"Check rank {v.rank}'s GPU (clocks, throttle reasons, other processes, XID errors: an agent "
            "with NVML on its node shows them), then uneven data or sharding"
        )
    return (
        "Communication slowed: check the links and peers of the rank's process groups; overlap "
        "communication with compute"
    )

"""An incident in English: the sentence of each kind of typed evidence (perfd.analytics.incidents
.evidence), what is missing, a live stall, the incident's one line (its cause, :func:`cause_line`) and
what a rank's GPU shows (:func:`gpu_observations`, :func:`seen_text`), which detector the evidence
comes from (:data:`EVIDENCE_SOURCE_TEXT`). The one place they become English, where they are
shown (the report, the HTML page, the HTTP API's JSON, the events, `perfd top`); nothing reads them
back: decisions are made on the typed values. An incident keeps no line of its own, except one
recorded by an older perfd (Incident.cause, read back from the aggregator's state): that one is shown
as it was written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence

from perfd.analytics.incidents.attribution import GpuHint, GpuSeen, gpu_seen
from perfd.analytics.incidents.detect import CAPTURE, HANG, LEVEL_SHIFT, STALL, Incident
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind, Missing, StallReason, Verdict, decide
from perfd.analytics.incidents.host_evidence import CpuRoom, CpuUse
from perfd.analytics.incidents.incident_evidence import EvidenceSource
from perfd.report.collective_text import hang_json


def cpu_use_text(use: CpuUse) -> str:
    """The evidence behind a data-loading action (perfd.analytics.breakdown.advice_registry.data_loading),
    in one sentence."""
    where = f"{use.cpus} CPU(s)" if use.cpus is not None else "its CPUs"
    parts = [f"rank {use.rank}'s {where}" + (f" {use.busy_ratio:.0%} busy" if use.busy_ratio is not None
                                             else "")]
    if use.rank_cores is not None:
        parts.append(f"the rank process {use.rank_cores:.2f} cores")
    if use.children_cores is not None:
        n = f"{use.children} " if use.children is not None else ""
        parts.append(f"its {n}child process(es) (data-loader workers, the job's own) "
                     f"{use.children_cores:.2f} cores")
    if use.quota_cores is not None:
        parts.append(f"cgroup quota {use.quota_cores:.2f} cores")
    if use.throttled_ratio:
        parts.append(f"throttled in {use.throttled_ratio:.0%} of its periods")
    state = "full" if use.room is CpuRoom.FULL else "room left"
    when = ""
    if use.while_running and use.observed_at is not None:  # a finished job: when, and that it ran then
        at = dt.datetime.fromtimestamp(use.observed_at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        when = f"; observed at {at}, while running"
    return f"{'; '.join(parts)} ({state}){when}"

K = EvidenceKind
CMDLINE_CHARS = 80  # a foreign process's command line as shown in one line (whitespace collapsed)


def _mhz(hz: float | None) -> str:
    return "n/a" if hz is None else f"{hz / 1e6:.0f} MHz"


def _gib(b: object) -> str:
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
    since = d.get("since_ms")
    if isinstance(since, (int, float)):  # began later, the pace never having come back
        return (f"the steps have not come back to their pace since perfd's own capture ({span}): "
                f"{since:.1f} ms per step since it against {d.get('before_ms', float('nan')):.1f} before it "
                f"({e.worst or float('nan'):.2f}×): the profiler's cost outlasted the capture")
    if e.worst is None:
        return f"it began as perfd's own capture ended ({span})"
    return (f"it began as perfd's own capture ended ({span}) and the steps stayed {e.worst:.2f}× the median "
            "before it: the profiler's cost outlasted the capture")


def _share_grew(what: str, e: Evidence) -> str:
    """A part's share of the step that grew: its worst share, and its steady one where known."""
    base = e.detail.get("steady")
    return (
        f"{what} took up to {e.worst:.0%} of the step" if e.worst is not None else f"{what} grew"
    ) + (f" (steady {base:.0%})" if isinstance(base, (int, float)) else "")


def _data(e: Evidence) -> str:
    return _share_grew("data loading", e)


def _ratio(e: Evidence) -> str:
    return (
        f"rank {e.rank} computed up to {e.worst:.2f}× its stage's median"
        if e.worst is not None
        else f"rank {e.rank} computed longer than its peers"
    )


def _line(e: Evidence) -> str:
    return f"the straggler detector named rank {e.rank} the slowest in {e.n} iteration(s)"


def _comm(e: Evidence) -> str:
    return _share_grew("exposed communication", e)


def cpus_text(cpus: object) -> str:
    """``CPU 3``, ``CPUs 2–3``, ``CPUs 0, 2, 5`` (runs of consecutive CPUs as ranges)."""
    xs = sorted({int(c) for c in (cpus if isinstance(cpus, Iterable) else ()) if isinstance(c, int)})
    if not xs:
        return "its CPUs"
    runs: list[list[int]] = []
    for c in xs:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs]
    return ("CPU " if len(xs) == 1 else "CPUs ") + ", ".join(parts[:6]) + (", …" if len(parts) > 6 else "")


def _cmd(d: Mapping[str, object]) -> str:
    cmd = " ".join(str(d.get("cmdline") or d.get("name") or "command line not visible").split())
    return cmd if len(cmd) <= CMDLINE_CHARS else cmd[: CMDLINE_CHARS - 1] + "…"


def _proc(e: Evidence) -> str:
    pid = e.detail.get("pid")
    return f"rank {e.rank}'s process" + (f" (pid {pid})" if pid is not None else "") + \
        (f" on {e.detail['node']}" if e.detail.get("node") else "")


def _stopped(e: Evidence) -> str:
    held = f" for {e.worst:.0f} s" if e.worst is not None and e.worst >= 1 else ""
    return f"{_proc(e)} was stopped (state T: SIGSTOP, a debugger, or a frozen container){held}"


def _gone(e: Evidence) -> str:
    what = "a zombie (it exited; its parent has not reaped it)" if e.detail.get("state") == "zombie" \
        else "gone (it exited)"
    return f"{_proc(e)} was {what} while the job ran"


def _oom(e: Evidence) -> str:
    n = f"{e.worst:.0f} process(es)" if e.worst is not None else "a process"
    cg = e.detail.get("cgroup")
    return f"the OOM killer killed {n} in rank {e.rank}'s cgroup" + (f" ({cg})" if cg else "")


def _contention(e: Evidence) -> str:
    d = e.detail
    others = [o for o in d.get("others") or [] if isinstance(o, Mapping)]
    pids = ", ".join(str(o.get("pid")) for o in others[:4]) + (", …" if len(others) > 4 else "")
    cmds = [_cmd(o) for o in others]
    cmd = max(set(cmds), key=cmds.count) if cmds else "command line not visible"
    share = d.get("others_ratio")
    took = f"took {share:.0%} of" if isinstance(share, (int, float)) else "ran on"
    level = d.get("steady_worst")
    steady = f" ({level:.0%} in steady state)" if isinstance(level, (int, float)) else ""
    wait = f"; the rank waited for a CPU {e.worst:.0%} of the time{steady}" if e.worst is not None else ""
    return (f"{len(others)} other process(es) (pid{'s' if len(others) > 1 else ''} {pids}, `{cmd}`) {took} "
            f"rank {e.rank}'s {cpus_text(d.get('allowed_cpus'))}{wait}{_seen(e)}")


def _throttled(e: Evidence) -> str:
    d = e.detail
    quota = d.get("quota_cores")
    limit = f" of {quota:.2g} CPU" if isinstance(quota, (int, float)) else ""
    wait = d.get("wait_ratio")
    return (f"rank {e.rank}'s cgroup hit its CPU quota{limit}: throttled in {e.worst:.0%} of its periods"
            if e.worst is not None else f"rank {e.rank}'s cgroup was throttled by its CPU quota") + \
        (f"; the rank waited for a CPU {wait:.0%} of the time" if isinstance(wait, (int, float)) else "") + \
        _seen(e)


def _memory(e: Evidence) -> str:
    d = e.detail
    where = "the node's" if d.get("pressure_source") == "node" else f"rank {e.rank}'s cgroup's"
    text = f"{where} tasks stalled on memory {e.worst:.0%} of the time" if e.worst is not None \
        else f"rank {e.rank}'s node was short of memory"
    swap = d.get("swap_in_bytes_per_second")
    swapping = f", swapping in {swap / 2**20:.1f} MiB/s" if isinstance(swap, (int, float)) else ""
    return text + swapping + _seen(e)


def _io(e: Evidence) -> str:
    d = e.detail
    parts = []
    if d.get("state") == "disk_sleep":
        parts.append("in disk sleep (state D)")
    if e.worst is not None:
        where = "the node's" if d.get("pressure_source") == "node" else "its cgroup's"
        parts.append(f"{where} tasks stalled on I/O {e.worst:.0%} of the time")
    return f"{_proc(e)} was blocked in I/O ({'; '.join(parts) or 'I/O pressure'}){_seen(e)}"


_SENTENCE: dict[EvidenceKind, Callable[[Evidence], str]] = {
    K.PROCESS_STOPPED: _stopped,
    K.OOM_KILL: _oom,
    K.PROCESS_GONE: _gone,
    K.CPU_CONTENTION: _contention,
    K.CPU_THROTTLED: _throttled,
    K.MEMORY_PRESSURE: _memory,
    K.IO_BLOCKED: _io,
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
    Missing.RANK_PLACEMENT: "the rank's GPU is unknown (no process on the job's nodes declares its RANK "
    "and no step hook named its process or its CUDA device to an agent with NVML there; the agent needs "
    "the host pid namespace)",
}


_STALL: dict[StallReason, str] = {
    StallReason.STOPPED: "a rank process stopped",
    StallReason.GONE: "a rank process gone",
    StallReason.IO_BLOCKED: "a rank process blocked in disk sleep",
    StallReason.IDLE: "every rank process idle (no CPU, no GPU work)",
    StallReason.PENDING_COLLECTIVE: "a collective pending in the Flight Recorder",
}


def stall_text(silent_s: float | None, cadence_s: float | None, reasons: Sequence[StallReason]) -> str:
    """How a live stall reads before anything names its cause: the silence against the job's usual
    interval between step records, and what corroborates it."""
    quiet = f"no step for {silent_s:.0f} s" if silent_s is not None else "no step"
    usual = f" (a step record every {cadence_s:.2g} s before)" if cadence_s else ""
    seen = "; ".join(_STALL[r] for r in reasons)
    return f"stalled: {quiet}{usual}" + (f"; {seen}" if seen else "")


def sentence(e: Evidence) -> str:
    """One observation as a person reads it."""
    return _SENTENCE[e.kind](e)


def missing_text(m: Missing) -> str:
    return _MISSING[m]


def cause_text(v: Verdict, slow: str, single_rank: bool = False, cpu_only: bool = False) -> str:
    """The incident's one line: the lead cause, how slow, and what the lead also explains
    (``cpu_only``: the job computes on CPUs, so its GPU is neither evidence nor a gap)."""
    if v.lead is None:
        gaps = [missing_text(m) for m in v.missing if not (single_rank and m is Missing.PER_RANK_TIMERS)
                and not (cpu_only and m in (Missing.GPU_STATE, Missing.RANK_PLACEMENT))]
        seen = "its timers and host" if cpu_only else "its GPU and timers"
        why = "; ".join(gaps) if gaps else f"{seen} showed nothing unusual"
        if single_rank:
            rank = v.rank if v.rank is not None else 0
            return f"the job's only rank ({rank}) ran {slow}; not explained: {why}"
        return f"{slow}; not explained: {why}"
    text = f"{sentence(v.lead)}; {slow}"
    if v.effects:
        text += "; with its effects: " + "; ".join(sentence(e) for e in v.effects)
    return text


def slow_text(inc: Incident) -> str:
    return (f"steps {inc.median_step_ms / inc.steady_step_ms:.1f}× the steady time per step"
            if inc.median_step_ms and inc.steady_step_ms else "slow steps")


def _hang_line(inc: Incident) -> str:
    """A collective hang's line: the op, and who never reached it (else who is stuck in it)."""
    ev = inc.evidence
    if ev.hang is None:  # a record kept without its hang: its own line
        return inc.cause
    culprits, stuck = list(ev.ranks_not_joined or ()), list(ev.stuck_ranks or ())
    return (f"collective hang: {ev.hang.op} #{ev.hang.seq} — "
            + (f"rank(s) {', '.join(map(str, culprits))} never reached it" if culprits
               else f"rank(s) {', '.join(map(str, stuck))} stuck in it"))


def cause_line(inc: Incident) -> str:
    """The incident's one line from its typed values: a hang's op, a stall's silence, a capture-only
    stretch, a level shift, else its verdict's lead, how slow, and what the lead also explains. A
    line recorded by an older perfd (Incident.cause) is shown as it was written."""
    if inc.cause:
        return inc.cause
    if HANG in inc.kinds:
        return _hang_line(inc)
    verdict = inc.verdict if inc.verdict is not None else decide([], inc.ranks)  # not decided yet
    if inc.kinds == [STALL]:  # open, or closed with no slow step after it: the silence is its measure
        st = inc.evidence.stall.check if inc.evidence.stall is not None else None
        silent, cadence = (st.silent_s, st.cadence_s) if st is not None else (None, None)
        if verdict.lead is not None:  # the lead names what the reasons would only hint at
            return f"{stall_text(silent, cadence, ())}; {sentence(verdict.lead)}"
        return stall_text(silent, cadence, list(st.reasons) if st is not None else [])
    if CAPTURE in inc.kinds and not inc.ranks and len(inc.kinds) == 1:
        return f"perfd's own capture disturbed {inc.n_iterations} iteration(s) ({slow_text(inc)})"
    cp = inc.evidence.change_point
    if LEVEL_SHIFT in inc.kinds and cp is not None:
        normal = cp.new_normal_at
        return (f"step time shifted from {cp.before_ms:.0f} to {cp.after_ms:.0f} ms at iteration "
                f"{cp.iteration} and " + (f"stayed until taken as the new normal at iteration {normal}"
                                             if normal is not None else "stays there")
                + f"; {cause_text(verdict, slow_text(inc), inc.single_rank, inc.cpu_only)}")
    return cause_text(verdict, slow_text(inc), inc.single_rank, inc.cpu_only)


def incident_json(inc: Incident) -> dict[str, object]:
    """An incident as JSON, its line worded (the offline analysis'; the live aggregator's kept ones:
    perfd/aggregator/incident_records.TrackedIncident.to_json)."""
    return {**worded_evidence(inc, inc.to_json()), "cause": cause_line(inc)}


def seen_text(seen: GpuSeen, items: Sequence[Evidence]) -> list[str]:
    """What a rank's GPU shows against the job's others, in sentences: its items', or that it is
    unplaced, or that it looks like the others; nothing for a CPU job's rank on no GPU."""
    if seen is GpuSeen.NO_GPU:
        return []
    if seen is GpuSeen.UNPLACED:
        return [missing_text(Missing.RANK_PLACEMENT)]
    if seen is GpuSeen.LIKE_OTHERS:
        return ["its GPU looks like the others (clock, throttling, temperature, no other process): look "
                "at its data loading or host instead"]
    return [sentence(e) for e in items]


def gpu_observations(h: GpuHint) -> list[str]:
    """A GPU hint's observations (perfd.analytics.incidents.attribution.gpu_hints) in sentences."""
    return seen_text(gpu_seen(h.placed, h.items), h.items)


# Which detector an incident's evidence comes from (IncidentEvidence.source), as the JSON and the
# report's finding say it.
EVIDENCE_SOURCE_TEXT: dict[EvidenceSource, str] = {
    EvidenceSource.STEPS: "per-iteration analysis (step timers, straggler detector)",
    EvidenceSource.NCCL_HANG: "collectors/nccl Flight Recorder hang detector",
    EvidenceSource.LIVE_STALL: "perfd aggregator, live stall detector (perfd.analytics.incidents.stall)",
}


def worded_evidence(inc: Incident, doc: dict[str, object]) -> dict[str, object]:
    """``inc``'s JSON (Incident.to_json: its evidence's codes where sentences are served) with its
    evidence's source, its hang's resolution and line and each rank snapshot's observations worded, in
    their places (the keys keep
    their order: a value replaced in a dict stays where it was)."""
    ev, src = doc.get("evidence"), inc.evidence.source
    if not isinstance(ev, dict):
        return doc
    if src is not None:
        ev["source"] = EVIDENCE_SOURCE_TEXT[src]
    if inc.evidence.hang is not None and "hang" in ev:  # a collective hang: its resolution and line
        ev["hang"] = hang_json(inc.evidence.hang)
    snaps, served = inc.evidence.gpu or {}, ev.get("gpu")
    for r, snap in snaps.items():
        one = served.get(str(r)) if isinstance(served, dict) else None
        if isinstance(one, dict) and snap.written is None:
            one["observations"] = seen_text(snap.seen, snap.seen_items)
    return doc


def unworded_evidence(ev: Mapping[str, object]) -> dict[str, object]:
    """Served evidence JSON (the state store's copy) with its source's sentence back as its code, for
    IncidentEvidence.from_json: one lookup in the table above, no parsing; a sentence it does not
    declare (an older perfd's) reads as no source."""
    src = ev.get("source")
    code = next((k.value for k, t in EVIDENCE_SOURCE_TEXT.items() if t == src), None)
    return {**ev, "source": code} if "source" in ev else dict(ev)


def hint_json(h: GpuHint) -> dict[str, object]:
    """A GPU hint as the HTTP API serves it, its observations worded."""
    return {"rank": h.rank, "node": h.node, "gpu": h.gpu, "placed": h.placed,
            "observations": gpu_observations(h), "evidence": dict(h.evidence),
            "items": [e.to_json() for e in h.items]}

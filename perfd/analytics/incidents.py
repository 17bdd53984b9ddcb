"""Incidents: stretches of iterations that depart from steady state, with who, why and what it cost.

A slow stretch (steps above ``STEP_FACTOR`` × the steady median), the iterations a perfd capture
disturbed, and a collective hang each become an incident: first and last iteration and their
times, the ranks involved, the time lost against the steady median (``cost_s`` = Σ(step − steady
median) over its iterations), and the evidence the run's own data gives (per-rank compute ratios,
straggler-detector lines). The live aggregator adds what only it saw then (the rank's GPU state,
processes sharing the GPU, collective waits, captures): perfd/aggregator/incidents.py.

Pure functions over the per-iteration results of perfd.analytics.megatron_job; no I/O.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from perfd.analytics.findings import Finding, Recommendation

STEP_FACTOR = 1.2  # a step this much above the steady median is part of an incident
STRAGGLER_STEP_FACTOR = 1.1  # a flagged straggler rank whose step is this much slower: part of one
MERGE_GAP = 2  # up to this many ordinary iterations inside one incident (it flickers)
MIN_COST_STEPS = 1.0  # a slow stretch is an incident once it cost this many steady steps (jitter is not)
MAX_INCIDENTS = 100  # kept per job (the costliest, then the newest)

SLOW = "slow-steps"
STRAGGLER = "straggler"
CAPTURE = "capture-disturbed"
HANG = "hang"


class IterationLike(Protocol):
    """What detection reads of an iteration (perfd.analytics.megatron_job.IterationResult)."""

    iteration: int
    step_time_ms: float | None
    straggler_candidate_ranks: list[int]
    straggler_rank_compute_ratio: dict[int, float]
    straggler_rtt_ratio: float | None
    straggler_rtt_max_rank: int | None
    straggler_between_stages: bool


# Those fields by name: a caller holding rows in columns builds only these (Table.project).
DETECTION_FIELDS: tuple[str, ...] = tuple(IterationLike.__annotations__)


@dataclass
class Incident:
    id: str
    first_iteration: int
    last_iteration: int
    kinds: list[str]
    ranks: list[int]  # the ranks the data names, most often named first
    n_iterations: int
    cost_s: float | None  # Σ(step − steady median); None without step times
    steady_step_ms: float | None
    median_step_ms: float | None
    max_step_ms: float | None
    start_time: float | None = None  # epoch s: the end of the iteration before the first
    end_time: float | None = None  # epoch s: the end of the last iteration
    open: bool = False  # the run's latest iteration is still part of it
    cause: str = ""  # one line: who and why, from the strongest evidence
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        if self.start_time is None or self.end_time is None:
            return None
        return self.end_time - self.start_time

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s}


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def detect_incidents(iterations: Sequence[IterationLike], end_times: Mapping[int, float | None],
                     disturbed: Mapping[int, bool], first_eligible: int,
                     reference_ms: float | None) -> tuple[list[Incident], float | None]:
    """Incidents among ``iterations`` (ordered; those before index ``first_eligible`` are warm-up),
    and the steady median step they were measured against. ``reference_ms`` is the window's
    median; it is re-taken without the slow iterations, so a long incident does not raise the bar
    it is measured by."""
    post = iterations[first_eligible:]  # a view of a long run's table: its rows are built one at a time
    ref = reference_ms
    if ref is None:
        ref = _median([it.step_time_ms for it in post if it.step_time_ms is not None])
    if ref is None:
        return [], None
    calm = [it.step_time_ms for it in post
            if it.step_time_ms is not None and it.step_time_ms <= STEP_FACTOR * ref]
    ref = _median(calm) or ref

    def flag(it: IterationLike) -> str | None:
        step = it.step_time_ms
        if disturbed.get(it.iteration):
            return CAPTURE
        if step is None:
            return None
        if step > STEP_FACTOR * ref:
            return SLOW
        if it.straggler_candidate_ranks and step > STRAGGLER_STEP_FACTOR * ref:
            return STRAGGLER
        return None

    runs: list[list[int]] = []  # indexes into post
    last_flag = -10**9
    for i, it in enumerate(post):
        if flag(it) is None:
            continue
        if runs and i - last_flag <= MERGE_GAP + 1:
            runs[-1].extend(range(last_flag + 1, i + 1))
        else:
            runs.append([i])
        last_flag = i
    out = [_incident([post[i] for i in run], ref, end_times, disturbed, flag,
                     is_open=run[-1] == len(post) - 1,
                     prev_end=end_times.get(post[run[0] - 1].iteration) if run[0] > 0 else None)
           for run in runs]
    out = [x for x in out if CAPTURE in x.kinds or (x.cost_s or 0.0) * 1e3 >= MIN_COST_STEPS * ref]
    out.sort(key=lambda x: x.first_iteration)
    if len(out) > MAX_INCIDENTS:  # keep the costliest; the report says how many were seen
        keep = sorted(out, key=lambda x: -(x.cost_s or 0.0))[:MAX_INCIDENTS]
        out = sorted(keep, key=lambda x: x.first_iteration)
    return out, ref


def _incident(its: Sequence[IterationLike], ref: float, end_times: Mapping[int, float | None],
              disturbed: Mapping[int, bool], flag: Any, is_open: bool,
              prev_end: float | None) -> Incident:
    steps = [it.step_time_ms for it in its if it.step_time_ms is not None]
    kinds = sorted({k for it in its if (k := flag(it)) is not None})
    named: Counter[int] = Counter()
    ratios: dict[int, float] = {}
    rtt_max: Counter[int] = Counter()
    for it in its:
        named.update(it.straggler_candidate_ranks)
        for r, v in it.straggler_rank_compute_ratio.items():
            ratios[r] = max(ratios.get(r, 0.0), v)
        if it.straggler_rtt_max_rank is not None and not it.straggler_between_stages and \
                (it.straggler_rtt_ratio or 0.0) > STRAGGLER_STEP_FACTOR:
            rtt_max[it.straggler_rtt_max_rank] += 1
    for r, n in rtt_max.items():
        named[r] += n
    # Per-rank timers are the most direct evidence: a flagged rank's compute ratio orders first.
    ranks = sorted(named, key=lambda r: (-(ratios.get(r, 0.0) if ratios.get(r, 0.0) > STRAGGLER_STEP_FACTOR
                                           else 0.0), -named[r], r))
    if ranks and STRAGGLER not in kinds:
        kinds.append(STRAGGLER)
    first, last = its[0].iteration, its[-1].iteration
    start = prev_end
    if start is None and end_times.get(first) is not None and its[0].step_time_ms is not None:
        start = float(end_times[first] or 0.0) - its[0].step_time_ms / 1e3
    cost = sum(s - ref for s in steps) / 1e3 if steps else None
    ev: dict[str, Any] = {
        "named_by_iterations": {str(r): named[r] for r in ranks},
        "rank_compute_ratio_max": {str(r): round(v, 4) for r, v in sorted(ratios.items())},
        "straggler_line_max_rank": {str(r): n for r, n in rtt_max.items()},
        "disturbed_by_capture": sum(1 for it in its if disturbed.get(it.iteration)),
        "source": "per-iteration analysis (Megatron timers, straggler detector)",
    }
    inc = Incident(f"inc-{first}", first, last, sorted(set(kinds)), ranks, len(its), cost, ref,
                   _median(steps), max(steps) if steps else None, start, end_times.get(last), is_open,
                   evidence=ev)
    inc.cause = cause_text(inc)
    return inc


def cause_text(inc: Incident, gpu_hint: str | None = None) -> str:
    """One line a person reads first: who, and why as far as the evidence goes."""
    slow = (f"steps {inc.median_step_ms / inc.steady_step_ms:.1f}× the steady median"
            if inc.median_step_ms and inc.steady_step_ms else "slow steps")
    if HANG in inc.kinds:
        return inc.cause + (f"; {gpu_hint}" if gpu_hint else "")
    if CAPTURE in inc.kinds and not inc.ranks:
        return f"perfd's own capture disturbed {inc.n_iterations} iteration(s) ({slow})"
    if inc.ranks:
        r = inc.ranks[0]
        ratio = inc.evidence.get("rank_compute_ratio_max", {}).get(str(r))
        what = (f"rank {r} computed up to {ratio:.2f}× its stage's median" if ratio
                else f"the straggler detector named rank {r} the slowest")
        return f"{what}; {slow}" + (f"; {gpu_hint}" if gpu_hint else "")
    return f"{slow}; no per-rank data names a rank (--timing-log-option all or --log-straggler would)" + (
        f"; {gpu_hint}" if gpu_hint else "")


def hang_incident(hang: Mapping[str, Any], last_iteration: int | None, now: float) -> Incident:
    """An incident from one merged collective hang (HangView JSON of
    perfd.analytics.collective_hangs): the job stopped after ``last_iteration``; its cost runs from
    when the op was enqueued until the hang resolved (or ``now`` while it is open)."""
    first = hang.get("first_reported")
    age = hang.get("age_at_first_report_s")
    start = float(first) - float(age or 0.0) if isinstance(first, (int, float)) else None
    resolved = bool(hang.get("resolved"))
    last = hang.get("last_reported")
    end = float(last) if resolved and isinstance(last, (int, float)) else None
    culprits = [int(r) for r in hang.get("ranks_not_joined") or [] if isinstance(r, int)]
    stuck = [int(r) for r in hang.get("stuck_ranks") or [] if isinstance(r, int)]
    it = (last_iteration + 1) if last_iteration is not None else 0
    cost = ((end if end is not None else now) - start) if start is not None else None
    inc = Incident(f"hang-{hang.get('process_group', '?')}-{hang.get('seq', it)}", it, it, [HANG],
                   culprits or stuck, 0, cost, None, None, None, start, end, not resolved,
                   evidence={"hang": dict(hang), "stuck_ranks": stuck, "ranks_not_joined": culprits,
                             "source": "collectors/nccl Flight Recorder hang detector"})
    inc.cause = (f"collective hang: {hang.get('op', 'a collective')} #{hang.get('seq', '?')} — "
                 + (f"rank(s) {', '.join(map(str, culprits))} never reached it" if culprits
                    else f"rank(s) {', '.join(map(str, stuck))} stuck in it"))
    return inc


def incident_findings(incidents: Sequence[Mapping[str, Any]], run_s: float | None
                      ) -> tuple[list[Finding], list[Recommendation]]:
    """One finding per incident (the JSON of :class:`Incident`, as analysed offline or as the live
    aggregator kept it with the GPU evidence of the time), with a recommendation whose impact is
    the share of the run it cost."""
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    for inc in incidents:
        first, last = inc.get("first_iteration"), inc.get("last_iteration")
        kinds, cost = list(inc.get("kinds") or []), inc.get("cost_s")
        lost = f"{cost:.1f} s lost" if isinstance(cost, (int, float)) else "time lost unknown"
        span = f"iteration {first}" if first == last else f"iterations {first}–{last}"
        dur = inc.get("duration_s")
        during = f" over {dur:.0f} s" if isinstance(dur, (int, float)) else ""
        fid = f"incident-{inc.get('id')}"
        ev = {k: v for k, v in (inc.get("evidence") or {}).items() if k != "source"}
        caps = inc.get("captures") or []
        cap_text = "".join(f" Capture {c.get('id')} ({c.get('tool')}, ranks {c.get('ranks')}) ran during it"
                           + (f": {c['findings'][0]['title']}" if c.get("findings") else "") + "."
                           for c in caps)
        steps = (f" {inc.get('n_iterations')} iteration(s); steady median {_ms(inc.get('steady_step_ms'))}, "
                 f"median during {_ms(inc.get('median_step_ms'))}, worst {_ms(inc.get('max_step_ms'))}. "
                 "Left out of the steady-state statistics." if inc.get("n_iterations") else "")
        fs.append(Finding(fid, "critical" if HANG in kinds else "warning",
                          f"Incident {span}: {lost}" + (" (still open)" if inc.get("open") else ""),
                          f"{inc.get('cause', '')}{during}.{steps}{cap_text}",
                          {"incident": inc.get("id"), "kinds": kinds, "ranks": inc.get("ranks") or [],
                           "cost_s": cost, **ev, "captures": caps},
                          span, str((inc.get("evidence") or {}).get("source", ""))))
        impact = (cost / run_s) if isinstance(cost, (int, float)) and run_s else None
        rs.append(Recommendation("", fid, 0, _action(inc), str(inc.get("cause", "")), impact))
    return fs, rs


def _action(inc: Mapping[str, Any]) -> str:
    kinds, ranks = inc.get("kinds") or [], list(inc.get("ranks") or [])
    if HANG in kinds:
        return ("Find why the named rank(s) never reached the collective (their last Flight Recorder "
                "entries, a dead process, a lost GPU); set a NCCL timeout so a hang fails fast")
    if CAPTURE in kinds and not ranks:
        return "Nothing to fix: perfd's capture cost this time; captures are rate-limited by the rules"
    gpu = (inc.get("evidence") or {}).get("gpu") or {}
    for r in [*map(str, ranks), *gpu]:
        g = gpu.get(r) or {}
        obs = " ".join(g.get("observations") or [])
        if "shares its GPU" in obs:
            return (f"Keep other processes off rank {r}'s GPU (exclusive-process compute mode, or the "
                    "scheduler's GPU isolation)")
        if "throttled" in obs or "below the job's median" in obs:
            return f"Check rank {r}'s GPU cooling, power and clocks ({obs})"
    if ranks:
        return (f"Check rank {ranks[0]}'s GPU: clocks, throttle reasons, other processes, XID errors "
                "(perfd's live view of the incident shows them); then uneven data or sharding")
    return "Look for host-side causes of the slow stretch: checkpointing, evaluation, other jobs on the node"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"

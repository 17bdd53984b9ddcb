"""Incidents: stretches of iterations that depart from steady state, with who, why and what it cost.

A slow stretch (steps above ``STEP_FACTOR`` × the steady median), the iterations a perfd capture
disturbed, and a collective hang each become an incident: first and last iteration and their
times, the ranks involved, the time lost against the steady median (``cost_s`` = Σ(step − steady
median) over its iterations), and the evidence the run's own data gives (per-rank compute ratios,
straggler-detector lines). The live aggregator adds what only it saw then (the rank's GPU state,
processes sharing the GPU, collective waits, captures): perfd/aggregator/incidents.py.

Pure functions over the per-iteration results of perfd.analytics.run.run_analysis; no I/O.
"""

from __future__ import annotations

import enum
import itertools
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from perfd.analytics import thresholds as th
from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.finding_types import Finding
from perfd.analytics.incidents.after_capture import since_capture
from perfd.analytics.incidents.cadence import CadencePause, Pause, find_cadences, outside_explains
from perfd.analytics.incidents.evidence import (
    Evidence,
    EvidenceKind,
    Missing,
    Verdict,
    decide,
)
from perfd.analytics.incidents.incident_evidence import EvidenceSource, IncidentEvidence, LevelShift, as_kept
from perfd.analytics.incidents.split import split_by_cause
from perfd.analytics.incidents.stall import StallCheck, StallSeen, silence_cost_s
from perfd.analytics.steps import windows
from perfd.analytics.steps.changepoint import accept, find_change_point

STEP_FACTOR = th.STEP_FACTOR.value  # a step this much above the steady median starts an incident
STRAGGLER_STEP_FACTOR = 1.1  # a flagged straggler rank whose step is this much slower: part of one
MERGE_GAP = 2  # up to this many ordinary iterations inside one incident (it flickers)
MIN_COST_STEPS = th.INCIDENT_MIN_COST_STEPS.value
MIN_COST_S = th.INCIDENT_MIN_COST_S.value
MERGE_FRACTION = th.INCIDENT_MERGE_FRACTION.value
EXPLAINS_SHARE = th.EXPLAINS_SHARE.value
MAX_INCIDENTS = 100  # kept per job (the costliest, then the newest)


class CaptureDuring(Protocol):
    """A capture that ran during an incident, as the live aggregator kept it with the incident
    (perfd/aggregator/capture_records.CaptureSeen)."""

    @property
    def id(self) -> str: ...

    @property
    def tool(self) -> str: ...

    @property
    def ranks(self) -> Sequence[int] | None: ...

    @property
    def started_at(self) -> float | None: ...

    @property
    def findings(self) -> Sequence[Finding]: ...


class IncidentKind(str, enum.Enum):
    """What made iterations part of an incident (a closed set; JSON carries the value)."""

    SLOW = "slow-steps"
    STRAGGLER = "straggler"
    CAPTURE = "capture-disturbed"
    HANG = "hang"
    LEVEL_SHIFT = "level-shift"  # a lasting shift: perfd.analytics.steps.changepoint
    STALL = "stall"  # no step for a while, corroborated live (perfd.analytics.incidents.stall)


SLOW, STRAGGLER, CAPTURE, HANG, LEVEL_SHIFT, STALL = (k.value for k in IncidentKind)


class IterationLike(Protocol):
    """What detection reads of an iteration (perfd.analytics.run.run_analysis.IterationResult)."""

    iteration: int
    step_time_ms: float | None
    data_share: float | None
    outside_share: float | None  # the step hook's time between the steps: a pause's (cadence)
    comm_exposed_share: float | None
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
    cost_s: float | None  # Σ(step − steady median); a captured iteration counts up to the incident's level
    steady_step_ms: float | None
    median_step_ms: float | None
    max_step_ms: float | None
    start_time: float | None = None  # epoch s: the end of the iteration before the first
    end_time: float | None = None  # epoch s: the end of the last iteration
    open: bool = False  # the run's latest iteration is still part of it
    # The line an older perfd recorded (read back from the aggregator's state) and nothing else: a
    # fresh incident's line is worded where it is shown, from its typed values
    # (perfd.report.incident_text.cause_line).
    cause: str = ""
    evidence: IncidentEvidence = field(default_factory=IncidentEvidence)
    verdict: Verdict | None = None  # None: not decided yet (a hang's or a stall's, before the tracker)
    capture_cost_s: float | None = None  # what captured iterations took beyond the incident's own level
    single_rank: bool = False  # the job has one rank: it is the one
    cpu_only: bool = False  # the job computes on CPUs (perfd.core.model.JobInfo.device): no GPU is missing

    @property
    def duration_s(self) -> float | None:
        if self.start_time is None or self.end_time is None:
            return None
        return self.end_time - self.start_time

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "first_iteration": self.first_iteration, "last_iteration": self.last_iteration,
                "kinds": list(self.kinds), "ranks": list(self.ranks), "n_iterations": self.n_iterations,
                "cost_s": self.cost_s, "steady_step_ms": self.steady_step_ms,
                "median_step_ms": self.median_step_ms, "max_step_ms": self.max_step_ms,
                "start_time": self.start_time, "end_time": self.end_time, "open": self.open,
                "cause": self.cause,
                "evidence": self.evidence_json(),
                "verdict": self.verdict.to_json() if self.verdict is not None else {},
                "capture_cost_s": self.capture_cost_s, "single_rank": self.single_rank,
                "cpu_only": self.cpu_only, "duration_s": self.duration_s}

    def evidence_json(self) -> dict[str, object]:
        """The evidence as served (a stall's own has always opened with the stall)."""
        return self.evidence.to_json(stall_first=self.kinds == [STALL])

    # What makes it a ReportedIncident (perfd.report.incident_findings): offline it is all there
    # is, and no capture is known.
    @property
    def incident(self) -> Incident:
        return self

    @property
    def captures(self) -> Sequence[CaptureDuring]:
        return ()

    def observed(self) -> list[Evidence]:
        """The typed items the incident's steps show, as the incident keeps them."""
        return [as_kept(e) for e in self.evidence.observed or ()]


@dataclass
class Detection:
    """What detect_incidents found: incidents, perfd's own capture disturbances (listed apart,
    never an incident), the jitter below the incident floor, and the steady median used."""

    incidents: list[Incident]
    disturbances: list[Incident]
    jitter: dict[str, float | None]  # n, iterations, cost_s, floor_s, worst_ratio
    reference_ms: float | None
    # the loop's own pauses at a cadence (perfd.analytics.incidents.cadence): neither incidents nor jitter
    pauses: list[CadencePause] = field(default_factory=list)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _part_ms(it: IterationLike, share: float | None) -> float | None:
    return share * it.step_time_ms if share is not None and it.step_time_ms is not None else None


def min_cost_s(ref_ms: float) -> float:
    """The incident floor: max(MIN_COST_STEPS steady steps, MIN_COST_S)."""
    return max(MIN_COST_STEPS * ref_ms / 1e3, MIN_COST_S)


def detect_incidents(iterations: Sequence[IterationLike], end_times: Mapping[int, float | None],
                     disturbed: Mapping[int, bool], first_eligible: int,
                     reference_ms: float | None, world_size: int | None = None,
                     new_normal_at: int | None = None, steps: Sequence[float | None] | None = None,
                     work: Sequence[float | None] | None = None, cpu_only: bool = False) -> Detection:
    """Incidents among ``iterations`` (ordered; those before index ``first_eligible`` are warm-up),
    and the steady median step they were measured against. ``reference_ms`` is the window's
    median; it is re-taken without the slow iterations, so a long incident does not raise the bar
    it is measured by. Steps above STEP_FACTOR × the median form stretches (MERGE_GAP ordinary steps
    may flicker within one); stretches naming the same rank merge across gaps short against their
    length; a stretch whose steps change cause is an incident per cause
    (perfd.analytics.incidents.split); an incident costs at least :func:`min_cost_s` — smaller
    departures are counted as jitter.
    A lasting shift (perfd.analytics.steps.changepoint) is one incident of kind ``level-shift`` measured
    against the level before it, to the end or to ``new_normal_at`` (the user took the new level as
    the new normal there: from it on that level is the reference). ``steps``: the step times from
    ``first_eligible`` on, None where disturbed, when the caller holds them as a column (a pass over
    ``iterations`` builds every row); ``work``: their sizes (FLOPs) where steps differ by design;
    ``cpu_only``: the job computes on CPUs (its GPU is never a missing input).

    Departures are judged on the rolling mean of :data:`perfd.analytics.steps.windows.WINDOW` steps per
    unit of work, not on single steps: a regular pattern (a two-worker loader's alternating waits,
    batches of different lengths) never opens an incident, and a change in rate opens one within
    half a window of where it starts; its edges are then trimmed to the first and last step that is
    itself slow, and its cost is each step's excess over the steady rate for its size."""
    post = iterations[first_eligible:]  # a view of a long run's table: its rows are built one at a time
    if steps is None:
        steps = [None if disturbed.get(it.iteration) else it.step_time_ms for it in post]
    sized = windows.per_work(steps, work)
    scale = [s / z if s is not None and z is not None and z > 0 else 1.0
             for s, z in zip(steps, sized, strict=True)]
    smooth = windows.rolling(sized)
    shift = find_change_point(sized)
    if shift is not None:
        shift = accept(shift, [it.iteration for it in post], new_normal_at)
    # A first guess of the steady level that a long slowdown does not lift: the lower quartile of the
    # windows (the steady state's median is between the two levels once a slowdown covers half the run)
    guess = windows.reference(sized, quantile=0.25)
    if shift is not None:
        ref: float | None = shift.before_ms
    elif reference_ms is not None and guess is not None:
        ref = min(reference_ms, guess)
    else:
        ref = reference_ms if reference_ms is not None else guess
    if ref is None:
        return Detection([], [], {"n": 0, "cost_s": None}, None)
    shifted = range(0) if shift is None else range(shift.index, shift.accepted_index or len(post))
    # From where the user took the shift's level as the new normal, that level is the reference.
    normal_from = shift.accepted_index if shift is not None else None
    new_level = shift.after_ms if shift is not None else ref
    # The steady reference anew over the calm windows (a long incident does not raise the bar it is
    # measured by): windows clear of the bar, half a window away from any step above it.
    near = {j for i, z in enumerate(sized) if z is not None and (smooth[i] or 0.0) > STEP_FACTOR * ref
            for j in range(i - windows.WINDOW // 2, i + windows.WINDOW // 2 + 1)}
    calm = [i for i, z in enumerate(sized)
            if z is not None and i not in near and (shift is None or i < shift.index)]
    ref = _median([m for i in calm if (m := smooth[i]) is not None]) or ref
    calm_its = [post[i] for i in calm]
    calm_steps = [it.step_time_ms for it in calm_its]
    steady_shares = (windows.weighted([it.data_share for it in calm_its], calm_steps),
                     windows.weighted([it.comm_exposed_share for it in calm_its], calm_steps))
    steady_parts = (steady_shares[0] * ref if steady_shares[0] is not None else None,
                    steady_shares[1] * ref if steady_shares[1] is not None else None)

    flags: list[str | None] = []
    for i, it in enumerate(post):
        step, mean = sized[i], smooth[i]
        f: str | None = None
        level = new_level if normal_from is not None and i >= normal_from else ref
        if disturbed.get(it.iteration):
            f = CAPTURE
        elif i in shifted:
            f = LEVEL_SHIFT
        elif step is not None and mean is not None and mean > STEP_FACTOR * level and step > level:
            f = SLOW
        elif (step is not None and mean is not None and it.straggler_candidate_ranks
              and min(step, mean) > STRAGGLER_STEP_FACTOR * level):  # the window too: one noisy step is not
            f = STRAGGLER
        flags.append(f)
    # The rolling mean crosses the bar up to half a window after a change in rate begins (and stops
    # crossing before it ends): a slow stretch takes in the slow steps just before and after it.
    reach = windows.WINDOW // 2
    slow = [i for i, f in enumerate(flags) if f == SLOW]
    for i in slow:
        for j in (*range(i - 1, max(-1, i - 1 - reach), -1), *range(i + 1, min(len(post), i + 1 + reach))):
            z = sized[j]
            level = new_level if normal_from is not None and j >= normal_from else ref
            if flags[j] is None and z is not None and z > STEP_FACTOR * level:
                flags[j] = SLOW

    runs: list[list[int]] = []  # indexes into post
    last_flag = -10**9
    for i, f in enumerate(flags):
        if f is None:
            continue
        if runs and i - last_flag <= MERGE_GAP + 1:
            runs[-1].extend(range(last_flag + 1, i + 1))
        else:
            runs.append([i])
        last_flag = i
    # A window over the bar reaches half a window past the slow steps it holds: a stretch starts and
    # ends at a step that is itself slow (within a step of the truth for an alternating series).
    def itself_slow(i: int) -> bool:
        z = sized[i]
        level = new_level if normal_from is not None and i >= normal_from else ref
        return flags[i] not in (None, SLOW) or (z is not None and z > STEP_FACTOR * level)

    for r in runs:
        while r and not itself_slow(r[-1]):
            r.pop()
        while r and not itself_slow(r[0]):
            r.pop(0)
    runs = [r for r in runs if r]
    real = [r for r in runs if any(flags[i] not in (None, CAPTURE) for i in r)]
    captures = [r for r in runs if r not in real]
    for r in real:  # a capture at the head of a stretch is a disturbance of its own, then the stretch
        head = list(itertools.takewhile(lambda i: flags[i] in (CAPTURE, None), r))
        if head and any(flags[i] == CAPTURE for i in head):
            captures.append([i for i in head if flags[i] == CAPTURE])
            del r[:len(head)]
    captures.sort()
    real = _merge_same_cause(post, real, flags)

    # Steps of different causes in one stretch (a data slowdown that ran into load-slowed steps) are
    # an incident each (perfd.analytics.incidents.split); a lasting shift is one level, never split.
    def by_cause(run: list[int]) -> list[list[int]]:
        if any(flags[i] == LEVEL_SHIFT for i in run):
            return [run]
        excess = {i: None if (z := sized[i]) is None
                  else (z - (new_level if normal_from is not None and i >= normal_from else ref)) * scale[i]
                  for i in run}
        growth = [{i: None if (pm := _part_ms(post[i], getattr(post[i], attr))) is None
                   else pm - (steady_ms or 0.0) for i in run}
                  for steady_ms, attr in ((steady_parts[0], "data_share"),
                                          (steady_parts[1], "comm_exposed_share"))]
        return split_by_cause(run, excess, growth, min_cost_s(ref) * 1e3)

    real = [piece for r in real for piece in by_cause(r)]

    def build(run: list[int]) -> Incident:
        level = new_level if normal_from is not None and run[0] >= normal_from else ref
        inc = _incident([post[i] for i in run], [flags[i] for i in run], level, end_times, disturbed,
                        [scale[i] for i in run], is_open=run[-1] == len(post) - 1,
                        prev_end=end_times.get(post[run[0] - 1].iteration) if run[0] > 0 else None,
                        steady_parts=steady_parts, steady_shares=steady_shares, world_size=world_size,
                        cpu_only=cpu_only)
        if shift is not None and LEVEL_SHIFT in inc.kinds:
            inc.kinds = sorted({*inc.kinds, SLOW})  # still slow steps: the tracker matches it by kind too
            accepted = post[shift.accepted_index].iteration if shift.accepted_index is not None else None
            shifted_at = post[shift.index].iteration
            inc.evidence = replace(inc.evidence, change_point=LevelShift.of(shift, shifted_at, accepted))
        before = [c for c in captures if c[-1] < run[0] <= c[-1] + MERGE_GAP + 1]
        # else: a capture since which the steps never came back to their pace (its cost outlasting it)
        since = None if before else since_capture(captures, run[0], sized)
        if (before or since is not None) and flags[run[0]] != CAPTURE:
            c = before[-1] if before else since.capture if since is not None else []
            detail: dict[str, object] = {"capture_first": post[c[0]].iteration,
                                         "capture_last": post[c[-1]].iteration}
            if since is not None:
                detail |= {"before_ms": since.before_ms, "since_ms": since.since_ms}
            ev = Evidence(EvidenceKind.AFTER_CAPTURE, inc.ranks[0] if inc.ranks else None, "",
                          (inc.median_step_ms or 0.0) / ref if since is None else since.ratio,
                          inc.start_time, inc.end_time, inc.n_iterations, detail)
            inc.evidence = replace(inc.evidence, observed=(*(inc.evidence.observed or ()), ev))
            prior = inc.verdict
            verdict = decide(inc.observed(), inc.ranks, prior.missing if prior is not None else ())
            inc.verdict = verdict
        return inc

    floor = min_cost_s(ref)
    built = [(r, build(r)) for r in real]
    pauses = find_cadences(_pauses(built, post), post[-1].iteration if len(post) else None)
    out, small = [], []
    within: list[tuple[list[int], str]] = []  # a capture's steps inside an incident, and its id
    for r, inc in built:
        if any(c.covers(inc.first_iteration) for c in pauses):
            continue  # the loop's own pause at its cadence: named as such, neither incident nor jitter
        if (inc.cost_s or 0.0) >= floor:
            out.append(inc)
            # Listed as the capture's too (an ncu range inside the armed rank's level shift, on the
            # H100: the incident was the arming's and went, and the range was listed nowhere); its
            # time is the incident's capture_cost_s, counted there once.
            touched = [i for i in r if flags[i] == CAPTURE]
            for _, grp in itertools.groupby(enumerate(touched), key=lambda x: x[1] - x[0]):
                within.append(([i for _, i in grp], inc.id))
            continue
        small.append(inc)  # jitter; the part a capture touched is still listed as its disturbance
        touched = [i for i in r if flags[i] == CAPTURE]
        for _, grp in itertools.groupby(enumerate(touched), key=lambda x: x[1] - x[0]):
            captures.append([i for _, i in grp])
    captures.sort()
    jitter = {"n": len(small), "iterations": sum(x.n_iterations for x in small),
              "cost_s": sum(x.cost_s or 0.0 for x in small) if small else None,
              "floor_s": floor,
              "worst_ratio": max((x.max_step_ms or 0.0) / ref for x in small) if small else None}
    if len(out) > MAX_INCIDENTS:  # keep the costliest; the report says how many were seen
        keep = sorted(out, key=lambda x: -(x.cost_s or 0.0))[:MAX_INCIDENTS]
        out = sorted(keep, key=lambda x: x.first_iteration)
    inside = []
    for run, inc_id in within:
        d = build(run)
        d.evidence = replace(d.evidence, inside_incident=inc_id)
        inside.append(d)
    return Detection(out, sorted([*(build(r) for r in captures), *inside], key=lambda d: d.first_iteration),
                     jitter, ref, pauses)


def _pauses(built: Sequence[tuple[list[int], Incident]], post: Sequence[IterationLike]) -> list[Pause]:
    """The slow stretches that are pauses between the steps (perfd.analytics.incidents.cadence): a step
    or two of slow steps only, whose excess lies outside the step."""
    out = []
    for r, inc in built:
        if not set(inc.kinds) <= {SLOW, STRAGGLER} or inc.cost_s is None:
            continue
        if outside_explains([post[i].step_time_ms for i in r], [post[i].outside_share for i in r],
                            inc.cost_s * 1e3):
            out.append(Pause(inc.first_iteration, inc.cost_s, inc.start_time, inc.end_time,
                             inc.last_iteration))
    return out


def _lead_rank(its: Sequence[IterationLike]) -> int | None:
    named: Counter[int] = Counter()
    for it in its:
        named.update(it.straggler_candidate_ranks)
    return named.most_common(1)[0][0] if named else None


def _merge_same_cause(post: Sequence[IterationLike], runs: list[list[int]],
                      flags: Sequence[str | None]) -> list[list[int]]:
    """Neighbouring stretches that name the same rank (or none) merge across a gap up to
    MERGE_FRACTION of the shorter one's length: one lasting episode, not fragments (and a lone noisy
    step near a long stretch does not stretch it)."""
    out: list[list[int]] = []
    for run in runs:
        if out:
            prev = out[-1]
            gap = run[0] - prev[-1] - 1
            same = _lead_rank([post[i] for i in prev]) == _lead_rank([post[i] for i in run])
            if same and gap <= MERGE_FRACTION * min(len(prev), len(run)):
                prev.extend(range(prev[-1] + 1, run[-1] + 1))
                continue
        out.append(list(run))
    return out


def _incident(its: Sequence[IterationLike], flags: Sequence[str | None], ref: float,
              end_times: Mapping[int, float | None], disturbed: Mapping[int, bool], sizes: Sequence[float],
              is_open: bool,
              prev_end: float | None, steady_parts: tuple[float | None, float | None],
              steady_shares: tuple[float | None, float | None], world_size: int | None,
              cpu_only: bool = False) -> Incident:
    own = [it for it in its if not disturbed.get(it.iteration)]
    size = {it.iteration: z for it, z in zip(its, sizes, strict=True)}
    # each step against the steady rate for its size (a step of twice the work takes twice as long)
    steps = [it.step_time_ms / size[it.iteration] for it in own if it.step_time_ms is not None]
    weights = [size[it.iteration] for it in own if it.step_time_ms is not None]
    touched = [it.step_time_ms for it in its if disturbed.get(it.iteration) and it.step_time_ms is not None]
    kinds = sorted({f for f in flags if f is not None})
    named: Counter[int] = Counter()
    ratios: dict[int, float] = {}
    rtt_max: Counter[int] = Counter()
    seen: dict[tuple[EvidenceKind, int], list[float]] = {}  # (kind, rank) -> end times seen
    for it in own:
        t = end_times.get(it.iteration)
        named.update(it.straggler_candidate_ranks)
        for r, v in it.straggler_rank_compute_ratio.items():
            ratios[r] = max(ratios.get(r, 0.0), v)
            if v > STRAGGLER_STEP_FACTOR and t is not None:
                seen.setdefault((EvidenceKind.RANK_COMPUTE_RATIO, r), []).append(t)
        if it.straggler_rtt_max_rank is not None and not it.straggler_between_stages and \
                (it.straggler_rtt_ratio or 0.0) > STRAGGLER_STEP_FACTOR:
            rtt_max[it.straggler_rtt_max_rank] += 1
            if t is not None:
                seen.setdefault((EvidenceKind.STRAGGLER_LINE, it.straggler_rtt_max_rank), []).append(t)
    for r, n in rtt_max.items():
        named[r] += n
    # Per-rank timers are the most direct evidence: a flagged rank's compute ratio orders first.
    ranks = sorted(named, key=lambda r: (-(ratios.get(r, 0.0) if ratios.get(r, 0.0) > STRAGGLER_STEP_FACTOR
                                           else 0.0), -named[r], r))
    single = world_size == 1
    if not ranks and single:
        ranks = [0]
    if ranks and STRAGGLER not in kinds and not single:
        kinds.append(STRAGGLER)
    items: list[Evidence] = []
    for r, v in ratios.items():
        if v > STRAGGLER_STEP_FACTOR:
            ts = seen.get((EvidenceKind.RANK_COMPUTE_RATIO, r), [])
            items.append(Evidence(EvidenceKind.RANK_COMPUTE_RATIO, r, "", v, min(ts, default=None),
                                  max(ts, default=None), max(len(ts), 1)))
    for r, n in rtt_max.items():
        ts = seen.get((EvidenceKind.STRAGGLER_LINE, r), [])
        items.append(Evidence(EvidenceKind.STRAGGLER_LINE, r, "", float(n), min(ts, default=None),
                              max(ts, default=None), n))
    excess = _median([s - ref for s in steps])
    for kind, steady_ms, steady_share, attr in (
            (EvidenceKind.DATA_WAIT, steady_parts[0], steady_shares[0], "data_share"),
            (EvidenceKind.EXPOSED_COMM, steady_parts[1], steady_shares[1], "comm_exposed_share")):
        during = [(pm, getattr(it, attr)) for it in own
                  if (pm := _part_ms(it, getattr(it, attr))) is not None]
        grew = _median([v for v, _ in during])
        explains = grew is not None and excess and grew - (steady_ms or 0.0) >= EXPLAINS_SHARE * excess
        # Or by its share of the cost: a stretch that ran into later slow steps of another kind
        # (a loaded host) is one incident whose median step is not data-bound, yet the data wait
        # can still be most of what the incident lost.
        grew_total = sum(pm - (steady_ms or 0.0) for pm, _ in during)
        excess_total = sum((s - ref) * w for s, w in zip(steps, weights, strict=True))
        explains = explains or (excess_total > 0 and grew_total >= EXPLAINS_SHARE * excess_total)
        if excess and excess > 0 and explains:
            ts = [t for it in own if (t := end_times.get(it.iteration)) is not None]
            items.append(Evidence(kind, ranks[0] if single else None, "", max(s for _, s in during),
                                  min(ts, default=None), max(ts, default=None), len(during),
                                  {"steady": steady_share, "grew_ms": (grew or 0.0) - (steady_ms or 0.0),
                                   "excess_ms": excess}))
    missing = [] if ranks else [Missing.PER_RANK_TIMERS]
    verdict = decide(items, ranks, missing if cpu_only else [*missing, Missing.GPU_STATE])
    first, last = its[0].iteration, its[-1].iteration
    start = prev_end
    if start is None and end_times.get(first) is not None and its[0].step_time_ms is not None:
        start = float(end_times[first] or 0.0) - its[0].step_time_ms / 1e3
    # A perfd capture inside the incident: its iterations count as lost up to the incident's own
    # level (the co-tenant slowed them too), and only what they took beyond it is the capture's.
    level = max(_median(steps) or ref, ref)
    cost = (sum((s - ref) * w for s, w in zip(steps, weights, strict=True))
            + sum(min(s, level) - ref for s in touched)) / 1e3 if steps or touched else None
    capture_cost = sum(max(s - level, 0.0) for s in touched) / 1e3 if touched else None
    ev = IncidentEvidence(
        named_by_iterations={r: named[r] for r in ranks if r in named},
        rank_compute_ratio_max={r: round(v, 4) for r, v in sorted(ratios.items())},
        straggler_line_max_rank=dict(rtt_max), disturbed_by_capture=len(its) - len(own),
        observed=tuple(items),
        source=EvidenceSource.STEPS)
    all_steps = steps + touched
    inc = Incident(id=f"inc-{first}", first_iteration=first, last_iteration=last, kinds=sorted(set(kinds)),
                   ranks=ranks, n_iterations=len(its), cost_s=cost, steady_step_ms=ref,
                   median_step_ms=_median(steps or all_steps),
                   max_step_ms=max(all_steps) if all_steps else None,
                   start_time=start, end_time=end_times.get(last), open=is_open, evidence=ev, verdict=verdict,
                   capture_cost_s=capture_cost, single_rank=single, cpu_only=cpu_only)
    return inc


def hang_incident(hang: HangView, last_iteration: int | None, now: float) -> Incident:
    """An incident from one merged collective hang (perfd.analytics.collectives.collective_hangs): the job
    stopped after ``last_iteration``; its cost runs from when the op was enqueued until the hang
    resolved (or ``now`` while it is open)."""
    start = float(hang.first_reported) - float(hang.age_at_first_report_s or 0.0)
    end = float(hang.last_reported) if hang.resolved else None
    culprits, stuck = list(hang.ranks_not_joined), list(hang.stuck_ranks)
    it = (last_iteration + 1) if last_iteration is not None else 0
    cost = (end if end is not None else now) - start
    return Incident(id=f"hang-{hang.process_group}-{hang.seq}", first_iteration=it,
                    last_iteration=it, kinds=[HANG], ranks=culprits or stuck, n_iterations=0, cost_s=cost,
                    steady_step_ms=None, median_step_ms=None, max_step_ms=None, start_time=start,
                    end_time=end,
                    open=not hang.resolved,
                    evidence=IncidentEvidence(hang=hang, stuck_ranks=tuple(stuck),
                                              ranks_not_joined=tuple(culprits),
                                               source=EvidenceSource.NCCL_HANG))


def stall_incident(check: StallCheck, first_iteration: int, last_iteration: int, started_at: float | None,
                   opened_at: float, closed_at: float | None, single_rank: bool = False,
                   extra: Mapping[str, object] | None = None, cpu_only: bool = False) -> Incident:
    """The incident of a live stall (perfd.analytics.incidents.stall): the iterations the job was on when it
    stopped (while open, the one record after its last, ``last_iteration`` covering a log interval;
    once closed, up to the newest the records that ended it reached: steps done before the stop can
    arrive after it, held in the stopped process), its ranks (the stuck ones first), its cost so far
    (the silence beyond one usual interval), open until steps resume. ``extra``: what the aggregator
    gathered for it (stacks, each rank's last collective)."""
    stall = StallSeen(check, opened_at, closed_at, dict(extra or {}))
    return Incident(id=f"stall-{first_iteration}", first_iteration=first_iteration,
                    last_iteration=max(first_iteration, last_iteration), kinds=[STALL],
                    ranks=list(check.stuck_ranks), n_iterations=0, cost_s=silence_cost_s(stall) or 0.0,
                    steady_step_ms=None, median_step_ms=None, max_step_ms=None, start_time=started_at,
                    end_time=closed_at, open=closed_at is None,
                    evidence=IncidentEvidence(
                        stall=stall,
                        source=EvidenceSource.LIVE_STALL),
                    single_rank=single_rank, cpu_only=cpu_only)

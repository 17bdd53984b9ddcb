"""What arming Nsight Compute costs a rank, measured.

A rank under ``ncu --profile-from-start off`` pays on every kernel launch for the life of its process,
profiled or not (perfd.capture.ncu_exec: ~80 µs a launch on the H100; a 12-layer Megatron-LM step went
from 548 to 853 ms). ``perfd ncu-prefix`` estimates that cost before the rank starts, from the job's
latest timeline (launches per step × the measured cost of one); once the rank runs armed, the job's own
step records measure it:

- against the job's own steps before it was armed (a run of the same job before it was restarted under
  ncu): the clean comparison, same ranks, same work;
- else against its unarmed ranks over the same time (per-rank records, the step hook's). Where the
  ranks synchronise every step (data-parallel gradients), an unarmed rank waits for the armed one and
  steps at its pace: the comparison then reads little or no cost — said with the basis, never hidden.

Steps a capture touched (``disturbed_by_capture``, and any that end inside ``exclude``) are left out on
both sides: an ncu range holds its step for tens of seconds and is the capture's, not the arming's.
Pure: the caller hands in the records it holds and when each rank was armed.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfd.analytics import thresholds as th
from perfd.analytics.incidents.detect import CAPTURE, LEVEL_SHIFT, SLOW, Incident
from perfd.analytics.run.runs import RunDigest
from perfd.core.model import StepRecord
from perfd.core.record_json import JsonRecord, written_after

MIN_STEPS = int(th.ARMING_MIN_STEPS.value)


class ArmingBasis(str, enum.Enum):
    """What the armed rank's steps were measured against."""

    EARLIER_STEPS = "earlier_steps"  # the job's own steps before the rank was armed
    UNARMED_RANKS = "unarmed_ranks"  # the job's other ranks over the same time
    # The job's previous run without an armed rank (perfd.analytics.run.runs.RunDigest): its steady
    # steps, or where they are too few its captures' steps. The clean comparison after a restart under
    # ncu: same job, same work, the earlier records replaced by the armed run's.
    PREVIOUS_RUN = "previous_run"
    PREVIOUS_RUN_CAPTURE = "previous_run_capture"


@dataclass(frozen=True)
class ArmingCost(JsonRecord):
    basis: ArmingBasis
    ranks: tuple[int, ...]  # the armed ranks
    armed_ms: float  # median step of the armed steps
    reference_ms: float  # median step of the reference
    n_armed: int
    n_reference: int
    first_iteration: int | None = None  # the first armed step measured
    run: int | None = None  # the job's run the armed steps are of (perfd.analytics.run.runs)
    reference_run: int | None = None  # ... and the run of the reference (PREVIOUS_RUN*)

    @property
    @written_after("n_reference")
    def extra_ms(self) -> float:
        return self.armed_ms - self.reference_ms

    @property
    @written_after("n_reference")
    def ratio(self) -> float:
        return self.armed_ms / self.reference_ms if self.reference_ms > 0 else float("nan")


def _start(r: StepRecord) -> float | None:
    if r.end_time is None or r.step_time_ms is None:
        return None
    return r.end_time - r.step_time_ms / 1e3


def _clean(r: StepRecord, exclude: Sequence[tuple[float, float]]) -> bool:
    if r.step_time_ms is None or r.end_time is None or r.disturbed_by_capture or r.step_time_ms <= 0:
        return False
    s = _start(r)
    return not any(s is not None and a <= r.end_time and s <= b for a, b in exclude)


def measure_arming(records: Sequence[StepRecord], armed_at: Mapping[int, float],
                   exclude: Sequence[tuple[float, float]] = ()) -> ArmingCost | None:
    """The arming cost of the ranks in ``armed_at`` (rank -> when its process started under ncu,
    epoch s) from the job's step records (per rank, or job-level: ``rank`` not an int); ``exclude``:
    (start, end) windows of captures whose steps are left out. None when neither basis has
    MIN_STEPS steps on both sides."""
    if not armed_at:
        return None
    since = min(armed_at.values())
    ranks = tuple(sorted(armed_at))
    clean = [r for r in records if _clean(r, exclude)]
    per_rank = [r for r in clean if isinstance(r.rank, int)]
    # The armed steps: the armed ranks' own records where there are some, else the job's (a job-level
    # record of a one-rank job, or a log rank 0 writes, is the armed rank's step).
    own = [r for r in per_rank if r.rank in armed_at and (_start(r) or 0.0) >= armed_at[int(r.rank)]]
    if not own:
        own = [r for r in clean if not isinstance(r.rank, int) and (_start(r) or 0.0) >= since]
    before = [r for r in clean if r.end_time is not None and r.end_time <= since]
    others = [r for r in per_rank if r.rank not in armed_at and (_start(r) or 0.0) >= since]
    armed_steps = [float(r.step_time_ms or 0.0) for r in own]
    for basis, ref in ((ArmingBasis.EARLIER_STEPS, before), (ArmingBasis.UNARMED_RANKS, others)):
        ref_steps = [float(r.step_time_ms or 0.0) for r in ref]
        if len(armed_steps) >= MIN_STEPS and len(ref_steps) >= MIN_STEPS:
            return ArmingCost(basis, ranks, statistics.median(armed_steps), statistics.median(ref_steps),
                              len(armed_steps), len(ref_steps), min(r.iteration for r in own))
    return None




def against_run(armed_steps: Sequence[float], first_iteration: int | None, run: int, ref: RunDigest,
                ranks: Sequence[int] = ()) -> ArmingCost | None:
    """The arming cost of run ``run``, whose armed steps (those that would be steady: warm-up, capture
    and outliers left out) are ``armed_steps``, against ``ref``, an earlier run of the job without an
    armed rank: its steady steps' median, else its captures' steps (ArmingBasis.PREVIOUS_RUN_CAPTURE).
    None when the armed steps or the reference are fewer than MIN_STEPS."""
    if len(armed_steps) < MIN_STEPS:
        return None
    armed = statistics.median(armed_steps)
    if ref.step_median_ms is not None and ref.n_steady >= MIN_STEPS:
        return ArmingCost(ArmingBasis.PREVIOUS_RUN, tuple(ranks), armed, ref.step_median_ms, len(armed_steps),
                          ref.n_steady, first_iteration, run, ref.run)
    captured = ref.capture_median_ms()
    n_captured = sum(c.last_iteration - c.first_iteration + 1 for c in ref.captures if c.step_ms is not None)
    if captured is not None and n_captured >= MIN_STEPS:
        return ArmingCost(ArmingBasis.PREVIOUS_RUN_CAPTURE, tuple(ranks), armed, captured, len(armed_steps),
                          n_captured, first_iteration, run, ref.run)
    return None


def is_the_arming(inc: Incident, arming: ArmingCost | None) -> bool:
    """Whether an incident the analysis found is the arming itself: slow steps (a level shift, most
    often) of the armed ranks only, beginning at the first armed step (within two). On the H100 the
    armed rank of a 12-layer Megatron-LM job stepped 2.4x slower for the rest of its life and was
    opened as 'level-shift, not explained'; the report states that cost as the arming's
    (ArmingCost.text), so it is not an incident too. A slowdown that begins later while armed is
    still one when it stands apart; one that falls inside the armed level shift (open to the end) goes
    with it: an armed rank is a diagnosis session, its steps are not the job's steady state."""
    if arming is None or arming.first_iteration is None:
        return False
    kinds = set(inc.kinds)
    if not kinds & {SLOW, LEVEL_SHIFT} or kinds - {SLOW, LEVEL_SHIFT, CAPTURE}:
        return False
    ranks = set(inc.ranks)
    if ranks and not ranks <= set(arming.ranks):
        return False
    # A level shift begins at its change point (the incident may take in a few slow steps before it)
    cp = inc.evidence.change_point if LEVEL_SHIFT in kinds else None
    start = cp.iteration if cp is not None else inc.first_iteration
    return abs(start - arming.first_iteration) <= 2

"""Pipeline bubble: analytic, measured idle per stage, and the part due to stage imbalance.

docs/design.md §2 "Pipeline bubble". Measured idle of a stage = (forward-backward − (forward-compute
+ backward-compute)) / forward-backward. Megatron's default ``minmax`` timers give, per timer,
the min and max across ranks but not which rank: pairing the smaller forward with the smaller
backward (the lighter stage) and the larger with the larger (the heavier stage) is an inference,
and the provenance says so. ``--timing-log-option all`` gives per-rank rows: then each rank's
idle is computed exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfd.analytics.common import (
    BACKWARD_COMPUTE,
    FORWARD_BACKWARD,
    FORWARD_COMPUTE,
    record_source,
    timer_max,
    timer_min,
)
from perfd.analytics.steps.provenance import Code, Measured, cite
from perfd.core.bounds import LAYOUT_BOUNDS, SPEC_BOUNDS, in_bounds
from perfd.core.model import StepRecord


def analytic_bubble(pp: int | None, microbatches: int | None, vpp: int | None = None) -> Measured:
    """(p−1)/(m+p−1) for 1F1B; (p−1)/(v·m+p−1) interleaved with v virtual stages per rank."""
    if pp is None:
        return Measured.absent(Code.PP_UNKNOWN)
    if pp <= 1:
        return Measured(0.0, cite(Code.NO_BUBBLE))
    if microbatches is None or microbatches <= 0:
        return Measured.absent(Code.MICROBATCHES_UNKNOWN)
    v = vpp if vpp and vpp > 1 else 1
    value = (pp - 1) / (v * microbatches + pp - 1)
    if v > 1:
        return Measured(value, cite(Code.BUBBLE_INTERLEAVED, pp - 1, v, microbatches))
    return Measured(value, cite(Code.BUBBLE_1F1B, pp - 1, microbatches))


def microbatches_for_bubble(pp: int, target: float, vpp: int | None = None) -> int:
    """Smallest m with analytic bubble <= target (for recommendations)."""
    v = vpp if vpp and vpp > 1 else 1
    m = 1
    while (pp - 1) / (v * m + pp - 1) > target and m < 1_000_000:
        m += 1
    return m


@dataclass(frozen=True)
class StageIdle:
    """Measured idle inside forward-backward, for the most and the least idle stage."""

    idle_max: Measured  # the lighter stage (waits most)
    idle_min: Measured  # the heavier stage
    imbalance: Measured  # idle_max − analytic bubble: attributed to stage imbalance
    lighter_compute_ms: float | None = None  # forward+backward compute of the lighter stage
    heavier_compute_ms: float | None = None
    per_rank_idle: dict[int, float] = field(default_factory=dict)  # only with per-rank timers
    method: str | None = None  # "minmax-pairing" | "per-rank"

    @property
    def compute_ratio(self) -> float | None:
        """Heavier stage compute ÷ lighter stage compute."""
        if self.lighter_compute_ms and self.heavier_compute_ms:
            return self.heavier_compute_ms / self.lighter_compute_ms
        return None


def _per_rank(rec: StepRecord) -> dict[int, tuple[float, float]] | None:
    """rank -> (forward-backward ms, forward+backward compute ms), when per-rank rows exist."""
    fwd = rec.timers.get(FORWARD_COMPUTE)
    bwd = rec.timers.get(BACKWARD_COMPUTE)
    fb = rec.timers.get(FORWARD_BACKWARD)
    if fwd is None or bwd is None or fb is None or not fwd.per_rank or not bwd.per_rank:
        return None
    fb_max = timer_max(fb)
    out: dict[int, tuple[float, float]] = {}
    for rank in sorted(set(fwd.per_rank) & set(bwd.per_rank)):
        span = fb.per_rank.get(rank, fb_max) if fb.per_rank else fb_max
        if span is None or span <= 0:
            continue
        out[rank] = (span, fwd.per_rank[rank] + bwd.per_rank[rank])
    return out or None


def stage_idle(rec: StepRecord, pp: int | None, analytic: Measured) -> StageIdle:
    """Idle share of forward-backward for the lighter and heavier stage, and the imbalance part."""
    if pp is None:
        none = Measured.absent(Code.PP_UNKNOWN)
        return StageIdle(none, none, none)
    if pp <= 1:
        none = Measured.absent(Code.NO_STAGES)
        return StageIdle(none, none, none)
    src = record_source(rec)
    rows = _per_rank(rec)
    if rows is not None:
        idle = {r: (span - comp) / span for r, (span, comp) in rows.items()}
        r_max = max(idle, key=lambda r: idle[r])
        r_min = min(idle, key=lambda r: idle[r])
        comp = {r: c for r, (_, c) in rows.items()}
        hi = Measured(idle[r_max], cite(Code.IDLE_RANK_MAX, r_max, rows[r_max][1], rows[r_max][0], src))
        lo = Measured(idle[r_min], cite(Code.IDLE_RANK_MIN, r_min, rows[r_min][1], rows[r_min][0], src))
        result = StageIdle(hi, lo, _imbalance(hi, analytic), min(comp.values()), max(comp.values()),
                           idle, "per-rank")
        return result
    fwd = rec.timers.get(FORWARD_COMPUTE)
    bwd = rec.timers.get(BACKWARD_COMPUTE)
    fb = rec.timers.get(FORWARD_BACKWARD)
    fb_ms = timer_max(fb)
    fwd_min, fwd_max = timer_min(fwd), timer_max(fwd)
    bwd_min, bwd_max = timer_min(bwd), timer_max(bwd)
    if None in (fb_ms, fwd_max, bwd_max):
        none = Measured.absent(Code.NO_STAGE_TIMERS)
        return StageIdle(none, none, none)
    if None in (fwd_min, bwd_min):
        none = Measured.absent(Code.MAX_ONLY)
        return StageIdle(none, none, none)
    assert fb_ms is not None and fwd_min is not None and fwd_max is not None
    assert bwd_min is not None and bwd_max is not None
    if fb_ms <= 0:
        none = Measured.absent(Code.FB_ZERO)
        return StageIdle(none, none, none)
    light = fwd_min + bwd_min
    heavy = fwd_max + bwd_max
    pairing = Code.MINMAX_PAIRING  # which rank holds which value is inferred: the sources say so
    hi = Measured((fb_ms - light) / fb_ms,
                  cite(Code.IDLE_LIGHTER, fwd_min, bwd_min, fb_ms, src, caveat=pairing))
    lo = Measured((fb_ms - heavy) / fb_ms,
                  cite(Code.IDLE_HEAVIER, fwd_max, bwd_max, fb_ms, src, caveat=pairing))
    return StageIdle(hi, lo, _imbalance(hi, analytic), light, heavy, {}, "minmax-pairing")


def _imbalance(idle_max: Measured, analytic: Measured) -> Measured:
    if idle_max.value is None or analytic.value is None:
        return Measured.absent(Code.IMBALANCE_INPUTS)
    return Measured(idle_max.value - analytic.value, cite(Code.IMBALANCE))


@dataclass(frozen=True)
class RebalanceEstimate:
    """What moving whole layers off the heavier stage would do (p = 2 or last-vs-rest estimate).

    Per-layer compute is estimated as the lighter stage's compute ÷ its layer count (an inference:
    it assumes the lighter stage holds only transformer layers and the split is uniform).
    """

    layers_per_stage: int
    per_layer_ms: float
    gap_ms: float  # heavier − lighter compute, ms per iteration
    best_move: int  # layers to move from the heavier to the lighter stage (0: none helps)
    new_heavier_ms: float  # estimated max stage compute after the move
    current_heavier_ms: float


def rebalance_estimate(num_layers: int | None, pp: int | None, lighter_ms: float | None,
                       heavier_ms: float | None) -> RebalanceEstimate | None:
    """Best whole-layer move between the heaviest and the lightest stage, or None if unknowable."""
    if not num_layers or not pp or pp < 2 or num_layers % pp or lighter_ms is None or heavier_ms is None:
        return None
    # The loop below runs once per layer of a stage: a value from input past perfd.core.bounds would
    # make it unbounded (num_layers 10^29 ran forever), so it is no estimate at all.
    if not in_bounds(num_layers, *SPEC_BOUNDS["num_layers"]) or not in_bounds(pp, *LAYOUT_BOUNDS["pp"]):
        return None
    if not (math.isfinite(lighter_ms) and math.isfinite(heavier_ms)):
        return None
    per_stage = num_layers // pp
    if per_stage < 1 or lighter_ms <= 0:
        return None
    per_layer = lighter_ms / per_stage
    best_k, best = 0, heavier_ms
    for k in range(1, per_stage):
        new_max = max(heavier_ms - k * per_layer, lighter_ms + k * per_layer)
        if new_max < best - 1e-9:
            best_k, best = k, new_max
    return RebalanceEstimate(per_stage, per_layer, heavier_ms - lighter_ms, best_k, best, heavier_ms)

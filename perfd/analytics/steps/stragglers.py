"""Straggler detection from Megatron's outputs (docs/design.md §2 "Stragglers").

Three signals, per iteration:
1. the straggler-detector line (``MnRtt/Rnk`` / ``MxRtt/Rnk``): max/min ratio > 1.1 names the max
   rank as a candidate — but only when the min and max ranks sit in the same pipeline stage; across
   stages the difference is stage imbalance (e.g. the last stage computes the logits), not a
   straggler. The stage of a rank follows Megatron's rank order (an inference on the order);
2. the spread (max/min across ranks) of forward-compute / backward-compute > 1.1: only with
   pp == 1, since with PP the min and max come from different stages; the rank is not named;
3. per-rank timers (``--timing-log-option all``): a rank whose forward+backward compute exceeds
   1.1× the median of the ranks of its own stage.
"Persistent" = flagged in at least half of the steady-state iterations of a window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from perfd.analytics import thresholds as th
from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_COMPUTE, median, pp_stage_of_rank
from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.core.model import ParallelLayout, StepRecord, TimerValue

STRAGGLER_RATIO = th.STRAGGLER_RATIO.value
PERSISTENT_FRACTION = th.STRAGGLER_PERSISTENT_FRACTION.value


@dataclass(frozen=True)
class RankOrder:
    """What is needed to map a rank to its pipeline stage."""

    layout: ParallelLayout
    order: str = "tp-cp-ep-dp-pp"  # Megatron's default; "tp-pp-dp" with --use-tp-pp-dp-mapping

    def stage(self, rank: int) -> int | None:
        lay = self.layout
        return pp_stage_of_rank(rank, lay.world_size, lay.tp, lay.pp, lay.dp, lay.cp, self.order)


class StragglerFlags(Protocol):
    """What persistence reads of one iteration (a StragglerResult, or the same two facts)."""

    @property
    def flagged_ranks(self) -> list[int]: ...

    @property
    def compute_spread_flagged(self) -> bool | None: ...


@dataclass
class StragglerResult:
    """Straggler signals of one iteration."""

    rtt_ratio: float | None = None  # straggler line: max rtt / min rtt
    rtt_max_rank: int | None = None
    rtt_min_rank: int | None = None
    line_candidate_rank: int | None = None  # named by the straggler line (same stage, ratio > 1.1)
    line_between_stages: bool = False  # ratio > 1.1 but min/max ranks in different stages
    compute_spread: float | None = None  # max(forward-compute, backward-compute) max/min
    compute_spread_flagged: bool | None = None  # None when not applicable (pp > 1 or absent)
    per_rank_ratio: dict[int, float] = field(default_factory=dict)  # rank -> compute / stage median
    per_rank_flagged: list[int] = field(default_factory=list)
    notes: list[Cited] = field(default_factory=list)  # why a spread names no rank, as codes (Kind.NOTE)

    @property
    def flagged_ranks(self) -> list[int]:
        """Ranks named as straggler candidates in this iteration."""
        ranks = set(self.per_rank_flagged)
        if self.line_candidate_rank is not None:
            ranks.add(self.line_candidate_rank)
        return sorted(ranks)

    @property
    def flagged(self) -> bool:
        return bool(self.flagged_ranks) or bool(self.compute_spread_flagged)


def rank_order(layout: ParallelLayout, arguments: dict[str, str]) -> RankOrder:
    """The job's rank order: Megatron's default, or tp-pp-dp with --use-tp-pp-dp-mapping."""
    order = "tp-pp-dp" if arguments.get("use_tp_pp_dp_mapping") == "True" else "tp-cp-ep-dp-pp"
    return RankOrder(layout, order)


def _spread(t: TimerValue | None) -> float | None:
    if t is None:
        return None
    s = t.spread()
    if s is None and t.per_rank:
        lo, hi = min(t.per_rank.values()), max(t.per_rank.values())
        s = hi / lo if lo > 0 else None
    return s


def detect(rec: StepRecord, ranks: RankOrder) -> StragglerResult:
    """All straggler signals present in one step record."""
    res = StragglerResult()
    pp = ranks.layout.pp
    line = rec.straggler
    if line is not None and "rtt" in line.quantities:
        lo, hi = line.quantities["rtt"]
        res.rtt_min_rank, res.rtt_max_rank = lo.rank, hi.rank
        if lo.value > 0:
            res.rtt_ratio = hi.value / lo.value
        if res.rtt_ratio is not None and res.rtt_ratio > STRAGGLER_RATIO:
            s_lo, s_hi = ranks.stage(lo.rank), ranks.stage(hi.rank)
            if pp == 1 or (s_lo is not None and s_lo == s_hi):
                res.line_candidate_rank = hi.rank
            elif s_lo is not None and s_hi is not None:
                res.line_between_stages = True
                # the spread itself is the row's straggler_rtt_ratio: the note is the same on every such row
                res.notes.append(cite(Code.RTT_BETWEEN_STAGES, STRAGGLER_RATIO, lo.rank, s_lo, hi.rank, s_hi))
            else:
                res.notes.append(cite(Code.RTT_STAGES_UNKNOWN, STRAGGLER_RATIO))

    spreads = [s for s in (_spread(rec.timers.get(FORWARD_COMPUTE)),
                           _spread(rec.timers.get(BACKWARD_COMPUTE))) if s is not None]
    if spreads:
        res.compute_spread = max(spreads)
        if pp == 1:
            res.compute_spread_flagged = res.compute_spread > STRAGGLER_RATIO
        elif pp is not None:
            res.notes.append(cite(Code.SPREAD_WITH_PP))

    fwd, bwd = rec.timers.get(FORWARD_COMPUTE), rec.timers.get(BACKWARD_COMPUTE)
    has_rows = fwd is not None and bwd is not None and bool(fwd.per_rank) and bool(bwd.per_rank)
    if has_rows and pp is None:
        res.notes.append(cite(Code.PER_RANK_NO_PP))
    elif has_rows and fwd is not None and bwd is not None and pp is not None:
        compute = {r: fwd.per_rank[r] + bwd.per_rank[r] for r in set(fwd.per_rank) & set(bwd.per_rank)}
        groups: dict[int, dict[int, float]] = {}
        for r, c in compute.items():
            stage = ranks.stage(r) if pp > 1 else 0
            if stage is None:
                res.notes.append(cite(Code.PER_RANK_NO_STAGE))
                groups = {}
                break
            groups.setdefault(stage, {})[r] = c
        if groups and res.compute_spread_flagged is not None:
            res.compute_spread_flagged = None  # the per-rank comparison below names the rank
            res.notes.append(cite(Code.PER_RANK_INSTEAD))
        for group in groups.values():
            med = median(group.values())
            if med is None or med <= 0 or len(group) < 2:
                continue
            for r, c in group.items():
                res.per_rank_ratio[r] = c / med
                if c / med > STRAGGLER_RATIO:
                    res.per_rank_flagged.append(r)
        res.per_rank_flagged.sort()
    return res


@dataclass(frozen=True)
class PersistentStragglers:
    """Ranks flagged in >= 50% of the window's iterations, and the fraction for every rank seen."""

    ranks: list[int]
    fraction: dict[int, float]  # rank -> fraction of iterations it was flagged in
    anonymous_fraction: float | None  # pp == 1 compute-spread flags (rank unknown)
    n_iterations: int


def persistent(results: Iterable[StragglerFlags]) -> PersistentStragglers:
    """Persistence over a window (normally the steady-state iterations); one pass, so a long run's
    window can be streamed."""
    n = 0
    counts: dict[int, int] = {}
    spread_known = spread_flagged = 0
    for r in results:
        n += 1
        for rank in r.flagged_ranks:
            counts[rank] = counts.get(rank, 0) + 1
        if r.compute_spread_flagged is not None:
            spread_known += 1
            spread_flagged += bool(r.compute_spread_flagged)
    if n == 0:
        return PersistentStragglers([], {}, None, 0)
    fraction = {rank: c / n for rank, c in sorted(counts.items())}
    anon = (spread_flagged / spread_known) if spread_known else None
    return PersistentStragglers(
        [rank for rank, f in fraction.items() if f >= PERSISTENT_FRACTION], fraction, anon, n)

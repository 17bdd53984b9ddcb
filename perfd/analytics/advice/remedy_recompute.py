"""Turning activation checkpointing off, outside Megatron-LM (whose recompute options are
remedy_catalog.recompute's, read from its log): the forward the backward runs again is in the capture
(perfd.analytics.breakdown.recompute_seen), kernel by kernel, so its gain is read from it rather than from
a share of the layers. Without the checkpointing those kernels and their dispatch do not run; the replay
(Change.RECOMPUTE) says what that gives at the job's host pace. What it costs is memory, which no trace
shows: the remedy says to read the peak first (torchtitan's log prints it each step; perfd's GPU memory
reading). Pure.
"""

from __future__ import annotations

from perfd.analytics.advice.remedies import Advice, FitContext, Gain, RemedyId, Removal, named
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.advice.trainer_switches import in_terms
from perfd.analytics.breakdown.replay_table import RECOMPUTE_HOST, Change
from perfd.analytics.breakdown.step_parts import Part

# Of the recomputed kernels' time, what goes with them: all at the high end; at the low end 0.8, for what
# the backward's kernels may take longer reading activations kept since the forward (out of cache) than
# the recomputed ones they read just after they were made.
RECOMPUTED_GONE = (0.8, 1.0)
RECOMPUTED = "recompute:forward"  # the atom: the forward run again in the backward
_PARTS = frozenset(p.value for p in Part)


def loop_recompute(c: FitContext) -> Advice | None:
    r = c.budget.recompute
    if r is None or r.launches <= 0 or not named(c.budget, r.ms):
        return None
    lo, hi = (r.ms * f for f in RECOMPUTED_GONE)
    gpu = Gain(lo, hi, say(Say.RECOMPUTE_BASIS, r.launches, r.ms, *RECOMPUTED_GONE))
    what = say(Say.RECOMPUTE_REPLAYED, r.launches, r.ms, RECOMPUTE_HOST[0], RECOMPUTE_HOST[1])
    if r.forward_host < 1.0 and r.forward_us is not None and r.backward_us is not None:
        what = say(Say.CHECKPOINT_FORWARD, what, r.forward_us, r.backward_us)
    replayed = c.replayed(Change.RECOMPUTE, what, gpu)
    sw = in_terms(RemedyId.RECOMPUTE, c.config.framework, Say.RECOMPUTE_OFF, cost=Say.RECOMPUTE_OFF_COST)
    # the part most of it computes (by_part is largest first; "other": no part said what)
    part = next((Part(p) for p, _ms in r.by_part if p in _PARTS), Part.POINTWISE)
    gain = replayed or gpu
    return Advice(RemedyId.RECOMPUTE, part, sw.action, gain, sw.flags, cost=sw.cost_said,
                  removes=(Removal(RECOMPUTED, gain.low_ms, gain.high_ms),),
                  replay=Change.RECOMPUTE if replayed else None)

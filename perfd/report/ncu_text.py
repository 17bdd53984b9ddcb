"""The Nsight Compute verdicts and coverage as they read: what the profiled launches were
(perfd.analytics.breakdown.ncu_rows.Coverage, in a sentence), and each verdict's finding and recommendation
(perfd.analytics.ncu.ncu_verdicts.NcuFinding, NcuRecommendation: the PartVerdict) with its title,
observation, action, detail and its evidence's coverage sentence. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.bottleneck import RowsWhy
from perfd.analytics.breakdown.kernel_rows import RowVerdict
from perfd.analytics.breakdown.ncu_rows import Coverage, MatchHow, Phase
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.ncu.ncu_verdicts import NcuFinding, NcuRecommendation, PartVerdict


def _spans(nums: Sequence[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    runs: list[list[int]] = []
    for n in sorted(set(nums)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def rows_class_text(w: RowsWhy) -> str:
    """Why an ncu capture's rows give the class they do, for a job with no timeline (the class's reason
    as the aggregator keeps it with the capture's timeline class)."""
    if w.coverage is None:
        return "the ncu rows' time or the step's compute time is unknown"
    if not w.enough:
        return (f"the ncu rows cover {w.coverage:.0%} of the step's compute time (under "
                f"{th.NCU_CLASS_COVERAGE.value:.0%}): too little to class the step")
    return (f"the ncu rows cover {w.coverage:.0%} of the step's compute time; {w.share:.0%} of their time is "
            f"in kernels NVIDIA's rule calls {w.bound}")


def coverage_text(c: Coverage) -> str:
    """What the profiled launches were, in a sentence ("the 40 launches profiled were the forward pass
    of layers 1-3 of 4 only (micro-batch 1; no backward launch): attention 15, linear 12, ...")."""
    if c.how is MatchHow.NONE or not c.matched:
        return (f"the {c.launches} launches profiled could not be matched to the timeline's (another run's "
                "shapes, or another filter): their ops, passes and layers are unknown")
    passes = []
    for ph in (Phase.FORWARD, Phase.BACKWARD):
        if c.phases.get(ph.value):
            layers = c.layers.get(ph.value) or ()
            of = f" of {c.layers_total}" if c.layers_total else ""
            where = (f" of layer{'s' if len(layers) > 1 else ''} {_spans(layers)}{of}" if layers else "")
            passes.append(f"the {ph.value} pass{where}")
    what = " and ".join(passes) or "neither pass (optimizer, zeroing, between steps)"
    only = " only" if len(passes) == 1 else ""
    missing = [ph.value for ph in (Phase.FORWARD, Phase.BACKWARD) if not c.phases.get(ph.value)]
    notes = []
    if c.microbatches:
        notes.append(f"micro-batch {_spans(c.microbatches)}")
    if missing and passes:
        notes.append(f"no {missing[0]} launch")
    if c.matched < c.launches:
        notes.append(f"{c.launches - c.matched} launch(es) undecided")
    parts = ", ".join(f"{p} {n}" for p, n in c.parts.items())
    return (f"the {c.launches} launches profiled were {what}{only}"
            + (f" ({'; '.join(notes)})" if notes else "") + (f": {parts}" if parts else ""))


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


# What each verdict calls for.
ACTION: dict[RowVerdict, str] = {
    RowVerdict.FEWER_FLOPS: "Do fewer FLOPs in these GEMMs (less recomputation, a smaller or shorter model): "
    "the kernels already run near the GPU's compute ceiling, a faster kernel gains nothing",
    RowVerdict.SHAPE: "Give these GEMMs better shapes: hidden, FFN and sequence sizes that are multiples of "
    "the kernel's tile (128 or 256), a larger micro-batch — they run far below the compute ceiling",
    RowVerdict.FUSION_ONLY: "Fuse these pointwise kernels into their neighbours (a fused kernel, "
    "torch.compile): they already move DRAM near its peak, only fewer bytes moved helps",
    RowVerdict.ISSUE_BOUND: "Fuse these pointwise kernels (fewer launches, index arithmetic done once): "
    "ncu's rule calls them compute-bound, but with the tensor pipes idle their SM work is issue slots and "
    "integer index arithmetic, not math",
}


def verdict_text(v: PartVerdict) -> str:
    """A verdict's figures, where they were measured and what was profiled."""
    figs = (f"compute SOL {_pct(v.compute)}, memory SOL {_pct(v.memory)}, DRAM {_pct(v.dram)}, "
            f"tensor pipe {_pct(v.tensor)}")
    of = f" ({v.of}'s, by the op that launched them)" if v.of else ""
    covered = coverage_text(v.covered) if v.covered is not None else ""
    return (f"Nsight Compute (capture {v.capture}) on the {v.part} part ({v.part_ms:.0f} ms a step): "
            f"{v.category}{of}, {v.kernels} kernel(s), time-weighted {figs}"
            + (f"; kernels chosen {v.chosen}" if v.chosen else "")
            + (f"; {covered}" if covered else ""))


def verdict_json(v: PartVerdict) -> dict[str, object]:
    """A verdict as its finding's evidence shows it: its coverage in a sentence ("" without one)."""
    return {**v.to_json(), "covered": coverage_text(v.covered) if v.covered is not None else ""}


def worded_ncu(f: Finding) -> Finding:
    """An Nsight Compute verdict's finding with its words; any other as it is."""
    if isinstance(f, NcuFinding) and f.facts is not None:
        v = f.facts
        return dataclasses.replace(
            f, title=f"{v.category} kernels of {v.of or v.part}: {v.verdict.value.replace('_', ' ')}",
            observation=verdict_text(v) + ".", evidence={**f.evidence, "ncu_verdict": verdict_json(v)},
            facts=None)
    return f


def worded_ncu_recommendation(r: Recommendation) -> Recommendation:
    """What an Nsight Compute verdict calls for, in words; any other as it is."""
    if isinstance(r, NcuRecommendation) and r.facts is not None:
        return dataclasses.replace(r, action=ACTION[r.facts.verdict], detail=verdict_text(r.facts),
                                   facts=None)
    return r

"""Each provenance code's sentence (perfd.analytics.steps.provenance.Code), declared once, here:
the analytics return codes and numbers, and the English is made only where it is shown — the
report's metric sources, the JSON rows' legend (perfd.report.row_json), a finding that quotes a
metric's absence. A template is ``str.format`` over the code's arguments, positional: a nested
:class:`Cited` is its own sentence, a tuple of names is joined by commas, a record's provenance is
its text. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfd.analytics.steps.provenance import Arg, Cited, Code
from perfd.model import Provenance

TEMPLATE: dict[Code, str] = {
    # The record itself, the log's own figures.
    Code.RECORD: "{0}",
    Code.STEP_TIME: "{0}: step time",
    Code.LOSS: "{0}: loss",
    Code.QUOTED: "{0}",
    Code.STRAGGLER_LINE: "megatron: straggler detector line (MnRtt/MxRtt)",
    Code.NO_STRAGGLER_LINE: "{0}: {1}",
    # Throughput and MFU.
    Code.THROUGHPUT: "analytics:FLOPs/(step s·1e12·world={0}); {1}",
    Code.THROUGHPUT_LOGGED: "{0}:logged throughput per GPU (perfd's formula unavailable: {1})",
    Code.MFU: "analytics:model TFLOP/s per GPU ÷ {0}",
    # Shares of the step from timers.
    Code.TIMER_SHARE: "{0}:timer {1} ({2}) {3:g} ms ÷ step time {4:g} ms; {5}",
    Code.COMM_PER_RANK: "{0}:per-rank Σ({1}) on worst rank {2}: {3:.2f} ms ÷ step {4:g} ms; {5}",
    Code.COMM_ONE_MAX: "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms; {4}",
    Code.COMM_SUM_OF_MAX: "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms (maxima may come "
        "from different ranks: upper bound); {4}",
    # The pipeline.
    Code.NO_BUBBLE: "analytics:pp=1: no pipeline bubble",
    Code.BUBBLE_1F1B: "analytics:1F1B (p-1)/(m+p-1) = {0}/({1}+{0})",
    Code.BUBBLE_INTERLEAVED: "analytics:interleaved 1F1B (p-1)/(v·m+p-1) = {0}/({1}·{2}+{0})",
    Code.IDLE_RANK_MAX: "megatron:per-rank timers: rank {0} idle = 1 − (forward-compute + backward-compute)"
        " / forward-backward = 1 − {1:.2f}/{2:.2f}; {3}",
    Code.IDLE_RANK_MIN: "megatron:per-rank timers: rank {0} idle = 1 − {1:.2f}/{2:.2f}; {3}",
    Code.IDLE_LIGHTER: "megatron:1 − (forward-compute min {0:g} + backward-compute min {1:g}) / "
        "forward-backward max {2:g}; {3}",
    Code.IDLE_HEAVIER: "megatron:1 − (forward-compute max {0:g} + backward-compute max {1:g}) / "
        "forward-backward max {2:g}; {3}",
    Code.IMBALANCE: "analytics:max stage idle − analytic bubble: attributed to stage imbalance",
    Code.MINMAX_PAIRING: "inference: min forward paired with min backward (lighter stage), max with max "
        "(heavier stage); minmax timers do not say which rank holds which value",
    # Absent: why.
    Code.UNKNOWN: "unknown",
    Code.WHY: "{0}",
    Code.NO_LOSS: "no loss on this iteration (a NaN loss removes the field)",
    Code.MISSING: "missing {0}",
    Code.MISSING_NOTED: "missing {0}; {1}",
    Code.NON_POSITIVE: "non-positive step time {0} ms or world {1}",
    Code.NO_STEP_TIME: "step time absent",
    Code.NO_TIMERS: "no {0} timers present",
    Code.FLOPS_UNKNOWN: "model FLOPs unknown",
    Code.THROUGHPUT_UNKNOWN: "throughput unknown",
    Code.PEAK_UNKNOWN: "peak TFLOP/s unknown",
    Code.PP_UNKNOWN: "pipeline-parallel size unknown",
    Code.MICROBATCHES_UNKNOWN: "micro-batches per iteration unknown",
    Code.NO_STAGES: "pp=1: no pipeline stages",
    Code.NO_STAGE_TIMERS: "forward-backward / forward-compute / backward-compute timers absent (needs "
        "--timing-log-level >= 1)",
    Code.MAX_ONLY: "max-only timers (--timing-log-option max): per-stage idle needs min and max (minmax) "
        "or per-rank values (all)",
    Code.FB_ZERO: "forward-backward timer is zero",
    Code.IMBALANCE_INPUTS: "needs the measured stage idle and the analytic bubble",
    # Notes of the straggler check.
    Code.RTT_BETWEEN_STAGES: "rtt spread > {0:g}× between rank {1} (stage {2}) and rank {3} (stage {4}): "
        "stage imbalance, not a straggler",
    Code.RTT_STAGES_UNKNOWN: "rtt spread > {0:g}× but the ranks' pipeline stages are unknown",
    Code.SPREAD_WITH_PP: "compute timer spread with pp>1 reflects stage imbalance, not stragglers",
    Code.PER_RANK_NO_PP: "per-rank timers: pipeline size unknown, ranks not compared",
    Code.PER_RANK_NO_STAGE: "per-rank timers: pipeline stage of ranks unknown, not compared",
    Code.PER_RANK_INSTEAD: "per-rank timers present: compared per rank instead of the min/max spread",
    # Why a row is out of the steady state.
    Code.WARMUP_ROWS: "warm-up (first {0} records)",
    Code.CAPTURED: "disturbed by a perfd capture",
    Code.NO_STEP: "no step time",
    Code.ARMED_STEP: "armed: its rank runs under a profiler (perfd ncu-exec): the profiler's step, not the "
        "job's",
    Code.OUTLIER_STEP: "step {0:g} ms > {1:g}× the steady {2:.4g} ms a step",
    Code.IN_INCIDENT: "incident {0}",
    Code.IN_CAPTURE: "perfd capture ({0})",
}


def _shown(a: Arg) -> object:
    if isinstance(a, Cited):
        return text(a)
    if isinstance(a, tuple):
        return ", ".join(a)
    if isinstance(a, Provenance):
        return str(a)
    return a


def text(c: Cited) -> str:
    """The sentence alone: a source's detail, an absence's reason (as another sentence quotes it)."""
    return TEMPLATE[c.code].format(*map(_shown, c.args))


def line(c: Cited) -> str:
    """The sentence as a metric's source reads: ``absent: why``, or the source with its caveat."""
    if c.absent:
        return f"absent: {text(c)}"
    out = text(c)
    return f"{out} [{TEMPLATE[c.caveat]}]" if c.caveat is not None else out


def lines(sources: Mapping[str, Cited]) -> dict[str, str]:
    """Every metric's source as it reads (the legend, the report)."""
    return {k: line(c) for k, c in sources.items()}

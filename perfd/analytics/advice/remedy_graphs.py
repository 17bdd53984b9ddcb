"""The CUDA-graphs remedies (the registry is perfd.analytics.advice.remedy_catalog.REMEDIES): Megatron-LM's
own graphs, and torch.compile's (mode="reduce-overhead") for any other loop, eager or compiled already.
Each reads the forward-backward launch gaps (perfd.capture.sweep) and names them as the atom the
micro-batch remedy acts on too (remedy_steps.LAUNCH_GAPS), so that a plan counts them once.

torch.compile's graphs replay over the same memory each call: a loop that keeps what one call returned
while the next runs (several micro-batches a step, a module that caches a tensor it made in forward) fails
as is, and needs a mark before each forward. Measured on an H200 (docs/evidence/loops_ab_h200: the Hugging
Face Trainer with 4 micro-batches a step, Lightning's Transformer demo): both failed with the flag or the
call alone; Lightning's demo failed again with the mark first in training_step (its positional encoding
keeps a tensor it made in the first forward: docs/evidence/loops_ab2_h200). Every torch.compile graphs
remedy says so in its cost, and its gain is never promised (Gain.risk): the Trainer's own training step
calls the model (the mark is not the user's to add there); several micro-batches a step keep one call's
outputs across the next; and with one a step, whether a module keeps a tensor across calls is in the
code, not in a trace. Pure.
"""

from __future__ import annotations

import dataclasses

from perfd.analytics import thresholds as th
from perfd.analytics.advice.remedies import (
    COMPILED_GRAPH_COST_OF_STEP,
    GRAPH_GAPS_BACK,
    GRAPH_REPLAY_COST_OF_STEP,
    GRAPHS_HOST_OF_DEVICE,
    Advice,
    FitContext,
    Framework,
    Gain,
    RemedyId,
    Removal,
    Risk,
    compiled,
    flags_for,
    gain_of,
    idle_ms,
    named,
    removal,
)
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.advice.remedy_steps import LAUNCH_GAPS, LAYERS
from perfd.analytics.advice.trainer_switches import Switch, in_terms
from perfd.analytics.breakdown.budget import IdleCause, StepBudget
from perfd.analytics.breakdown.replay_table import GRAPHED_HOST, Change
from perfd.analytics.breakdown.step_parts import Part


def micro_batches_seen(b: StepBudget) -> float | None:
    """The forward-backward passes a step the capture shows: the replay's count of them, else the job's
    facts' (None: neither says)."""
    if b.replay is not None and b.replay.microbatches is not None:
        return float(b.replay.microbatches)
    return b.facts.micro_batches if b.facts is not None else None


def graphs_risk(c: FitContext) -> Risk:
    """Why torch.compile's graphs are not promised on this job: the Trainer's own training step, more
    than one micro-batch a step, else a tensor a module may keep across calls (no trace shows it)."""
    if c.config.framework is Framework.HF_TRAINER:
        return Risk.GRAPHS_TRAINER
    m = micro_batches_seen(c.budget)
    return Risk.GRAPHS_MICRO_BATCHES if m is not None and m > 1 else Risk.GRAPHS_KEPT_TENSOR


def _torch_graphs(c: FitContext) -> Switch:
    """torch.compile's graphs in the job's framework's terms, its cost where the mark goes there."""
    return in_terms(RemedyId.CUDA_GRAPHS, c.config.framework, Say.GRAPHS_COMPILE, cost=Say.GRAPHS_KEEP)


def _at(gain: Gain, risk: Risk | None) -> Gain:
    return dataclasses.replace(gain, risk=risk) if risk is not None else gain


def cuda_graphs(c: FitContext) -> Advice | None:
    """Only where the launch gaps are large enough to pay for replaying: the low end is a loss. The
    host's launch gaps (it issues work slower than the GPU runs it), not the GPU's own switches between
    kernels it had queued (the host ahead: graphs take nothing from the host there). Below that, a
    compiled job whose host's margin is thin (:func:`compiled_graphs`)."""
    b, cfg = c.budget, c.config
    short = b.ms(Part.IDLE_SHORT)
    if b.step_ms <= 0:
        return None
    if short / b.step_ms < th.LAUNCH_GAPS_FOR_GRAPHS.value:
        return compiled_graphs(c)
    launch = idle_ms(b, IdleCause.LAUNCH, LAYERS) or short  # a capture without phases: all of them
    removes = (
        removal(LAUNCH_GAPS, launch, GRAPH_GAPS_BACK),
        Removal("cuda_graphs:replay", -GRAPH_REPLAY_COST_OF_STEP * b.step_ms, 0.0),
    )
    gain = gain_of(removes, say(Say.GRAPHS_BASIS, *GRAPH_GAPS_BACK, launch, GRAPH_REPLAY_COST_OF_STEP))
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(cfg, ("--cuda-graph-impl", "local"))
        if not flags:
            flags, notes = flags_for(cfg, ("--enable-cuda-graph", None))
        if not flags:
            return None
        replayed = c.replayed(Change.GRAPHS, say(Say.GRAPHS_REPLAYED, GRAPHED_HOST[1], GRAPHED_HOST[0]), gain)
        return Advice(
            RemedyId.CUDA_GRAPHS,
            Part.IDLE_SHORT,
            say(Say.GRAPHS_FLAG, flags[0].text()),
            replayed or gain,
            flags,
            cost=say(Say.GRAPHS_COST),
            notes=notes,
            removes=removes,
            replay=Change.GRAPHS if replayed else None,
        )
    sw, risk = _torch_graphs(c), graphs_risk(c)
    if compiled(b):  # already compiled: the compile mode, not compile itself
        return Advice(RemedyId.CUDA_GRAPHS, Part.IDLE_SHORT, say(Say.GRAPHS_COMPILED), _at(gain, risk),
                      cost=say(Say.GRAPHS_COMPILED_COST, sw.cost_said), removes=removes)
    return Advice(RemedyId.CUDA_GRAPHS, Part.IDLE_SHORT, sw.action, _at(gain, risk), sw.flags,
                  cost=sw.cost_said, removes=removes)


def compiled_graphs(c: FitContext) -> Advice | None:
    """A job torch.compile already runs, whose profiled host issues its step in GRAPHS_HOST_OF_DEVICE of
    the GPU's busy time or more (the replay's reading of the trace, on the job's host where the replay
    reaches its clock): its compiled regions replayed as CUDA graphs, one launch each. The launch gaps of
    its forward-backward phase come back in part; the copies of the batch into the graphs cost a little."""
    b, cfg = c.budget, c.config
    t = b.replay
    ratio = t.host_of_device if t is not None else None
    if cfg.framework is not Framework.PYTORCH or t is None or ratio is None or not compiled(b):
        return None
    scale = c.replay.scale if c.replay is not None else 1.0  # the job's own host against the profiled one
    if ratio * scale < GRAPHS_HOST_OF_DEVICE:
        return None
    launch = idle_ms(b, IdleCause.LAUNCH, LAYERS) if b.idle else b.ms(Part.IDLE_SHORT)
    if not named(b, launch):
        return None
    removes = (
        removal(LAUNCH_GAPS, launch, GRAPH_GAPS_BACK),
        Removal("cuda_graphs:replay", -COMPILED_GRAPH_COST_OF_STEP * b.step_ms, 0.0),
    )
    gain = gain_of(removes, say(Say.GRAPHS_THIN_BASIS, t.host_ms * scale, t.device_ms, ratio * scale, launch,
                                *GRAPH_GAPS_BACK, COMPILED_GRAPH_COST_OF_STEP))
    replayed = c.replayed(Change.GRAPHS, say(Say.GRAPHS_REPLAYED, GRAPHED_HOST[1], GRAPHED_HOST[0]), gain)
    sw, risk = _torch_graphs(c), graphs_risk(c)
    return Advice(
        RemedyId.CUDA_GRAPHS,
        Part.IDLE_SHORT,
        say(Say.GRAPHS_COMPILED),
        _at(replayed or gain, risk),
        cost=say(Say.GRAPHS_COMPILED_COST, sw.cost_said),
        removes=removes,
        replay=Change.GRAPHS if replayed else None,
    )

"""The findings and recommendations as they read: the title and observation of each finding
of perfd.analytics.run.run_findings, the action and detail of each recommendation, from their kind and
numbers (perfd.analytics.run.run_facts); a capture's slower-than-steady finding
(perfd.analytics.advice.capture_findings.SlowerFinding). Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.advice.capture_findings import SlowerFacts, SlowerFinding
from perfd.analytics.advice.remedies import Framework
from perfd.analytics.finding_types import Finding, Recommendation, Severity, StepSpan
from perfd.analytics.run.arming import ArmingBasis, ArmingCost
from perfd.analytics.run.run_facts import (
    BubbleFacts,
    CadenceFacts,
    DataShareFacts,
    Divider,
    ExposedFacts,
    GradSyncFacts,
    ImbalanceFacts,
    JitterFacts,
    NextStepFacts,
    OutlierFacts,
    OutsideFacts,
    PpWaitFacts,
    RebalanceFacts,
    RunFacts,
    RunFiguresFacts,
    RunFinding,
    RunRecFacts,
    RunRecommendation,
    SpreadFacts,
    StageSpreadFacts,
    StragglerFacts,
    UntimedFacts,
)
from perfd.analytics.run.runs import FiguresFrom, RunDigest, Runs
from perfd.analytics.steps.untimed import names
from perfd.core.model import HOOK_OUTSIDE
from perfd.report.bottleneck_text import class_reason, untimed_text
from perfd.report.cadence_text import cadence_recommendation, cadence_source, cadence_words
from perfd.report.capture_text import worded_match
from perfd.report.data_text import DATA_ACTIONS, knobs_text
from perfd.report.ncu_text import worded_ncu, worded_ncu_recommendation

# A data share's state, by the severity its thresholds give it.
DATA_STATE: dict[Severity, str] = {Severity.CRITICAL: "bottleneck", Severity.WARNING: "elevated",
                                   Severity.INFO: "healthy"}
# How to name the slow rank of a spread across ranks, by what gives the job's per-rank times.
_HOOK_EVERY_RANK = "Name the slow rank: the step hook on every rank (a rank without it reports nothing)"
NAME_THE_RANK: Mapping[Framework, str] = {
    Framework.MEGATRON: "Name the slow rank: --timing-log-option all (per-rank timers) or --log-straggler",
    Framework.TORCHTITAN: "Name the slow rank: the step hook on every rank (torchtitan logs no per-rank "
                          "times)",
    **{f: _HOOK_EVERY_RANK for f in Framework if f.hooked},
}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def span_text(s: StepSpan) -> str:
    """The steps a run finding's figures are over: "run 2: iterations 10–40 (31 steady)"."""
    if s.reference:
        return (f"run {s.run}: iterations {s.first}–{s.last} ({s.n} steady; the current run's steps are all "
                "armed)")
    head = f"run {s.run}: " if s.run is not None else ""
    return head + (f"iterations {s.first}–{s.last} ({s.n} steady)" if s.n else "no steady-state iterations")


def runs_text(r: Runs) -> str | None:
    """Why the job's figures are not the current run's (None when they are)."""
    ref = r.reference
    if r.figures is FiguresFrom.EARLIER_UNARMED and ref is not None:
        return (f"every step of run {r.current} ran on a rank armed for a capture (ncu): the job's "
                f"figures are run {ref.run}'s, its last run without (iterations {ref.first_iteration}-"
                f"{ref.last_iteration}, {ref.n_steady} steady steps)")
    if r.figures is FiguresFrom.NONE:
        return (f"every step of run {r.current} ran on a rank armed for a capture (ncu), and no "
                "earlier run ran without: the job has no steady steps of its own to report")
    return None


def digest_json(d: RunDigest, made: Mapping[str, Any]) -> dict[str, Any]:
    """An earlier run's digest as served: its JSON (``made``) with why its class, after it."""
    out: dict[str, Any] = {}
    for k, v in made.items():
        out[k] = v
        if k == "bottleneck":
            out["bottleneck_reason"] = class_reason(d.bottleneck_of) if d.bottleneck_of is not None else ""
    return out


def arming_text(a: ArmingCost) -> str:
    """What arming ncu costs the armed rank(s), against what, for how long: the report's line."""
    who = f"rank(s) {', '.join(map(str, a.ranks))}" if a.ranks else "the armed rank"
    against = {ArmingBasis.EARLIER_STEPS: "its own steps before it was armed",
               ArmingBasis.UNARMED_RANKS: "the job's unarmed ranks over the same time",
               ArmingBasis.PREVIOUS_RUN: f"the steady steps of run {a.reference_run}, the job's last run "
                                         "without ncu",
               ArmingBasis.PREVIOUS_RUN_CAPTURE: f"the captured steps of run {a.reference_run}, the job's "
                                                 "last run without ncu (its steady steps too few)",
               }[a.basis]
    line = (f"Arming ncu cost {who} {a.extra_ms:+.0f} ms a step ({a.ratio - 1:+.0%}): "
            f"median step {a.armed_ms:.0f} ms armed ({a.n_armed} steps) against "
            f"{a.reference_ms:.0f} ms for {against} ({a.n_reference} steps), for the life of the "
            "process, profiled or not")
    if a.basis is ArmingBasis.UNARMED_RANKS:
        line += ("; where the ranks synchronise every step the unarmed ones wait for the armed one, "
                 "so this reads low")
    return line


def runs_json(r: Runs, made: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The job's runs as served: their JSON (``made``: as the summary's JSON holds it) with why the
    figures are not the current run's, and each earlier run's digest with why its class."""
    out: dict[str, Any] = {}
    for k, v in (r.to_json() if made is None else made).items():
        if k == "earlier":
            out["why"] = runs_text(r)
            assert isinstance(v, list)  # each digest's JSON, in order (Runs.to_json)
            v = [digest_json(d, m) for d, m in zip(r.earlier, v, strict=True)]
        out[k] = v
    return out


def _imbalance(f: ImbalanceFacts) -> tuple[str, str]:
    v = f", v={f.vpp}" if f.vpp and f.vpp > 1 else ""
    return ("Stage imbalance dominates the pipeline bubble",
            f"The lighter stage idles {_pct(f.idle_lighter)} of forward-backward, the heavier "
            f"{_pct(f.idle_heavier)}, while the analytic bubble is {_pct(f.bubble)} (p={f.pp}, "
            f"m={f.microbatches}{v}): {f.imbalance * 100:.1f} points come from stage imbalance "
            f"(forward+backward compute {f.lighter_ms:.0f} vs {f.heavier_ms:.0f} ms, "
            f"{f.heavier_ms / f.lighter_ms:.2f}×).")


def _jitter(f: JitterFacts) -> tuple[str, str]:
    slow = f.slow
    said = ""
    if slow is not None and slow.count:
        said = (f" {slow.count} slow steps (over {th.BEAT_SLOW_STEP_EXCESS.value:.0%} past what their work "
                f"takes) cost {slow.excess_share:.1%} of the steady time"
                + (f"; they recur every {slow.period_s:.2f} s (in phase: R {slow.concentration:.2f}): "
                   "something on a timer." if f.beat else ", at no fixed period."))
    beat = f" every {slow.period_s:.1f} s" if f.beat and slow is not None else ""
    return (f"Step time jitter (CV {f.cv:.0%})" + (f": slow steps{beat}" if beat else ""),
            "Steady-state step times, less their data wait and per unit of work, vary with a "
            f"coefficient of variation of {f.cv:.1%}.{said}")


def finding_words(f: RunFacts) -> tuple[str, str]:
    """A run finding's title and observation."""
    ratio = th.STRAGGLER_RATIO.value
    match f:
        case ImbalanceFacts():
            return _imbalance(f)
        case BubbleFacts():
            return (f"Pipeline bubble {_pct(max(f.bubble, f.idle_lighter))}",
                    f"Analytic 1F1B bubble {_pct(f.bubble)} with p={f.pp}, m={f.microbatches}; the lighter "
                    f"stage idles {_pct(f.idle_lighter)} of forward-backward.")
        case GradSyncFacts():
            return (f"Gradient sync exposed {_pct(f.dp_share)} of the step",
                    f"all-grads-sync and the other gradient all-reduces take {_pct(f.dp_share)} of the "
                    f"step (> {th.GRAD_SYNC_SHARE.value:.0%}).")
        case PpWaitFacts():
            return (f"Exposed p2p wait {_pct(f.pp_share)} is pipeline waiting",
                    f"The communication timers hold {_pct(f.total)} of the step: pipeline send/recv "
                    f"{_pct(f.pp_share)}, gradient sync {_pct(f.dp_share)}. The p2p timers include "
                    f"waiting for the peer stage, the same time as the stage idle "
                    f"({_pct(f.idle_lighter)}): a pipeline wait, not link bandwidth; the exposed "
                    f"communication is the gradient sync's {_pct(f.dp_share)}.")
        case ExposedFacts():
            return (f"Exposed communication {_pct(f.total)}",
                    f"Communication the CPU waits on takes {_pct(f.total)} of the step.")
        case UntimedFacts():
            return (f"Communication not timed: {', '.join(names(f.untimed))}",
                    f"Exposed communication {_pct(f.total)} of the step is the timed collectives' only (DP "
                    f"gradient sync, PP send/recv); {untimed_text(f.untimed)}. A capture's timeline times "
                    "every NCCL kernel (perfd capture --tool kineto or nsys), the Flight Recorder every "
                    "collective (perfd launch --flight-recorder --fr-timing).")
        case DataShareFacts():
            return (f"Data loading {_pct(f.share)} of the step: {DATA_STATE[f.state]}",
                    f"{f.timer} ({f.across_ranks}) takes {_pct(f.share)} of the step (healthy < "
                    f"{th.DATA_HEALTHY_SHARE.value:.0%}, bottleneck > {th.DATA_BOUND_SHARE.value:.0%}).")
        case OutsideFacts():
            return (f"{_pct(f.share)} of the step passes between steps",
                    "Host time between one step's end and the next one's begin that was neither a data "
                    f"fetch perfd stamped nor an announced checkpoint or evaluation takes {_pct(f.share)} of "
                    f"the step (over {th.OUTSIDE_STEP_SHARE.value:.0%}).")
        case JitterFacts():
            return _jitter(f)
        case StragglerFacts():
            return (f"Rank {f.rank} is a persistent straggler",
                    f"Rank {f.rank} was > {ratio:g}× its peers in {_pct(f.fraction)} of steady iterations.")
        case SpreadFacts():
            return (f"Compute time spread across ranks > {ratio:g}×",
                    f"forward/backward compute max/min across ranks exceeds {ratio:g}× in "
                    f"{_pct(f.fraction)} of steady iterations (pp=1: same work on every rank).")
        case StageSpreadFacts():
            return ("Straggler-detector spread is stage imbalance",
                    f"The straggler detector's rtt max/min (median {f.rtt_ratio or float('nan'):.2f}×) is "
                    f"between ranks of different pipeline stages in {_pct(f.fraction)} of steady "
                    "iterations: the slower rank is the heavier stage, not a straggler.")
        case RunFiguresFacts():
            r, ref = f.runs, f.runs.reference
            text = runs_text(r) or ""
            return (f"Figures of run {ref.run}: run {r.current} runs under ncu" if ref is not None
                    else f"No figures: run {r.current} runs under ncu", text[0].upper() + text[1:] + ".")
        case OutlierFacts():
            return f"{f.count} slow iteration(s) left out", ""
        case CadenceFacts():
            return cadence_words(f.cadence)


def source_words(f: RunFacts) -> str | None:
    """Where a run finding's figures come from, for its ``source`` (None: it names none)."""
    match f:
        case ImbalanceFacts():
            return ("megatron timers forward-backward, forward-compute, backward-compute (minmax pairing is "
                    "an inference)" if f.minmax else "megatron timers")
        case PpWaitFacts():
            return "sum of max-across-ranks of the p2p timers (upper bound)"
        case DataShareFacts():
            return f"{f.source} timer {f.timer}"
        case OutsideFacts():
            return f"hook timer {HOOK_OUTSIDE}"
        case StageSpreadFacts():
            return "megatron straggler detector (MnRtt/MxRtt); stage from rank order (inference)"
        case RunFiguresFacts():
            return "the job's runs (perfd.analytics.run.runs)"
        case CadenceFacts():
            return cadence_source()
    return None


def _rebalance(f: RebalanceFacts) -> str:
    """Why and by how much to rebalance the stages."""
    parts: list[str] = []
    s = f.slower
    if s is not None:
        which = "last" if s.stage == s.pp - 1 else "first" if s.stage == 0 else f"{s.stage}"
        parts.append(f"the straggler detector's slower rank is rank {s.rank} (stage {s.stage}, the {which} "
                     f"stage) in {s.count}/{s.of} steady iterations")
    if f.logit_layers is not None:
        parts.append(f"the logit GEMM (6·h·V per token, V={f.padded_vocab}) is worth {f.logit_layers:.1f} "
                     "transformer layers of FLOPs")
    if f.uneven:
        parts.append("an uneven split is already configured: estimate skipped")
    elif f.per_layer_ms is not None:
        light, heavy, per = f.lighter_ms, f.heavier_ms, f.per_layer_ms
        basis = (f"estimated ~{per:.0f} ms compute per layer per iteration (lighter stage {light:.0f} ms / "
                 f"{f.layers_per_stage} layers, an inference) against a gap of {f.gap_ms:.0f} ms")
        if f.best_move:
            parts.append(f"{basis}: moving {f.best_move} layer(s) off the heavier stage "
                         f"(--decoder-last-pipeline-num-layers {f.layers_per_stage - f.best_move}) would "
                         f"bring the slowest stage from {heavy:.0f} to ~{f.new_heavier_ms:.0f} ms")
        else:
            parts.append(f"{basis}: moving one whole layer would flip the imbalance ({light + per:.0f} vs "
                         f"{heavy - per:.0f} ms); with {f.num_layers} layers on {f.pp} stages rebalance at "
                         "a finer grain (more layers per stage, or virtual stages with an uneven split)")
    return "; ".join(parts)


def _next_step(f: NextStepFacts) -> tuple[str, str]:
    """What would divide the compute time, and what the budget says of it."""
    name = f.job
    if f.divider is Divider.UNARMED_TIMELINE:
        act = (f"Divide the compute time with a timeline of a rank not under ncu (perfd capture --job {name} "
               "--tool kineto --steps 3 --ranks R, R not armed: the armed rank refuses it, one CUPTI client "
               "per process), or of the job before it was armed; the Nsight Compute rows on the compute part "
               "say what its profiled kernels do meanwhile")
    elif f.divider is Divider.TIMELINE:
        act = (f"Divide the compute time: a steady-state capture (perfd capture --job {name} "
               "--tool kineto --steps 3, or a rule with a capture action) names the ops that hold it, and "
               "perfd turns them into a step budget with remedies")
    else:
        launch = "the step hook in the loop" if f.hook_loop else "perfd launch --kineto -- torchrun ..."
        act = (f"Divide the compute time next run: start the job under {launch} with perfd agent beside it, "
               f"take a steady capture (perfd capture --job {name} --tool kineto --steps 3), then read it "
               "with this log: perfd analyze megatron LOG --capture TRACE (or perfd report --html ... "
               "--capture TRACE)")
    basis = (f"compute {f.compute_ms:.0f} ms per step ({f.compute_share:.0%}), not divided by the timers"
             + (f"; the model's FLOPs would take {f.ideal_ms:.0f} ms of it at the peak" if f.ideal_ms else "")
             if f.compute_ms is not None else "the timers do not divide the compute time")
    notes = ([f"TP={f.tp}: keep the tensor-parallel group within one node (NVLink)"] if f.tp is not None
             else []) + ([f"hidden size {f.hidden_size}: small GEMMs run far below peak on this GPU"]
                         if f.hidden_size is not None else [])
    return act, "; ".join([basis, *notes])


def recommendation_words(f: RunRecFacts) -> tuple[str, str]:
    """A run recommendation's action and detail."""
    match f:
        case RebalanceFacts():
            return ("Rebalance layers across pipeline stages: the last stage also computes the logits and "
                    "loss (e.g. --decoder-last-pipeline-num-layers / --account-for-loss-in-pipeline-split)",
                    _rebalance(f))
        case BubbleFacts():
            target = th.BUBBLE_TARGET.value
            return (f"Raise micro-batches per iteration from {f.microbatches} to ≥{f.need} "
                    f"(bubble ≤ {target:.0%}) or use interleaved PP",
                    f"m = global batch / (micro batch · DP); interleaving with v=2 would give {_pct(f.v2)} "
                    f"at m={f.microbatches} (--num-layers-per-virtual-pipeline-stage)")
        case GradSyncFacts():
            return ("Overlap gradient communication with compute: --use-distributed-optimizer "
                    "--overlap-grad-reduce --overlap-param-gather" if f.overlap
                    else "More gradient accumulation per step (more micro-batches) to amortise the reduce",
                    f"DP={f.dp}; check inter-node bandwidth")
        case DataShareFacts():
            # the action is the typed data-loading action's (Recommendation.data_loading): DATA_ACTIONS
            knobs = knobs_text(f.knobs_of, f.cpu_only) if f.knobs_of is not None else ""
            return "", (f"{f.timer} {_pct(f.share)} of the step; {knobs}"
                        + (f"; step time also jitters (CV {f.jitter_cv:.1%}, finding step-jitter)"
                           if f.jitter_cv is not None else ""))
        case OutsideFacts():
            return ("Name the time between the steps: iterate the loader through hook.loader(loader) if it "
                    "is the data, announce evaluations and checkpoint saves with hook.phase(...); else move "
                    "the work (logging, syncs) off the loop or do it less often",
                    f"outside the step {_pct(f.share)} of the step")
        case JitterFacts():
            slow = f.slow
            if f.beat and slow is not None:
                return (f"Find what runs every {slow.period_s:.1f} s beside the job: a monitoring agent's "
                        "poll, a logger's flush, a periodic eval or checkpoint callback, a cron or daemon on "
                        "the node",
                        f"{slow.count} of {slow.steps} steady steps, period {slow.period_s:.2f} s")
            return ("Look for host-side gaps: garbage collection, logging, checkpointing, other processes on "
                    "the node",
                    f"CV {f.cv:.1%}" + (f"; {slow.count} slow steps, {slow.excess_share:.1%} of the steady "
                                        "time" if slow is not None and slow.count else ""))
        case StragglerFacts():
            return (f"Check rank {f.rank}'s GPU health: clocks, throttle reasons, power, temperature, XID "
                    "errors, another process on its GPU; then uneven sharding",
                    "join with the NVML collector's samples for that GPU")
        case SpreadFacts():
            return NAME_THE_RANK[f.framework], ""
        case NextStepFacts():
            return _next_step(f)
        case CadenceFacts():
            return cadence_recommendation(f)


def slower_words(f: SlowerFacts) -> tuple[str, str]:
    """A capture's slower-than-steady finding's title and observation."""
    return (f"Device {f.device}: kernels ran {f.ratio:.1f}× slower than in steady state",
            f"Compute kernels took {f.per_iteration_ms:.0f} ms per captured iteration against "
            f"{f.steady_ms:.0f} ms of forward+backward compute per steady iteration (timers): the same work "
            "ran slower while captured — the GPU was shared, throttled, or clocked down.")


def worded_run(f: Finding) -> Finding:
    """A run finding (perfd.analytics.run.run_facts.RunFinding), a capture's slower-than-steady one, a
    capture's mismatch with the job (perfd.report.capture_text) or an Nsight Compute verdict's
    (perfd.report.ncu_text) with its words; any other as it is."""
    if isinstance(f, RunFinding) and f.facts is not None:
        title, observation = finding_words(f.facts)
        source = source_words(f.facts)
        # the figures' finding's evidence is the runs' JSON: as served, with why
        evidence = runs_json(f.facts.runs) if isinstance(f.facts, RunFiguresFacts) else f.evidence
        return dataclasses.replace(f, title=title, observation=observation, evidence=evidence,
                                   source=source if source is not None else f.source, facts=None)
    if isinstance(f, SlowerFinding) and f.facts is not None:
        title, observation = slower_words(f.facts)
        return dataclasses.replace(f, title=title, observation=observation,
                                   source="capture timeline vs Megatron timers", facts=None)
    return worded_ncu(worded_match(f))


def worded_run_recommendation(r: Recommendation) -> Recommendation:
    """A run recommendation with its action (where the facts make it) and detail, an Nsight Compute
    verdict's (perfd.report.ncu_text); any other as it is."""
    if isinstance(r, RunRecommendation) and r.facts is not None:
        action, detail = recommendation_words(r.facts)
        if not action and r.data_loading is not None:  # the typed data-loading action's words
            action = DATA_ACTIONS[r.data_loading]
        return dataclasses.replace(r, action=action or r.action, detail=detail, facts=None)
    return worded_ncu_recommendation(r)

"""The remedies as a plan (issue "the plan an engineer would make"), on the recorded H100 Megatron-LM job
(tests/data/captures/kineto_h100_megatron/ops_live3_*: core 0.20, local transformer, no TE, no Apex; its
log shows both missing): typed relations between remedies, the combined gain of a set counted once where
they overlap, the order by effort then gain, prerequisites against what the start-up shows, the idle of
the step charged by cause and phase, a capture window that cut a step, and the parts named for this
layout."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.advice.plan import Plan, Presence, Relation, combined, make_plan
from perfd.analytics.advice.remedies import (
    GAIN_MODEL,
    SYNC_EXPOSED_JITTER,
    Advice,
    Effort,
    FitContext,
    RemedyId,
    run_spread_ms,
)
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Said, Say
from perfd.analytics.breakdown.budget import IdleCause, Phase, StepBudget
from perfd.analytics.breakdown.replay_table import Change, ReplayTable
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.collectors.megatron import parse_file
from perfd.report.budget_text import part_title
from perfd.report.plan_view import compact, text_lines
from perfd.report.remedy_text import worded_plan
from tests.trace_cache import analyze_chrome_trace, timeline_class

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("plan")]

ROOT = Path(__file__).resolve().parents[2]
KINETO = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron"
TRACE, LOG = KINETO / "ops_live3_rank0.json.gz", KINETO / "ops_live3_megatron.log.gz"
H100 = "NVIDIA H100 80GB HBM3"
TE, APEX, FLASH = "transformer_engine", "apex", "flash_attn"


@pytest.fixture(scope="module")
def job() -> RunAnalysis:
    parsed = parse_file(LOG, job="big2048")
    return analyze_run(parsed.job_info, parsed.records, gpu_name=H100, job_name="big2048",
                       timeline=timeline_class(str(TRACE)), live=False)


def _budget(job: RunAnalysis) -> StepBudget:
    b = job.summary.step_budget
    assert b is not None and b.has_kernels
    return b


def _fit(job: RunAnalysis, **changes: Any) -> dict[RemedyId, Advice]:
    assert job.config is not None
    return {a.remedy: a for a in fit(FitContext(_budget(job), dataclasses.replace(job.config, **changes)))}


def _plan(job: RunAnalysis, **changes: Any) -> Plan:
    assert job.config is not None
    cfg = dataclasses.replace(job.config, **changes)
    b = _budget(job)
    p = make_plan(list(fit(FitContext(b, cfg))), cfg, b.step_ms, run_spread_ms(b.step_ms, b.step_sd_ms))
    assert p is not None
    return p


def _codes(s: Said | None) -> set[Say]:
    """Every code a sentence says, its nested ones with it."""
    if s is None:
        return set()
    return {s.code}.union(*(_codes(a) for a in s.args if isinstance(a, Said)))


# --- relations, combined gain, order -------------------------------------------------------------------
def test_fused_attention_replaces_the_remedies_acting_on_attentions_kernels(job: RunAnalysis) -> None:
    """Fused attention removes every slice of the unfused attention: the attention dropout's kernels and
    the mask fill's copies with the rest. It replaces the dropout and the Apex softmax fusion (they are
    moot once it is in), and the set of the three gains what fused attention gains alone: not the sum."""
    plan = job.plan
    assert plan is not None
    fa = plan.item("fused_attention")
    assert fa is not None
    links = {(k.relation, k.target) for k in fa.links}
    assert {(Relation.REPLACES, "attention_dropout"), (Relation.REPLACES, "softmax_fusion"),
            (Relation.REQUIRES, TE)} <= links
    drop = plan.item("attention_dropout")
    assert drop is not None and (Relation.REPLACED_BY, "fused_attention") in {(k.relation, k.target)
                                                                              for k in drop.links}
    a = _fit(job)
    three = combined([a[RemedyId.FUSED_ATTENTION], a[RemedyId.ATTENTION_DROPOUT], a[RemedyId.SOFTMAX_FUSION]],
                     plan.spread_ms)
    alone = combined([a[RemedyId.FUSED_ATTENTION]], plan.spread_ms)
    assert three == pytest.approx(alone)
    summed = sum(g.mid_ms for r in (RemedyId.FUSED_ATTENTION, RemedyId.ATTENTION_DROPOUT,
                                    RemedyId.SOFTMAX_FUSION) if (g := a[r].gain) is not None)
    assert summed > 1.5 * sum(alone) / 2  # what the old list added up


def test_the_timers_host_jitter_is_given_back_only_where_the_host_sets_the_pace(job: RunAnalysis) -> None:
    """Gain model 7: the timers' range reaches up by the job's host jitter (SYNC_EXPOSED_JITTER robust
    deviations of its steady steps) where the replayed step follows the host's speed, not where the GPU
    hides the host (ReplayGains.host_hidden; the six GPU-bound A/Bs held without it:
    docs/evidence/entries/40-issue-53-the-micro-batch-factor-and-the-timers-jitter-re-rea.md). The
    same job, the same timers' gap, two replays: one whose step moves with the host, one whose does not."""
    b, cfg = _budget(job), job.config
    assert cfg is not None and b.step_sd_ms and b.steady_step_ms
    clock = b.steady_step_ms
    paced_step, hidden_step = (0.6 * clock, 1.4 * clock), (clock - 2.0, clock + 2.0)  # at host speeds 0.5, 1

    def context(as_is: tuple[float, float]) -> FitContext:
        table = ReplayTable((0.5, 1.0), as_is, {"timers": ((as_is[0] - 5, as_is[1] - 5),) * 2}, 0.0, None)
        return FitContext(dataclasses.replace(b, replay=table), cfg)

    host, gpu = context(paced_step).replay, context(hidden_step).replay
    assert host is not None and host.host_share is not None and not host.host_hidden
    assert gpu is not None and gpu.host_share is not None and gpu.host_hidden
    paced, hidden = ({a.remedy: a for a in fit(context(x))}[RemedyId.TIMER_SYNC].gain
                     for x in (paced_step, hidden_step))
    assert paced is not None and hidden is not None
    assert paced.high_ms - hidden.high_ms == pytest.approx(SYNC_EXPOSED_JITTER * b.step_sd_ms)
    assert Say.HOST_JITTER in _codes(paced.basis) and Say.HOST_JITTER not in _codes(hidden.basis)


def test_micro_batch_and_timer_level_overlap_on_the_same_synchronisation_gaps(job: RunAnalysis) -> None:
    """Twice the micro-batch halves the per-micro-batch timer gaps that timer level 1 removes: the two
    overlap, and together they gain less than the sum of their gains (the shared gaps counted once)."""
    a = _fit(job)
    mb, timer = a[RemedyId.MICRO_BATCH], a[RemedyId.TIMER_SYNC]
    plan = job.plan
    assert plan is not None
    item = plan.item("micro_batch")
    assert item is not None
    shared = next(k for k in item.links if k.target == "timer_sync")
    assert shared.relation is Relation.OVERLAPS and shared.shared_ms is not None and shared.shared_ms[0] > 3
    spread = plan.spread_ms
    assert mb.gain is not None and timer.gain is not None
    # by the trace's slices: the sum counts the shared gaps twice (and the spread twice), the set once
    slices = combined([mb, timer], spread)
    removed = {r.atom: r.low_ms for x in (mb, timer) for r in x.removes}
    for r in mb.removes:
        removed[r.atom] = max(removed[r.atom], r.low_ms)
    assert slices[0] == pytest.approx(sum(removed.values()) - spread, abs=0.01)
    # both read from the replay (this H100 job's host is as fast as the profiled one: its slices hold
    # too): the set spans the slices' sum and the replay of the two together, less than their gains'
    assert mb.replay is Change.MICROBATCH and timer.replay is Change.TIMERS and plan.replay is not None
    assert plan.replay.slices_hold
    together = plan.replay.of((Change.MICROBATCH, Change.TIMERS))
    assert together is not None
    both = combined([mb, timer], spread, plan.replay)
    assert both == pytest.approx((min(slices[0], together[0] - spread), max(slices[1], together[1] + spread)))
    assert both[1] < mb.gain.high_ms + timer.gain.high_ms


def test_the_plan_goes_options_first_then_the_install_that_covers_most(job: RunAnalysis) -> None:
    """Stage 1: the options that take minutes (no install), by gain; stage 2: Transformer Engine, which
    brings fused attention, its layers, a fused optimizer, the gradient norm without a sync per tensor and
    the gradient accumulation fusion; then Apex, which adds nothing once TE is in (its fused softmax is
    replaced by fused attention). Each stage's total counts what the stages share once."""
    plan = job.plan
    assert plan is not None
    efforts = [s.effort for s in plan.stages]
    assert efforts == sorted(efforts, key=lambda e: e.rank) and efforts[0] is Effort.FLAG
    flags = plan.stages[0]
    assert set(flags.items) == {"attention_dropout", "micro_batch", "timer_sync"}
    # cross-entropy fusion's 1-4 ms is inside this job's own run-to-run spread (± 8 ms): listed to measure
    ce = plan.item("cross_entropy_fusion")
    assert ce is not None and ce.stage == -1 and ce.gain_ms is not None and ce.gain_ms[0] < 0 < ce.gain_ms[1]
    gains: list[tuple[float, float]] = []
    for r in flags.items:
        item = plan.item(r)
        assert item is not None and item.gain_ms is not None
        gains.append(item.gain_ms)
    assert [g[0] + g[1] for g in gains] == sorted((g[0] + g[1] for g in gains), reverse=True)
    te = plan.stages[1]
    assert te.install == (TE,) and "fused_attention" in te.items
    assert {"fused_optimizer", "fused_layers"} <= set(te.items)
    # the gradient norm's syncs and the main_grad accumulation (5-9 ms each) are inside the job's own
    # spread: listed apart, to measure once TE is in
    for r in ("grad_norm", "grad_accum_fusion"):
        item = plan.item(r)
        assert item is not None and item.stage == -1 and item.gain_ms is not None and item.gain_ms[1] > 5
    apex = plan.stages[2]
    assert apex.install == (APEX,) and apex.items == ("softmax_fusion",) and apex.gain_ms == (0.0, 0.0)
    assert plan.item("softmax_fusion").moot_by == "fused_attention"  # type: ignore[union-attr]
    for before, after in zip(plan.stages, plan.stages[1:], strict=False):
        assert after.total_ms[0] >= before.total_ms[0] - 1e-9
    # the options together: less than their gains summed (micro-batch and timers share gaps)
    summed_low = sum(g[0] for g in gains)
    assert flags.total_ms[0] > 0 and flags.total_ms[1] < sum(g[1] for g in gains)
    assert flags.total_ms[0] > summed_low  # the spread once, not four times


def test_every_option_the_plan_names_exists_in_megatron_0_20(job: RunAnalysis) -> None:
    with gzip.open(ROOT / "tests" / "data" / "megatron_options" / "0.20.txt.gz", "rt") as f:
        accepted = {r["option"]: r for r in map(json.loads, (x for x in f if x.startswith("{")))}
    plan = job.plan
    assert plan is not None and len(plan.items) >= 8
    for i in plan.items:
        for opt in [*i.flags, *i.remove]:
            option, _, value = opt.partition(" ")
            assert option in accepted, (i.remedy, option)
            assert accepted[option]["takes_value"] == bool(value), (i.remedy, opt)
    ga = plan.item("grad_accum_fusion")
    assert ga is not None and ga.remove == ("--no-gradient-accumulation-fusion",)


# --- prerequisites ---------------------------------------------------------------------------------------
def test_prerequisites_are_what_the_start_up_shows(job: RunAnalysis) -> None:
    """The log says TE and Apex are missing (Megatron-LM's fallback warnings, TE 0.0.0) and says nothing of
    flash-attn: fused attention requires TE, is an install, and does not name --attention-backend flash
    (with it TE uses only the separate flash-attn package); the default auto lets TE pick its cuDNN fused
    attention. The gradient norm and the fused optimizer need TE or Apex's CUDA extensions."""
    plan = job.plan
    assert plan is not None
    fa = plan.item("fused_attention")
    assert fa is not None and fa.effort is Effort.INSTALL
    assert [(p.package, p.presence) for p in fa.prerequisites] == [(TE, Presence.ABSENT)]
    assert not any("flash" in f for f in fa.flags)
    gn = plan.item("grad_norm")
    assert gn is not None and gn.any_of and {(p.package, p.presence) for p in gn.prerequisites} == {
        (TE, Presence.ABSENT), (APEX, Presence.ABSENT)}
    text = "\n".join(text_lines(worded_plan(plan), {}))
    assert "requires Transformer Engine or Apex (both missing at start-up)" in text


def test_with_te_present_its_remedies_are_options_and_apex_ones_fall_away(job: RunAnalysis) -> None:
    """The same budget for a job whose start-up shows TE 2.9 (and flash-attn): fused attention is an
    option (--transformer-impl transformer_engine --attention-backend flash, flash-attn being there), the
    gradient accumulation fusion is the flag removed, and neither the fused optimizer nor the per-tensor
    gradient norm is suggested (Megatron-LM uses TE's when TE is there)."""
    got = _fit(job, packages={TE: "2.9.0", APEX: "absent", FLASH: "2.7.4"})
    fa = got[RemedyId.FUSED_ATTENTION]
    assert fa.effort is Effort.FLAG and not fa.needs
    assert [f.text() for f in fa.flags] == ["--transformer-impl transformer_engine",
                                            "--attention-backend flash"]
    assert got[RemedyId.GRAD_ACCUM_FUSION].effort is Effort.FLAG
    assert RemedyId.FUSED_OPTIMIZER not in got and RemedyId.GRAD_NORM not in got
    unknown = _fit(job, packages={TE: "2.9.0"})[RemedyId.FUSED_ATTENTION]  # flash-attn not shown
    assert [f.text() for f in unknown.flags] == ["--transformer-impl transformer_engine"]  # auto: the default
    assert any(n.code is Say.NOT_FLASH_BACKEND for n in unknown.notes)
    plan = _plan(job, packages={TE: "2.9.0", APEX: "absent"})
    assert plan.stages[0].effort is Effort.FLAG and "fused_attention" in plan.stages[0].items


def test_apex_present_makes_its_softmax_fusion_an_option(job: RunAnalysis) -> None:
    got = _fit(job, packages={TE: "absent", APEX: "0.1"})
    sm = got[RemedyId.SOFTMAX_FUSION]
    assert sm.effort is Effort.FLAG and sm.remove == ("--no-masked-softmax-fusion",)
    assert RemedyId.GRAD_NORM not in got  # amp_C is there: Megatron-LM's norm is multi-tensor


# --- the missing remedies, re-modelled ones ---------------------------------------------------------------
def test_the_gradient_norms_syncs_and_the_main_grad_accumulation_are_remedies(job: RunAnalysis) -> None:
    """Without Apex or TE, Megatron-LM's local_multi_tensor_l2_norm calls .item() on each parameter
    tensor's norm: ~120 synchronisations a step in the optimizer phase (aten::item), the GPU idle after
    each. With --no-gradient-accumulation-fusion each weight gradient is added into main_grad by a kernel
    of its own (on a side stream): the fusion removes them once TE or Apex is in."""
    b = _budget(job)
    rows = [r for r in b.idle
            if r.cause is IdleCause.SYNC and r.phase is Phase.OPTIMIZER and r.owner == "aten::item"]
    assert len(rows) == 1 and 100 <= rows[0].gaps <= 160 and 4 < rows[0].ms < 10
    got = _fit(job)
    gn = got[RemedyId.GRAD_NORM]
    assert gn.gain is not None and gn.gain.mid_ms > 5 and gn.action.code is Say.GRAD_NORM
    assert Say.GRAD_NORM_BASIS in _codes(gn.gain.basis)  # the .item() syncs
    ga = got[RemedyId.GRAD_ACCUM_FUSION]
    assert ga.gain is not None and {Say.GRAD_ACCUM_BASIS, Say.SIDE_STREAM} <= _codes(ga.gain.basis)


def test_the_fused_optimizer_is_modelled_on_the_foreach_kernels_of_a_complete_step(job: RunAnalysis) -> None:
    """The trace shows torch's multi-tensor (foreach) AdamW, not per-tensor Adam: the model says so, and
    counts the optimizer phase of a complete step — its Adam kernels, the per-tensor scale and copy kernels
    of Megatron-LM's local multi_tensor_scale and the phase's launch gaps."""
    b = _budget(job)
    opt = b.get(Part.OPTIMIZER)
    assert opt is not None and 20 < opt.ms < 32  # the complete steps' (the window cut the third one)
    fo = _fit(job)[RemedyId.FUSED_OPTIMIZER]
    assert fo.gain is not None and Say.FOREACH_ADAM in _codes(fo.gain.basis)
    assert fo.action.code is Say.FUSED_OPTIMIZER_INSTALL and Say.PER_TENSOR_ADAM not in _codes(fo.action)
    assert {r.atom for r in fo.removes} >= {"optimizer:adam", "optimizer:per-tensor-scale"}
    # 20-30 ms by an op-level count of the complete step; ± the job's own spread (8 ms) around the model
    assert 5 < fo.gain.low_ms < 20 < 30 < fo.gain.high_ms < 35


def test_a_larger_micro_batch_does_not_scale_the_per_step_gaps(job: RunAnalysis) -> None:
    """Only the gaps paid per micro-batch (forward-backward launch gaps, the per-micro-batch timers) halve;
    the optimizer phase's are per step. With every gap moved into the optimizer phase the remedy finds
    nothing to halve."""
    mb = _fit(job)[RemedyId.MICRO_BATCH]
    assert all(Phase.OPTIMIZER.value not in r.atom for r in mb.removes)
    b = _budget(job)
    moved = tuple(dataclasses.replace(r, phase=Phase.OPTIMIZER) for r in b.idle)
    assert job.config is not None
    none = fit(FitContext(dataclasses.replace(b, idle=moved), job.config))
    assert RemedyId.MICRO_BATCH not in {a.remedy for a in none}


# --- idle by cause, the window, names ---------------------------------------------------------------
@pytest.fixture(scope="module")
def device() -> Any:
    return analyze_chrome_trace(TRACE).devices[0]


def test_idle_is_charged_to_what_precedes_it(device: Any) -> None:
    """Every gap is charged once: the idle parts add up to the span's idle. Few of the short gaps are the
    sub-5 µs launch gaps a 'launch-bound' reading assumes; the rest follow synchronisations (the timers'
    bare torch.cuda.synchronize, the gradient norm's .item()), each named by the op that made it."""
    idle = sum(device.parts_ms.get(p, 0.0) for p in ("idle_sync", "idle_short", "idle_switch", "idle_long",
                                                       "data"))
    assert idle == pytest.approx(device.idle_ms, rel=1e-6)
    owners = {(r.cause, r.phase, r.owner) for r in device.idle}
    assert (IdleCause.SYNC, Phase.LAYERS, "torch.cuda.synchronize()") in owners
    assert (IdleCause.SYNC, Phase.OPTIMIZER, "aten::item") in owners
    assert (IdleCause.SYNC, Phase.OPTIMIZER, "c10d::barrier") in owners
    launch = sum(r.ms for r in device.idle if r.cause is IdleCause.LAUNCH)
    assert 0 < device.launch_latency_ms < 0.25 * launch  # few of the launch gaps are the launch latency
    sync = sum(r.ms for r in device.idle if r.cause is IdleCause.SYNC)
    assert sync > 0.25 * device.idle_ms
    # the short gaps after a sync while the host, ahead of the GPU before it, refills the queue it drained:
    # the sync's too, by its owner
    refill = sum(r.ms for r in device.idle if r.cause is IdleCause.REFILL)
    assert {r.owner for r in device.idle if r.cause is IdleCause.REFILL} <= \
        {r.owner for r in device.idle if r.cause is IdleCause.SYNC}
    assert device.parts_ms["idle_sync"] == pytest.approx(sync + refill, rel=1e-6)


def test_the_optimizer_phase_holds_the_gradient_norm_and_master_weight_kernels(device: Any) -> None:
    """The ops no rule places that run between the last backward and the next forward (Megatron-LM's
    per-tensor norm, the clipping's mul, the master weights' copy_) are the optimizer's."""
    ops = device.complete.part_op_ms["optimizer"]
    assert any("linalg_vector_norm" in k for k in ops) and any("_foreach_" in k for k in ops)
    assert "linalg_vector_norm" not in json.dumps(device.complete.part_op_ms.get("pointwise", {}))


def test_the_window_that_cut_a_step_is_found_and_kept_out(job: RunAnalysis, device: Any) -> None:
    """Kineto's iteration-aligned window ends once the third step's optimizer.step returns on the host: the
    GPU had run part of that step's optimizer phase. The budget is the mean of the two complete steps
    between the first and last marks, and says the window cut a step's optimizer (its edges ~13 of 26 ms)."""
    assert device.trace_steps == 3 and device.complete is not None and device.complete.steps == 2
    b = _budget(job)
    assert b.window is not None and (b.window.marked, b.window.complete) == (3, 2)
    (cut,) = b.window.cut
    assert cut.part is Part.OPTIMIZER and cut.edge_ms < 0.6 * cut.expected_ms
    whole = device.parts_ms["optimizer"] / 3
    assert b.ms(Part.OPTIMIZER) > 1.15 * whole  # the span over 3 marks under-read it
    assert b.step_ms == pytest.approx(device.complete.span_ms / 2, rel=1e-6)


def test_a_trace_without_step_marks_keeps_the_span_over_its_steps() -> None:
    """No host side (the trace cut to its GPU events): no marks, so no complete steps to take and nothing
    claimed about a cut; no sync seen, so the idle goes by gap length alone, as before."""
    d = analyze_chrome_trace(KINETO / "big2048_rank0.json.gz").devices[0]
    assert d.complete is None
    assert {r.cause for r in d.idle} <= {IdleCause.LAUNCH, IdleCause.HOST} and "idle_sync" not in d.parts_ms


def test_the_gradient_reduction_part_is_named_for_what_it_is_with_dp_1(job: RunAnalysis) -> None:
    p = _budget(job).get(Part.GRAD_REDUCE)
    assert p is not None and part_title(p) == "gradient accumulation (main_grad +=, a side stream)"


def test_the_plan_travels_as_json_and_reads_in_one_line(job: RunAnalysis) -> None:
    plan = worded_plan(job.plan)  # what travels is the plan as shown: its items' actions worded
    assert plan is not None and all(i.action and i.said is None for i in plan.items)
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back == plan
    assert back.combined(plan.stages[0].items) == pytest.approx(plan.stages[0].total_ms)
    line = compact(plan.to_json())
    assert line.startswith("1) 3 option(s) −") and "2) install Transformer Engine −" in line
    assert "Apex" not in line  # a stage that adds nothing is not a step of the plan


def test_perfd_top_shows_the_plan_in_one_line(job: RunAnalysis) -> None:
    """The aggregator's summary carries the report's plan; `perfd top` reads it as one line."""
    from perfd.app.commands import top_screen as top
    from perfd.report.training_report import analysis_json

    summary = json.loads(json.dumps({**analysis_json(job, rows=iter(())), "iterations": []}))
    line = top.plan_text(summary)
    assert line is not None and line.plain.startswith("plan: 1) 3 option(s) −")
    assert top.plan_text({"report": {"plan": None}}) is None  # no capture: no plan line, not an empty one


def test_the_ab_script_writes_the_plan_from_a_capture_and_holds_it_to_the_bar() -> None:
    """tests/gpu/plan_ab_live.py's plan step on this recorded capture (what it runs on the GPU machine
    before any change), and its table on measurements made up to sit inside and outside the ranges."""
    from tests.gpu.plan_ab_live import plan_from
    from tests.gpu.plan_ab_table import table

    got = plan_from(TRACE, LOG, H100, "big2048")
    # every options-only item alone (cross-entropy fusion, listed apart to measure, too); the set the plan's
    assert set(got["apply_here"]) == {"attention_dropout", "micro_batch", "timer_sync",
                                      "cross_entropy_fusion"}
    assert set(got["set"]["remedies"]) == {"attention_dropout", "micro_batch", "timer_sync"}
    assert "fused_attention" in got["cannot_run_here"]
    lo, hi = got["set"]["gain_ms"]
    base = 700.0

    def run(ms: float, at: float) -> dict[str, Any]:
        return {"steady": {"n": 16, "median_ms": ms}, "started_at": at}

    runs = {"base": run(base, 10), "base_mid": run(base + 2, 11), "base_end": run(base - 2, 12)}
    for k, (a, b) in ((k, v["gain_ms"]) for k, v in got["apply_here"].items()):
        runs[k] = run(base - (a + b) / 2, 20)
    runs["set"] = run(base - (lo + hi) / 2, 30)
    t = table({"big2048": {"plan": {**got, "written_at": 5.0}, "runs": runs, "gpu": H100}})
    c = t["configs"][0]
    assert c["predicted_before_applying"] and c["spread_ms"] == pytest.approx(4.0)
    assert t["inside"] == t["singles"] == 4 and c["set"]["within_20pct"]
    assert got["model"] == GAIN_MODEL
    late = table({"big2048": {"plan": {**got, "written_at": 25.0}, "runs": runs}})
    assert not late["configs"][0]["predicted_before_applying"] and not late["done"]


def test_the_ab_table_averages_a_repeated_change_against_the_bases_beside_each_run() -> None:
    """plan_ab_live --repeat: a change run twice is held, per run, to the base runs either side of that
    run (never to a neighbouring change), the mean of the two judged; a base's ``_<n>`` is no repeat and
    a repeat is no base."""
    from tests.gpu.plan_ab_table import is_base, markdown, split_repeat, table

    assert split_repeat("base_1") == ("base_1", 1) and is_base("base_1") and is_base("base")
    assert split_repeat("set@2") == ("set", 2) and not is_base("base_x@2") and not is_base("set@2")
    assert split_repeat("micro_batch") == ("micro_batch", 1) and split_repeat("a@1") == ("a@1", 1)

    def run(ms: float, at: float) -> dict[str, Any]:
        return {"steady": {"n": 16, "median_ms": ms}, "started_at": at, "exit": 0}

    plan = {"written_at": 1.0, "apply_here": {"a": {"gain_ms": [8.0, 14.0], "flags": ["--a"], "remove": []},
                                              "b": {"gain_ms": [0.0, 50.0], "flags": ["--b"], "remove": []}},
            "set": {"remedies": ["a", "b"], "gain_ms": [30.0, 50.0]}}
    # --base-every 2 --repeat 2: base a b base_1 set a@2 base_2 b@2 set@2 base_3 (a@2's neighbour set
    # and b@2's a@2 are changes: each run is held to the bases either side of it, not to them)
    runs = {"base": run(300, 10), "a": run(290, 11), "b": run(280, 12), "base_1": run(304, 13),
            "set": run(260, 14), "a@2": run(293, 15), "base_2": run(308, 16), "b@2": run(250, 17),
            "set@2": run(270, 18), "base_3": run(312, 19)}
    t = table({"x": {"plan": plan, "runs": runs, "gpu": H100, "repeat": 2}})
    c = t["configs"][0]
    assert c["bases_ms"] == [300, 304, 308, 312] and c["repeat"] == 2
    a, b = c["rows"]
    # a: 302 − 290 = 12 beside base and base_1; a@2: 306 − 293 = 13 beside base_1 and base_2
    assert a["saved_each_ms"] == pytest.approx([12.0, 13.0]) and a["saved_ms"] == pytest.approx(12.5)
    assert a["measured_ms"] == pytest.approx(291.5) and a["inside"]
    assert b["saved_each_ms"] == pytest.approx([22.0, 60.0]) and b["saved_ms"] == pytest.approx(41.0)
    s = c["set"]
    assert s["saved_each_ms"] == pytest.approx([46.0, 40.0]) and s["saved_ms"] == pytest.approx(43.0)
    assert s["sum_of_singles_ms"] == pytest.approx(53.5) and s["within_20pct"]
    assert "| 12.5 (12.0, 13.0) | yes |" in markdown(t) and "ran 2 times in turn" in markdown(t)
    # one run of a change (an A/B before --repeat): the table it always gave, no brackets
    one = table({"x": {"plan": plan, "runs": {k: v for k, v in runs.items() if "@" not in k}}})
    a1 = one["configs"][0]["rows"][0]
    assert a1["saved_ms"] == pytest.approx(12.0) and a1["saved_each_ms"] == pytest.approx([12.0])
    assert "| 12.0 | yes |" in markdown(one) and "in turn" not in markdown(one)


def test_the_ab_reads_a_change_by_the_estimate_it_fixed_before_its_runs() -> None:
    """plan_ab_live --estimate median: one base run far from the others moves the mean of the runs beside
    it, not their median; the A/B keeps the estimate it began with (an A/B from before the option reads
    the mean), and an estimate it does not know is refused, never guessed."""
    from tests.gpu.plan_ab_table import estimate_of, markdown, table

    def run(ms: float, at: float) -> dict[str, Any]:
        return {"steady": {"n": 16, "median_ms": ms}, "started_at": at, "exit": 0}

    plan = {"written_at": 1.0, "apply_here": {"a": {"gain_ms": [5.0, 15.0], "flags": ["--a"], "remove": []}},
            "set": {"remedies": ["a"], "gain_ms": [5.0, 15.0]}}
    # base a base_1 a@2 base_2 a@3 base_3: base_1 stepped 24 ms slow, once (the sixteenth A/B's base_2)
    runs = {"base": run(450, 10), "a": run(440, 11), "base_1": run(474, 12), "a@2": run(440, 13),
            "base_2": run(450, 14), "a@3": run(440, 15), "base_3": run(450, 16)}
    mean = table({"x": {"plan": plan, "runs": runs, "repeat": 3}})["configs"][0]["rows"][0]
    median = table({"x": {"plan": plan, "runs": runs, "repeat": 3, "estimate": "median"}})
    m = median["configs"][0]["rows"][0]
    assert mean["saved_each_ms"] == m["saved_each_ms"] == pytest.approx([22.0, 22.0, 10.0])
    assert mean["saved_ms"] == pytest.approx(18.0) and not mean["inside"]
    assert m["saved_ms"] == pytest.approx(22.0) and not m["inside"]  # two of three runs beside base_1
    runs["base_1"] = run(450, 12)
    calm = table({"x": {"plan": plan, "runs": runs, "repeat": 3, "estimate": "median"}})["configs"][0]
    assert calm["estimate"] == "median" and calm["rows"][0]["saved_ms"] == pytest.approx(10.0)
    assert "the median of its runs'" in markdown(median)
    assert estimate_of({}) == "mean"
    with pytest.raises(ValueError, match="unknown estimate"):
        estimate_of({"estimate": "trimmed"})


def test_the_ab_script_runs_the_changes_in_turn_with_bases_between() -> None:
    """plan_ab_live's run order: --repeat 1 is the order it always ran; more passes number their runs
    <change>@<k> and their bases on."""
    from tests.gpu.plan_ab_live import run_order

    assert run_order(["a", "b", "set"]) == ["base", "a", "base_1", "b", "base_2", "set", "base_3"]
    assert run_order(["a", "b", "set"], 2) == ["base", "a", "b", "base_1", "set", "base_2"]
    assert run_order(["a", "b"], 1, 2) == ["base", "a", "base_1", "b", "base_2",
                                          "a@2", "base_3", "b@2", "base_4"]
    assert run_order(["a", "b", "set"], 2, 2) == ["base", "a", "b", "base_1", "set", "a@2", "base_2",
                                                  "b@2", "set@2", "base_3"]
    # the kept A/Bs ran this order (a base after every change; v4 after every two)
    for d, every in (("plan_h100_v5", 1), ("plan_h100_v4", 2)):
        res = json.loads((EVIDENCE / d / "ab_long_seq.json").read_text())
        ran = sorted(res["runs"], key=lambda k: res["runs"][k]["started_at"])
        changes = [*res["plan"]["apply_here"], "set"]
        assert ran == run_order(changes, every) == run_order(changes, every, 1), d


@pytest.mark.parametrize("trace", ["ops_default_rank0.json.gz", "ops_live_rank0.json.gz",
                                   "ops_stack_rank0.json.gz"])
def test_each_recorded_window_is_checked_for_a_cut_step(trace: str) -> None:
    """The other captures of the remedies' H100 job
    (docs/evidence/entries/25-remedies-applied-one-at-a-time-on-the-issue-s-h100-job-attri.md; the on-demand
    default, the live rule's, the one with Python stacks): three marks, two complete steps, and the last
    step's optimizer phase cut by the window in each (Kineto stops once the third optimizer.step returns on
    the host)."""
    from perfd.analytics.breakdown.capture_budget import window_of

    d = analyze_chrome_trace(KINETO / trace).devices[0]
    w, src = window_of(d, d.trace_steps)
    assert w is not None and (w.marked, w.complete) == (3, 2) and src is d.complete
    assert [c.part for c in w.cut] == [Part.OPTIMIZER]


EVIDENCE = ROOT / "docs" / "evidence"  # plan_<gpu>/ab_<config>.json; the capture under kineto_<gpu>_megatron


# One test per kept A/B configuration: each re-derives its plans from a whole trace (twice with a base
# reading), ~15-30 s apiece, 135-268 s for all of them in one test: under load, near the 300 s timeout.
AB_EVIDENCE = sorted(EVIDENCE.glob("plan_h*/ab_*.json"))


@pytest.mark.parametrize("f", AB_EVIDENCE or [None],
                         ids=lambda f: f"{f.parent.name}/{f.stem}" if f else "none")
def test_the_ab_evidence_holds_when_recorded(f: Path | None) -> None:
    """The GPU A/B (tests/gpu/plan_ab_live.py), once its outputs are kept: each configuration's plan was
    written before any change ran, and the ranges the model gives now from the recorded capture and log
    (tests/data/captures/kineto_h100_megatron/plan_<config>_*) are the ones it wrote then (the check is
    of the model as it stands)."""
    from tests.gpu.plan_ab_live import captured_of, plan_from

    if f is None:
        pytest.skip("the plan A/B has not been recorded in docs/evidence/plan_<gpu> yet")
    res = json.loads(f.read_text())
    name = f.stem[3:]
    runs = res.get("runs") or {}
    written = res["plan"]["written_at"]
    assert all(r["started_at"] > written for k, r in runs.items() if not k.startswith("base")), name
    if res["plan"].get("model", 1) != GAIN_MODEL:  # written by an earlier model: kept as it measured
        return
    kineto = KINETO.parent / f"kineto_{f.parent.name.removeprefix('plan_')}_megatron"
    now = plan_from(kineto / f"plan_{name}_rank0.json.xz", kineto / f"plan_{name}_megatron.log.gz",
                    res.get("gpu") or H100, name, captured_of(res))
    for remedy, item in res["plan"]["apply_here"].items():
        assert now["apply_here"][remedy]["gain_ms"] == pytest.approx(item["gain_ms"], rel=0.02), remedy
    at_base = res.get("plan_at_base")
    if at_base:  # read again at the first base run's step, before any change ran: the same model
        first = float(runs["base"]["steady"]["median_ms"])
        changes = [r["started_at"] for k, r in runs.items() if not k.startswith("base")]
        assert at_base["written_at"] < min(changes), name
        again = plan_from(kineto / f"plan_{name}_rank0.json.xz", kineto / f"plan_{name}_megatron.log.gz",
                          res.get("gpu") or H100, name, captured_of(res), first,
                          at_base["set"]["remedies"])
        for remedy, item in at_base["apply_here"].items():
            got = again["apply_here"][remedy]["gain_ms"]
            assert got == pytest.approx(item["gain_ms"], rel=0.02), remedy
        assert again["set"]["gain_ms"] == pytest.approx(at_base["set"]["gain_ms"], rel=0.02)

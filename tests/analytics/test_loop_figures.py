"""The step budget's figures on two published training loops recorded on one H200 (tests/data/loops,
read as tests/analytics/loop_recordings.py says), each checked against an independent reading: the
model's FLOPs counted by hand from its architecture, the idle gaps of the raw trace read here with
json alone.
"""

from __future__ import annotations

import dataclasses

import pytest

from perfd.analytics.advice.remedies import SYNC_GAP_BACK, Effort, RemedyId
from perfd.analytics.breakdown.budget import IdleCause, StepBudget
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.steps.flops import FlopsBasis
from perfd.capture.sweep import DATA_SHARE_OF_GAP
from perfd.report import build_report, render_text
from tests.analytics.loop_recordings import HF, NANOGPT, analysis, meta, raw_gaps


@pytest.fixture(scope="module")
def nano() -> RunAnalysis:
    return analysis(NANOGPT)


@pytest.fixture(scope="module")
def hf() -> RunAnalysis:
    return analysis(HF)


def _budget(a: RunAnalysis) -> StepBudget:
    b = a.summary.step_budget
    assert b is not None
    return b


def gemm_flops_per_token(layers: int, h: int, ffn: int, mats: int, vocab: int, q: int | None = None) -> int:
    """Every weight matrix × 6 FLOPs per token (forward 2, backward 4): QKV and the output projection
    (4·h·q a layer, q the heads' width, h without GQA or its own head size), the MLP (``mats`` matrices of
    h × ffn), the LM head (h × vocab)."""
    return 6 * (layers * (4 * h * (q or h) + mats * h * ffn) + h * vocab)


def test_nanogpt_linear_layers_run_their_own_flops_not_the_models(nano: RunAnalysis) -> None:
    """GPT-2 124M, 65,536 tokens a step: its GEMMs run 6·T·(12·(4h² + 2·h·4h) + h·V) = 48.59 TFLOP of
    the 52.30 the hook states (the rest: causal attention's QKᵀ and ·V, 3.71 TFLOP). The linear layers'
    68.3 ms run those at 711 TFLOP/s, 90% of the 790 TFLOP/s ceiling (the whole count over the same
    time read 766 TFLOP/s, 97%)."""
    b = _budget(nano)
    lin = b.get(Part.LINEAR)
    assert lin is not None
    own = gemm_flops_per_token(12, 768, 3072, 2, 50304) * 65536.0
    stated = 52299816763392.0  # the hook's flops_per_step: 6·N·T plus causal attention at half
    attention = 6 * 1024 * 768 * 12 * 65536.0
    assert own + attention == pytest.approx(stated, rel=1e-9)
    per_gpu = b.mfu * b.peak_tflops * 1e12 * b.steady_step_ms / 1e3 if b.mfu and b.peak_tflops and \
        b.steady_step_ms else None
    assert per_gpu is not None
    assert lin.detail["flops_basis"] == FlopsBasis.GEMMS.value
    assert lin.detail["flops"] == pytest.approx(per_gpu * own / stated, rel=1e-6)
    achieved = float(lin.detail["achieved_tflops"])
    assert achieved == pytest.approx(lin.detail["flops"] / (lin.ms * 1e9))
    assert 700 < achieved < 720 and 0.88 < float(lin.detail["of_ceiling"] or 0) < 0.92
    att = b.get(Part.ATTENTION)
    assert att is not None and att.detail["flops"] == pytest.approx(per_gpu * attention / stated, rel=1e-6)
    text = " ".join(render_text(build_report(nano)).split())  # the lines as words, unwrapped
    assert "run their own FLOPs (the formula's GEMM terms" in text and f"{achieved:.0f} TFLOP/s" in text


def test_hf_linear_layers_run_the_gemm_share_of_the_stated_count(hf: RunAnalysis) -> None:
    """The Llama the Trainer built (SwiGLU: three MLP matrices of 768 × 2048, 12 heads of 128: q_proj 768 ×
    1536, vocabulary 16,000): its GEMM terms are 753.2M FLOPs a token of the formula's 866.5M (86.9%);
    the budget divides that share of the count the hook stated by the linear layers' time."""
    b = _budget(hf)
    lin = b.get(Part.LINEAR)
    assert lin is not None and lin.detail["flops_basis"] == FlopsBasis.GEMMS.value
    gemms = gemm_flops_per_token(12, 768, 2048, 3, 16000, q=1536)
    share = gemms / (gemms + 6 * 1024 * 1536 * 12)
    assert gemms + 6 * 1024 * 1536 * 12 == 866_451_456  # the hook's count a token (its records)
    assert share == pytest.approx(0.8693, abs=1e-4)
    assert b.mfu and b.peak_tflops and b.steady_step_ms
    per_gpu = b.mfu * b.peak_tflops * 1e12 * b.steady_step_ms / 1e3
    assert lin.detail["flops"] == pytest.approx(per_gpu * share, rel=1e-6)


def test_a_count_stated_whole_gives_the_linear_layers_no_speed_without_its_split() -> None:
    """The step hook's flops_per_step with no model to divide it by: dividing the whole count (core
    attention's among it) by the linear layers' time would overstate them (nanoGPT read 97% of the
    ceiling that way); GEMMs known by name only run the whole count, said so."""
    from perfd.analytics.breakdown.budget import FlopsContext, math_detail
    from perfd.analytics.steps.flops import (
        FORMULA_CURRENT,
        FORMULA_LEGACY,
        flops_split,
        model_flops,
        six_n_flops,
    )
    from perfd.core.model import ModelSpec

    whole = FlopsContext(flops_per_gpu_step=52.3e12, peak_tflops=989.0, ceiling_tflops=790.0)
    assert math_detail(Part.LINEAR, 68.3, whole) == {}
    assert math_detail(Part.GEMM, 68.3, whole)["flops_basis"] == FlopsBasis.WHOLE_MODEL.value
    spec = ModelSpec(num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=12,
                     kv_channels=64, seq_length=1024, padded_vocab_size=50304)
    per_seq = flops_split(None, spec, None, "pytorch")  # a stated count: the formula's shares, one sequence
    assert per_seq is not None and per_seq.formula == FORMULA_CURRENT and per_seq.causal_halved
    assert per_seq.gemm_share == pytest.approx(741408768 / 798031872)
    legacy = flops_split(model_flops(spec, 8, "0.11.0"), spec, "0.11.0")
    assert legacy is not None and not legacy.causal_halved
    assert (legacy.attention_share or 0) > (per_seq.attention_share or 0)
    six = flops_split(six_n_flops(124_000_000, 65536), ModelSpec())
    assert six is not None and six.basis is FlopsBasis.SIX_N and six.attention_share is None
    assert flops_split(None, ModelSpec(num_layers=12)) is None  # nothing to divide the count by
    assert FORMULA_LEGACY == legacy.formula


def _idle(b: StepBudget, cause: IdleCause, owner: str | None = None) -> float:
    return sum(r.ms for r in b.idle if r.cause is cause and (owner is None or r.owner == owner))


def test_nanogpt_idle_is_the_gpus_own_switches_and_the_syncs_knock_on(nano: RunAnalysis) -> None:
    """nanoGPT's host runs 1-17 ms ahead of its GPU: every short gap but those after its per-iteration
    loss.item() is before a kernel launched long before the GPU reached it (the GPU's own switch: 4.0 ms
    a step), not the host issuing slower than the GPU; after the .item() the GPU waits 1.7 ms for the
    sync, then 0.6 ms more while the host refills the queue, charged to the sync (2.3 ms a step). The
    raw trace read here with json alone gives the same split."""
    b = _budget(nano)
    raw = raw_gaps(NANOGPT)
    assert raw["steps"] == 1.0 and b.iterations == 1.0
    assert _idle(b, IdleCause.LAUNCH) < 0.01 and b.get(Part.IDLE_SHORT) is None
    assert _idle(b, IdleCause.SWITCH) == pytest.approx(raw["ahead"], rel=1e-3)
    assert b.ms(Part.IDLE_SWITCH) == pytest.approx(raw["ahead"], rel=1e-3) and 3.8 < raw["ahead"] < 4.2
    sync, refill = _idle(b, IdleCause.SYNC, "aten::item"), _idle(b, IdleCause.REFILL, "aten::item")
    assert sync == pytest.approx(raw["behind_max"], rel=1e-3) and 1.6 < sync < 1.8
    assert sync + refill == pytest.approx(raw["behind"], rel=1e-3) and 0.5 < refill < 0.7
    assert b.ms(Part.IDLE_SYNC) == pytest.approx(sync + refill, rel=1e-6)
    # the sync remedy's gain is read from both (before the run-to-run spread: its removal)
    item = nano.plan.item(RemedyId.TIMER_SYNC.value) if nano.plan is not None else None
    assert item is not None
    (gone,) = item.removes
    assert (gone.low_ms, gone.high_ms) == pytest.approx(((sync + refill) * SYNC_GAP_BACK[0],
                                                         (sync + refill) * SYNC_GAP_BACK[1]))
    text = " ".join(render_text(build_report(nano)).split())  # the lines as words, unwrapped
    assert "Idle, launch gaps" not in text and "the host issuing work slower" not in text
    assert "aten::item in the optimizer phase 1.7 ms (1 a step) and 0.6 ms after it while the host " \
           "refilled the queue" in text
    assert "idle, kernel switches" in text


def test_hf_idle_is_the_host_behind_its_gpu(hf: RunAnalysis) -> None:
    """The eager Trainer's host is behind its GPU: its short gaps are launch gaps (the host issuing work
    slower than the GPU runs it), the GPU's own switches a few ms; no sync's knock-on (the host was
    behind before each sync too). The raw trace's reading: 2.5 ms a step ahead, the rest behind (as
    captured: the budget scales the host's gaps back to the unprofiled step, below)."""
    b = _budget(hf)
    raw = raw_gaps(HF)
    assert raw["steps"] == 2.0
    assert _idle(b, IdleCause.SWITCH) == pytest.approx(raw["ahead"], rel=1e-3) and raw["ahead"] < 3.0
    behind = sum(_idle(b, c) for c in (IdleCause.LAUNCH, IdleCause.HOST, IdleCause.SYNC, IdleCause.DATA,
                                        IdleCause.REFILL))
    f = b.unprofiled.factor if b.unprofiled is not None else 1.0  # the profiler's share taken out
    data = b.ms(Part.DATA)  # the GPU idle while the host made a batch: the job's own, as captured
    # the Trainer makes a step's four batches with the GPU's queue drained: about the fetches' host time
    # (a gap is charged whole where the loader took at least DATA_SHARE_OF_GAP of it)
    assert 0.9 * raw["fetch"] < data <= raw["fetch"] / DATA_SHARE_OF_GAP
    assert behind == pytest.approx((raw["behind"] - data) * f + data, rel=1e-3)
    assert _idle(b, IdleCause.REFILL) == 0.0 and _idle(b, IdleCause.LAUNCH) > 0.75 * (behind - data)


@pytest.mark.parametrize("name", [NANOGPT, HF])
def test_the_losss_log_softmax_does_not_make_fused_attention_unfused(name: str, nano: RunAnalysis,
                                                                      hf: RunAnalysis) -> None:
    """Both loops run attention in cuDNN's fused SDPA kernels; their cross-entropy's log-softmax kernels
    (Inductor's triton_..._log_softmax_..., PyTorch's cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>)
    read as attention's softmax made it 'unfused': its FLOPs counted twice and a fused-attention remedy
    offered to a job that has it."""
    from perfd.analytics.breakdown.kernels import is_softmax

    a = nano if name == NANOGPT else hf
    att = _budget(a).get(Part.ATTENTION)
    assert att is not None and att.detail["fused"] is True
    assert att.detail["executed_flops"] == att.detail["flops"]
    assert a.plan is None or a.plan.item(RemedyId.FUSED_ATTENTION.value) is None
    assert not is_softmax("triton_red_fused__log_softmax__unsafe_view_prepare_softmax_online_view_15")
    kernel = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, {}>(...)"
    assert not is_softmax(kernel.format("at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue"))
    assert is_softmax(kernel.format("at::native::(anonymous namespace)::SoftMaxForwardEpilogue"))


def test_hf_budget_is_brought_back_to_the_unprofiled_step_before_gains(hf: RunAnalysis) -> None:
    """The profiler slowed the host-bound Trainer's steps: 422 ms captured (the raw trace's complete
    steps) against its steady 300 ms (293 ms by its own clock). Its GPU's time (168 ms of kernels, 2.5 ms
    of its own switches) a host-side profiler does not change, nor the GPU's idle while the host made
    its batches (the data loader's fetches record a few ops a ms for the profiler to slow), so the host's
    other gaps (251 ms less the data wait) are scaled by (300 − 168 − 2.5 − data) / (251 − data) ≈ 0.41:
    CUDA graphs are modelled from ~80 ms of launch gaps, not the ~196 the profiler made of them. The
    budget says so, typed."""
    b = _budget(hf)
    raw = raw_gaps(HF)
    u = b.unprofiled
    assert u is not None and b.steady_step_ms is not None
    own = meta(HF)["own_clock_median_ms"]
    assert b.steady_step_ms == pytest.approx(own, rel=0.03)  # the job's steady step is the loop's
    assert u.captured_ms == pytest.approx(raw["step_ms"], rel=1e-6) and u.steady_ms == b.steady_step_ms
    data = b.ms(Part.DATA)
    assert 0.9 * raw["fetch"] < data <= raw["fetch"] / DATA_SHARE_OF_GAP
    assert u.host_idle_ms == pytest.approx(raw["behind"] - data, rel=1e-3)
    factor = (b.steady_step_ms - raw["busy"] - raw["ahead"] - data) / (raw["behind"] - data)
    assert u.factor == pytest.approx(factor, rel=1e-3) and 0.38 < factor < 0.45
    assert b.step_ms == pytest.approx(b.steady_step_ms, rel=1e-9)
    assert b.capture_overhead_ms == pytest.approx(raw["step_ms"] - b.steady_step_ms, rel=1e-6)
    kernels = sum(p.ms for p in b.parts if p.part not in (Part.IDLE_SYNC, Part.IDLE_SHORT, Part.IDLE_SWITCH,
                                                            Part.IDLE_LONG, Part.DATA))
    assert kernels == pytest.approx(raw["busy"], rel=1e-3)  # the GPU's time as captured
    assert b.ms(Part.IDLE_SWITCH) == pytest.approx(raw["ahead"], rel=1e-3)
    launch = _idle(b, IdleCause.LAUNCH, "")
    assert launch == pytest.approx(200.06 * factor, rel=0.01)  # the captured launch gaps, scaled
    item = hf.plan.item(RemedyId.CUDA_GRAPHS.value) if hf.plan is not None else None
    assert item is not None
    gaps = next(r for r in item.removes if r.atom.startswith("idle:launch:forward-backward"))
    assert gaps.high_ms == pytest.approx(0.8 * sum(r.ms for r in b.idle if r.cause is IdleCause.LAUNCH
                                                   and r.phase.value == "forward-backward"))
    assert gaps.high_ms < 0.8 * 110  # not the ~196 ms the profiler made of them
    back = StepBudget.from_json(b.to_json())
    assert back is not None and back.unprofiled == u
    text = " ".join(render_text(build_report(hf)).split())
    assert (f"the captured 422 ms step (the profiler added +123 ms) brought back to the job's steady 300 ms, "
            f"its host-side idle (the gaps after syncs, the launch gaps, the host elsewhere: "
            f"{raw['behind'] - data:.0f} ms) × {u.factor:.2f}, the GPU's time as captured, the data wait "
            f"({data:.0f} ms) not scaled") in text
    assert u.data_ms == pytest.approx(data)


def test_nanogpt_budget_is_read_as_captured(nano: RunAnalysis) -> None:
    """nanoGPT's captured step (132 ms) is within the profiler's usual cost of its steady 134 ms: read as
    captured, nothing rescaled."""
    b = _budget(nano)
    assert b.unprofiled is None and b.step_ms == pytest.approx(raw_gaps(NANOGPT)["step_ms"], rel=1e-6)


def test_a_budget_is_rescaled_only_within_the_profilers_reach() -> None:
    """Captured within th.CAPTURE_SLOWDOWN of the steady step: as captured; past
    th.CAPTURE_OTHER_JOB_STEP: another job's steps, not rescaled; the GPU's time alone past the steady
    step: nothing the host's gaps could give back."""
    from perfd.analytics.breakdown.budget import BudgetPart, Source
    from perfd.analytics.breakdown.capture_budget import unprofiled

    def budget(kernels: float, idle: float, steady: float) -> StepBudget:
        parts = (BudgetPart(Part.LINEAR, kernels, 0.0, Source.CAPTURE),
                 BudgetPart(Part.IDLE_SHORT, idle, 0.0, Source.CAPTURE))
        return StepBudget(kernels + idle, parts, (Source.CAPTURE,), steady_step_ms=steady)

    assert unprofiled(budget(100.0, 5.0, 100.0)).unprofiled is None  # +5%
    assert unprofiled(budget(100.0, 150.0, 100.0)).unprofiled is None  # 2.5×: another job's
    assert unprofiled(budget(130.0, 20.0, 120.0)).unprofiled is None  # the kernels alone are past it
    got = unprofiled(budget(100.0, 60.0, 130.0))
    assert got.unprofiled is not None and got.unprofiled.factor == pytest.approx(0.5)
    assert got.ms(Part.IDLE_SHORT) == pytest.approx(30.0) and got.step_ms == pytest.approx(130.0)
    # a data wait the timers measured is their share of the steady step; the other gaps take the rest
    from perfd.analytics.breakdown.budget import PartDetail

    timed = BudgetPart(Part.DATA, 16.0, 0.0, Source.TIMERS, PartDetail(timer_share=0.1,
                                                                          from_idle_ms={"idle_long": 16.0}))
    b = budget(100.0, 44.0, 130.0)
    got = unprofiled(dataclasses.replace(b, step_ms=b.step_ms + 16.0, parts=(*b.parts, timed)))
    assert got.ms(Part.DATA) == pytest.approx(13.0) and got.step_ms == pytest.approx(130.0)
    assert got.ms(Part.IDLE_SHORT) == pytest.approx(17.0) and got.unprofiled is not None
    assert got.unprofiled.factor == pytest.approx(17.0 / 44.0)


@pytest.mark.parametrize("name", [NANOGPT, HF])
def test_every_plan_item_has_a_modelled_gain_and_each_effort_is_ordered_by_it(name: str, nano: RunAnalysis,
                                                                              hf: RunAnalysis) -> None:
    a = nano if name == NANOGPT else hf
    plan = a.plan
    assert plan is not None and plan.items
    assert all(i.gain_ms is not None for i in plan.items)
    for stage in range(-1, len(plan.stages)):
        for effort in Effort:
            mids = [sum(i.gain_ms) / 2 for i in plan.items if i.stage == stage and i.effort is effort
                    and i.gain_ms is not None]
            assert mids == sorted(mids, reverse=True), (stage, effort)
    assert all(r.gain_ms is not None for r in a.recommendations if r.remedy)
    text = " ".join(render_text(build_report(a)).split())
    assert "gain not estimated" not in text


def test_a_remedy_with_no_modelled_gain_is_listed_apart_from_the_plan() -> None:
    """Unfused attention (a Megatron-LM job's local attention on an H100) read with no model FLOPs:
    fused attention fits, but what its kernel would cost is unknown, so it has no gain: it is no plan
    item and no recommendation (it used to be one, "effort: a code change" and nothing else), but a
    note of its own, with why."""
    from perfd.analytics.advice.budget_findings import BudgetContext, analyze
    from perfd.analytics.advice.plan import make_plan
    from perfd.analytics.advice.remedies import FitContext, JobConfig, NoGain, run_spread_ms
    from perfd.analytics.advice.remedy_catalog import fit
    from perfd.analytics.breakdown.capture_budget import from_capture
    from perfd.report.plan_view import text_lines
    from perfd.report.remedy_text import worded_plan, worded_remedies
    from tests.analytics.loop_recordings import LOOPS
    from tests.trace_cache import analyze_chrome_trace

    trace = LOOPS.parent / "captures" / "kineto_h100_megatron" / "ops_live3_rank0.json.gz"
    b = from_capture(analyze_chrome_trace(trace).devices[0], 3)
    assert b is not None
    advice = fit(FitContext(b, JobConfig()))
    fused = next(x for x in advice if x.remedy is RemedyId.FUSED_ATTENTION)
    assert fused.gain is None and fused.no_gain is NoGain.ATTENTION_FLOPS
    plan = worded_plan(make_plan(advice, JobConfig(), b.step_ms, run_spread_ms(b.step_ms, None)))
    assert plan is not None and plan.item(RemedyId.FUSED_ATTENTION.value) is None
    (u,) = plan.unmodelled
    assert u.remedy == RemedyId.FUSED_ATTENTION.value and u.why is NoGain.ATTENTION_FLOPS
    assert u.action.startswith("Fused attention: torch.nn.functional.scaled_dot_product_attention")
    lines = text_lines(plan, {})
    assert any(line.strip().startswith("Not modelled") for line in lines)
    assert "what the fused kernel would cost is not read" in lines[-1]
    back = type(plan).from_json(plan.to_json())
    assert back is not None and back.unmodelled == plan.unmodelled
    fs, rs = analyze(BudgetContext(b))
    assert all(r.remedy != RemedyId.FUSED_ATTENTION.value for r in rs)
    note = next(worded_remedies(f) for f in fs if f.id == "budget-unmodelled-remedies")
    assert note.title.startswith("1 remedy with no modelled gain") and "Fused attention" in note.observation


@pytest.mark.parametrize("name", [NANOGPT, HF])
def test_mfu_states_how_its_flops_were_counted(name: str, nano: RunAnalysis, hf: RunAnalysis) -> None:
    """Both loops' hooks counted FLOPs from their model= by perfd's formula (Megatron-Core's: 6 per weight
    per token plus causal attention at half): the MFU finding says so, typed (its evidence) and in
    words. nanoGPT's own MFU line (``mfu 134%``: against an A100's 312 TFLOP/s) does not reach perfd:
    neither recording's log states a throughput perfd reads, so no log figure is shown beside it."""
    from perfd.analytics.steps.flops import MfuConvention

    a = nano if name == NANOGPT else hf
    assert a.mfu_convention is MfuConvention.HOOK_CAUSAL_HALF
    f = next(x for x in a.findings if x.id == "mfu-grade")
    assert f.evidence["convention"] == MfuConvention.HOOK_CAUSAL_HALF.value
    assert f.evidence["logged_tflops_per_gpu"] is None
    text = " ".join(render_text(build_report(a)).split())
    assert ("Model FLOPs as the step hook counted them from its model=, by perfd's formula, Megatron-Core's "
            "since 0.12: 6 per weight per token for every GEMM, the LM head's among them, plus core "
            "attention's QKᵀ and ·V with the causal mask counted at half.") in text
    assert "the log's own throughput" not in text


def test_the_mfu_convention_of_each_count() -> None:
    """A count the hook stated follows perfd's formula only where its model record gave the job's spec;
    else it is the script's own. Each formula's convention as Megatron-Core's releases and torchtitan
    count attention."""
    from perfd.analytics.steps.flops import (
        FORMULA_6N,
        FORMULA_CURRENT,
        FORMULA_LEGACY,
        FORMULA_STATED,
        FORMULA_TORCHTITAN,
        MfuConvention,
        mfu_convention,
        read_spec,
    )
    from perfd.core.model import ModelSpec
    from tests.analytics.loop_recordings import MODELS

    spec = read_spec(MODELS[NANOGPT]).spec
    assert mfu_convention(FORMULA_STATED, spec) is MfuConvention.HOOK_CAUSAL_HALF
    assert mfu_convention(FORMULA_STATED, ModelSpec(dtype="bf16")) is MfuConvention.STATED
    assert mfu_convention(FORMULA_CURRENT, spec) is MfuConvention.CAUSAL_HALF
    assert mfu_convention(FORMULA_LEGACY, spec) is mfu_convention(FORMULA_TORCHTITAN, spec) \
        is MfuConvention.ATTENTION_WHOLE
    assert mfu_convention(FORMULA_6N, spec) is MfuConvention.SIX_N and mfu_convention(None, spec) is None


def test_a_megatron_log_says_its_convention_and_its_own_throughput_beside_perfds() -> None:
    """A Megatron-LM log (--log-throughput, 2 H200s): perfd counts its FLOPs by its formula for the
    job's release (causal attention at half) and shows the log's own TFLOP/s beside its MFU."""
    from perfd.analytics.steps.flops import MfuConvention
    from perfd.collectors.megatron.parser import parse_file
    from tests.analytics.loop_recordings import LOOPS

    parsed = parse_file(LOOPS.parent / "megatron" / "dp2_all_timers.log")
    a = analyze_run(parsed.job_info, parsed.records, "NVIDIA H200", live=False)
    assert a.mfu_convention is MfuConvention.CAUSAL_HALF
    f = next(x for x in a.findings if x.id == "mfu-grade")
    logged = a.summary.median("logged_tflops_per_gpu")
    assert logged is not None and f.evidence["logged_tflops_per_gpu"] == logged
    text = " ".join(render_text(build_report(a)).split())
    assert "Model FLOPs by perfd's formula, Megatron-Core's since 0.12" in text
    own = f"the log's own throughput {logged:.1f} TFLOP/s per GPU ({logged / 989.0:.1%} of the same peak)"
    assert own in text

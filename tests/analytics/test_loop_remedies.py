"""The remedies that pay on the loops people write, fitted to two published loops recorded on one H200
(tests/data/loops): nanoGPT's train.py (compiled GPT-2 124M, 16×1024 tokens a micro-batch, 4 a step,
vocabulary 50304, bf16 autocast; its own clock 133.5 ms a step) and transformers' run_clm.py (an eager
137.8M Llama, 8×1024 tokens a micro-batch, 4 a step, vocabulary 16000; 293 ms a step unprofiled).

Each gain is held to a reading of the trace's own kernels and gaps made apart from perfd's attribution
(the raw Chrome trace: each kernel's launch on the host placed between the two ``Optimizer.step#``
annotations of the first complete step), written down in each test's docstring. Every range is widened
by the run-to-run spread, 0.5% of the captured step (0.66 ms of nanoGPT's 132.3 ms, 2.1 ms of the Llama's
422.2 ms): perfd.analytics.advice.remedies.run_spread_ms.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfd.analytics.advice.budget_findings import BudgetContext, plan_of
from perfd.analytics.advice.plan import PlanItem
from perfd.analytics.advice.remedies import Advice, Effort, FitContext, Framework, JobConfig, RemedyId, Risk
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Said, Say
from perfd.analytics.breakdown.budget import IdleCause, Phase, StepBudget, TimerShares
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.casts_seen import CastGroup, CastsSeen, weight_casts
from perfd.analytics.breakdown.replay_table import Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.capture.ops import Launch
from perfd.capture.step_replay import _MB_START, HostTrace, simulate, timeline
from perfd.report.plan_view import text_lines
from perfd.report.remedy_text import detail_text, text, worded_plan
from tests.trace_cache import analyze_chrome_trace

LOOPS = Path(__file__).resolve().parents[1] / "data" / "loops"
SPREAD = 0.005  # remedies.RUN_SPREAD_OF_STEP: what every range carries beside its model


def _budget(name: str) -> StepBudget:
    folder = LOOPS / name
    clock = json.loads((folder / "meta.json").read_text())["own_clock_median_ms"]
    dev = analyze_chrome_trace(folder / "trace.json.xz").devices[0]
    b = from_capture(dev, dev.trace_steps, timers=TimerShares(step_ms=clock))
    assert b is not None
    return b


def _fitted(b: StepBudget, framework: Framework = Framework.PYTORCH) -> dict[RemedyId, Advice]:
    return {a.remedy: a for a in fit(FitContext(b, JobConfig(framework=framework)))}


@pytest.fixture(scope="module")
def nanogpt() -> StepBudget:
    return _budget("nanogpt_h200")


@pytest.fixture(scope="module")
def llama() -> StepBudget:
    return _budget("hf_clm_h200")


def _near(got: float, want: float, tol: float) -> bool:
    return abs(got - want) <= tol


def _sentences(s: Said) -> list[Said]:
    """A sentence and every sentence nested in it."""
    return [s, *(x for a in s.args if isinstance(a, Said) for x in _sentences(a))]


def test_compiled_loss_kernels_are_the_loss(nanogpt: StepBudget) -> None:
    """Inductor's kernels that fused the log-softmax are the cross-entropy's, whatever region launched
    them. Reading: triton_red_fused__log_softmax__unsafe_view_prepare_softmax_online_view_15 (4 × 1.17
    ms), triton_red_fused__log_softmax__log_softmax_backward_data_…_nll_loss_backward_…_0 (4 × 1.27 ms)
    and _16, _17 (0.05 ms): 9.80 ms of the complete step, left in "other pointwise" before."""
    assert _near(nanogpt.ms(Part.LOSS), 9.80, 0.05)
    assert all("log_softmax" in k["name"] for k in nanogpt.get(Part.LOSS).detail["kernels"])  # type: ignore[union-attr]


def test_the_micro_batches_are_the_forward_passes_between_optimizer_steps(nanogpt: StepBudget,
                                                                           llama: StepBudget) -> None:
    """nanoGPT fetches its batch with its own get_batch (no DataLoader range) and the trace lost the GPU
    activity of its last micro-batch; the Trainer fetches a step's four batches before the first forward:
    both run 4 micro-batches a step (meta.json), counted as their forward passes on the host."""
    assert nanogpt.replay is not None and nanogpt.replay.microbatches == 4
    assert llama.replay is not None and llama.replay.microbatches == 4


def _host(prefetch: bool, lost: bool = False) -> HostTrace:
    """One step (marks at 0 and 100 ms, the optimizer phase its first ms: one 0.5 ms kernel) of 4
    micro-batches at 10, 30, 50, 70 ms: each a forward of 3 launches (1 ms kernels) then a backward of 3
    (2 ms). The batches are fetched all at 2 ms (``prefetch``, as the Trainer does) or each 1 ms before
    its forward; ``lost``: the last micro-batch's launches have no GPU activity in the trace."""
    ms = 1e6
    launches = [Launch(0, 1, 0.1 * ms, "cudaLaunchKernel")]
    device = {0: (0.2 * ms, 0.7 * ms, 7)}
    backward: set[int] = set()
    corr = 0
    for k, t in enumerate((10.0, 30.0, 50.0, 70.0)):
        for j in range(6):
            corr += 1
            at = (t + j) * ms
            launches.append(Launch(corr, 1, at, "cudaLaunchKernel"))
            if j >= 3:
                backward.add(corr)
            if not (lost and k == 3):
                device[corr] = (at + 0.01 * ms, at + (1.0 if j < 3 else 2.0) * ms, 7)
    fetches = [2.0 * ms] * 4 if prefetch else [(t - 1.0) * ms for t in (10.0, 30.0, 50.0, 70.0)]
    return HostTrace(launches, (), device, (0.0, 100 * ms), {}, {}, {}, ((0.0, 1.0 * ms),), fetches,
                     frozenset(backward))


def test_a_step_whose_batches_are_fetched_first_splits_at_its_forward_passes() -> None:
    """Fetched first, the batches no longer mark the micro-batches (the fetches' count said 1 a step, and
    twice the micro-batch dropped all but the first, the step's work with them): each forward's first
    launch does. Fetched each before its forward, the fetches still mark them (Megatron-LM's loop); a
    micro-batch the trace kept no GPU activity of is counted on the host all the same."""
    for prefetch in (True, False):
        t = timeline(_host(prefetch))
        assert t is not None and t.microbatches == 4
        starts = [i for i, e in enumerate(t.events) if e.flags & _MB_START]
        assert starts == [1, 7, 13, 19], prefetch
        # as traced: the last micro-batch ends at 79 ms (9 ms of kernels from 70 ms); half the micro-batches
        # at twice the rows (the replay's lo end: 2×): the second, of 18 ms, from 30 ms
        assert simulate(t, 1.0) == pytest.approx(79.0 - 0.1, abs=0.1)
        assert simulate(t, 1.0, frozenset({Change.MICROBATCH})) == pytest.approx(48.0 - 0.1, abs=0.2)
    lost = timeline(_host(True, lost=True))
    assert lost is not None and lost.microbatches == 4


def test_fewer_larger_micro_batches_in_nanogpt(nanogpt: StepBudget) -> None:
    """Reading of the complete step: the GPU idles 4.58 ms in 2619 gaps under 1 ms; 3.99 ms of them are
    its own switches between kernels the host had queued long before (one a kernel), none a gap where the
    host launched late; autograd's AccumulateGrad runs 225 CUDAFunctor_add<float> kernels (75 parameters
    × micro-batches 2-4), 1.45 ms. Under bf16 autocast each micro-batch casts the fp32 weights of its 49
    matmuls (12 layers × 4, and the tied lm_head) and their gradients back: 388 kernels, 1.79 ms a step
    (the weights' casts below). Twice the micro-batch absorbs 2 of 4: half the switches (~1.95 ms), half
    to two thirds of the adds (0.72-0.96), half the weight casts (0.89): 3.56-3.80 ms, ± 0.66 → 2.9-4.46
    (it was 2.0-3.57 without the casts; the job measured 4.77 ms). The memory it needs is said as a
    factor of the activations (no memory in the trace). Its weight-gradient GEMMs run split-K: 144
    cuBLAS splitKreduce kernels a step (36 a micro-batch, three a layer), 1.15 ms; at twice the rows none
    to half of them go (cuBLAS may split the longer inner dimension twice as far): up to 0.57 more, so
    2.9-5.03 (the job measured 4.77, 4.89 and 4.78 ms in three A/Bs, above the 4.46 without them)."""
    mb = _fitted(nanogpt)[RemedyId.MICRO_BATCH]
    assert mb.gain is not None and mb.replay is None  # the replay cannot reach nanoGPT's clock
    assert _near(mb.gain.low_ms, 2.9, 0.1) and _near(mb.gain.high_ms, 5.03, 0.1)
    splitk = next(r for r in mb.removes if r.atom == "gemm:splitk_reduce")
    assert splitk.low_ms == 0.0 and _near(splitk.high_ms, 0.57, 0.02)
    (sk,) = [x for x in _sentences(mb.gain.basis) if x.code is Say.SPLITK_GO]
    assert sk.args[0] == 36 and "split-K reductions" in text(mb.gain.basis)
    casts = next(r for r in mb.removes if r.atom == "casts:weights")
    assert _near(casts.low_ms, 0.89, 0.02) and casts.high_ms == casts.low_ms
    (said,) = [x for x in _sentences(mb.gain.basis) if x.code is Say.WEIGHT_CASTS_GO]
    assert said.args[0] == 97 and "autocast's casts of the fp32 weights" in text(mb.gain.basis)
    assert mb.action.code is Say.MICRO_BATCH_TORCH and mb.action.args[:2] == (4, 2)
    assert mb.cost is not None and mb.cost.code is Say.ACTIVATION_MEMORY and mb.cost.args == (2.0,)
    assert mb.effort is Effort.CODE


def test_nanogpts_weight_casts_are_told_from_its_activation_casts(nanogpt: StepBudget) -> None:
    """Reading of the raw trace's complete step (kernels launched between the first two
    Optimizer.step#AdamW.step annotations; grids as Kineto records them), the kernels that only cast:

    - forward (under CompiledFunction): triton_poi_fused__to_copy_t_4 96 × 5.9 µs, 0.568 ms (c_fc and
      the MLP's c_proj, 24 a micro-batch, grid 4608 = 768×3072 / 512); _to_copy_t_0 48, 0.223 ms
      (c_attn, 3456 = 768×2304 / 512); _to_copy_t_3 48, 0.109 ms (attention's c_proj, 576 = 768² /
      1024); _to_copy_t_13 4, 0.207 ms (the tied wte/lm_head, 37728 = 50304×768 / 1024): 196, 1.107 ms;
    - backward (under CompiledFunctionBackward), the gradients: _to_copy_3 96 × 4.3 µs, 0.416 ms (grid
      2304 = 768×3072 / 1024); _to_copy_8 48 × 3.5 µs, 0.168 ms; _to_copy_6 48 × 2.1 µs, 0.100 ms: 192,
      0.684 ms;
    - not the weights': _to_copy_view_2 96 × 17.2 µs, 1.648 ms (grid 12288 = 16×1024×768 / 1024: an
      activation's gradient, the rows × the width, cast for a GEMM), and wte's gradient cast fused with
      the tied embedding's (_to_copy_add_13, 4, 0.347 ms: an add, not counted).

    388 kernels (97 a micro-batch), 1.79 ms a step. The other engineer's 2.3 ms of backward casts is the
    0.68 here and the activation gradients' 1.65."""
    assert nanogpt.replay is not None
    casts = weight_casts(nanogpt.casts, nanogpt.replay.microbatches or 0)
    by = {(g.name, g.backward): g for g in casts}
    assert sum(g.count for g in casts) == 388 and _near(sum(g.ms for g in casts), 1.79, 0.01)
    assert _near(sum(g.ms for g in casts if not g.backward), 1.107, 0.01)
    assert _near(sum(g.ms for g in casts if g.backward), 0.684, 0.01)
    assert by[("triton_poi_fused__to_copy_3", True)].count == 96
    assert ("triton_poi_fused__to_copy_view_2", True) not in by  # as many as c_fc's, 3× as long each
    seen = {(g.name, g.backward) for g in nanogpt.casts.groups}  # type: ignore[union-attr]
    assert ("triton_poi_fused__to_copy_view_2", True) in seen
    # a set of casts not one a micro-batch (or no micro-batches to share them) is none
    assert weight_casts(nanogpt.casts, 5) == () and weight_casts(None, 4) == ()


def test_a_backward_cast_pairs_only_with_a_forward_weight_cast_of_its_count_and_time() -> None:
    """The backward's pure casts are a weight's gradient only where a forward weight cast matches them:
    as many a step, at most PAIRED_TIME apart a kernel, one each; an eager cast counts where autograd
    linked it to a parameter's gradient, else not at all (an activation's cast under aten::linear)."""
    fwd = CastGroup("triton_poi_fused__to_copy_t_4", False, False, 8.0, 0.040)  # 5 µs each
    grad = CastGroup("triton_poi_fused__to_copy_3", True, False, 8.0, 0.032)  # 4 µs
    act = CastGroup("triton_poi_fused__to_copy_view_2", True, False, 8.0, 0.136)  # 17 µs: the rows'
    twin = CastGroup("triton_poi_fused__to_copy_5", True, False, 8.0, 0.030)  # a second one, unpaired
    eager = CastGroup("void at::native::unrolled_elementwise_kernel<direct_copy>", True, True, 8.0, 0.1)
    loose = CastGroup("void at::native::vectorized_elementwise_kernel<bfloat16_copy>", False, False, 8.0, 0.1)
    got = weight_casts(CastsSeen((fwd, grad, act, twin, eager, loose)), 4)
    assert got == (eager, fwd, grad)
    assert weight_casts(CastsSeen((fwd, act)), 4) == (fwd,)
    assert weight_casts(CastsSeen((dataclasses.replace(fwd, count=6.0), grad)), 4) == ()


def test_the_trainers_weight_casts_are_autograds_and_add_nothing_to_the_replay(llama: StepBudget) -> None:
    """Reading of the eager Llama's complete step: under aten::linear > aten::to > aten::_to_copy >
    aten::copy_, 584 bf16_copy kernels a step, 146 a micro-batch: its 85 weights (12 layers × 7
    projections, the lm_head) and 61 activations (the fp32 inputs of q, k, v, gate, up and the lm_head);
    backward, 680 ToCopyBackward0 direct_copy kernels, of which the 340 whose node the autograd thread
    follows with an AccumulateGrad (85 a micro-batch) are the weights' gradients: 340 + 340 kernels,
    1.33 + 2.44 ms a step. The replay gives the Trainer's gain (its host sets the pace: the GPU's casts
    are under its launches): the casts are in the slices' model only, the gain as it was (91.7-104.7)."""
    assert llama.replay is not None and llama.replay.microbatches == 4
    casts = weight_casts(llama.casts, 4)
    assert all(g.linked for g in casts) and sorted(g.count for g in casts) == [340, 340]
    assert _near(sum(g.ms for g in casts if not g.backward), 1.33, 0.02)
    assert _near(sum(g.ms for g in casts if g.backward), 2.44, 0.02)
    mb = _fitted(llama)[RemedyId.MICRO_BATCH]
    without = _fitted(dataclasses.replace(llama, casts=None))[RemedyId.MICRO_BATCH]
    assert mb.replay is Change.MICROBATCH and mb.gain == without.gain
    assert _near(next(r.low_ms for r in mb.removes if r.atom == "casts:weights"), 1.88, 0.02)
    assert StepBudget.from_json(json.loads(json.dumps(llama.to_json()))) == llama


def test_fewer_larger_micro_batches_in_the_trainer_loop(llama: StepBudget) -> None:
    """Reading: the host sets the pace. Each traced step (432 and 412 ms) fetches its 4 batches first
    (31 ms), then runs 4 micro-batches of ~97 ms of host work for ~42 ms of kernels each (168 ms of 8089
    kernels a step), and 6-7 ms of optimizer. On the job's own 293 ms (its host ~0.69× the profiled one),
    a micro-batch is ~67 ms of host; twice the rows make ~84 ms of kernels: 2 such micro-batches, the
    fetch and the optimizer, ~194 ms, a gain of ~100 ms (90-110 for the host's share of the fetch and
    the optimizer). It cannot pass 293 − 160 (the kernels at 0.95-1.0× of twice the rows): 133 ms."""
    mb = _fitted(llama)[RemedyId.MICRO_BATCH]
    assert mb.gain is not None and mb.replay is Change.MICROBATCH
    assert mb.gain.low_ms <= 110 and mb.gain.high_ms >= 90
    assert 80 <= mb.gain.low_ms and mb.gain.high_ms <= 133


def test_one_micro_batch_a_step_gets_no_micro_batch_remedy(nanogpt: StepBudget) -> None:
    """The remedy removes what each micro-batch after the first pays: with one a step (or a count the
    trace does not show, or an odd one) there is nothing to absorb."""
    assert nanogpt.replay is not None
    for m in (1, None, 3):
        b = dataclasses.replace(nanogpt, replay=dataclasses.replace(nanogpt.replay, microbatches=m))
        assert RemedyId.MICRO_BATCH not in _fitted(b), m


def test_a_compiled_model_gets_no_fused_linear_cross_entropy(nanogpt: StepBudget) -> None:
    """nanoGPT's loss runs in Inductor's fused kernels (9.80 ms a step); the fused linear + cross-entropy
    called outside the compiled graph made its step 59 ms slower on the H200 (two runs, bases either
    side), and traced into by torch.compile it failed: a compiled plain-PyTorch or Lightning model is not
    offered it. The zero gradient of its returned logits (1.94 ms) stays the loss-only remedy's."""
    fitted = _fitted(nanogpt)
    assert RemedyId.CE_FUSION not in fitted
    assert RemedyId.CE_FUSION not in _fitted(nanogpt, Framework.LIGHTNING)
    assert {r.atom for r in fitted[RemedyId.LOSS_ONLY].removes} == {"logits:zero_grad"}


def test_returning_only_the_loss_in_nanogpt(nanogpt: StepBudget) -> None:
    """Reading: the 1.94 ms of zero fill above, gone (× 0.88-1.12): 1.71-2.17 ms, ± 0.66 → 1.05-2.83. It
    shares its atom with the fused loss: a plan counts that time once."""
    lo = _fitted(nanogpt)[RemedyId.LOSS_ONLY]
    assert lo.gain is not None and _near(lo.gain.low_ms, 1.05, 0.15) and _near(lo.gain.high_ms, 2.83, 0.15)
    assert [r.atom for r in lo.removes] == ["logits:zero_grad"] and lo.effort is Effort.CODE


def test_no_loss_only_remedy_where_the_trace_does_not_show_its_cost(llama: StepBudget) -> None:
    """The eager Llama's loss: cunn_SoftMaxForward 4 × 0.37 ms, cunn_SoftMaxBackward 4 × 0.52 ms, NLL's
    fill of its gradient 4 × 0.11 ms and its two reductions 0.12 ms: 4.13 ms, 1.4% of the job's own
    299.6 ms step (the budget brought back to it): a fused loss is named. Eager autograd fills no gradient
    for the logits the model returns (no CompiledFunctionBackward): nothing to return only the loss for."""
    got = _fitted(llama)
    assert _near(llama.ms(Part.LOSS), 4.13, 0.05)
    assert RemedyId.CE_FUSION in got and RemedyId.LOSS_ONLY not in got


def test_no_graphs_for_a_compiled_job_whose_host_is_ahead(nanogpt: StepBudget) -> None:
    """Reading: every forward-backward gap of nanoGPT's complete step is the GPU switching between kernels
    the host had launched long before (the host 1-7 ms ahead): graphs take launches off the host, which is
    not what the GPU waits for here. No CUDA-graphs remedy."""
    assert RemedyId.CUDA_GRAPHS not in _fitted(nanogpt)


def test_the_uncompiled_job_keeps_its_cuda_graphs_words(llama: StepBudget) -> None:
    """The eager Llama's launch gaps (46% of the step as captured) pay for graphs as before: torch.compile
    with mode="reduce-overhead", its gain from those gaps (195.8 ms as captured in the forward-backward
    phase, 81 ms brought back to the unprofiled step: the data wait kept as captured, the host's other
    gaps × 0.41; × 0.3-0.8, less 5% of the step)."""
    g = _fitted(llama)[RemedyId.CUDA_GRAPHS]
    assert g.action.code is Say.GRAPHS_COMPILE and g.gain is not None
    # the gaps where the host launched late, brought back to the job's unprofiled step
    launch = sum(r.ms for r in llama.idle if r.cause is IdleCause.LAUNCH and r.phase is Phase.LAYERS)
    assert llama.unprofiled is not None and launch == pytest.approx(195.8 * llama.unprofiled.factor, rel=1e-3)
    assert _near(g.gain.low_ms, launch * 0.3 - 0.05 * llama.step_ms - SPREAD * llama.step_ms, 1.5)


@pytest.fixture(scope="module")
def lightning() -> StepBudget:
    return _budget("lightning_h200")


# --- remedies that failed as said (docs/evidence/loops_ab_h200: applied one at a time on an H200) ---------
def test_the_trainers_cuda_graphs_are_no_promised_plan_item(llama: StepBudget) -> None:
    """`--torch_compile_mode reduce-overhead` on the Trainer's run_clm.py (4 micro-batches a step) failed:
    a compiled call's output overwritten by the next replay. Its range stays (the launch gaps it would give
    back, wholly above zero), but it is no item of the set: listed to measure, with why, and its cost says
    what the graphs need of the loop and that the Trainer's own step is where the mark would go."""
    g = _fitted(llama, Framework.HF_TRAINER)[RemedyId.CUDA_GRAPHS]
    assert g.gain is not None and g.gain.low_ms > 0 and not g.gain.promised
    assert g.gain.risk is Risk.GRAPHS_TRAINER
    assert g.cost is not None and g.cost.code is Say.GRAPHS_KEEP_HF
    plan = plan_of(BudgetContext(llama, Framework.HF_TRAINER, config=JobConfig(Framework.HF_TRAINER)))
    item = plan.item(RemedyId.CUDA_GRAPHS.value) if plan is not None else None
    assert plan is not None and item is not None and item.stage == -1 and item.risk is Risk.GRAPHS_TRAINER
    assert all(RemedyId.CUDA_GRAPHS.value not in s.items for s in plan.stages)
    assert PlanItem.from_json(item.to_json()).risk is Risk.GRAPHS_TRAINER  # as the plan's JSON keeps it
    detail = detail_text(g, llama.step_ms, None)
    assert "not promised" in detail and "torch.compiler.cudagraph_mark_step_begin()" in detail
    lines = text_lines(worded_plan(plan), {})
    graphs = next(x for x in lines if "--torch_compile_mode reduce-overhead" in x)
    assert "not promised" in graphs and lines.index(graphs) > next(
        i for i, x in enumerate(lines) if "Not in the set" in x)


def test_cuda_graphs_over_several_micro_batches_are_not_promised(llama: StepBudget) -> None:
    """The same loop as a plain one (its step the user's to edit): the trace's 4 micro-batches a step keep
    micro-batch k's outputs alive when k + 1 replays; the graphs need the mark before each forward, which
    is not measured: not promised. One micro-batch a step (the replay's count and the facts' both 1): still
    not promised, for what no trace shows (a module keeping a tensor it made in forward), the cost still
    saying what the loop must not keep."""
    g = _fitted(llama)[RemedyId.CUDA_GRAPHS]
    assert g.gain is not None and g.gain.low_ms > 0 and g.gain.risk is Risk.GRAPHS_MICRO_BATCHES
    assert not g.gain.promised and g.cost is not None and g.cost.code is Say.GRAPHS_KEEP
    assert llama.replay is not None and llama.facts is not None
    one = dataclasses.replace(llama, replay=dataclasses.replace(llama.replay, microbatches=1),
                              facts=dataclasses.replace(llama.facts, micro_batches=1.0))
    g1 = _fitted(one)[RemedyId.CUDA_GRAPHS]
    assert g1.gain is not None and g1.gain.risk is Risk.GRAPHS_KEPT_TENSOR and not g1.gain.promised
    assert g1.cost is not None and g1.cost.code is Say.GRAPHS_KEEP


def test_lightnings_cuda_graphs_say_what_they_need(lightning: StepBudget) -> None:
    """Lightning's demo runs one micro-batch a step, but its positional encoding caches a tensor it made in
    forward: the graphs failed as is, and again with the mark first in training_step (the second A/B).
    Not promised; the cost says where the mark goes and that it failed so."""
    assert lightning.replay is not None and lightning.replay.microbatches == 1
    g = _fitted(lightning, Framework.LIGHTNING)[RemedyId.CUDA_GRAPHS]
    assert g.gain is not None and not g.gain.promised and g.gain.risk is Risk.GRAPHS_KEPT_TENSOR
    assert g.cost is not None and g.cost.code is Say.GRAPHS_KEEP_LIGHTNING
    said = text(g.cost)
    assert "torch.compiler.cudagraph_mark_step_begin()" in said and "training_step" in said
    assert "Lightning's Transformer demo" in said


def test_the_eager_models_fused_loss_keeps_its_words(llama: StepBudget) -> None:
    """An eager model's fused loss is as it was (no risk of compile's); the Trainer's stays
    --use_liger_kernel, its cost saying Liger's kernels run outside torch.compile unless --torch_compile
    is given too."""
    plain = _fitted(llama)[RemedyId.CE_FUSION]
    assert plain.action.code is Say.FUSED_LINEAR_CE and plain.gain is not None and plain.gain.risk is None
    hf = _fitted(llama, Framework.HF_TRAINER)[RemedyId.CE_FUSION]
    assert hf.action.code is Say.FUSED_LINEAR_CE_HF and hf.gain is not None and hf.gain.risk is None
    assert hf.cost is not None and hf.cost.code is Say.FUSED_CE_COST_HF
    cost = text(hf.cost)
    assert "outside torch.compile unless --torch_compile is given too" in cost
